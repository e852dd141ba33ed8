"""LoRA scales per request on a resident model (runtime.lora, the scheduler): what the HTTP layer's per-request `lora`
and /lora-adapters call. Requests under other scales are answered together without a reload, each as a model loaded
at its scales answers alone; a slot's KV made under some scales is never reused under others; bad scales are
refused naming the field. On SmolLM2 with an adapter written here (tests/loramodel.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from loramodel import write_lora

from localrun.engine import merge_options
from localrun.runtime import lora as runtime_lora
from localrun.runtime.generate import generate
from localrun.runtime.loader import load
from localrun.runtime.options import LoadSpec
from localrun.runtime.request import Request
from localrun.runtime.serving.runner import start_scheduler

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapter(smollm2, tmp_path_factory) -> Path:
    return write_lora(smollm2, tmp_path_factory.mktemp("lora") / "lora.gguf")


@pytest.fixture(scope="module")
def served(smollm2, adapter):
    """SmolLM2 loaded with the adapter at scale 1, on a scheduler of two slots (as the pool starts one)."""
    spec = LoadSpec(ctx=512, parallel=2, threads=1, kind="batch", lora=((str(adapter), 1.0),))
    loaded = load(str(smollm2), spec)
    scheduler = start_scheduler(loaded, 512, spec, max_waiting=8, prefill_chunk=64)
    yield loaded, scheduler
    scheduler.stop()
    loaded.close()


def ask(loaded, place, lora=None, prompt=PROMPT, use_cache=True) -> tuple[list[int], int]:
    request = Request(tokens=loaded.engine.tokenize(prompt), sampling=merge_options({}, {"temperature": 0, "max_tokens": 10}),
                      use_cache=use_cache, lora=lora)
    tokens, final = [], None
    for response in generate(loaded, request, place=place):
        tokens += response.tokens
        final = response if response.done else final
    return tokens, final.stats.cached_tokens


def in_process(model: Path, lora: tuple) -> list[int]:
    loaded = load(str(model), LoadSpec(ctx=512, threads=1, kind="run", lora=lora))
    try:
        return ask(loaded, None, use_cache=False)[0]
    finally:
        loaded.close()


def test_requests_under_other_scales_are_answered_together_as_each_alone(smollm2, adapter, served, monkeypatch):
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", "0")  # (the slots' own KV only: no disk cache here)
    loaded, scheduler = served
    engine = loaded.engine
    base, adapted = in_process(smollm2, ()), in_process(smollm2, ((str(adapter), 1.0),))
    half = in_process(smollm2, ((str(adapter), 0.5),))
    assert len({tuple(base), tuple(adapted), tuple(half)}) == 3
    asked = [(0.0,), (1.0,), (0.5,), None, (0.0,), (1.0,)]
    answers: dict[int, list[int]] = {}

    def one(i: int) -> None:
        answers[i] = ask(loaded, scheduler, asked[i], use_cache=False)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asked))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = {(0.0,): base, (1.0,): adapted, (0.5,): half, None: adapted}  # None: the load's own scale, 1
    assert [answers[i] for i in range(len(asked))] == [expected[s] for s in asked]
    assert loaded.engine is engine and engine.options.lora == ((str(adapter), 1.0),)  # no reload


def test_a_slots_kv_is_not_reused_under_other_scales(served, monkeypatch):
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", "0")
    loaded, scheduler = served
    prompt = "Tell me about the history of Paris, the capital of France, in a few words:"
    first = ask(loaded, scheduler, (0.0,), prompt)
    again = ask(loaded, scheduler, (0.0,), prompt)
    assert again[1] > 10 and again[0] == first[0]  # its own KV, kept by a slot
    other = ask(loaded, scheduler, (1.0,), prompt)
    assert other[1] == 0  # the same prompt under another scale: evaluated afresh (neither slot's KV is its)
    assert ask(loaded, scheduler, (1.0,), prompt)[1] > 10  # and now it has its own
    assert ask(loaded, scheduler, (0.0,), prompt)[0] == first[0]  # (from its own KV, kept or evaluated again)
    for seat_key, tokens in zip(loaded.engine.kv.made_with, loaded.engine.kv.tokens):  # what each slot holds is marked
        assert not tokens or seat_key in ((), ((0, 1.0),))


def test_kv_under_other_scales_is_dropped_in_this_process_too(smollm2, adapter, monkeypatch):
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", "0")
    loaded = load(str(smollm2), LoadSpec(ctx=512, threads=1, kind="run", lora=((str(adapter), 1.0),)))
    try:
        prompt = "Tell me about the history of Paris, the capital of France, in a few words:"
        assert ask(loaded, None, None, prompt)[1] == 0
        assert ask(loaded, None, None, prompt)[1] > 10
        assert ask(loaded, None, (0.0,), prompt)[1] == 0
        assert ask(loaded, None, (1.0,), prompt)[1] == 0
    finally:
        loaded.close()


def test_request_scales_as_llama_server_takes_them_and_bad_ones_name_the_field(served, smollm2):
    loaded, _ = served
    assert runtime_lora.request_scales(loaded, [{"id": 0, "scale": 0.25}]) == (0.25,)
    assert runtime_lora.request_scales(loaded, []) == (1.0,)  # nothing asked: the model's own
    assert runtime_lora.request_scales(loaded, [{"id": 0}]) == (0.0,)  # (llama-server reads a missing scale as 0)
    for bad, words in (([{"id": 1, "scale": 1}], "no adapter has id 1: this model has 1 LoRA adapter"),
                       ([{"id": "0", "scale": 1}], "no adapter has id '0'"),
                       ([{"id": 0, "scale": "big"}], "the scale 'big' is not a finite number"),
                       ([{"id": 0, "scale": float("nan")}], "not a finite number"),
                       ({"id": 0, "scale": 1}, "give a list"), ([3], 'each entry is {"id": N, "scale": X}')):
        with pytest.raises(runtime_lora.LoraRequestError) as caught:
            runtime_lora.request_scales(loaded, bad)
        assert caught.value.setting == "lora" and words in caught.value.message, caught.value.message
    with pytest.raises(runtime_lora.LoraRequestError):
        generate(loaded, Request(tokens=[1, 2], lora=(1.0, 0.5))).__next__()  # one scale per adapter
    plain = load(str(smollm2), LoadSpec(ctx=64, threads=1, kind="run"))
    try:
        with pytest.raises(runtime_lora.LoraRequestError) as caught:
            runtime_lora.request_scales(plain, [{"id": 0, "scale": 1}])
        assert "loaded without LoRA adapters" in caught.value.message
        assert runtime_lora.listed(plain) == []
    finally:
        plain.close()


def test_default_scales_change_while_the_model_stays_loaded(served, adapter, monkeypatch):
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", "0")
    loaded, scheduler = served
    adapted = ask(loaded, scheduler, (1.0,), use_cache=False)[0]
    base = ask(loaded, scheduler, (0.0,), use_cache=False)[0]
    try:
        assert runtime_lora.set_default_scales(loaded, [{"id": 0, "scale": 0}]) == [
            {"id": 0, "path": str(adapter), "scale": 0.0, "task_name": "", "prompt_prefix": ""}]
        assert ask(loaded, scheduler, None, use_cache=False)[0] == base  # a request that names none: the new default
        assert ask(loaded, scheduler, (1.0,), use_cache=False)[0] == adapted  # one that names its own: that
    finally:
        runtime_lora.set_default_scales(loaded, [{"id": 0, "scale": 1.0}])
    assert [(a["id"], a["scale"]) for a in runtime_lora.listed(loaded)] == [(0, 1.0)]


def test_a_model_loaded_with_other_adapters_is_another_load(smollm2, adapter, tmp_path):
    """As other load options: the pool reloads the model for a request whose spec names other adapters or scales."""
    from localrun.runtime.serving.pool import ModelPool

    pool = ModelPool(make_scheduler=lambda loaded, slot_ctx, spec: start_scheduler(loaded, slot_ctx, spec, max_waiting=4, prefill_chunk=64),
                     load=lambda ref, spec: load(ref, spec))
    try:
        plain = LoadSpec(ctx=256, threads=1, parallel=1)
        first, _ = pool.acquire(str(smollm2), plain)
        pool.release(first)
        tuned, _ = pool.acquire(str(smollm2), LoadSpec(ctx=256, threads=1, parallel=1, lora=((str(adapter), 1.0),)))
        pool.release(tuned)
        assert tuned is not first and tuned.engine.options.lora == ((str(adapter), 1.0),) and first.engine.options.lora == ()
        same, _ = pool.acquire(str(smollm2), LoadSpec(ctx=256, threads=1, parallel=1, lora=[[str(adapter), 1]]))  # (as JSON sends it)
        pool.release(same)
        assert same is tuned
    finally:
        pool.close()
