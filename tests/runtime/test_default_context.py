"""The default context of a model no catalogue entry sizes (a path, a repository file): its trained length
up to 32768, halved while every slot's KV cache would take more than a quarter of the free memory, never
under 4096 (#32: a 4,096-token default refused Open WebUI's first message, 6,623 tokens with its tools)."""

from __future__ import annotations

import json

import pytest

from localrun.engine.gguf_info import kv_cache_bytes, read_info
from localrun.runtime.loader import CONTEXT_CAP, FALLBACK_CONTEXT, default_context

GIB = 1 << 30


def test_the_trained_length_where_memory_allows(smollm2, gemma):
    small, windowed = read_info(smollm2), read_info(gemma)
    assert small.context_length == 8192 and windowed.context_length == 32768
    assert default_context(small, 1, available=64 * GIB) == 8192
    assert default_context(windowed, 4, available=64 * GIB) == 32768 == CONTEXT_CAP


def test_halved_to_fit_a_quarter_of_free_memory_never_under_the_fallback(smollm2):
    info = read_info(smollm2)
    per_slot_8k = kv_cache_bytes(info, 8192)
    # Four slots of 8192 need 4x that; a quarter of the memory holds only two slots' worth: 4096 each.
    assert default_context(info, 4, available=4 * 2 * per_slot_8k) == 4096
    assert default_context(info, 4, available=4 * 4 * per_slot_8k) == 8192
    assert default_context(info, 4, available=1) == FALLBACK_CONTEXT  # no memory to size by: the old default
    q8 = kv_cache_bytes(info, 8192, "q8_0")  # about half of f16's
    assert q8 < per_slot_8k * 0.6
    assert default_context(info, 1, "q8_0", available=4 * q8) == 8192
    assert default_context(info, 1, "q8_0", available=4 * q8 - 4) == 4096


@pytest.mark.slow
def test_open_webuis_first_message_with_its_36_tools_is_answered(tiny_tools_model, cli, tmp_path):
    """The recorded first message of an Open WebUI chat, with the 36 tools it attaches, to a server started
    with no --ctx: a model whose template renders tools makes it a prompt of over 4,096 tokens, answered
    (it was a 400 at the old default). `show` and /api/ps say the context chosen. The model is the tiny one
    with SmolLM2's tokenizer (conftest.tiny_tools_model): the prompt's tokens are what is tested, not the answer."""
    import httpx

    from conftest import OPEN_WEBUI_RECORDINGS, start_server

    shown = json.loads(cli("show", str(tiny_tools_model), "--json").stdout)
    assert shown["memory_estimate"]["n_ctx"] == 8192, shown
    assert shown["name"] == str(tiny_tools_model)  # a file is named by its path (it read PATH:QUANT)
    recorded = OPEN_WEBUI_RECORDINGS / "ollama-api.jsonl"
    call = json.loads(recorded.read_text().splitlines()[8])
    assert call["path"] == "/api/chat" and len(call["body"]["tools"]) == 36
    body = {**call["body"], "model": tiny_tools_model.name, "stream": False, "options": {"num_predict": 8}}
    with start_server(tiny_tools_model, tmp_path / "home", "--parallel", "1", threads=2) as srv:  # the client only waits
        r = httpx.post(srv.url + "/api/chat", json=body, timeout=600)
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] > 4096
        assert [m["context_length"] for m in httpx.get(srv.url + "/api/ps").json()["models"]] == [8192]


def test_a_request_that_sets_no_length_runs_until_its_slot_is_full(tiny_tools_model, tmp_path):
    """No max_tokens in the request and no `serve -n`: the answer is not cut at the command line's 512 (Codex
    sends no max_output_tokens, and its edits were cut there); it runs until the model ends it or its slot is
    full, as OpenAI's, Ollama's and llama-server's do. The tiny model, greedy, does not end this answer by itself."""
    import httpx

    from conftest import start_server

    with start_server(tiny_tools_model, tmp_path / "home", "--parallel", "1", "--ctx", "768") as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "temperature": 0},
                       timeout=600).json()  # greedy: the same answer every run
        # the slot's 768 cells, and the last token sampled (not evaluated): past 512 either way
        assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["total_tokens"] == 769, r["usage"]
        cut = httpx.post(srv.url + "/v1/responses", json={"input": "hi", "max_output_tokens": 3, "temperature": 0}, timeout=600).json()
        assert cut["status"] == "incomplete" and cut["usage"]["output_tokens"] == 3
