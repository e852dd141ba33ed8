"""Memory figures count what llama.cpp really allocates: the mapped weights, the repacked copy its CPU backend
makes of Q4_0/Q4_K/IQ4_NL/MXFP4 matrices (CPU_REPACK), KV and compute. Checked against llama.cpp's own buffer
log and the process's RSS growth with the real SmolLM2 (Q4_1: nothing repacked) and gemma-3 (Q4_K: repacked)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import last_json

MIB = 1 << 20

# Loads the model in a fresh process and prints llama.cpp's buffers, the estimate and the RSS growth, as JSON.
PROBE = r"""
import json, sys, psutil
from localrun.engine.llama import llama_cpp_module
llama_cpp_module()
from localrun.runtime.reports.report import measured_allocation
from localrun.engine.footprint import footprint, repacks_here
from localrun.engine.gguf_info import read_info
path, n_ctx = sys.argv[1], int(sys.argv[2])
info = read_info(path)
estimate = footprint(info, n_ctx, "f16", repack=repacks_here())
before = psutil.Process().memory_info().rss
from localrun.engine import Engine, LoadOptions
engine = Engine(path, LoadOptions(n_ctx=n_ctx, n_outputs=1))
grown = psutil.Process().memory_info().rss - before
engine.close()
print(json.dumps({"estimate": estimate, "allocated": measured_allocation(path, n_ctx, "f16"), "rss_growth": grown}))
"""


def probe(path, n_ctx: int) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, str(path), str(n_ctx)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return last_json(r.stdout)


@pytest.fixture(scope="module")
def cpu_only():
    from localrun.engine.footprint import cpu_features, repacks_here

    if not repacks_here() or "AVX2" not in cpu_features():
        pytest.skip("llama.cpp repacks Q4_K on an x86 CPU with AVX2 when the CPU is the only device")


def test_the_repacked_copy_is_counted_as_llama_cpp_allocates_it(gemma, cpu_only):
    d = probe(gemma, 2048)
    est, got = d["estimate"], d["allocated"]
    assert got["repacked_bytes"] > 10 * MIB  # gemma-3-270m Q4_K_M: 12.66 MiB of Q4_K matrices
    # llama.cpp logs MiB with two decimals
    assert abs(est["repacked_bytes"] - got["repacked_bytes"]) <= 0.01 * MIB
    assert abs(est["weights_bytes"] - got["weights_bytes"]) <= 0.01 * MIB
    assert est["kv_bytes"] == got["kv_bytes"]
    assert abs(est["compute_bytes"] - got["compute_bytes"]) <= 0.15 * got["compute_bytes"]
    assert abs(est["total_bytes"] - got["total_bytes"]) <= 0.03 * got["total_bytes"]
    # What the process holds grows by the whole of it, the repacked copy included (the old figure, weights + KV,
    # fell short of it).
    assert 0.9 * est["total_bytes"] <= d["rss_growth"] <= 1.15 * est["total_bytes"], d
    assert d["rss_growth"] > est["weights_bytes"] + est["kv_bytes"] + est["repacked_bytes"] * 0.9


def test_a_q4_1_model_has_no_repacked_copy(smollm2, cpu_only):
    d = probe(smollm2, 2048)
    assert d["estimate"]["repacked_bytes"] == d["allocated"]["repacked_bytes"] == 0
    assert abs(d["estimate"]["total_bytes"] - d["allocated"]["total_bytes"]) <= 0.05 * d["allocated"]["total_bytes"]
    assert 0.9 * d["estimate"]["total_bytes"] <= d["rss_growth"] <= 1.15 * d["estimate"]["total_bytes"], d


def test_repack_rules_follow_ggml_cpu(gemma, smollm2):
    """Which tensor types are repacked depends on the CPU's kernels (ggml-cpu/repack.cpp)."""
    from localrun.engine.footprint import repacked_bytes

    x86 = frozenset({"REPACK", "AVX2"})
    assert repacked_bytes(gemma, x86) > 0 and repacked_bytes(smollm2, x86) == 0  # Q4_K yes, Q4_1 never
    assert repacked_bytes(gemma, frozenset({"AVX2"})) == 0  # a build without the repacking buffer
    assert repacked_bytes(gemma, frozenset({"REPACK", "SSE3"})) == 0  # no kernel without AVX2
    # NEON with int8 matmul also has Q6_K and Q8_0 kernels: more of gemma's matrices are repacked there
    assert repacked_bytes(gemma, frozenset({"REPACK", "NEON", "MATMUL_INT8"})) > repacked_bytes(gemma, x86)


def test_show_explains_its_figures(gemma, cli, cpu_only):
    r = cli("show", str(gemma), "--ctx", "2048")
    assert r.returncode == 0, r.stderr
    rows = dict(line.split(":", 1) for line in r.stdout.splitlines())
    for row in ("memory at ctx 2048 (f16)", "llama.cpp allocated"):
        assert "weights " in rows[row] and " + repacked copy " in rows[row] and " + KV " in rows[row] and " + compute " in rows[row]


def test_ps_counts_the_repacked_copy(resident, gemma, cli, cpu_only):
    import psutil

    r = cli("run", str(gemma), "-n", "4", "-t", "0", "--ctx", "2048", "Hello")
    assert r.returncode == 0, r.stderr
    server = resident()
    models = json.loads(cli("ps", "--json").stdout)
    assert len(models) == 1
    m = models[0]
    parts = m["memory"]
    assert parts["repacked_bytes"] > 10 * MIB
    assert m["size"] == parts["total_bytes"] == sum(v for k, v in parts.items() if k != "total_bytes")
    held = psutil.Process(server).memory_info().rss
    assert m["size"] <= held  # the server holds at least what ps says (and Python besides)
    table = cli("ps")
    assert "repacked copy" in table.stdout and "KV" in table.stdout
    # `show` says it beforehand: the background server's load, its slots each that context (it gave only one
    # sequence's, a quarter of the KV ps then showed: found by a helper)
    shown = json.loads(cli("show", str(gemma), "--ctx", "2048", "--no-measure", "--json").stdout)
    assert shown["memory_served"]["slots"] == 4 and shown["memory_served"]["total_bytes"] == m["size"], (shown, m)
    assert "served, 4 slots" in cli("show", str(gemma), "--ctx", "2048", "--no-measure").stdout


def test_the_pools_fit_decision_counts_the_repacked_copy(gemma, cpu_only):
    """A budget that holds weights, KV and logits (the old figure) but not the repacked copy refuses the model."""
    from types import SimpleNamespace

    from localrun.runtime.options import LoadSpec
    from localrun.runtime.serving.pool import ModelPool, ModelTooBig, estimate_breakdown

    spec = LoadSpec(ctx=1024, parallel=1, gpu_layers="0", kind="run")
    parts = estimate_breakdown(gemma, spec)
    assert parts["repacked_bytes"] > 10 * MIB
    loads = []

    def load(ref, spec):
        loads.append(ref)
        engine = SimpleNamespace(n_ctx=1024, info=None, gpu_fraction=lambda: 0.0, close=lambda: None)
        return SimpleNamespace(engine=engine, name=ref, ref=ref, close=lambda: None)

    scheduler = lambda loaded, ctx, spec: SimpleNamespace(slots=[None], fatal=None, idle_slots=lambda: 1,  # noqa: E731
                                                          request_stop=lambda: None, stop=lambda: None)
    pool = ModelPool(make_scheduler=scheduler, load=load, memory_budget=parts["total_bytes"] - parts["repacked_bytes"] // 2,
                     free_vram=lambda: None, on_notice=lambda _: None)
    try:
        with pytest.raises(ModelTooBig):
            pool.acquire(str(gemma), spec)
        assert loads == []
    finally:
        pool.close()


# Loads the model and prints how much of its mapped file the process holds, and what the engine gave back.
MAPPED_PROBE = r"""
import json, os, sys
from localrun.engine.llama import llama_cpp_module
llama_cpp_module()
from localrun.engine import Engine, LoadOptions
from localrun.engine.footprint import released_bytes
path = os.path.realpath(sys.argv[1])
engine = Engine(path, LoadOptions(n_ctx=256, n_outputs=1))
held, name = 0, None
for line in open("/proc/self/smaps"):
    first = line.split()
    if "-" in first[0] and len(first) >= 6:
        name = line.split(None, 5)[5].strip()
    elif first[0] == "Rss:" and name == path:
        held += int(first[1]) * 1024
print(json.dumps({"held": held, "size": os.path.getsize(path), "released": engine.released_bytes,
                  "estimate": released_bytes(path)}))
"""


def test_the_file_pages_of_repacked_weights_are_given_back(gemma, cpu_only):
    """llama.cpp reads a repacked weight's pages of the mapped file once, to make its copy, and left them mapped:
    the process held those weights twice (Qwen2.5-Coder-1.5B Q4_K_M: 597 MiB, and its server's RSS exceeded
    llama-server's). The engine gives them back, whole pages, as footprint() counts them."""
    r = subprocess.run([sys.executable, "-c", MAPPED_PROBE, str(gemma)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = last_json(r.stdout)
    assert d["released"] == d["estimate"] > 10 * MIB  # gemma-3-270m Q4_K_M: 12.66 MiB of Q4_K matrices
    assert d["held"] <= d["size"] - d["released"], d
