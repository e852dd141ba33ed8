"""Decoding strategies beyond one token per step: speculative decoding and beam search.

Both plug into Engine.generate (so `run`, `chat` and `bench` get them from one switch) and yield the
same events as plain decoding (engine.Token ..., engine.Done).

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

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from .engine import Done, Engine, LoadOptions, Stats, Token, llama_cpp_module
from .errors import ContextOverflow, EngineError, UsageError
from .sampling import SamplingOptions, check_bias_tokens


@dataclass(frozen=True)
class DecodeOptions:
    draft: Optional[str] = None  # "lookup", or a model reference for a draft model
    draft_max: int = 8  # most tokens drafted per step (a CPU pays for every rejected one)
    beams: int = 1
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.draft_max < 1 or self.draft_max > 64:
            raise UsageError(f"invalid --draft-max {self.draft_max}: use 1 to 64")
        if self.beams < 1 or self.beams > 64:
            raise UsageError(f"invalid --beams {self.beams}: use 1 to 64")
        if self.beams > 1 and self.draft:
            raise UsageError("--beams and --draft do not combine: pick one")
        if not -10.0 <= self.length_penalty <= 10.0:
            raise UsageError(f"invalid --length-penalty {self.length_penalty}: use -10 to 10 (1 = average log-probability)")


# -- drafters --------------------------------------------------------------------------------------


class LookupDrafter:
    """Prompt-lookup n-grams: if the last n tokens (n = 4..2) occurred before in the prompt or the
    output, propose what followed them last time."""

    MAX_N, MIN_N = 4, 2

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

    def propose(self, k: int) -> list[int]:
        toks = self.tokens
        for n in range(self.MAX_N, self.MIN_N - 1, -1):
            if len(toks) < n:
                continue
            start = self.index.get(tuple(toks[-n:]))
            if start is not None:
                return toks[start : start + k]
        return []

    def close(self) -> None:
        pass


class ModelDrafter:
    """A smaller model with the same vocabulary drafts greedily from its own KV cache, which keeps
    the history: only the tokens since its last draft are evaluated."""

    def __init__(self, draft: Engine, target: Engine):
        if draft.n_vocab != target.n_vocab or any(
            draft.token_bytes(t) != target.token_bytes(t) for t in range(0, target.n_vocab, max(1, target.n_vocab // 512))
        ):
            raise UsageError(
                f"the draft model {draft.path.name} has another vocabulary ({draft.n_vocab} tokens) than "
                f"{target.path.name} ({target.n_vocab}): pick a draft model from the same family, or --draft lookup"
            )
        ll = llama_cpp_module()
        self.engine = draft
        params = ll.llama_sampler_chain_default_params()
        self.greedy = ll.llama_sampler_chain_init(params)
        ll.llama_sampler_chain_add(self.greedy, ll.llama_sampler_init_greedy())
        self.tokens: list[int] = []

    def reset(self, prompt: Sequence[int]) -> None:
        self.tokens = list(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        ll, eng = llama_cpp_module(), self.engine
        room = eng.n_ctx - len(self.tokens) - 1
        k = min(k, room)
        if k <= 0:
            return []
        eng.prefill(self.tokens)
        out: list[int] = []
        one = (ll.llama_token * 1)()
        for i in range(k):
            tok = ll.llama_sampler_sample(self.greedy, eng.ctx, -1)
            if eng.is_eog(tok):
                break
            out.append(tok)
            if i + 1 < k:
                one[0] = tok
                if ll.llama_decode(eng.ctx, ll.llama_batch_get_one(one, 1)) != 0:
                    break
                eng.cached.append(tok)
        return out

    def close(self) -> None:
        if self.greedy:
            llama_cpp_module().llama_sampler_free(self.greedy)
            self.greedy = None
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


# -- speculative generation ------------------------------------------------------------------------


class Speculative:
    def __init__(self, drafter, draft_max: int):
        self.drafter = drafter
        self.draft_max = draft_max

    def close(self) -> None:
        self.drafter.close()

    def generate(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions) -> Iterator:
        ll = llama_cpp_module()
        stats, sampler, utf8 = engine.begin(prompt, sampling)
        drafter, length = self.drafter, DraftLength(self.draft_max)
        generated: list[int] = []
        cap = self.draft_max + 1
        batch = ll.llama_batch_init(cap, 0, 1)
        ctx, cached, n_ctx = engine.ctx, engine.cached, engine.n_ctx
        limit = sampling.max_tokens if sampling.max_tokens > 0 else 1 << 62
        t0 = time.perf_counter()
        t_first = None
        try:
            stats.cached_tokens = engine.prefill(prompt)
            sampler.accept_prompt(prompt)
            drafter.reset(prompt)
            pending = [sampler.sample(ctx, 0)]  # sampled by the target, not yet emitted
            while True:
                if t_first is None:
                    t_first = time.perf_counter()
                    stats.prompt_eval_s = t_first - t0
                done = False
                for tok in pending:
                    if engine.is_eog(tok):
                        stats.finish_reason, done = "eos", True
                        break
                    generated.append(tok)
                    drafter.extend([tok])
                    yield Token(utf8.decode(engine.token_bytes(tok)), tok)
                    if len(generated) >= limit or len(cached) >= n_ctx:
                        stats.finish_reason, done = "length", True
                        break
                if done:
                    break
                last = pending[-1]  # the one emitted token whose KV is not in the cache yet
                room = min(limit - len(generated), n_ctx - len(cached) - 1, cap - 1)
                k = min(length.next(), room)
                draft = drafter.propose(k) if k > 0 else []
                n = 1 + len(draft)
                pos0 = len(cached)
                for i, t in enumerate([last, *draft]):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                batch.n_tokens = n
                if ll.llama_decode(ctx, batch) != 0:
                    raise EngineError(f"llama.cpp decode failed at position {pos0}: try a smaller --ctx")
                cached.append(last)
                cached.extend(draft)
                stats.target_steps += 1
                pending = []
                accepted = 0
                for i in range(n):
                    tok = sampler.sample(ctx, len(generated) + i, i)
                    pending.append(tok)
                    if i < len(draft) and tok == draft[i] and not engine.is_eog(tok):
                        accepted += 1
                        continue
                    break
                rejected = len(draft) - accepted
                if rejected:
                    keep = len(cached) - rejected
                    ll.llama_memory_seq_rm(engine.memory, 0, keep, -1)
                    del cached[keep:]
                stats.draft_tokens += len(draft)
                stats.draft_accepted += accepted
                length.update(len(draft), accepted)
            tail = utf8.decode(b"", final=True)
            if tail:
                yield Token(tail, -1)
        except KeyboardInterrupt:
            stats.finish_reason = "interrupted"
            raise
        finally:
            ll.llama_batch_free(batch)
            engine.end(stats, t0, t_first, len(generated))
            sampler.close()
        yield Done(stats, generated)


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


class BeamSearch:
    """N hypotheses decoded together. Needs a context with 2N sequences (Engine n_seq_max): the live
    beams use one bank of N sequence ids while their children are forked into the other."""

    def __init__(self, beams: int, length_penalty: float, ctx_limit: Optional[int] = None):
        self.beams = beams
        self.length_penalty = length_penalty
        self.ctx_limit = ctx_limit  # the --ctx asked for (the context itself holds N answers more)

    def close(self) -> None:
        pass

    def generate(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions,
                 allowed: Optional[Sequence[int]] = None) -> Iterator:
        best, stats = self.search(engine, prompt, sampling, allowed)
        if best.text:
            yield Token(best.text, -1)
        yield Done(stats, best.tokens)

    def search(self, engine: Engine, prompt: Sequence[int], sampling: SamplingOptions,
               allowed: Optional[Sequence[int]] = None) -> tuple[Hypothesis, Stats]:
        """The best finished hypothesis. `allowed` restricts the vocabulary (tests compare against
        brute force on a few tokens); `sampling` contributes max_tokens, stop and logit_bias."""
        import numpy as np

        from .stops import StopMatcher

        ll = llama_cpp_module()
        if not prompt:
            raise UsageError("empty prompt: give some text as an argument or on stdin")
        n_beams = self.beams
        if ll.llama_n_seq_max(engine.ctx) < 2 * n_beams + 1:
            raise EngineError(f"beam search with {n_beams} beams needs a context made for {2 * n_beams + 1} sequences")
        n_ctx = self.ctx_limit or engine.n_ctx  # the context asked for; the pool is larger, for N answers
        if len(prompt) >= n_ctx:
            raise ContextOverflow(f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}: raise --ctx or pass --truncate")
        stats = Stats(load_s=engine.load_s, prompt_tokens=len(prompt))
        limit = sampling.max_tokens if sampling.max_tokens > 0 else n_ctx
        limit = min(limit, n_ctx - len(prompt))
        check_bias_tokens(sampling.logit_bias, engine.n_vocab)
        mask = None
        if allowed is not None or sampling.logit_bias:
            mask = np.zeros(engine.n_vocab, dtype=np.float32)
            if allowed is not None:
                mask[:] = -np.inf
                mask[list(allowed)] = 0.0
            for tok, bias in sampling.logit_bias.items():
                mask[tok] += bias
        eog = np.zeros(engine.n_vocab, dtype=bool)
        eog[engine.eog_tokens()] = True
        mem, ctx = engine.memory, engine.ctx
        batch = ll.llama_batch_init(max(n_beams, 1), 0, 1)
        t0 = time.perf_counter()
        t_first = None
        finished: list[Hypothesis] = []
        try:
            stats.cached_tokens = engine.prefill(prompt)
            # Sequence 0 holds the prompt; the beams live in sequences 1..2N (two banks).
            for s in range(1, 2 * n_beams + 1):
                ll.llama_memory_seq_rm(mem, s, 0, -1)
            live = [Hypothesis([], 0.0, seq=0)]
            rows = [-1]  # logits row of each live hypothesis
            bank = 1
            for step in range(limit):
                candidates: list[tuple[float, int, int]] = []  # (logprob, parent index, token)
                for b, (hyp, row) in enumerate(zip(live, rows)):
                    logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), shape=(engine.n_vocab,))
                    x = logits + mask if mask is not None else logits.astype(np.float32, copy=True)
                    x -= x.max()
                    logp = x - np.log(np.exp(x).sum())
                    top = np.argpartition(-logp, n_beams)[: n_beams + 1] if n_beams + 1 < len(logp) else np.arange(len(logp))
                    for t in top:
                        if np.isfinite(logp[t]):
                            candidates.append((hyp.logprob + float(logp[t]), b, int(t)))
                if t_first is None:
                    t_first = time.perf_counter()
                    stats.prompt_eval_s = t_first - t0
                candidates.sort(key=lambda c: -c[0])
                children: list[Hypothesis] = []
                for lp, b, t in candidates:
                    parent = live[b]
                    if eog[t]:
                        finished.append(Hypothesis(parent.tokens, lp))
                        continue
                    child = Hypothesis(parent.tokens + [t], lp, parent=b)
                    if sampling.stop:  # the whole text each time: a stop may span the tokens
                        matcher = StopMatcher(sampling.stop)
                        cut = matcher.feed(engine.detokenize(child.tokens))
                        if matcher.stopped is not None:
                            child.text, child.stopped_by = cut, matcher.stopped
                            finished.append(child)
                            continue
                    if len(child.tokens) >= limit:
                        finished.append(child)
                        continue
                    children.append(child)
                    if len(children) == n_beams:
                        break
                if not children or self._done(finished, children, n_beams):
                    break
                # Fork: each child's sequence is a copy of its parent's, then gets its new token.
                other = 1 + n_beams if bank == 1 else 1
                for j, child in enumerate(children):
                    parent = live[child.parent]
                    dst = other + j
                    ll.llama_memory_seq_rm(mem, dst, 0, -1)
                    ll.llama_memory_seq_cp(mem, parent.seq, dst, -1, -1)
                    child.seq = dst
                    batch.token[j], batch.pos[j], batch.n_seq_id[j] = child.tokens[-1], len(prompt) + len(child.tokens) - 1, 1
                    batch.seq_id[j][0], batch.logits[j] = dst, 1
                for hyp in live:
                    if hyp.seq != 0:
                        ll.llama_memory_seq_rm(mem, hyp.seq, 0, -1)
                batch.n_tokens = len(children)
                if ll.llama_decode(ctx, batch) != 0:
                    raise EngineError("llama.cpp decode failed during beam search: try fewer --beams or a smaller --ctx")
                stats.target_steps += 1
                live, rows, bank = children, list(range(len(children))), 2 if bank == 1 else 1
            if not finished:
                finished = live
        except KeyboardInterrupt:
            stats.finish_reason = "interrupted"
            raise
        finally:
            ll.llama_batch_free(batch)
            for s in range(1, 2 * n_beams + 1):
                ll.llama_memory_seq_rm(mem, s, 0, -1)
        best = max(finished, key=lambda h: h.score(self.length_penalty))
        if best.stopped_by is not None:
            stats.finish_reason = "stop"  # its text was cut at the stop
        else:
            best.text = engine.detokenize(best.tokens)
            stats.finish_reason = "length" if len(best.tokens) >= limit else "eos"
        engine.end(stats, t0, t_first, len(best.tokens))
        return best, stats

    def _done(self, finished: list[Hypothesis], live: list[Hypothesis], n_beams: int) -> bool:
        """Hugging Face's default rule: N finished, and the best live beam at its current length
        cannot beat the worst of the N best finished ones."""
        if len(finished) < n_beams:
            return False
        lp = self.length_penalty
        kept = sorted((h.score(lp) for h in finished), reverse=True)[:n_beams]
        return max(h.score(lp) for h in live) <= kept[-1]


def context_options(decoding: DecodeOptions, options: LoadOptions, answer_room: int) -> LoadOptions:
    """The context a strategy needs, from the one plain decoding would get (options.n_ctx: the context
    asked for). Refuses, before any model is loaded, a --batch that cannot hold one step of it."""
    if decoding.draft and decoding.draft_max + 1 > options.n_batch:
        raise UsageError(f"--draft-max {decoding.draft_max} needs --batch of at least {decoding.draft_max + 1}")
    if decoding.beams > options.n_batch:
        raise UsageError(f"--beams {decoding.beams} needs --batch of at least {decoding.beams}")
    if decoding.beams > 1:
        # The prompt in sequence 0, the beams in two banks of N; one KV pool, so a fork shares cells.
        return replace(options, n_ctx=options.n_ctx + decoding.beams * answer_room,
                       n_seq_max=2 * decoding.beams + 1, kv_unified=True)
    if decoding.draft and options.flash_attn is None and options.kv_type == "f16":
        # llama.cpp's CPU flash-attention kernel rounds differently for one query than for several, so
        # with it a verified draft (several queries) can come out a different greedy token than one-
        # token steps. Off (and on a build without llamafile's sgemm: make BACKEND=cpu-exact),
        # speculative output equals plain decoding. --flash-attn still turns it on, and so does a quantized
        # --kv-type, which needs it (it was refused as "drop --no-flash-attn", a flag nobody gave).
        return replace(options, flash_attn=False)
    return options


def attach(engine: Engine, decoding: DecodeOptions, *, ctx_limit: int, source: str = "auto") -> None:
    """Give `engine` the strategy `decoding` asks for, loading the draft model if one is named."""
    draft = None
    if decoding.draft not in (None, "lookup"):
        from . import hub

        draft = Engine(hub.ensure_local(decoding.draft, source=source).path,
                       replace(engine.options, n_seq_max=1, kv_unified=False))
    try:
        engine.strategy = make_strategy(decoding, engine, draft, ctx_limit)
    except Exception:
        if draft is not None:
            draft.close()
        raise


def make_strategy(options: DecodeOptions, engine: Engine, draft_engine: Optional[Engine] = None,
                  ctx_limit: Optional[int] = None):
    """The strategy Engine.generate delegates to, or None for plain decoding."""
    if options.beams > 1:
        return BeamSearch(options.beams, options.length_penalty, ctx_limit)
    if options.draft == "lookup":
        return Speculative(LookupDrafter(), options.draft_max)
    if options.draft:
        if draft_engine is None:
            raise UsageError("--draft MODEL needs the draft model loaded")
        return Speculative(ModelDrafter(draft_engine, engine), options.draft_max)
    return None
