"""Reranking as llama-server, Jina's and Cohere's clients speak it (/v1/rerank, /rerank, /v1/reranking, /reranking):
a query and documents (text, or {"text": ...} as Jina's and Cohere's clients send them), `top_n`, `return_documents`;
the results most relevant first, each with its index and relevance_score (and its document as {"text"} where asked),
with the prompt tokens as usage. A body with `texts` instead of `documents` is Hugging Face's text-embeddings-inference
(TEI) form, answered as TEI answers: a list of {index, score} (and `text` with return_text), as llama-server does.
Pure: a body in, what to rank out; runtime.rerank's result in, the answer out. serve/routes/rerank.py serves it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

from ..asked import Asked
from ..checks import need
from ..errors import Fault, Wording, fault

WORDING = Wording(more_context="restart the server with a larger --ctx", no_projector="rerank text only")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 501: "not_supported_error",
          503: "unavailable_error"}


def error_answer(exc: BaseException, model: Optional[str] = None) -> tuple[int, dict]:
    """llama-server's error shape ({"error": {"code", "message", "type"}}), with the field at fault as OpenAI's
    `param` (Jina's and Cohere's clients read the message)."""
    return error_shape(fault(exc, WORDING))


def error_shape(f: Fault) -> tuple[int, dict]:
    kind = _TYPES.get(f.status, "server_error" if f.status >= 500 else "invalid_request_error")
    return f.status, {"error": {"code": f.status, "message": f.message, "type": kind, "param": f.param}}


@dataclass
class Ranking:
    """What a rerank body asks: the query, the documents' texts, how many to keep, whether to give them back, and
    the answer's shape (TEI's list, or Jina's and Cohere's object)."""

    query: Any
    documents: Any
    top_n: Optional[int] = None
    return_documents: bool = False
    tei: bool = False


def asked_of(data: Any) -> tuple[Asked, Ranking]:
    """The model a rerank body names and what it asks (the query, documents and top_n are checked where they are
    ranked: runtime.rerank refuses each bad one naming it)."""
    need(isinstance(data, dict), "the body must be a JSON object")
    need("query" in data, '"query" must be provided', "query")
    tei = "texts" in data
    documents = data.get("texts" if tei else "documents")
    if isinstance(documents, list):
        documents = [_text(d, i) for i, d in enumerate(documents)]
    flag = "return_text" if tei else "return_documents"
    back = data.get(flag, False)
    need(isinstance(back, bool), f"{flag} must be true or false", flag)
    top_n = data.get("top_n")
    if isinstance(top_n, int) and not isinstance(top_n, bool) and documents and top_n > len(documents):
        top_n = None  # more than there are: every document, as llama-server answers
    model = data.get("model")
    need(model is None or isinstance(model, str), "model must be a string", "model")
    return Asked(model=model), Ranking(data["query"], documents, top_n, back, tei)


def _text(document: Any, i: int) -> Any:
    """A document as Jina's and Cohere's clients send it ({"text": ...}) or as text; anything else is left for the
    ranking to refuse naming its place."""
    if isinstance(document, dict):
        need(isinstance(document.get("text"), str), f'documents.{i} must be text or {{"text": ...}}', "documents")
        return document["text"]
    return document


def answer(ranking: Ranking, model: str, result) -> Any:
    """runtime.rerank.Reranking as the client's form answers it."""
    if ranking.tei:
        return [{"index": r.index, "score": r.relevance_score, **({"text": r.document} if r.document is not None else {})}
                for r in result.results]
    results = [{"index": r.index, "relevance_score": r.relevance_score,
                **({"document": {"text": r.document}} if r.document is not None else {})} for r in result.results]
    return {"id": str(uuid.uuid4()), "model": model, "object": "list", "results": results,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
            "meta": {"billed_units": {"search_units": 1}, "tokens": {"input_tokens": result.prompt_tokens}}}
