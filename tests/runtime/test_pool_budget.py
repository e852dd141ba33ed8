"""The resident pool's memory budgets, RAM and GPU, with the real SmolLM2 and Gemma files (their estimates
read from the GGUF) but no llama.cpp load: a model's layers on a GPU count against free GPU memory (this
machine has none, so the GPU's free bytes are given), the rest against RAM; the least recently used idle
model makes room in whichever does not fit; a model too big for the GPU even alone is refused with both
numbers."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from conftest import wait_until
from localrun.cli.failures import message_for
from localrun.runtime.options import LoadSpec
from localrun.runtime.serving.pool import ModelPool, ModelTooBig, PoolBusy, _gib, estimate_bytes, gpu_share

GIB = 1 << 30


class FakeRunner:
    def __init__(self):
        self.slots, self.fatal, self.closed = [None], None, False

    def idle_slots(self):
        return 1

    def request_stop(self):
        pass

    def stop(self):
        self.closed = True


def fake_load(ref, spec):
    from localrun.engine.gguf_info import read_info

    info = read_info(ref)
    engine = SimpleNamespace(n_ctx=1024, info=info, gpu_fraction=lambda: 1.0, close=lambda: None)
    return SimpleNamespace(engine=engine, name=ref, ref=ref, close=lambda: None)


def pool(gpu_total, ram=64 * GIB):
    """A pool whose GPU has `gpu_total` bytes (None: no GPU), of which the loaded models' layers take theirs."""
    notices = []
    p = ModelPool(make_scheduler=lambda loaded, ctx, spec: FakeRunner(), load=fake_load, memory_budget=ram,
                  free_vram=lambda: None if gpu_total is None else gpu_total - sum(r.vram for r in p.residents),
                  on_notice=notices.append)
    p.notices = notices
    return p


def test_gpu_share_follows_gpu_layers(smollm2):
    assert gpu_share(smollm2, "auto", True) == 1.0 and gpu_share(smollm2, "auto", False) == 0.0
    assert gpu_share(smollm2, "0", True) == 0.0 and gpu_share(smollm2, "-1", True) == 1.0
    assert gpu_share(smollm2, "15", True) == pytest.approx(15 / 31)  # 30 layers and the output layer


def test_models_take_turns_on_a_small_gpu_and_a_too_big_one_is_refused(smollm2, gemma):
    spec = LoadSpec(ctx=1024, parallel=1, gpu_layers="auto", kind="run")
    small, big = estimate_bytes(smollm2, spec), estimate_bytes(gemma, spec)
    p = pool(gpu_total=big + small // 2)  # room on the GPU for one of them at a time, RAM for both
    try:
        a, _ = p.acquire(str(smollm2), spec)
        assert a.vram == a.estimate  # all layers on the GPU
        p.release(a)
        b, _ = p.acquire(str(gemma), spec)  # does not fit beside it on the GPU: the idle one goes
        assert [r.name for r in p.residents] == [str(gemma)] and any("unloading" in n for n in p.notices)
        c, _ = p.acquire(str(smollm2), LoadSpec(ctx=1024, parallel=1, gpu_layers="0", kind="run"))  # on the CPU: fits beside
        assert c.vram == 0 and len(p.residents) == 2
        p.release(c)
        # Back on the GPU, where the one there is busy: the load waits for it to finish (as Ollama queues it),
        # new requests no longer go to it, and it is unloaded when its last request ends.
        got = []
        waiting = threading.Thread(target=lambda: got.append(p.acquire(str(smollm2), spec)))
        waiting.start()
        wait_until(lambda: any(f"waiting for {gemma}" in n for n in p.notices), what="the load to wait")
        assert waiting.is_alive() and b.yielding and not b.retiring and p._find(str(gemma), spec) is None
        p.release(b)
        waiting.join(timeout=30)
        (d, loaded), = got
        assert loaded and d.vram == d.estimate and str(gemma) not in [r.name for r in p.residents]
        p.release(d)
        p.room_wait = 0.2  # up to a point: then 503 (PoolBusy), and the busy one stays
        e, _ = p.acquire(str(gemma), spec)
        with pytest.raises(PoolBusy, match="GPU memory"):
            p.acquire(str(smollm2), spec)
        assert not e.yielding and p._find(str(gemma), spec) is e
        p.release(e)
        # A stop (or rm) while a load waits for its room keeps its meaning when the wait ends; shutting down ends
        # the wait at once (nothing loads for a server that is ending)
        p.room_wait = 60.0
        failed = []
        waiting = threading.Thread(target=lambda: failed.append(pytest.raises(PoolBusy, p.acquire, str(smollm2), spec)))
        waiting.start()
        wait_until(lambda: sum(f"waiting for {gemma}" in n for n in p.notices) == 3, what="this load's own wait")
        p.stop(str(gemma))
        p.request_stop()
        waiting.join(timeout=30)
        assert not waiting.is_alive() and "shutting down" in str(failed[0].value)
        assert e.retiring and not e.yielding and str(smollm2) not in [r.name for r in p.residents]
        p.release(e)
    finally:
        p.close()
    tiny = pool(gpu_total=small // 3)
    try:
        with pytest.raises(ModelTooBig) as refused:
            tiny.acquire(str(gemma), spec)
        message = refused.value.message
        assert f"on the GPU need about {_gib(big)}" in message and f"has {_gib(small // 3)} free" in message  # both numbers
        assert "(gpu_layers)" in message  # the setting, named by the edge: the command line's flag
        assert "offload fewer layers (--gpu-layers)" in message_for(refused.value)[0]
        half, _ = tiny.acquire(str(smollm2), LoadSpec(ctx=1024, parallel=1, gpu_layers="8", kind="run"))  # fewer layers fit
        assert 0 < half.vram <= small // 3
        tiny.release(half)
    finally:
        tiny.close()


def test_without_a_gpu_only_ram_counts(smollm2, gemma):
    spec = LoadSpec(ctx=1024, parallel=1, gpu_layers="auto", kind="run")
    p = pool(gpu_total=None, ram=estimate_bytes(gemma, spec) + estimate_bytes(smollm2, spec) // 2)
    try:
        a, _ = p.acquire(str(smollm2), spec)
        assert a.vram == 0
        p.release(a)
        b, _ = p.acquire(str(gemma), spec)
        assert [r.name for r in p.residents] == [str(gemma)]
        p.release(b)
    finally:
        p.close()
