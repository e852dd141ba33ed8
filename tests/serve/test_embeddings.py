"""Embeddings end to end: `localrun embed` and the server's /v1/embeddings, /api/embed and /api/embeddings,
answered to the real openai, ollama and langchain-ollama clients, with the real SmolLM2 and Gemma 3 (mean
pooling of their hidden states: neither says otherwise in its GGUF). What must hold: one vector of the
model's n_embd values per text, unit length, the same text the same vector, a text's vector in a batch
the one it gets alone (to float rounding: llama.cpp's CPU kernels round a batch of many rows slightly
differently), and every bad request a 400 in the dialect's shape."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from conftest import start_server

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply on Monday.", "The cat sat on the mat."]
CLOSE = 0.9995  # cosine between a text's vector in a batch and alone


def n_embd(model) -> int:
    from localrun.engine.gguf_info import read_info

    info = read_info(model)
    return info.n_embd


def vectors_of(stdout: str) -> tuple[list[str], np.ndarray]:
    rows = [json.loads(line) for line in stdout.splitlines()]
    return [r["text"] for r in rows], np.array([r["embedding"] for r in rows])


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_embed_command_json_lines_npy_and_stdin(which, request, cli, tmp_path):
    model = request.getfixturevalue(which)
    args = ("embed", str(model), "--threads", "1", "--ctx", "512")
    r = cli(*args, *TEXTS)
    assert r.returncode == 0, r.stderr
    texts, v = vectors_of(r.stdout)
    assert texts == TEXTS and v.shape == (3, n_embd(model))
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert v[0] @ v[2] > 0.99999 and v[0] @ v[1] < 0.99  # the same text, another text
    alone = vectors_of(cli(*args, TEXTS[1]).stdout)[1][0]
    assert alone @ v[1] > CLOSE

    piped = cli(*args, "-o", str(tmp_path / "v.npy"), input="\n".join(TEXTS) + "\n\n")  # blank lines skipped
    assert piped.returncode == 0 and piped.stdout == "" and "wrote 3 x" in piped.stderr
    saved = np.load(tmp_path / "v.npy")
    assert saved.dtype == np.float32 and np.allclose(saved, v, atol=1e-6)


def test_embed_command_errors(smollm2, cli, tmp_path):
    long_text = "word " * 300
    cut = cli("embed", str(smollm2), "--threads", "1", "--ctx", "64", long_text)  # cut to the context by default
    assert cut.returncode == 0 and len(vectors_of(cut.stdout)[1][0]) == n_embd(smollm2)
    refused = cli("embed", str(smollm2), "--threads", "1", "--ctx", "64", "--no-truncate", long_text)
    assert refused.returncode == 1 and "the context holds 64" in refused.stderr and "Traceback" not in refused.stderr
    for bad, fragment in ((["-o", str(tmp_path / "v.txt"), "x"], "name a .npy file"), (["--pooling", "max", "x"], "--pooling"), ([], "nothing to embed")):
        r = cli("embed", str(smollm2), *bad)
        assert r.returncode == 2 and fragment in r.stderr, r.stderr
    assert not (tmp_path / "v.txt").exists()
    nowhere = cli("embed", str(smollm2), "--threads", "1", "-o", str(tmp_path / "missing" / "v.npy"), "x")
    assert nowhere.returncode == 1 and "cannot write" in nowhere.stderr and len(nowhere.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("embed-home"), "--parallel", "2", "--ctx", "1024") as srv:
        yield srv


def test_openai_embeddings(server, smollm2):
    client = server.client("none")
    batch = client.embeddings.create(model=str(smollm2), input=TEXTS)  # the client asks for base64 and decodes it
    v = np.array([d.embedding for d in batch.data])
    assert [d.index for d in batch.data] == [0, 1, 2] and v.shape == (3, n_embd(smollm2))
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5) and v[0] @ v[2] > 0.99999
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > 10
    one = client.embeddings.create(model=str(smollm2), input=TEXTS[1], encoding_format="float")
    assert np.array(one.data[0].embedding) @ v[1] > CLOSE
    # Token ids are input too (as LangChain's OpenAI embeddings send them).
    ids = client.embeddings.create(model=str(smollm2), input=[[1, 504, 2365], [1, 504]], encoding_format="float")
    assert len(ids.data) == 2
    # The chat model is still served beside its embeddings context, and listed once, with both contexts.
    assert client.completions.create(model=str(smollm2), prompt="Hi", max_tokens=2).choices[0].text is not None
    [listed] = [m for m in httpx.get(server.url + "/api/ps").json()["models"] if m["path"] == str(smollm2)]
    assert sorted(c["kind"] for c in listed["contexts"]) == ["batch", "embed"]
    assert listed["size"] == sum(c["size"] for c in listed["contexts"]) and listed["load"]["kind"] == "batch"
    health = httpx.get(server.url + "/health").json()  # one model (it counted each context: found by a helper)
    assert health["models"] == len(httpx.get(server.url + "/api/ps").json()["models"]) == 1, health
    # An embeddings request last: the model is still described by its chat context (Open WebUI reads its
    # context length here; it read the embeddings context's 4096, found by a helper with Qwen).
    client.embeddings.create(model=str(smollm2), input="x")
    [listed] = [m for m in httpx.get(server.url + "/api/ps").json()["models"] if m["path"] == str(smollm2)]
    [chat] = [c for c in listed["contexts"] if c["kind"] == "batch"]
    assert listed["load"]["kind"] == "batch" and listed["context_length"] == chat["context_length"] == 1024
    [meta] = [m["meta"] for m in httpx.get(server.url + "/v1/models").json()["data"] if m["id"] == listed["name"]]
    assert meta["n_ctx_slot"] == 1024

    for body, param in (({"input": "word " * 1100}, "input"), ({"input": "x", "dimensions": 7}, "dimensions"), ({"input": []}, "input"), ({"input": [""]}, "input"),
                        ({"input": [[10**9]]}, "input"), ({"input": "x", "encoding_format": "hex"}, "encoding_format")):
        r = httpx.post(server.url + "/v1/embeddings", json={"model": str(smollm2), **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        if body["input"] == "word " * 1100:  # OpenAI's words and code, which clients match (its code was null)
            assert r.json()["error"]["code"] == "context_length_exceeded" and "maximum context length is" in r.json()["error"]["message"]
            assert "truncated" not in r.json()["error"]["message"]  # nothing on /v1 truncates


def test_ollama_embed_and_langchain(server, smollm2):
    import ollama

    from langchain_ollama import OllamaEmbeddings

    c = ollama.Client(host=server.url)
    e = c.embed(model=str(smollm2), input=TEXTS)
    # Unloading the model (an empty request, keep_alive 0) unloads its embeddings context too.
    assert c.generate(model=str(smollm2), prompt="", keep_alive=0).done_reason == "unload"
    from conftest import wait_until

    wait_until(lambda: c.ps().models == [], what="both of the model's contexts to unload")
    e = c.embed(model=str(smollm2), input=TEXTS)
    v = np.array(e.embeddings)
    assert v.shape == (3, n_embd(smollm2)) and v[0] @ v[2] > 0.99999 and e.prompt_eval_count > 10
    assert len(c.embed(model=str(smollm2), input=TEXTS[0]).embeddings) == 1
    assert c.embed(model=str(smollm2), input="").embeddings == []  # no text, no embedding: as Ollama (a 400 broke an ingestion)
    legacy = np.array(c.embeddings(model=str(smollm2), prompt=TEXTS[1]).embedding)
    assert legacy @ v[1] > CLOSE
    lc = OllamaEmbeddings(model=str(smollm2), base_url=server.url)
    docs = np.array(lc.embed_documents(TEXTS))
    assert np.allclose(docs, v, atol=1e-5) and np.array(lc.embed_query(TEXTS[1])) @ v[1] > CLOSE
    with pytest.raises(ollama.ResponseError) as bad:
        c.embed(model=str(smollm2), input="x", dimensions=5)
    assert bad.value.status_code == 400 and "dimensions" in bad.value.error
    with pytest.raises(ollama.ResponseError) as missing:
        c.embed(model="no-such-model", input="x")
    assert missing.value.status_code == 404
