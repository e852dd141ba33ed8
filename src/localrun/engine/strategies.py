"""Decoding strategies beyond one token per step: speculative decoding and beam search.

Each is a task of the one decode loop (loop.py): it says which tokens go into a step's batch and what
to do with the outputs, and streams the same responses as plain sampling. Perplexity is one too.

Speculative decoding (`--draft lookup` or `--draft MODEL`): a drafter proposes k tokens; the target
model evaluates the last token plus the draft in one batch, then samples position by position with
its own sampler chain, keeping draft tokens while the target's own choice agrees. The first
disagreement is replaced by the target's token and the rejected draft is removed from the KV cache
(`llama_memory_seq_rm`). Every emitted token is one the target sampled at its position from the same
logits and with the same RNG sequence as plain decoding, so greedy output is token-identical, and
for sampling this is the standard rejection rule for a deterministic (greedy) draft: a draft token d
is kept with probability p(d), and on rejection the token comes from p without d.

On a CPU, evaluating k+1 tokens costs more than one, so a draft that is rejected is a loss. The
draft length adapts (longer after full acceptance, shorter after a miss) and drafting pauses, with
a back-off, after repeated misses: on text that does not repeat its input the cost stays small.

Beam search (`--beams N`): N hypotheses in N sequences of one context, extended together in one
batch per step; a hypothesis that survives into several children is forked with
`llama_memory_seq_cp`. Finished hypotheses (end of text, a stop sequence, max tokens) are ranked by
log-probability / length ** length_penalty, and the best is returned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Optional

from ..errors import ContextOverflow, EngineError, Phrase, SettingError, SettingsConflict, UsageError
from .loop import PLAIN, Plain, Prefill, Task, drive, generate
from .model import Batch, Engine, LoadOptions
from .options import DRAFT_MAX, LOOKUP_DRAFT_MAX, MODEL_DRAFT_MAX
from .sampling import Sampler, SamplingOptions, check_bias_tokens
from .sequence import SequenceState
from .stops import StopMatcher
from .types import Progress, Response, Stats


@dataclass(frozen=True)
class DecodeOptions:
    draft: Optional[str] = None  # "lookup", or a model reference for a draft model
    # Most tokens drafted per step (see LookupDrafter for what a step of many tokens costs); None: the
    # drafter's own default, LOOKUP_DRAFT_MAX for lookup, MODEL_DRAFT_MAX for a draft model.
    draft_max: Optional[int] = None
    beams: int = 1
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.draft_max is None:
            object.__setattr__(self, "draft_max", LOOKUP_DRAFT_MAX if self.draft == "lookup" else MODEL_DRAFT_MAX)
        if self.draft_max < 1 or self.draft_max > DRAFT_MAX:
            raise SettingError("draft_max", self.draft_max, f"use 1 to {DRAFT_MAX}")
        if self.beams < 1 or self.beams > 64:
            raise SettingError("beams", self.beams, "use 1 to 64")
        if self.beams > 1 and self.draft:
            raise SettingsConflict(("beams", "draft"))
        if not -10.0 <= self.length_penalty <= 10.0:
            raise SettingError("length_penalty", self.length_penalty, "use -10 to 10 (1 = average log-probability)")


# -- drafters --------------------------------------------------------------------------------------


class LookupDrafter:
    """Prompt-lookup n-grams: if the last n tokens (n = 4..2) occurred before in the prompt or the
    output, propose what followed them last time, as much as the match is long: a run being copied (the
    last LONG tokens all agree with what stood before that earlier continuation: an edit's unchanged lines)
    drafts as many tokens as allowed, a match of 3 to LONG-1 tokens drafts SHORT, a shorter one nothing.
    On a CPU a step's cost grows with its tokens, more slowly the more there are (Qwen2.5-1.5B, two threads
    at a depth of 500, scripts/bench_verify_cost.py: on an AMD EPYC 2 cost 1.85 single steps, 4 cost 2.9, 17
    cost 9.0, 33 cost 14.5, 49 cost 21.2; on an Intel Xeon 17 cost 10.8; a step of whole fours costs a single
    step less than one token more: CPU_ROWS), so only a long match pays for a long draft (a kept draft of 31
    gains up to ~2.7x there) and a bare 2-token match for none."""

    MAX_N, MIN_N = 4, 2
    LONG, SHORT = 12, 3
    sizes_itself = True  # SpeculativeTask offers it all the room there is; DraftLength only pauses it

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.index: dict[tuple, int] = {}  # n-gram -> where its latest earlier continuation starts

    def reset(self, prompt: Sequence[int]) -> None:
        self.tokens, self.index = [], {}
        self.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        toks, index = self.tokens, self.index
        for t in tokens:
            p = len(toks)  # t goes at p: every n-gram ending at p-1 is continued by it
            for n in range(self.MIN_N, self.MAX_N + 1):
                if p >= n:
                    index[tuple(toks[p - n : p])] = p
            toks.append(t)

    def propose(self, k: int, long_only: bool = False) -> list[int]:
        """Up to `k` tokens; `long_only`: only for a run being copied (short drafts are paused after misses)."""
        toks = self.tokens
        for n in range(self.MAX_N, self.MIN_N - 1, -1):
            if len(toks) < n:
                continue
            start = self.index.get(tuple(toks[-n:]))
            if start is not None:
                agree = self._agreement(start)
                if agree < (self.LONG if long_only else 3):
                    return []
                draft = toks[start : start + (k if agree >= self.LONG else min(k, self.SHORT))]
                # An image's positions (negative ids in a vision prompt) are no tokens to propose.
                return next((draft[:i] for i, t in enumerate(draft) if t < 0), draft)
        return []

    def _agreement(self, start: int) -> int:
        """How many tokens before `start` equal the last ones (up to LONG): the length of the match."""
        toks, m = self.tokens, 0
        i, j = start - 1, len(self.tokens) - 1
        while i >= 0 and m < self.LONG and toks[i] == toks[j]:
            m, i, j = m + 1, i - 1, j - 1
        return m

    def close(self) -> None:
        pass

class ModelDrafter:
    """A smaller model with the same vocabulary drafts greedily from its own KV cache, which keeps the
    history: only the tokens since its last draft are evaluated (a plain greedy generation on its engine)."""

    def __init__(self, draft: Engine, target: Engine):
        if draft.n_vocab != target.n_vocab or any(
            draft.token_bytes(t) != target.token_bytes(t) for t in range(0, target.n_vocab, max(1, target.n_vocab // 512))
        ):
            raise UsageError(Phrase(
                "the draft model {name} has another vocabulary ({n} tokens) than {target} ({m}): pick a draft model"
                " from the same family, or {draft} lookup", name=draft.path.name, n=draft.n_vocab,
                target=target.path.name, m=target.n_vocab))
        self.engine = draft
        self.tokens: list[int] = []

    def reset(self, prompt: Sequence[int]) -> None:
        self.tokens = list(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        k = min(k, self.engine.n_ctx - len(self.tokens) - 1)
        if k <= 0:
            return []
        greedy = SamplingOptions(temperature=0.0, max_tokens=k)
        return [t for response in generate(self.engine, self.tokens, greedy) for t in response.tokens]

    def close(self) -> None:
        self.engine.close()


class DraftLength:
    """How many tokens to draft next. Verifying k+1 tokens costs a CPU about 1 + k/2 single steps,
    so drafting pays only while most drafted tokens are kept: below half (a running average),
    drafting pauses (16, 32, ... 128 steps) and then probes with 2 tokens. The length doubles after
    a fully accepted draft and drops to just past the last agreement after a miss."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.k = min(2, k_max)  # start cheap: one miss of a short draft costs little
        self.rate = 0.6  # a first full miss already pauses
        self.pause = 0
        self.backoff = 16

    def next(self) -> int:
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k if self.rate >= 0.5 else min(2, self.k)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.rate = 0.7 * self.rate + 0.3 * (accepted / drafted)
        self.k = min(self.k_max, self.k * 2) if accepted == drafted else max(1, min(self.k_max, accepted + 1))
        if self.rate < 0.5:
            self.pause, self.backoff = self.backoff, min(128, self.backoff * 2)
        else:
            self.backoff = 16


# -- speculative decoding --------------------------------------------------------------------------

# On a CPU, llama.cpp's repacked weight kernels (Q4_K, Q4_0, IQ4_NL...: ggml-cpu/repack.cpp) multiply a
# step's tokens four at a time and each one left over alone, as a whole pass over the weights: a step of
# 33 tokens costs about a single step more than one of 32 (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, depth
# 800, scripts/bench_verify_cost.py: 32 tokens 11.9 single steps, 33 12.9; 16 6.9, 17 7.6; 48 16.5, 49
# 17.0). So a verified draft there is cut to fill whole fours with the token before it (3, 7, ... 31).
CPU_ROWS = 4


def whole_rows(k: int, rows: int) -> int:
    """The longest draft of at most `k` tokens that fills whole multiples of `rows` with the token before it;
    one shorter than rows - 1 stays (cutting it would only drop what may be kept)."""
    return k - (k + 1) % rows if k + 1 > rows else k


class SpeculativeTask(Plain):
    """After the prompt, each step evaluates the last token plus a draft, all with outputs; the target's
    sampler then walks the positions and keeps draft tokens while its own choice agrees."""

    def __init__(self, engine: Engine, seq: SequenceState, sampler: Sampler, drafter, draft_max: int, *,
                 chunk: Optional[int] = None, reused: Optional[int] = None):
        super().__init__(engine, seq, sampler, chunk=chunk, reused=reused)
        self.drafter = drafter
        self.length = DraftLength(draft_max)
        self.cap = draft_max + 1
        self.row_multiple = CPU_ROWS if _cpu_only(engine.options) else 1
        self.draft: list[int] = []
        self.rows: list[int] = []
        drafter.reset(seq.prompt)

    def schedule(self, batch: Batch) -> bool:
        if self.next_token is None:
            return self.schedule_prompt(batch)
        pos0 = len(self.engine.kv.tokens[self.seq_id])
        self.rows = [batch.add(t, pos0 + i, self.seq_id, True) for i, t in enumerate([self.next_token, *self.draft])]
        return True

    def consume(self) -> list[Response]:
        seq, sampler, ctx = self.seq, self.sampler, self.engine.ctx
        if self.next_token is None:
            if not self.prompt_done():
                return [self.progress()]
            seq.before_sample()
            pending = [sampler.sample(ctx, 0, self.row)]  # sampled by the target, not yet emitted
        else:
            seq.stats.target_steps += 1
            pending, accepted = [], 0
            seq.before_sample()  # (a spent thinking budget's end marker: the draft's tokens after it are not taken)
            for i, row in enumerate(self.rows):
                tok = sampler.sample(ctx, len(seq.generated) + i, row)
                pending.append(tok)
                if i < len(self.draft) and tok == self.draft[i] and not self.engine.is_eog(tok):
                    accepted += 1
                    continue
                break
            rejected = len(self.draft) - accepted
            if rejected:
                self.engine.kv.truncate(self.seq_id, len(self.engine.kv.tokens[self.seq_id]) - rejected)
            seq.stats.draft_tokens += len(self.draft)
            seq.stats.draft_accepted += accepted
            self.length.update(len(self.draft), accepted)
        out = []
        for tok in pending:
            first = not seq.generated
            response = seq.push(tok)
            if first:  # the prompt is in: its last progress rides on the first token
                response.progress = Progress(len(self.prompt), self.cached, len(self.prompt))
            out.append(response)
            if response.done:
                self.done, self.next_token = True, None
                return out
            self.drafter.extend([tok])
        self.next_token = pending[-1]  # the one emitted token whose KV is not in the cache yet
        held = len(self.engine.kv.tokens[self.seq_id])
        room = min(seq.limit - len(seq.generated), seq.n_ctx - held - 1, self.cap - 1)
        allowed = self.length.next()  # 0: drafting is paused after misses
        if getattr(self.drafter, "sizes_itself", False):  # it drafts by its match; a pause stops only short guesses
            draft = self.drafter.propose(room, long_only=not allowed) if room > 0 else []
            self.draft = draft[: whole_rows(len(draft), self.row_multiple)]
        else:
            k = whole_rows(min(allowed, room), self.row_multiple)
            self.draft = self.drafter.propose(k) if k > 0 else []
        return out


class Speculative:
    def __init__(self, drafter, draft_max: int):
        self.drafter = drafter
        self.draft_max = draft_max

    def task(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions, n_ctx: Optional[int] = None) -> Task:
        engine.use_raw_logits()  # it reads every drafted position's logits
        sampler = Sampler(engine, sampling)
        try:
            return SpeculativeTask(engine, SequenceState(engine, prompt, sampling, n_ctx=n_ctx), sampler, self.drafter, self.draft_max)
        except BaseException:
            sampler.close()
            raise

    def close(self) -> None:
        self.drafter.close()


# -- beam search -----------------------------------------------------------------------------------

@dataclass
class Hypothesis:
    tokens: list[int]
    logprob: float
    seq: int = -1  # the KV sequence holding it
    parent: int = -1  # a new child: the index of the live hypothesis it extends
    text: str = ""  # set when a stop sequence cut it, else once it is chosen
    stopped_by: Optional[str] = None

    def score(self, length_penalty: float) -> float:
        return self.logprob / (max(1, len(self.tokens)) ** length_penalty)


class BeamTask(Prefill):
    """The prompt in sequence 0, then each step extends the live beams (two banks of N sequences: the live
    ones in one, their children forked into the other) by one token each, all in one batch."""

    def __init__(self, engine: Engine, seq: SequenceState, beams: int, length_penalty: float, allowed=None):
        import numpy as np

        super().__init__(engine, seq.prompt, seq_id=0)
        self.seq = seq
        seq.stats.cached_tokens = self.cached
        self.n_beams, self.length_penalty = beams, length_penalty
        sampling = seq.sampling
        self.stops = sampling.stop
        # The context asked for; the pool is larger, for N answers.
        self.limit = min(sampling.max_tokens if sampling.max_tokens > 0 else seq.n_ctx, seq.n_ctx - len(seq.prompt))
        check_bias_tokens(sampling.logit_bias, engine.n_vocab)
        self.mask = None
        if allowed is not None or sampling.logit_bias:
            self.mask = np.zeros(engine.n_vocab, dtype=np.float32)
            if allowed is not None:
                self.mask[:] = -np.inf
                self.mask[list(allowed)] = 0.0
            for tok, bias in sampling.logit_bias.items():
                self.mask[tok] += bias
        self.eog = np.zeros(engine.n_vocab, dtype=bool)
        self.eog[engine.eog_tokens()] = True
        self.finished: list[Hypothesis] = []
        self.live = [Hypothesis([], 0.0, seq=0)]
        self.rows: list[int] = []
        self.children: list[Hypothesis] = []
        self.bank = 1
        self.best: Optional[Hypothesis] = None
        for s in range(1, 2 * beams + 1):
            engine.kv.clear(s)

    def schedule(self, batch: Batch) -> bool:
        if not self.prefilled:
            return self.schedule_prompt(batch)
        self.rows = [batch.add(c.tokens[-1], len(self.seq.prompt) + len(c.tokens) - 1, c.seq, True) for c in self.children]
        return True

    def consume(self) -> list[Response]:
        if self.rows:  # the children just decoded become the live beams
            self.seq.stats.target_steps += 1
            self.live, self.bank = self.children, 2 if self.bank == 1 else 1
        elif not self.prompt_done():
            return []
        else:
            self.rows = [self.row]
        children = self._select()
        if not children or self._done(children):
            return [self._finish()]
        # Fork: each child's sequence is a copy of its parent's, then gets its new token at the next step.
        other = 1 + self.n_beams if self.bank == 1 else 1
        kv = self.engine.kv
        for j, child in enumerate(children):
            child.seq = other + j
            kv.copy(self.live[child.parent].seq, child.seq)
        for hyp in self.live:
            if hyp.seq != 0:
                kv.clear(hyp.seq)
        self.children = children
        return []

    def _select(self) -> list[Hypothesis]:
        import numpy as np

        n_beams = self.n_beams
        candidates: list[tuple[float, int, int]] = []  # (logprob, parent index, token)
        for b, (hyp, row) in enumerate(zip(self.live, self.rows)):
            logits = self.engine.logits(row)
            x = logits + self.mask if self.mask is not None else logits.astype(np.float32, copy=True)
            x -= x.max()
            logp = x - np.log(np.exp(x).sum())
            top = np.argpartition(-logp, n_beams)[: n_beams + 1] if n_beams + 1 < len(logp) else np.arange(len(logp))
            for t in top:
                if np.isfinite(logp[t]):
                    candidates.append((hyp.logprob + float(logp[t]), b, int(t)))
        self.seq.sampled()
        candidates.sort(key=lambda c: -c[0])
        children: list[Hypothesis] = []
        for lp, b, t in candidates:
            parent = self.live[b]
            if self.eog[t]:
                self.finished.append(Hypothesis(parent.tokens, lp))
                continue
            child = Hypothesis(parent.tokens + [t], lp, parent=b)
            if self.stops:  # the whole text each time: a stop may span the tokens
                matcher = StopMatcher(self.stops)
                cut = matcher.feed(self.engine.detokenize(child.tokens))
                if matcher.stopped is not None:
                    child.text, child.stopped_by = cut, matcher.stopped
                    self.finished.append(child)
                    continue
            if len(child.tokens) >= self.limit:
                self.finished.append(child)
                continue
            children.append(child)
            if len(children) == n_beams:
                break
        return children

    def _done(self, live: list[Hypothesis]) -> bool:
        """Hugging Face's default rule: N finished, and the best live beam at its current length
        cannot beat the worst of the N best finished ones."""
        if len(self.finished) < self.n_beams:
            return False
        lp = self.length_penalty
        kept = sorted((h.score(lp) for h in self.finished), reverse=True)[: self.n_beams]
        return max(h.score(lp) for h in live) <= kept[-1]

    def _finish(self) -> Response:
        self.done = True
        self.close()
        best = self.best = max(self.finished or self.live, key=lambda h: h.score(self.length_penalty))
        if best.stopped_by is not None:
            reason = "stop"  # its text was cut at the stop
        else:
            best.text = self.engine.detokenize(best.tokens)
            reason = "length" if len(best.tokens) >= self.limit else "eos"
        self.seq.finish_reason = reason
        return Response(best.text, list(best.tokens), reason, self.seq.close_stats(reason, len(best.tokens)))

    def interrupt(self, reason: str = "interrupted", error: Optional[str] = None) -> Response:
        self.close()
        return super().interrupt(reason, error)

    def close(self) -> None:
        for s in range(1, 2 * self.n_beams + 1):
            self.engine.kv.clear(s)


class BeamSearch:
    """N hypotheses decoded together. Needs a context with 2N+1 sequences (LoadOptions n_seq_max): the
    prompt in sequence 0, the live beams in one bank of N sequence ids while their children are forked into
    the other."""

    def __init__(self, beams: int, length_penalty: float, ctx_limit: Optional[int] = None):
        self.beams = beams
        self.length_penalty = length_penalty
        self.ctx_limit = ctx_limit  # the --ctx asked for (the context itself holds N answers more)

    def task(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions, n_ctx: Optional[int] = None,
             allowed=None) -> BeamTask:
        if engine.options.n_seq_max < 2 * self.beams + 1:
            raise EngineError(f"beam search with {self.beams} beams needs a context made for {2 * self.beams + 1} sequences")
        n_ctx = n_ctx or self.ctx_limit or engine.n_ctx
        if len(prompt) >= n_ctx:
            raise ContextOverflow(Phrase("the prompt is {n} tokens but the context holds {held}: raise {ctx} or pass {truncate}",
                                         n=len(prompt), held=n_ctx))
        engine.use_raw_logits()
        return BeamTask(engine, SequenceState(engine, prompt, sampling, n_ctx=n_ctx), self.beams, self.length_penalty, allowed)

    def search(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions,
               allowed: Optional[Sequence[int]] = None) -> tuple[Hypothesis, Stats]:
        """The best finished hypothesis. `allowed` restricts the vocabulary (tests compare against brute
        force on a few tokens); `sampling` contributes max_tokens, stop and logit_bias."""
        if not prompt:
            raise UsageError("empty prompt: give some text as an argument or on stdin")
        task = self.task(engine, prompt, sampling, allowed=allowed)
        try:
            final = [r for r in drive(engine, [task]) if r.done][-1]
        finally:
            task.close()
        return task.best, final.stats

    def close(self) -> None:
        pass


# -- perplexity ------------------------------------------------------------------------------------

@dataclass
class Perplexity:
    ppl: float
    error: float  # llama-perplexity's +/- estimate
    n_chunks: int
    n_scored: int
    seconds: float


class PerplexityTask(Task):
    """llama-perplexity's method: the text cut into chunks of n_ctx tokens, each evaluated in a fresh context
    (its first token replaced by BOS where the model adds one) with logits for the second half only; the
    negative log-likelihood of each next token there is summed."""

    def __init__(self, engine: Engine, tokens: list[int], n_ctx: int, n_chunks: int):
        self.engine, self.tokens, self.n_ctx, self.n_chunks = engine, tokens, n_ctx, n_chunks
        self.add_bos, self.bos = engine.add_bos, engine.bos_token
        self.chunk_index, self.start = 0, 0
        self.chunk: list[int] = []
        self.outputs: list[int] = []  # positions (in the chunk) whose next token is scored this step
        self.first_row = -1
        self.n_out = 0
        self.nll = self.nll2 = 0.0
        self.count = 0
        self._next_chunk()

    def _next_chunk(self) -> None:
        c = self.chunk_index
        self.chunk = self.tokens[c * self.n_ctx : (c + 1) * self.n_ctx]
        if self.add_bos:
            self.chunk[0] = self.bos
        self.start = 0
        self.engine.reset()

    def schedule(self, batch: Batch) -> bool:
        first = self.n_ctx // 2
        piece = self.chunk[self.start : self.start + self.engine.n_batch]
        self.outputs, self.first_row, self.n_out = [], -1, 0
        for k, tok in enumerate(piece):
            pos = self.start + k
            row = batch.add(tok, pos, 0, pos >= first)
            if pos >= first:
                self.first_row = row if self.first_row < 0 else self.first_row
                self.n_out += 1
                if pos + 1 < self.n_ctx:
                    self.outputs.append(pos)
        self._piece = len(piece)
        return True

    def consume(self) -> list[Response]:
        import numpy as np

        if self.outputs:
            # The flagged tokens' logits are consecutive output rows, the first at first_row.
            logits = self.engine.logits(self.first_row, self.n_out)
            if self.n_out == 1:
                logits = logits.reshape(1, -1)
            for lo in range(0, len(self.outputs), 32):  # blocks keep the float64 copies small for big vocabularies
                targets = [self.chunk[p + 1] for p in self.outputs[lo : lo + 32]]
                rows = logits[lo : lo + len(targets)].astype(np.float64)
                top = rows.max(axis=1)
                log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
                token_nll = log_z - rows[np.arange(len(targets)), targets]
                self.nll += float(token_nll.sum())
                self.nll2 += float((token_nll**2).sum())
                self.count += len(targets)
        self.start += self._piece
        if self.start >= self.n_ctx:
            self.chunk_index += 1
            self.engine.reset()
            if self.chunk_index == self.n_chunks:
                self.done = True
            else:
                self._next_chunk()
        return []

    def result(self, seconds: float) -> Perplexity:
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        ppl = math.exp(mean)
        error = ppl * math.sqrt(var / (self.count - 1)) if var > 0 and self.count > 1 else 0.0
        return Perplexity(ppl=ppl, error=error, n_chunks=self.n_chunks, n_scored=self.count, seconds=seconds)


def perplexity(engine: Engine, text: str, n_ctx: int, max_chunks: Optional[int] = None) -> Perplexity:
    """Perplexity of `text` in chunks of n_ctx tokens: PPL = exp(mean negative log-likelihood)."""
    import time

    engine.use_raw_logits()  # it reads every logit of half of each chunk
    tokens = engine.tokenize(text, add_special=True, parse_special=False)
    if len(tokens) < 2 * n_ctx:
        raise UsageError(Phrase("the text is {n} tokens; perplexity with {ctx} {n_ctx} needs at least {least}",
                                n=len(tokens), n_ctx=n_ctx, least=2 * n_ctx))
    if n_ctx > engine.n_ctx:
        raise UsageError(f"chunks of {n_ctx} tokens do not fit the context of {engine.n_ctx}")
    n_chunks = len(tokens) // n_ctx if max_chunks is None else min(max_chunks, len(tokens) // n_ctx)
    t0 = time.perf_counter()
    task = PerplexityTask(engine, tokens, n_ctx, n_chunks)
    for _ in drive(engine, [task]):
        pass
    return task.result(time.perf_counter() - t0)


def context_options(decoding: DecodeOptions, options: LoadOptions, answer_room: int) -> LoadOptions:
    """The context a strategy needs, from the one plain decoding would get (options.n_ctx: the context
    asked for). Refuses, before any model is loaded, a --batch that cannot hold one step of it."""
    if decoding.draft and decoding.draft_max + 1 > options.n_batch:
        raise SettingError("draft_max", decoding.draft_max, f"a step of it needs a batch of at least {decoding.draft_max + 1} tokens (it is {options.n_batch})")
    if decoding.beams > options.n_batch:
        raise SettingError("beams", decoding.beams, f"a step of them needs a batch of at least {decoding.beams} tokens (it is {options.n_batch})")
    if decoding.beams > 1:
        # The prompt in sequence 0, the beams in two banks of N; one KV pool, so a fork shares cells.
        return replace(options, n_ctx=options.n_ctx + decoding.beams * answer_room,
                       n_seq_max=2 * decoding.beams + 1, n_outputs=2 * decoding.beams + 1, kv_unified=True)
    if decoding.draft and options.n_outputs:  # a verified draft asks for the logits after each of its tokens
        options = replace(options, n_outputs=options.n_seq_max * (decoding.draft_max + 1))
    if decoding.draft and options.flash_attn is None and options.kv_type == "f16" and _cpu_only(options):
        # llama.cpp's CPU flash-attention kernel rounds differently for one query than for several, so
        # with it a verified draft (several queries) can come out a different greedy token than one-
        # token steps. Off (and on a build without llamafile's sgemm: make BACKEND=cpu-exact),
        # speculative output equals plain decoding. --flash-attn still turns it on, and so does a quantized
        # --kv-type, which needs it (it was refused as "drop --no-flash-attn", a flag nobody gave). It
        # costs nothing here: on this CPU (AVX2, 2 threads) Qwen2.5-1.5B decodes 1.20x faster without it at a
        # depth of 2048 (llama-bench tg32: 21.4 against 17.8 t/s), the same at depth 0. Where layers go to a
        # GPU, whose flash attention is much faster, llama.cpp decides as for plain decoding.
        return replace(options, flash_attn=False)
    return options


def _cpu_only(options: LoadOptions) -> bool:
    """Whether every layer runs on this machine's CPU (no GPU layers, no RPC worker)."""
    if options.rpc:
        return False
    if options.gpu_layers == 0:
        return True
    from .llama import supports_gpu_offload

    return not supports_gpu_offload()


def load_draft(target: Engine, path) -> Engine:
    """The draft model's engine: the target's settings, one sequence."""
    return Engine(path, replace(target.options, n_seq_max=1, kv_unified=False))


def make_strategy(options: DecodeOptions, engine: Engine, draft_engine: Optional[Engine] = None,
                  ctx_limit: Optional[int] = None):
    """The strategy a generation decodes with: plain sampling, speculative decoding or beam search."""
    if options.beams > 1:
        return BeamSearch(options.beams, options.length_penalty, ctx_limit)
    if options.draft == "lookup":
        return Speculative(LookupDrafter(), options.draft_max)
    if options.draft:
        if draft_engine is None:
            raise UsageError(Phrase("{draft} MODEL needs the draft model loaded"))
        return Speculative(ModelDrafter(draft_engine, engine), options.draft_max)
    return PLAIN
