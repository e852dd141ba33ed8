"""Reranking: documents scored against a query by a reranker (a cross-encoder: bge-reranker, jina-reranker,
Qwen3-Reranker), with llama.cpp's rank pooling, and sorted by relevance, for `localrun rerank` and the HTTP
layer's /v1/rerank and /rerank (as llama-server and the Jina and Cohere clients speak them).

What an HTTP handler calls:

    check_reranker(ref)                          before loading: NotAReranker, ModelNotFound
    reranker_spec(spec)                          the load it asks the pool for (an embeddings context, rank pooling)
    rerank(loaded, query, documents, ...)        on a model loaded in this process (on a server's model, taking
                                                 its turn: runtime.serving.resident.rerank_on)

A model that is no reranker is refused before it loads (NotAReranker: a UsageError, HTTP's 400), as are an empty
query or list of documents; the scores are llama-server's for the same model and texts (engine.rerank).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from ..errors import ContextOverflow, Phrase, SettingError
from ..engine.rerank import NotAReranker, check_reranker_file  # noqa: F401 - (serve sees the engine only through runtime)
from .options import LoadSpec


@dataclass
class Ranked:
    """One document's place: its index in the request's list, its score, and its text where asked for."""

    index: int
    relevance_score: float
    document: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "relevance_score": self.relevance_score}
        if self.document is not None:
            out["document"] = self.document
        return out


@dataclass
class Reranking:
    results: list[Ranked]  # most relevant first, at most top_n
    prompt_tokens: int  # every query-and-document prompt's tokens (llama-server's usage)
    seconds: float


def reranker_spec(spec: LoadSpec = LoadSpec()) -> LoadSpec:
    """The load a reranker needs: an embeddings context (its texts batched, each whole in one micro-batch) with
    rank pooling; `spec`'s placement (context, threads, GPU layers) kept."""
    return replace(spec, kind="embed", pooling="rank", lora=())


def check_reranker(ref: str) -> None:
    """Refuse `ref` before it loads when it is not a reranker (NotAReranker naming it); ModelNotFound where it is
    not here (a server does not pull for a request)."""
    from .. import hub
    from ..hub.catalogue import entry_for

    entry = entry_for(ref)
    if entry is not None and not entry.rerank:  # (a catalogue alias says what it is: no file needed)
        raise NotAReranker(ref)
    local = hub.resolve_local(ref)
    check_reranker_file(local.path, local.path.name if local.source == "path" else local.ref, hub.defaults_for(ref).rerank)


def load_reranker(model: str, spec: LoadSpec = LoadSpec(), *, source: str = "auto", on_notice=None):
    """Resolve (pulling if needed), check and load a reranker in this process (runtime.loader.load: the check runs
    there, before llama.cpp sees the file). A catalogue alias that is no reranker is refused before it is pulled."""
    from ..hub.catalogue import entry_for
    from .loader import load

    entry = entry_for(model)
    if entry is not None and not entry.rerank:
        raise NotAReranker(model)

    return load(model, reranker_spec(spec), source=source, on_notice=on_notice)


def rerank(loaded, query: str, documents: Sequence[str], *, top_n: Optional[int] = None, return_documents: bool = False,
           truncate: bool = True) -> Reranking:
    """Score each document against `query` on a loaded reranker (rank pooling) and sort them, most relevant first;
    keep the first `top_n` (None: all). A query and document longer than the context: the document's end is cut to
    fit when `truncate`, else ContextOverflow names it."""
    from ..engine.rerank import rerank_template, rerank_tokens

    query, documents = _checked(query, documents, top_n)
    engine = loaded.engine
    t0 = time.perf_counter()
    template = rerank_template(engine)
    limit = min(engine.n_ctx, engine.batch.capacity)
    prompts = []
    for i, document in enumerate(documents):
        tokens = rerank_tokens(engine, query, document, template)
        if len(tokens) > limit:
            tokens = _fitted(engine, query, document, template, limit, i, truncate)
        prompts.append(tokens)
    scores = engine.rank(prompts)
    ranked = sorted((Ranked(i, score, documents[i] if return_documents else None) for i, score in enumerate(scores)),
                    key=lambda r: r.relevance_score, reverse=True)  # (stable: equal scores keep their order)
    return Reranking(ranked[: len(ranked) if top_n is None else top_n], sum(len(p) for p in prompts), time.perf_counter() - t0)


def _checked(query: Any, documents: Any, top_n: Any) -> tuple[str, list[str]]:
    if not isinstance(query, str) or not query.strip():
        raise SettingError("query", query, "give the text to rank the documents against")
    if not isinstance(documents, (list, tuple)) or not documents:
        raise SettingError("documents", documents, "give one or more documents to rank")
    bad = next((i for i, d in enumerate(documents) if not isinstance(d, str)), None)
    if bad is not None:
        raise SettingError("documents", documents[bad], f"document {bad} is not text")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise SettingError("top_n", top_n, "use 1 or more (or leave it out for every document)")
    return query, list(documents)


def _fitted(engine, query: str, document: str, template: Optional[str], limit: int, index: int, truncate: bool) -> list[int]:
    """The prompt of a document cut to fit `limit` tokens (its end goes: the query and the prompt's frame stay)."""
    from ..engine.rerank import rerank_tokens

    doc = engine.tokenize(document, add_special=False, parse_special=False)
    frame = len(rerank_tokens(engine, query, "", template))
    room = limit - frame - 2  # (a little margin: text re-tokenizes a little differently at the cut)
    if not truncate or room < 1:
        n = frame + len(doc)
        raise ContextOverflow(Phrase("document {index} with the query is {n} tokens but the context holds {limit}: shorten it"
                                     + ("" if truncate else ", raise {ctx}, or let it be truncated"), index=index, n=n,
                                     limit=limit), n, limit)
    tokens = rerank_tokens(engine, query, engine.detokenize(doc[:room]), template)
    if len(tokens) > limit:
        raise ContextOverflow(f"the query of document {index} is {frame} tokens but the context holds {limit}: shorten it",
                              len(tokens), limit)
    return tokens
