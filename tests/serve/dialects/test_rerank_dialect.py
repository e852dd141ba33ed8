"""The rerank dialect without a model (serve.dialects.rerank): the bodies llama-server, Jina's and Cohere's clients
and TEI send (documents as text or {"text"}), the answer in each one's shape, most relevant first; bad bodies a 400
naming the field."""

from __future__ import annotations

import pytest

from localrun.errors import SettingError
from localrun.runtime.rerank import Ranked, Reranking
from localrun.serve.dialects import rerank, shape_for
from localrun.serve.errors import Refused

RESULT = Reranking([Ranked(2, 0.9, "c"), Ranked(0, 0.4, "a")], prompt_tokens=31, seconds=0.1)


def test_jina_and_cohere_bodies():
    asked, ranking = rerank.asked_of({"model": "bge", "query": "q", "documents": ["a", {"text": "b"}], "top_n": 1,
                                      "return_documents": True})
    assert asked.model == "bge" and ranking.query == "q" and ranking.documents == ["a", "b"]
    assert (ranking.top_n, ranking.return_documents, ranking.tei) == (1, True, False)
    # more than there are: every document, as llama-server answers
    assert rerank.asked_of({"query": "q", "documents": ["a"], "top_n": 99})[1].top_n is None


def test_the_answer_most_relevant_first_with_usage_and_documents_where_asked():
    _, ranking = rerank.asked_of({"query": "q", "documents": ["a", "b", "c"], "return_documents": True})
    answer = rerank.answer(ranking, "bge", RESULT)
    assert answer["model"] == "bge" and answer["object"] == "list" and answer["id"]
    assert answer["results"] == [{"index": 2, "relevance_score": 0.9, "document": {"text": "c"}},
                                 {"index": 0, "relevance_score": 0.4, "document": {"text": "a"}}]
    assert answer["usage"] == {"prompt_tokens": 31, "total_tokens": 31}
    bare = rerank.answer(ranking, "bge", Reranking([Ranked(1, 0.5)], 3, 0.1))
    assert bare["results"] == [{"index": 1, "relevance_score": 0.5}]


def test_tei_s_form_is_answered_as_tei_answers():
    _, ranking = rerank.asked_of({"query": "q", "texts": ["a", "b", "c"], "return_text": True})
    assert ranking.tei and ranking.return_documents
    assert rerank.answer(ranking, "bge", RESULT) == [{"index": 2, "score": 0.9, "text": "c"}, {"index": 0, "score": 0.4, "text": "a"}]


@pytest.mark.parametrize("body, field", [
    ("q", None), ({"documents": ["a"]}, "query"), ({"query": "q", "documents": [{"title": "a"}]}, "documents"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ({"query": "q", "documents": ["a"], "model": 3}, "model"),
])
def test_a_bad_body_is_a_400_naming_the_field(body, field):
    with pytest.raises(Refused) as caught:
        rerank.asked_of(body)
    assert caught.value.field == field
    status, shaped = rerank.error_answer(caught.value)
    assert status == 400 and shaped["error"]["param"] == field and shaped["error"]["type"] == "invalid_request_error"


def test_what_the_ranking_refuses_is_a_400_naming_its_field():
    status, shaped = rerank.error_answer(SettingError("documents", [], "give one or more documents to rank"))
    assert status == 400 and shaped["error"]["param"] == "documents" and "documents" in shaped["error"]["message"]
    for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
        assert shape_for(path, {}) is rerank
