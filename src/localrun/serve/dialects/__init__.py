"""The dialects: one module each, a pure translator from its wire body to localrun's own request (serve.asked) and
from the answer's events (serve.stream.Event) to its wire format, with its error shape. None imports another, none
imports Starlette (tests/test_architecture.py); serve/routes serves them.

    openai      /v1/chat/completions, /v1/completions, /v1/embeddings
    anthropic   /v1/messages (Claude Code, the anthropic SDKs)
    responses   /v1/responses (Codex, the Responses modes of LangChain and pydantic-ai)
    ollama      /api/chat, /api/generate, /api/embed (ollama_models: /api/create, /api/copy)
    native      /api/run, /api/converse: localrun's own, for `run` and `chat` (the resident server's socket only)
    llama       llama-server's own: /completion, /infill, /tokenize, /detokenize, /props, /lora-adapters
    rerank      /v1/rerank, /rerank (llama-server's, Jina's, Cohere's, TEI's forms)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import anthropic, llama, ollama, openai, rerank
from ..errors import Fault


def speaks_anthropic(path: str, headers: Mapping) -> bool:
    """Whether a request is Anthropic's: under /v1/messages, or from Anthropic's clients anywhere (they send
    anthropic-version, also to /v1/models, which both dialects share). `headers`: ASGI's (bytes) or Starlette's."""
    return path.startswith("/v1/messages") or any(
        (k.lower() if isinstance(k, str) else k.lower().decode("latin-1")) == "anthropic-version" for k in headers.keys())


def shape_for(path: str, headers: Mapping) -> Any:
    """The error shape of the dialect a request speaks by its path (and Anthropic's clients by their headers)."""
    if path.startswith("/api/"):
        return ollama
    if path in LLAMA_PATHS:
        return llama
    if path.rstrip("/").endswith(("/rerank", "/reranking")):
        return rerank
    return anthropic if speaks_anthropic(path, headers) else openai


# llama-server's own paths: refused before a route (no key, a body too large) in its shape
LLAMA_PATHS = frozenset({"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/props", "/slots",
                         "/lora-adapters"})


def error_bytes(path: str, headers: Mapping, fault: Fault) -> bytes:
    """A refusal made before any route (no key, a body too large, no such path) in the shape of the path's dialect."""
    _, body = shape_for(path, headers).error_shape(fault)
    return json.dumps(body).encode()
