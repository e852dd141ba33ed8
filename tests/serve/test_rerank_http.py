"""Reranking over HTTP on `localrun serve` (/v1/rerank, /rerank, /v1/reranking, /reranking, Cohere's /v2/rerank), on
the rerankers tests/rerankmodel.py writes (a tiny Qwen3-Reranker with its rerank template, and the same without it:
the BOS / EOS / SEP form): the documents most relevant first, top_n and return_documents honoured, llama-server's
form and text-embeddings-inference's (`texts`), the scores llama-server's /v1/rerank gives for the same GGUF, a model
that is no reranker a 400 in the dialect's shape, and the `cohere` client where it is installed."""

from __future__ import annotations

import httpx
import pytest

from conftest import start_server
from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server
from rerankmodel import write_reranker

pytestmark = pytest.mark.slow
QUERY = "What is machine learning?"
DOCUMENTS = [
    "A machine is a physical system that uses power to apply forces and control movement.",
    "Machine learning is a field of study in artificial intelligence concerned with statistical algorithms.",
    "Paris, capitale de la France, est une grande ville européenne.",
    "Learning is the process of acquiring new understanding, knowledge, behaviors and skills.",
    "Cats sleep for most of the day.",
]
PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")


@pytest.fixture(scope="module")
def rerankers(smollm2, tmp_path_factory):
    where = tmp_path_factory.mktemp("rerankers")
    return {"template": write_reranker(smollm2, where / "qwen3-like.gguf"),
            "bert form": write_reranker(smollm2, where / "bos-eos-sep.gguf", template=None)}


@pytest.fixture(scope="module")
def server(rerankers, tmp_path_factory):
    """A server whose own model is the reranker with the template; the other is named by its path."""
    with start_server(rerankers["template"], tmp_path_factory.mktemp("home"), "--ctx", "2048", "--parallel", "1") as srv:
        yield srv


def rerank(server, body: dict, path: str = "/v1/rerank", status: int = 200):
    r = httpx.post(server.url + path, json=body, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def test_most_relevant_first_top_n_and_return_documents(server, rerankers):
    for model in (None, str(rerankers["bert form"])):
        named = {"model": model} if model else {}
        every = rerank(server, {**named, "query": QUERY, "documents": DOCUMENTS})
        results = every["results"]
        assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
        assert all("document" not in r for r in results) and every["usage"]["prompt_tokens"] > 0
        for path in PATHS[1:]:
            assert rerank(server, {**named, "query": QUERY, "documents": DOCUMENTS}, path)["results"] == results, path
        top = rerank(server, {**named, "query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": True})["results"]
        assert [(r["index"], r["relevance_score"]) for r in top] == [(r["index"], r["relevance_score"]) for r in results[:2]]
        assert [r["document"] for r in top] == [{"text": DOCUMENTS[r["index"]]} for r in top]
        assert rerank(server, {**named, "query": QUERY, "documents": DOCUMENTS, "top_n": 99})["results"] == results
        # Jina's and Cohere's clients send {"text": ...}; text-embeddings-inference's form is answered in its own
        assert rerank(server, {**named, "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS]})["results"] == results
        tei = rerank(server, {**named, "query": QUERY, "texts": DOCUMENTS, "return_text": True}, "/rerank")
        assert tei == [{"index": r["index"], "score": r["relevance_score"], "text": DOCUMENTS[r["index"]]} for r in results]


def test_a_model_that_is_no_reranker_and_bad_fields_are_400s_naming_them(server, smollm2):
    refused = rerank(server, {"model": str(smollm2), "query": QUERY, "documents": DOCUMENTS}, status=400)
    assert refused["error"]["type"] == "invalid_request_error" and refused["error"]["param"] == "model"
    assert "SmolLM2-135M-Instruct.Q4_1.gguf is not a reranker" in refused["error"]["message"]
    for body, field in (({"query": QUERY, "documents": []}, "documents"), ({"query": QUERY, "documents": [1, 2]}, "documents"),
                        ({"query": " ", "documents": DOCUMENTS}, "query"), ({"documents": DOCUMENTS}, "query"),
                        ({"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
                        ({"query": QUERY, "documents": DOCUMENTS, "return_documents": "yes"}, "return_documents")):
        error = rerank(server, body, "/rerank", status=400)["error"]
        assert error["code"] == 400 and error["param"] == field and field in error["message"], (body, error)
    # the server still ranks after them
    assert len(rerank(server, {"query": QUERY, "documents": DOCUMENTS[:2]})["results"]) == 2


@pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_the_scores_are_llama_servers(server, rerankers):
    """llama-server --reranking with one slot on the same GGUF (tests/cli/test_rerank.py says why one): the same
    documents in the same order with the same scores to the last bit, the same prompt tokens, for both forms and for
    text-embeddings-inference's."""
    for form, model in rerankers.items():
        body = {"model": str(model), "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
        ours, tei = rerank(server, body), rerank(server, {"query": QUERY, "texts": DOCUMENTS, "model": str(model)}, "/rerank")
        with llama_server(model, "--reranking", "-c", "2048", "-np", "1") as http:
            theirs, their_tei = http.post("/v1/rerank", json=body).json(), http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
        assert ours["results"] == theirs["results"], form
        assert ours["usage"] == theirs["usage"], form
        assert tei == their_tei, form


def test_the_cohere_client(server):
    cohere = pytest.importorskip("cohere")
    v1 = cohere.Client(base_url=server.url, api_key="none", timeout=300)
    ranked = v1.rerank(model="qwen3-like.gguf", query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=True)
    every = rerank(server, {"query": QUERY, "documents": DOCUMENTS})["results"]
    assert [(r.index, r.relevance_score, r.document.text) for r in ranked.results] == \
        [(r["index"], r["relevance_score"], DOCUMENTS[r["index"]]) for r in every[:2]]
    v2 = cohere.ClientV2(base_url=server.url, api_key="none", timeout=300)
    ranked = v2.rerank(model="qwen3-like.gguf", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [(r.index, r.relevance_score) for r in ranked.results] == [(r["index"], r["relevance_score"]) for r in every[:3]]
