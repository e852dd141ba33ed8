"""A created model's LoRA adapters through Ollama's API: /api/create's `adapters` ({"FILE.gguf": "sha256:DIGEST"} of a
file uploaded with /api/blobs, as the ollama client's create_blob and create send them) makes a model that runs with
them, checked as a Modelfile's ADAPTER is (another architecture: a 400 naming it); /api/blobs keeps a file only under
its own digest. Real SmolLM2 through real llama.cpp, the real ollama client against a real loopback server; each
adapter a GGUF written here (tests/loramodel.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from conftest import start_server
from loramodel import write_lora

ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapters(smollm2, tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("lora")
    return {"lora": write_lora(smollm2, where / "lora.gguf"),
            "qwen2": write_lora(smollm2, where / "qwen2.gguf", architecture="qwen2")}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with start_server(None, tmp_path_factory.mktemp("home"), "--ctx", "512", "--parallel", "1") as srv:
        yield srv


def tokens(client, model: str, **options) -> list:
    answer = client.generate(model=model, prompt=PROMPT, raw=True, options={"temperature": 0, "num_predict": 12, **options})
    return answer.response


def test_api_create_with_uploaded_adapters_makes_a_model_that_runs_with_them(server, smollm2, adapters):
    client = ollama.Client(host=server.url)
    digest = client.create_blob(adapters["lora"])  # HEAD-less upload, as the client does it
    assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 200
    client.create(model="tuned", from_=str(smollm2), adapters={"lora.gguf": digest})
    client.create(model="plain", from_=str(smollm2))
    tuned, plain = tokens(client, "tuned"), tokens(client, "plain")
    assert tuned != plain
    # the adapter's answer, as llama-server's per-request scale 0 gives the model alone (the same load)
    r = httpx.post(f"{server.url}/completion", json={"model": "tuned", "prompt": PROMPT, "n_predict": 12, "temperature": 0,
                                                     "lora": [{"id": 0, "scale": 0.0}]}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == plain
    shown = httpx.post(f"{server.url}/api/show", json={"model": "tuned"}).json()
    assert [a["scale"] for a in shown["adapters"]] == [1.0] and "ADAPTER " in shown["modelfile"]


def test_api_create_refuses_an_adapter_it_cannot_use(server, smollm2, adapters):
    client = ollama.Client(host=server.url)
    wrong = client.create_blob(adapters["qwen2"])
    with pytest.raises(ollama.ResponseError) as refused:
        client.create(model="wrong", from_=str(smollm2), adapters={"qwen2.gguf": wrong})
    assert refused.value.status_code == 400 and "qwen2 architecture" in refused.value.error
    assert refused.value.error.startswith(f"adapters: {wrong}: is for the qwen2 architecture")  # not the server's path
    assert "\n" not in refused.value.error
    missing = "sha256:" + "0" * 64
    with pytest.raises(ollama.ResponseError) as refused:
        client.create(model="wrong", from_=str(smollm2), adapters={"x.gguf": missing})
    assert refused.value.status_code == 400 and "upload" in refused.value.error and "x.gguf" in refused.value.error
    assert "wrong" not in [m.model for m in client.list().models]  # nothing was made


def test_a_blob_is_kept_only_under_its_own_digest(server):
    body = b"not what it says"
    said = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    r = httpx.post(f"{server.url}/api/blobs/{said}", content=body)
    assert r.status_code == 400 and "digest mismatch" in r.json()["error"]
    assert httpx.head(f"{server.url}/api/blobs/{said}").status_code == 404
    assert httpx.post(f"{server.url}/api/blobs/md5:abc", content=body).status_code == 400
    right = "sha256:" + hashlib.sha256(body).hexdigest()
    assert httpx.post(f"{server.url}/api/blobs/{right}", content=body).status_code == 201
    assert httpx.head(f"{server.url}/api/blobs/{right}").status_code == 200


def test_a_bad_uploaded_adapter_is_named_as_the_client_named_it(server, smollm2):
    body = b"hello, not a GGUF"
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert httpx.post(f"{server.url}/api/blobs/{digest}", content=body).status_code == 201
    r = httpx.post(f"{server.url}/api/create", json={"model": "bad", "from": str(smollm2), "adapters": {"a.gguf": digest},
                                                     "stream": False}, timeout=120)
    assert (r.status_code, r.json()["error"]) == (400, f"adapters: 'a.gguf' ({digest}): not a GGUF file")


def test_a_digest_is_the_whole_name(server):
    """sha256:HEX and nothing after it: not a trailing newline (which a regex's `$` lets through)."""
    body = b"some bytes"
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert httpx.post(f"{server.url}/api/blobs/{digest}%0A", content=body).status_code == 400
    assert httpx.head(f"{server.url}/api/blobs/{digest}%0A").status_code == 400
    assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 404  # nothing kept under it


def test_a_requests_lora_on_a_model_without_adapters_is_said_in_the_requests_words(server, smollm2):
    client = ollama.Client(host=server.url)
    client.create(model="bare", from_=str(smollm2))
    r = httpx.post(f"{server.url}/completion", json={"model": "bare", "prompt": PROMPT, "n_predict": 2,
                                                     "lora": [{"id": 5, "scale": 1}]}, timeout=300)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ('invalid lora [{"id": 5, "scale": 1}]: this model was loaded without LoRA'
                                            " adapters: load it with some, or make a model with a Modelfile's ADAPTER")
