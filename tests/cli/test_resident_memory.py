"""What the background server holds for a model: its run and chat slots share one KV pool of the model's context
(llama.cpp's unified KV, as llama-server keeps its slots by default), so a first short run does not hold four
contexts' worth of KV (the default took 5.8 GB for a one-line answer of Qwen2.5-Coder-1.5B: 32768 tokens for each
of four slots), and one long prompt still gets the whole context. The installed command, the real server."""

from __future__ import annotations

import json

import pytest

from conftest import last_json, run_cli

pytestmark = pytest.mark.slow

MIB = 1 << 20


def _anon_rss(pid: int) -> int:
    """The server's anonymous memory resident now (the KV cache, the repacked weights, Python), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


def test_the_slots_share_one_context(resident, smollm2, tiny_smollm2):
    from localrun.engine.gguf_info import kv_cache_bytes, read_info

    info = read_info(smollm2)
    ctx = info.context_length  # SmolLM2: 8192, its trained length
    one = kv_cache_bytes(info, ctx)
    r = run_cli("run", str(smollm2), "-t", "0", "-n", "4", "--threads", "1", "--ctx", str(ctx), "Hi")
    assert r.returncode == 0, r.stderr
    (model,) = json.loads(run_cli("ps", "--json").stdout)
    assert model["context_length"] == ctx and model["slots"] == 4
    assert model["memory"]["kv_bytes"] == one  # one pool for the four slots (it was four contexts' KV)
    # What the server really holds: one KV pool besides Python and the weights (it held four: 755 MB of KV here).
    assert _anon_rss(resident()) < 2 * one + 300 * MIB, (_anon_rss(resident()), one)

    # A prompt longer than a quarter of the context (what a slot had, were the pool split) is answered whole.
    # On the tiny model (tests/tinymodel.py: SmolLM2's tokenizer and 8192-token trained context on two layers),
    # loaded beside it the same way: its slots share one pool as SmolLM2's do, and its 5,000-token prompt is
    # evaluated in seconds where SmolLM2's 30 layers took most of this test's time.
    assert read_info(tiny_smollm2).context_length == ctx
    long = run_cli("run", str(tiny_smollm2), "-t", "0", "-n", "4", "--threads", "1", "--ctx", str(ctx), "--json",
                   "Summarise: " + "the cat sat on the mat and looked at the dog. " * 450)
    assert long.returncode == 0, long.stderr
    done = last_json(long.stdout)
    assert done["stats"]["prompt_tokens"] > ctx // 2 and len(done["tokens"]) == 4
    tiny = {m["name"]: m for m in json.loads(run_cli("ps", "--json").stdout)}[tiny_smollm2.name]
    assert tiny["context_length"] == ctx and tiny["slots"] == 4
    assert tiny["memory"]["kv_bytes"] == kv_cache_bytes(read_info(tiny_smollm2), ctx)  # one pool for its four slots too
