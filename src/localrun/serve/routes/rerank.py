"""Reranking (serve.dialects.rerank) at llama-server's paths (/v1/rerank, /rerank, /v1/reranking, /reranking) and
Cohere's v2 client's (/v2/rerank), on the reranker a body names (the server's own when it names none), loaded with
rank pooling (runtime.rerank); a model that is no reranker is refused before it loads."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from ...runtime.serving.resident import rerank_on
from ..dialects import rerank
from ..endpoint import answered_by, also, endpoint, holding, named, read_json


@endpoint("/v1/rerank", rerank)
async def reranked(request: Request):
    asked, ranking = rerank.asked_of(await read_json(request))
    named(request, asked.model)
    async with holding(request, asked, kind="rerank") as held:
        result = await run_in_threadpool(rerank_on, held.resident, ranking.query, ranking.documents, top_n=ranking.top_n,
                                         return_documents=ranking.return_documents)
    return JSONResponse(rerank.answer(ranking, answered_by(request, asked, held.resident), result))


ROUTES = [reranked, also(reranked, "/rerank"), also(reranked, "/v1/reranking"), also(reranked, "/reranking"),
          also(reranked, "/v2/rerank")]
