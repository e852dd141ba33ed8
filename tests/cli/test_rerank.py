"""`localrun rerank MODEL QUERY DOC...` end to end, on rerankers written here (tests/rerankmodel.py: a tiny Qwen3-Reranker
laid out as llama.cpp's converter writes one, with its rerank template, and the same without it, whose query and
document go together in the BOS / EOS / SEP form): the scores are llama-server's /v1/rerank for the same model and
texts, the order and --top-n hold, and each bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server
from rerankmodel import write_reranker

QUERY = "What is machine learning?"
DOCUMENTS = [
    "A machine is a physical system that uses power to apply forces and control movement.",
    "Machine learning is a field of study in artificial intelligence concerned with statistical algorithms.",
    "Paris, capitale de la France, est une grande ville européenne.",
    "Learning is the process of acquiring new understanding, knowledge, behaviors and skills.",
    "Cats sleep for most of the day.",
]


@pytest.fixture(scope="module")
def rerankers(smollm2, tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("rerankers")
    return {"template": write_reranker(smollm2, where / "qwen3-like.gguf"),
            "bert form": write_reranker(smollm2, where / "bos-eos-sep.gguf", template=None)}


def ranked(cli, model, *args, documents=DOCUMENTS, input=None) -> list[dict]:
    r = cli("rerank", str(model), QUERY, *documents, "--json", "--threads", "1", *args, input=input)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_documents_come_most_relevant_first_with_their_scores_and_top_n_keeps_the_first(rerankers, cli):
    for model in rerankers.values():
        every = ranked(cli, model)
        assert sorted(r["index"] for r in every) == list(range(len(DOCUMENTS)))
        scores = [r["relevance_score"] for r in every]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)  # apart, in order
        assert all(r["document"] == DOCUMENTS[r["index"]] for r in every)
        assert ranked(cli, model, "--top-n", "2") == every[:2]
        assert ranked(cli, model, "--top-n", "9") == every  # more than there are: all of them
        piped = ranked(cli, model, documents=[], input="\n".join(DOCUMENTS) + "\n")  # one document a line of stdin
        assert piped == every
    plain = cli("rerank", str(rerankers["template"]), QUERY, *DOCUMENTS, "--threads", "1")
    assert plain.returncode == 0
    lines = plain.stdout.splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == [r["document"] for r in ranked(cli, rerankers["template"])]
    assert all(float(line.split("  ", 1)[0]) > 0 for line in lines)


@pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_the_scores_are_llama_servers(rerankers, cli):
    """llama-server --reranking (the llama.cpp llama-cpp-python vendors) on the same model: the same documents in
    the same order with the same scores, to the last bit of their float32, for the rerank template and for the BOS /
    EOS / SEP form, and top_n cuts both alike. llama-server with one slot (-np 1: a document per decode), as localrun
    evaluates each document alone: with several slots, a document's score there moves with the others decoded beside
    it (here by up to 3e-5 with its default one KV pool for every slot, 0.84419006 where alone 0.84418607; by 5e-6 with
    -np 4's stream a slot), where localrun's never does."""
    for form, model in rerankers.items():
        theirs = _llama_server_rerank(model, top_n=3)
        ours = ranked(cli, model, "--top-n", "3")
        assert [(r["index"], r["relevance_score"]) for r in ours] == [(r["index"], r["relevance_score"]) for r in theirs], form


def _llama_server_rerank(model: Path, top_n: int) -> list[dict]:
    with llama_server(model, "--reranking", "-c", "2048", "-np", "1") as http:
        reply = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": top_n})
        assert reply.status_code == 200, reply.text
        return reply.json()["results"]


def test_each_bad_input_is_one_line_and_no_traceback(rerankers, smollm2, cli, tmp_path):
    model = str(rerankers["template"])
    cases = [
        (("rerank", str(smollm2), QUERY, "a", "b"), 2, "is not a reranker"),
        (("rerank", "qwen2.5-0.5b", QUERY, "a"), 2, "qwen2.5-0.5b is not a reranker"),  # (a chat model's alias: nothing pulled)
        (("rerank", model, QUERY), 2, "nothing to rank"),
        (("rerank", model, " ", "a"), 2, "the query is empty"),
        (("rerank", model, QUERY, "a", "--top-n", "0"), 2, "invalid --top-n 0"),
        (("rerank", str(tmp_path / "none.gguf"), QUERY, "a"), None, "none.gguf"),
        (("rerank", model, QUERY, "word " * 800, "--ctx", "256", "--no-truncate"), 1, "the context holds 256"),
    ]
    for args, code, said in cases:
        r = cli(*args)
        assert r.returncode != 0 and (code is None or r.returncode == code), (args, r.returncode, r.stderr)
        assert said in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (args, r.stderr)
    assert not any((Path(tmp_path) / "..").glob("**/*qwen2.5*0.5b*.gguf"))
    cut = cli("rerank", model, QUERY, "word " * 800, "short", "--ctx", "256", "--json", "--threads", "1")  # cut to fit by default
    assert cut.returncode == 0 and len(cut.stdout.splitlines()) == 2, cut.stderr
