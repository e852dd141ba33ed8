"""Backend sampling: an exact top-k in llama.cpp's graph before the C sampler chain (on by default where
the output layer runs on a GPU). On the CPU build it is forced on here, so that CI exercises the same
llama.cpp code path and checks the one promise it makes: the chain picks exactly the tokens it picks
from the whole vocabulary. Every model here is on the GPU of a GPU build (gpu_layers auto), where the
top-k runs in the device's graph."""

from __future__ import annotations

import pytest
from conftest import CORES

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a small village by the sea,"

# (options, what the prefilter keeps): the default chain, greedy, a ban, min_tokens (end-of-text banned
# until then), a lowering bias, and chains that need the whole vocabulary (no prefilter).
CASES = [
    ({"seed": 7}, 40),
    ({"temperature": 0.0}, 1),
    ({"seed": 3, "top_k": 5, "top_p": 1.0, "min_p": 0.0, "temperature": 1.5}, 5),
    ({"seed": 11, "min_tokens": 24}, "eog"),
    ({"seed": 5, "logit_bias": {13: float("-inf"), 28: -3.0}}, 42),
    ({"seed": 5, "logit_bias": {13: 2.0}}, None),
    ({"seed": 5, "top_k": 0}, None),
    ({"seed": 5, "repeat_penalty": 1.3}, None),
]


@pytest.fixture(scope="module")
def engines(smollm2):
    from localrun.engine import Engine, LoadOptions

    pair = [Engine(smollm2, LoadOptions(n_ctx=256, n_threads=1, gpu_layers="auto", backend_sampling=on)) for on in (False, True)]
    yield pair
    for e in pair:
        e.close()


def _tokens(engine, options: dict, n: int = 32) -> list[int]:
    from localrun.engine import SamplingOptions, generate

    responses = list(generate(engine, engine.tokenize(PROMPT), SamplingOptions(max_tokens=n, **options)))
    assert responses[-1].done and not any(r.done for r in responses[:-1])
    return [t for r in responses for t in r.tokens]


@pytest.mark.parametrize("options,keep", CASES, ids=lambda x: str(x) if isinstance(x, dict) else None)
def test_the_chain_picks_the_same_tokens_from_k_candidates(engines, options, keep):
    from localrun.engine.sampling import Sampler, SamplingOptions

    cpu, backend = engines
    sampler = Sampler(backend, SamplingOptions(**options))
    try:
        expected_keep = 40 + len(backend.eog_tokens()) if keep == "eog" else keep
        assert sampler.prefilter == expected_keep
    finally:
        sampler.close()
    assert _tokens(backend, options) == _tokens(cpu, options)


def test_the_top_k_runs_in_the_graph_stays_between_generations_and_yields_to_raw_logits(engines):
    """While generating, llama.cpp hands the chain PREFILTER_K candidates, not the vocabulary; the top-k
    stays attached from one generation to the next (attaching costs a graph reservation), widens for a
    chain that needs more, and gives way to raw logits for a chain (or a caller) that needs them all."""
    from localrun.engine import PREFILTER_K, SamplingOptions, generate, llama_cpp_module
    from localrun.engine.loop import evaluate

    ll = llama_cpp_module()
    _, engine = engines
    prompt = engine.tokenize(PROMPT)

    def candidates_while_generating(**options) -> set[int]:
        seen = set()
        for _ in generate(engine, prompt, SamplingOptions(max_tokens=4, **options)):
            seen.add(ll.llama_get_sampled_candidates_count_ith(engine.ctx, -1))
        return seen

    assert candidates_while_generating(seed=1) == {PREFILTER_K}
    chain = engine._prefilters[0]
    assert candidates_while_generating(temperature=0.0) == {PREFILTER_K} and engine._prefilters[0] is chain
    assert candidates_while_generating(seed=1, top_k=300) == {300}
    assert candidates_while_generating(seed=1, top_k=0) == {0}  # the whole vocabulary: raw logits
    assert ll.llama_get_logits_ith(engine.ctx, -1)
    assert candidates_while_generating(seed=1) == {PREFILTER_K}  # attached again

    # Stopped early (a closed generator, as a stop sequence or a closed pipe does), then a caller that
    # reads logits itself (the server's scheduler, speculative decoding, beam search).
    events = generate(engine, prompt, SamplingOptions(seed=1, max_tokens=20))
    next(events)
    events.close()
    engine.use_raw_logits()
    evaluate(engine, engine.tokenize(PROMPT + " there"))
    assert ll.llama_get_sampled_candidates_count_ith(engine.ctx, -1) == 0
    assert ll.llama_get_logits_ith(engine.ctx, -1)  # the whole vocabulary's logits, on the host again


def test_a_device_that_cannot_run_the_top_k_falls_back_to_the_cpu_chain(smollm2, engines, monkeypatch):
    """Fault injection: llama.cpp reports no candidates (a device without the top-k op leaves the chain the
    bare vocabulary). generate then samples from raw logits, the last token evaluated again, and stops
    attaching the prefilter on that engine."""
    from localrun.engine import Engine, LoadOptions, llama_cpp_module

    cpu, _ = engines
    engine = Engine(smollm2, LoadOptions(n_ctx=256, n_threads=1, gpu_layers="auto", backend_sampling=True))
    try:
        monkeypatch.setattr(llama_cpp_module(), "llama_get_sampled_candidates_ith", lambda ctx, i: None)
        assert _tokens(engine, {"seed": 2}) == _tokens(cpu, {"seed": 2})
        assert engine.backend_sampling is False and not engine._prefilters
        assert _tokens(engine, {"temperature": 0.0}) == _tokens(cpu, {"temperature": 0.0})
    finally:
        engine.close()


def test_off_on_a_cpu_build_unless_asked(smollm2, monkeypatch):
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.llama import supports_gpu_offload

    if supports_gpu_offload():  # a GPU (llama.cpp's own llama_supports_gpu_offload also says yes for any RPC build)
        pytest.skip("a GPU build: backend sampling is on by default there")
    for env, expected in (("auto", False), ("on", True), ("off", False)):
        monkeypatch.setenv("LOCALRUN_BACKEND_SAMPLING", env)
        engine = Engine(smollm2, LoadOptions(n_ctx=64, n_threads=1))
        try:
            assert engine.backend_sampling is expected
        finally:
            engine.close()


def test_gemma_large_vocabulary_same_tokens(gemma):
    """gemma's 262k-entry vocabulary (where the prefilter saves the most) and sliding-window attention."""
    from localrun.engine import Engine, LoadOptions

    pair = [Engine(gemma, LoadOptions(n_ctx=256, n_threads=min(2, CORES), gpu_layers="auto", backend_sampling=on)) for on in (False, True)]
    try:
        for options in ({"seed": 9}, {"temperature": 0.0}, {"seed": 4, "min_tokens": 16}):
            cpu, backend = (_tokens(e, options, n=24) for e in pair)
            assert backend == cpu, options
    finally:
        for e in pair:
            e.close()


def _slots_tokens(smollm2, backend: bool, requests: list[dict]) -> tuple[list[list[int]], list[bool]]:
    """The server's scheduler with one slot per request, all submitted at once (they decode in one batch):
    each request's tokens, and whether its slot carried a backend top-k when it was assigned."""
    import queue

    from localrun.engine import Engine, LoadOptions
    from localrun.engine.sampling import merge_options
    from localrun.runtime.serving.scheduler import Job, Scheduler

    n = len(requests)
    engine = Engine(smollm2, LoadOptions(n_ctx=256 * n, n_threads=1, n_seq_max=n, n_outputs=n, gpu_layers="auto",
                                              backend_sampling=backend))
    scheduler = Scheduler(engine, parallel=n, slot_ctx=256, max_waiting=n, prefill_chunk=64,
                          deliver=lambda pairs: [job.sink.put_nowait(r) for job, r in pairs])
    try:
        jobs = []
        for i, options in enumerate(requests):
            options = dict(options)
            logprobs = options.pop("logprobs", None)
            job = Job.create(engine, engine.tokenize(f"{PROMPT} Chapter {i}:"), merge_options(options), max_tokens=24,
                             n_ctx=256, top_logprobs=logprobs)
            job.sink = queue.Queue()
            jobs.append(job)
        scheduler.start()
        prefiltered = []
        for job in jobs:
            assert scheduler.submit(job)
        out = []
        for job in jobs:
            tokens = []
            while True:
                response = job.sink.get(timeout=60)
                tokens += response.tokens
                if response.done:
                    break
            out.append(tokens)
            prefiltered.append(job.task.prefiltered)
        return out, prefiltered
    finally:
        scheduler.stop()
        engine.close()


def test_each_server_slot_samples_from_its_own_top_k(smollm2):
    """The server's slots (one KV stream and one sampler chain each, decoded in one batch): every slot
    carries a backend top-k from the start, a request whose chain needs the whole vocabulary (penalties)
    or logprobs takes it off its own slot only, and every request gets the tokens it gets from raw logits."""
    requests = [{"seed": 7}, {"temperature": 0.0}, {"seed": 5, "repeat_penalty": 1.3}, {"seed": 9, "logprobs": 2},
                {"seed": 3, "top_k": 5, "temperature": 1.5}]
    plain, raw = _slots_tokens(smollm2, False, requests)
    backend, prefiltered = _slots_tokens(smollm2, True, requests)
    assert raw == [False] * len(requests)
    assert prefiltered == [True, True, False, False, True]
    assert backend == plain
    assert all(len(tokens) == 24 for tokens in plain) and len({tuple(t) for t in plain}) == len(plain)
