"""Greedy sampling takes the argmax of the logits row with numpy instead of llama.cpp's greedy chain (which
first copies the whole vocabulary into candidates). It must pick exactly the chain's token: the first of
equal maxima, and never an end-of-generation token while min_tokens bans them. Checked against llama.cpp's
own chain on the same logits rows of both real models, including rows rewritten to hold ties and a banned
maximum."""

from __future__ import annotations

import pytest
from conftest import CORES

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a small village by the sea,"


def _chain_token(sampler, engine, ban: bool) -> int:
    """What llama.cpp's own C chain picks from the last logits row (the fast path switched off)."""
    fast, sampler._argmax = sampler._argmax, False
    try:
        return sampler.sample(engine.ctx, 0 if ban else 10**6)
    finally:
        sampler._argmax = fast


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_numpy_argmax_picks_what_the_greedy_chain_picks(which, request):
    import numpy as np

    from localrun.engine import Engine, LoadOptions
    from localrun.engine.loop import evaluate
    from localrun.engine.sampling import Sampler, SamplingOptions

    engine = Engine(request.getfixturevalue(which), LoadOptions(n_ctx=256, n_threads=min(2, CORES)))
    sampler = Sampler(engine, SamplingOptions(temperature=0.0, max_tokens=64, min_tokens=8))
    taken = []
    greedy = sampler._greedy
    sampler._greedy = lambda *a: taken.append(1) or greedy(*a)  # counts the rows the fast path picked from
    try:
        assert sampler._argmax and sampler._banned == frozenset(engine.eog_tokens())
        tokens = engine.tokenize(PROMPT)
        evaluate(engine, tokens)
        eog = engine.eog_tokens()[0]
        for step in range(12):
            row = engine.logits(-1)
            if step == 4:  # a tie for the highest logit: the lower token id wins, as in llama.cpp's loop
                top = int(row.argmax())
                row[top + 1] = row[top]
            if step in (6, 7):  # an end-of-generation token on top: banned under min_tokens, picked after
                row[eog] = row.max() + 5.0
            for ban in (True, False):
                assert sampler.sample(engine.ctx, 0 if ban else 10**6) == _chain_token(sampler, engine, ban), (step, ban)
            if step in (6, 7):
                assert sampler.sample(engine.ctx, 10**6) == eog
                assert sampler.sample(engine.ctx, 0) != eog
            tok = sampler.sample(engine.ctx, 0)
            tokens.append(tok)
            evaluate(engine, tokens)
        assert len(taken) == 12 * 3 + 2 * 2, "the numpy path was not taken"
        assert np.isfinite(engine.logits(-1)).all()
    finally:
        sampler.close()
        engine.close()


def test_a_biased_or_penalised_greedy_chain_stays_in_llama_cpp(smollm2):
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.sampling import Sampler, SamplingOptions

    engine = Engine(smollm2, LoadOptions(n_ctx=128, n_threads=1))
    try:
        for options in ({"logit_bias": {13: -2.0}}, {"repeat_penalty": 1.3}, {"grammar": 'root ::= "a"'}):
            sampler = Sampler(engine, SamplingOptions(temperature=0.0, **options))
            assert not sampler._argmax, options
            sampler.close()
    finally:
        engine.close()


def test_warm_up_leaves_an_empty_cache_and_the_same_answers(smollm2):
    """`serve` warms each model's context at load (one decode on the scheduler's thread), as llama-server
    does: nothing of it may stay in the cache or change what the first request gets."""
    from localrun.engine import Engine, LoadOptions, SamplingOptions, generate

    def answer(engine) -> list[int]:
        return [t for r in generate(engine, engine.tokenize("The capital of France is"),
                                    SamplingOptions(temperature=0.0, max_tokens=12)) for t in r.tokens]

    cold, warm = (Engine(smollm2, LoadOptions(n_ctx=512, n_seq_max=4, n_threads=min(2, CORES))) for _ in range(2))
    try:
        warm.warm_up()
        assert warm.kv.held() == 0 and warm._ll.llama_memory_seq_pos_max(warm.kv.memory, 0) == -1
        assert answer(warm) == answer(cold)
    finally:
        cold.close()
        warm.close()
