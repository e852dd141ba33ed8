"""LoRA adapters over HTTP on `localrun serve --lora` (SmolLM2 with an adapter tests/loramodel.py writes: small
random A and B matrices over its attention): llama-server's per-request `lora: [{"id", "scale"}]` on /v1 and
/completion, GET and POST /lora-adapters, the adapters in Ollama's /api/show. Scale 0 is the model alone; the
answer under the adapter is llama-server --lora's token for token; a bad id or scale is a 400 naming `lora`."""

from __future__ import annotations

import httpx
import pytest

from conftest import start_server
from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server
from loramodel import write_lora

pytestmark = pytest.mark.slow
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"
N = 16


@pytest.fixture(scope="module")
def adapter(smollm2, tmp_path_factory):
    return write_lora(smollm2, tmp_path_factory.mktemp("lora") / "lora.gguf")


@pytest.fixture(scope="module")
def server(smollm2, adapter, tmp_path_factory):
    """Two slots, so that answers under different scales go side by side and a slot's KV meets other scales."""
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--lora", str(adapter), "--parallel", "2", "--ctx", "512") as srv:
        yield srv


def post(server, path: str, body: dict, status: int = 200):
    r = httpx.post(server.url + path, json=body, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def tokens(server, lora=None) -> list[int]:
    """The greedy answer's tokens through llama-server's /completion (under the scales the server has, or `lora`)."""
    body = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "return_tokens": True, **({"lora": lora} if lora is not None else {})}
    return post(server, "/completion", body)["tokens"]


def v1_text(server, lora=None) -> str:
    body = {"model": SMOL, "prompt": PROMPT, "max_tokens": N, "temperature": 0, **({"lora": lora} if lora is not None else {})}
    return post(server, "/v1/completions", body)["choices"][0]["text"]


def test_a_requests_scales_pick_the_answer_and_scale_0_is_the_model_alone(server, smollm2, tmp_path):
    chat = {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    with start_server(smollm2, tmp_path / "home", "--parallel", "1", "--ctx", "512") as plain:
        base, base_text = tokens(plain), v1_text(plain)
        base_chat = post(plain, "/v1/chat/completions", chat)["choices"][0]["message"]["content"]
    adapted = tokens(server)
    assert adapted != base
    for _ in range(2):  # in turn on the same slots: the KV made under one scale is never reused under another
        assert tokens(server, [{"id": 0, "scale": 0}]) == base
        assert tokens(server, [{"id": 0, "scale": 1}]) == adapted
    assert tokens(server, []) == adapted  # an empty list: the model's own scales
    assert v1_text(server, [{"id": 0, "scale": 0}]) == base_text and v1_text(server) != base_text
    assert post(server, "/v1/chat/completions", {**chat, "lora": [{"id": 0, "scale": 0}]})["choices"][0]["message"]["content"] == base_chat
    half = tokens(server, [{"id": 0, "scale": 0.5}])
    assert half not in (base, adapted)


def test_lora_adapters_are_listed_and_their_default_scales_set(server, adapter):
    listed = httpx.get(server.url + "/lora-adapters", timeout=60).json()
    assert listed == [{"id": 0, "path": str(adapter), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]
    adapted = tokens(server)
    base = tokens(server, [{"id": 0, "scale": 0}])
    try:
        assert post(server, "/lora-adapters", [{"id": 0, "scale": 0}]) == {"success": True}
        assert httpx.get(server.url + "/lora-adapters", timeout=60).json()[0]["scale"] == 0.0
        assert tokens(server) == base  # every request that names none: the new default
        assert tokens(server, [{"id": 0, "scale": 1}]) == adapted  # one that names its own: its own
        props = httpx.get(server.url + "/props", timeout=60).json()
        assert props["default_generation_settings"]["params"]["lora"] == [{"id": 0, "scale": 0.0}]
    finally:
        post(server, "/lora-adapters", [{"id": 0, "scale": 1}])
    assert tokens(server) == adapted
    shown = httpx.post(server.url + "/api/show", json={"model": SMOL}, timeout=60).json()
    assert shown["adapters"] == [{"id": 0, "path": str(adapter), "scale": 1.0, "task_name": "", "prompt_prefix": ""}]


def test_a_bad_id_or_scale_is_a_400_naming_lora(server):
    bad = ([{"id": 1, "scale": 1}], [{"id": 0, "scale": "high"}], [{"id": -1, "scale": 1}], [{"scale": 1}], {"id": 0})
    for lora in bad:
        error = post(server, "/v1/completions", {"model": SMOL, "prompt": PROMPT, "max_tokens": 2, "lora": lora}, status=400)["error"]
        assert error["param"] == "lora" and "lora" in error["message"], (lora, error)
        native = post(server, "/completion", {"prompt": PROMPT, "n_predict": 2, "lora": lora}, status=400)["error"]
        assert native["code"] == 400 and native["type"] == "invalid_request_error" and "lora" in native["message"], (lora, native)
    assert "no adapter has id 1" in post(server, "/lora-adapters", [{"id": 1, "scale": 1}], status=400)["error"]["message"]
    assert "Request body must be an array" in post(server, "/lora-adapters", {"id": 0, "scale": 1}, status=400)["error"]["message"]
    assert httpx.get(server.url + "/lora-adapters", timeout=60).json()[0]["scale"] == 1.0  # none of them changed it


@pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_the_answer_under_the_adapter_is_llama_servers(server, smollm2, adapter):
    """llama-server --lora on the same model, asked the same /completion: token for token at the adapter's scale, at a
    request's 0.5 and at 0 (llama-server's per-request lora), and at the default its POST /lora-adapters sets."""
    ours = {scale: tokens(server, [{"id": 0, "scale": scale}]) for scale in (1.0, 0.5, 0.0)}
    with llama_server(smollm2, "--lora", str(adapter), "-c", "512", "-np", "1") as http:
        def theirs(lora=None):
            body = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "return_tokens": True, "cache_prompt": False}
            reply = http.post("/completion", json={**body, **({"lora": lora} if lora is not None else {})})
            assert reply.status_code == 200, reply.text
            return reply.json()["tokens"]

        assert theirs() == ours[1.0] == tokens(server)
        for scale, answer in ours.items():
            assert theirs([{"id": 0, "scale": scale}]) == answer, scale
        assert http.get("/lora-adapters").json()[0]["id"] == 0
