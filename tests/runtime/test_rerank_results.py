"""The runtime functions the HTTP layer's /v1/rerank and /rerank call (runtime.rerank), on the tiny rerankers of
tests/rerankmodel.py: the query and each document put together as llama-server puts them, the results sorted by
relevance and cut at top_n, the documents returned where asked, a model that is no reranker and each bad field
refused with the field named; and the same through a server's model pool (rerank_on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rerankmodel import QWEN3_RERANK, write_reranker

from localrun.errors import SettingError
from localrun.runtime.options import LoadSpec
from localrun.runtime.rerank import NotAReranker, check_reranker, load_reranker, rerank, reranker_spec
from localrun.runtime.serving.resident import rerank_on

DOCUMENTS = ["Machine learning is a field of AI.", "Paris is in France.", "Cats sleep.", "Learning takes time."]


@pytest.fixture(scope="module")
def models(smollm2, tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("rerank")
    return {"template": write_reranker(smollm2, where / "t.gguf"), "bert": write_reranker(smollm2, where / "b.gguf", template=None)}


@pytest.fixture(scope="module")
def loaded(models):
    out = {name: load_reranker(str(path), LoadSpec(ctx=512, threads=1)) for name, path in models.items()}
    yield out
    for one in out.values():
        one.close()


def test_a_query_and_a_document_are_put_together_as_llama_server_puts_them(loaded):
    from localrun.engine.rerank import rerank_template, rerank_tokens

    engine = loaded["template"].engine
    template = rerank_template(engine)
    assert template == QWEN3_RERANK  # read from the GGUF as llama.cpp reads it
    text = QWEN3_RERANK.replace("{query}", "q {document}").replace("{document}", "d")  # in llama.cpp's order
    assert rerank_tokens(engine, "q {document}", "d", template) == engine.tokenize(text, add_special=False, parse_special=True)
    bert = loaded["bert"].engine
    assert rerank_template(bert) is None
    q, d = bert.tokenize("a query", False, False), bert.tokenize("a document", False, False)
    # BOS, query, EOS, SEP, document, EOS: the writer set add_bos, add_eos, add_sep and SEP = token 0
    assert rerank_tokens(bert, "a query", "a document") == [1, *q, 2, 0, *d, 2]
    result = rerank(loaded["bert"], "a query", ["a document"])
    assert result.prompt_tokens == len(q) + len(d) + 4  # llama-server's usage counts the same tokens


def test_results_are_sorted_cut_at_top_n_and_carry_the_documents_only_when_asked(loaded):
    every = rerank(loaded["template"], "What is machine learning?", DOCUMENTS)
    assert sorted(r.index for r in every.results) == [0, 1, 2, 3] and all(r.document is None for r in every.results)
    scores = [r.relevance_score for r in every.results]
    assert scores == sorted(scores, reverse=True)
    two = rerank(loaded["template"], "What is machine learning?", DOCUMENTS, top_n=2, return_documents=True)
    assert [(r.index, r.relevance_score) for r in two.results] == [(r.index, r.relevance_score) for r in every.results[:2]]
    assert [r.document for r in two.results] == [DOCUMENTS[r.index] for r in two.results]
    assert two.results[0].as_dict() == {"index": two.results[0].index, "relevance_score": scores[0], "document": two.results[0].document}
    # a document's score is its own: the same ranked alone, or beside others in another order
    alone = rerank(loaded["template"], "What is machine learning?", [DOCUMENTS[2]]).results[0].relevance_score
    assert alone == next(r.relevance_score for r in every.results if r.index == 2)


@pytest.mark.parametrize("query, documents, top_n, field", [
    ("", DOCUMENTS, None, "query"), ("  ", DOCUMENTS, None, "query"), (3, DOCUMENTS, None, "query"),
    ("q", [], None, "documents"), ("q", None, None, "documents"), ("q", [1, 2, 3], None, "documents"), ("q", "text", None, "documents"),
    ("q", DOCUMENTS, 0, "top_n"), ("q", DOCUMENTS, True, "top_n"), ("q", DOCUMENTS, "2", "top_n"),
])
def test_each_bad_field_is_refused_naming_it(loaded, query, documents, top_n, field):
    with pytest.raises(SettingError) as caught:
        rerank(loaded["template"], query, documents, top_n=top_n)
    assert caught.value.setting == field and "\n" not in caught.value.message


def test_a_model_that_is_no_reranker_is_refused_before_it_loads(smollm2, models):
    with pytest.raises(NotAReranker) as caught:
        check_reranker(str(smollm2))
    assert caught.value.model == smollm2.name and "is not a reranker" in caught.value.message
    check_reranker(str(models["template"]))  # (no error)

    with pytest.raises(NotAReranker):
        load_reranker(str(smollm2))


def test_rerank_on_a_model_the_pool_holds(models):
    """As the HTTP layer will: the pool loads the reranker with reranker_spec (an embeddings context, rank pooling), and
    rerank_on takes the model's turn for the request; the scores are those of a load in this process."""
    from localrun.runtime.loader import load
    from localrun.runtime.serving.pool import ModelPool
    from localrun.runtime.serving.runner import start_scheduler

    pool = ModelPool(make_scheduler=lambda loaded, slot_ctx, spec: start_scheduler(loaded, slot_ctx, spec, max_waiting=4, prefill_chunk=64),
                     load=lambda ref, spec: load(ref, spec))
    try:
        spec = reranker_spec(LoadSpec(ctx=512, threads=1, parallel=4))
        assert (spec.kind, spec.pooling) == ("embed", "rank")
        resident, _ = pool.acquire(str(models["template"]), spec)
        try:
            served = rerank_on(resident, "What is machine learning?", DOCUMENTS, top_n=3, return_documents=True)
        finally:
            pool.release(resident)
        here = load_reranker(str(models["template"]), LoadSpec(ctx=512, threads=1))
        try:
            local = rerank(here, "What is machine learning?", DOCUMENTS, top_n=3, return_documents=True)
        finally:
            here.close()
        assert [r.as_dict() for r in served.results] == [r.as_dict() for r in local.results]
    finally:
        pool.close()
