"""One generation in flight: its prompt and limits, the tokens it produced, their text (incremental UTF-8
decoding, stop sequences cut out), its timings and how it ended. Every path that generates text (run,
chat, the server's slots, speculative decoding, beam search) keeps its output here."""

from __future__ import annotations

import codecs
import time
from collections.abc import Sequence
from typing import Optional

from .stops import StopMatcher
from .types import FinishReason, Response, Stats


class SequenceState:
    def __init__(self, engine, prompt: Sequence[int], sampling, *, seq_id: int = 0, n_ctx: Optional[int] = None,
                 max_tokens: Optional[int] = None, t0: Optional[float] = None):
        self.engine = engine
        self.prompt = list(prompt)
        self.sampling = sampling
        self.seq_id = seq_id
        self.n_ctx = n_ctx or engine.n_ctx  # the context this sequence may fill
        limit = sampling.max_tokens if max_tokens is None else max_tokens
        self.limit = limit if limit > 0 else 1 << 62
        self.generated: list[int] = []
        self.matcher = StopMatcher(sampling.stop)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stats = Stats(load_s=engine.load_s, prompt_tokens=len(self.prompt))
        self.t0 = time.perf_counter() if t0 is None else t0
        self.t_first: Optional[float] = None
        self.finish_reason: Optional[FinishReason] = None
        self.context_full = False  # it ended because its context was full (before its token limit)
        self.top_logprobs: Optional[int] = None  # set: each response carries its tokens' log-probabilities
        self.thinking = None  # a thinking.ThinkingSplitter: a reasoning model's thinking kept apart from the answer
        self.force = None  # the sampler's force(tokens): what comes next whatever the model would choose

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def before_sample(self) -> None:
        """Before the next token is chosen: a thinking whose budget (a request's reasoning_budget) is spent gets its
        family's own end marker next, and the answer begins (0: the thinking ends before it began)."""
        splitter = self.thinking
        if splitter is None or splitter.budget is None or not splitter.inside or self.force is None:
            return
        if self.stats.thinking_tokens >= splitter.budget:
            self.force(self.engine.tokenize(splitter.closing(), add_special=False, parse_special=True))
            splitter.budget = None

    def sampled(self) -> None:
        """A token was sampled (text or end of text): the first one ends the time to first token."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
            self.stats.prompt_eval_s = self.t_first - self.t0

    def push(self, token: int) -> Response:
        """Take the next sampled token: its text (what the stop matcher lets out), or the end."""
        self.sampled()
        if self.engine.is_eog(token):
            return self.finish("eos")
        self.generated.append(token)
        raw = self.engine.token_bytes(token)
        if not raw and self.thinking is not None:
            # A control token prints nothing, but a reasoning format may mark its channels with them
            # (gpt-oss's <|channel|>, <|message|>, <|end|>): those are written out, for the splitter to see.
            special = self.engine.token_bytes(token, special=True)
            if special and self.thinking.marks(special.decode("utf-8", "replace")):
                raw = special
        decoded = self._utf8.decode(raw)
        thought = ""
        if self.thinking is not None:  # stops apply to the answer only
            was_inside = self.thinking.inside
            thought, decoded = _split(self.thinking.feed(decoded))
            if was_inside or self.thinking.inside or thought:
                self.stats.thinking_tokens += 1

        text = self.matcher.feed(decoded)
        if self.matcher.stopped is not None:
            return self.finish("stop", text, [token], thinking=thought)
        # max tokens, or the context is full (the token would go past its last position): said, never silent
        full = len(self.prompt) + len(self.generated) - 1 >= self.n_ctx
        if len(self.generated) >= self.limit or full:
            self.context_full = full and len(self.generated) < self.limit
            return self.finish("length", text, [token], thinking=thought)
        return Response(text, [token], thinking=thought)

    def finish(self, reason: FinishReason, text: str = "", tokens: Optional[list[int]] = None,
               error: Optional[str] = None, thinking: str = "") -> Response:
        """The last response: what the decoder, the thinking splitter and the stop matcher still held, the
        finish reason (a stop found in the held text makes it 'stop') and the stats."""
        if self.matcher.stopped is None:
            # Bytes still held are the start of a character the answer ended inside (cut by --max-tokens, a
            # full context, Ctrl-C): dropped, as llama.cpp's server does, never shown as U+FFFD.
            self._utf8.reset()
            rest = ""
            if self.thinking is not None:
                more, rest = _split(self.thinking.feed(rest) + self.thinking.flush())
                thinking += more
            text += self.matcher.feed(rest)
        text += self.matcher.flush()
        if self.matcher.stopped is not None and reason not in ("error", "shutdown"):
            reason = "stop"
        self.finish_reason = reason
        self.close_stats(reason)
        return Response(text, tokens or [], reason, self.stats, error, thinking=thinking, stop_sequence=self.matcher.stopped,
                        context_full=reason == "length" and self.context_full)

    def close_stats(self, reason: FinishReason, n_generated: Optional[int] = None) -> Stats:
        """Timings up to now (also after an interruption); n_generated: for a beam, the tokens it chose."""
        s = self.stats
        n = len(self.generated) if n_generated is None else n_generated
        t_end = time.perf_counter()
        if self.t_first is None:
            self.t_first = t_end
            s.prompt_eval_s = t_end - self.t0
        s.ttft_s = self.t_first - self.t0
        s.generated_tokens = n
        s.eval_tokens = max(0, n - 1)
        s.eval_s = t_end - self.t_first if n > 1 else 0.0
        s.finish_reason = reason
        return s


def _split(parts: list[tuple[str, str]]) -> tuple[str, str]:
    """(thinking, answer) text of a splitter's pieces."""
    return "".join(t for kind, t in parts if kind == "thinking"), "".join(t for kind, t in parts if kind == "answer")
