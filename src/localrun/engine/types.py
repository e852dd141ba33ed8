"""The one response type every generation path streams, and the stats it ends with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

# stop: a stop sequence (or, in the APIs, end of text too); eos: the model's end of text; length: max tokens
# or a full context; interrupted: Ctrl-C or the caller's cancel; cancelled: the client went away;
# error / shutdown: the server could not finish it.
FinishReason = Literal["stop", "eos", "length", "interrupted", "cancelled", "error", "shutdown"]


@dataclass
class Stats:
    load_s: float = 0.0
    prompt_tokens: int = 0  # prompt tokens in the request
    cached_tokens: int = 0  # of those, reused from the KV cache (not evaluated)
    prompt_eval_s: float = 0.0  # from the request to the first token: queueing, prefill, the first sample
    generated_tokens: int = 0  # tokens generated (end of text not counted)
    eval_tokens: int = 0  # decode steps after the first token: generated_tokens - 1
    eval_s: float = 0.0
    ttft_s: float = 0.0
    finish_reason: FinishReason = "stop"
    target_steps: int = 0  # speculative decoding / beam search: batched decode calls of the target
    draft_tokens: int = 0  # speculative decoding: tokens proposed by the drafter
    draft_accepted: int = 0  # of those, tokens the target agreed with
    thinking_tokens: int = 0  # of generated_tokens, those of a reasoning model's thinking

    @property
    def prompt_eval_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def prompt_rate(self) -> float:
        return self.prompt_eval_tokens / self.prompt_eval_s if self.prompt_eval_s > 0 else 0.0

    @property
    def eval_rate(self) -> float:
        return self.eval_tokens / self.eval_s if self.eval_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        # Time per output token after the first one: decode cost as a user feels it.
        return self.eval_s / self.eval_tokens if self.eval_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.draft_accepted / self.draft_tokens if self.draft_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "load_s": round(self.load_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_eval_tokens": self.prompt_eval_tokens,
            "prompt_eval_s": round(self.prompt_eval_s, 6),
            "prompt_tokens_per_s": round(self.prompt_rate, 3),
            "generated_tokens": self.generated_tokens,
            "eval_tokens": self.eval_tokens,
            "eval_s": round(self.eval_s, 6),
            "eval_tokens_per_s": round(self.eval_rate, 3),
            "ttft_s": round(self.ttft_s, 6),
            "tpot_s": round(self.tpot_s, 6),
            "finish_reason": self.finish_reason,
            **({"thinking_tokens": self.thinking_tokens} if self.thinking_tokens else {}),
            **({"target_steps": self.target_steps, "draft_tokens": self.draft_tokens, "draft_accepted": self.draft_accepted,
                "acceptance_rate": round(self.acceptance_rate, 4)} if self.target_steps else {}),
        }


@dataclass
class TokenLogprob:
    """A sampled token's log-probability under the model's own distribution (the raw logits' softmax,
    before temperature, penalties or any other sampler), and the most likely tokens there with theirs."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Progress:
    """How far a prompt's evaluation is (llama-server's prompt_progress): its tokens, those taken from a cache
    (the KV a slot held, a prefix restored from disk), and those in the KV now (cached ones included)."""

    total: int
    cached: int
    processed: int


@dataclass
class Response:
    """One step of a generation's output: new text and the token ids that made it (the text may be '' while
    a multi-byte character or a possible stop sequence is held back). The last response of a stream has a
    finish_reason and the stats; an `error` says why a server could not finish it."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: Optional[FinishReason] = None
    stats: Optional[Stats] = None
    error: Optional[str] = None
    # Asked for (a sequence's top_logprobs): one TokenLogprob per token of `tokens`.
    logprobs: Optional[list["TokenLogprob"]] = None
    thinking: str = ""  # a reasoning model's thinking (its markers left out), apart from the answer in `text`
    stop_sequence: Optional[str] = None  # the last response of one a stop sequence ended: which one
    context_full: bool = False  # the last response of one cut ("length") because its context was full, not at its limit
    progress: Optional[Progress] = None  # while the prompt is evaluated (no text yet): how far it is

    @property
    def done(self) -> bool:
        return self.finish_reason is not None
