"""`run` on a resident model: the request `localrun run` sends the resident server, answered by the same
request path a run in-process takes (runtime.generate: the session or prefix cache, the decode loop, the
save after), so that what the user sees is the same either way.

A model loaded for run/chat has its own continuous-batching scheduler and slots (the server's --parallel):
each request leases a slot for its whole length (runtime.serving.scheduler.Scheduler.hold), so sessions and the
prefix cache are restored into it and saved from it, while the slots decode together. An embeddings
context takes its requests in turn (`Exclusive` stands where a Scheduler stands, so the pool keeps,
expires and evicts every kind alike).

`chat` keeps its conversation here (`converse`): a runtime Conversation per chat, so that each turn
evaluates only what is new, as in-process. The client keeps the messages too and sends them with every
request: a conversation this server no longer has (restarted, or one of more than CONVERSATIONS_KEPT) is
rebuilt from them, and one whose tokens another run displaced from the KV cache reuses what still matches.
A message's images come as runtime.images.stored gives them (base64 bytes and sha256: the client read
the files, the bytes are what it attached, wherever this server's working folder is); the answer's messages
go back without the bytes the client sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Optional

from ...errors import UsageError
from .scheduler import ServerStopping, StepStats

# The fields of a run request on the wire (localrun's own /api/run), besides model, load and keep_alive.
RUN_FIELDS = ("messages", "raw", "system", "truncate", "session", "use_cache", "think", "template_kwargs")
RUN_ONLY = ("mmproj", "sampling", "tty")  # also on the wire: run --mmproj (a path on this machine), the sampling flags given,
# whether the client's stderr is a terminal (advice for a person: busy_notice)
# What a chat client asks of its conversation (localrun's own /api/converse).
CONVERSE_OPS = ("info", "send", "save", "load")
CONVERSATIONS_KEPT = 8  # per model: the least recently used beyond that are rebuilt from their messages


class Exclusive:
    """One request at a time on a model loaded as an embeddings context (each request is batched itself)."""

    def __init__(self) -> None:
        self.turn = threading.Lock()
        self.slots = [None]
        self.stats = StepStats()
        self.fatal: Optional[str] = None
        self.stopping = False
        self.closed = False

    def idle_slots(self) -> int:
        return 0 if self.turn.locked() else 1

    def request_stop(self) -> None:
        self.stopping = True

    def stop(self) -> None:
        """Wait for the request in progress; the ones still waiting for their turn find the model closed
        and fail, rather than touch a freed model."""
        self.stopping = True
        with self.turn:
            self.closed = True


def wire(response) -> dict[str, Any]:
    """A response as the resident server streams it (the client makes a Response of it again)."""
    out: dict[str, Any] = {"text": response.text, "tokens": response.tokens}
    if response.thinking:
        out["thinking"] = response.thinking
    if response.progress is not None:  # a long prompt's evaluation, chunk by chunk (the client shows how far it is)
        out["progress"] = asdict(response.progress)
    if response.done:
        out["finish_reason"] = response.finish_reason
        out["stats"] = asdict(response.stats) if response.stats is not None else None
        if getattr(response.stats, "threads", None):  # what decoded it (--verbose says it): set by _settle
            out["threads"] = response.stats.threads
        if response.error:
            out["error_text"] = response.error
    return out


def busy_notice(resident, fresh: bool, tty: bool, notice: Callable[[str], None]) -> None:
    """Once, to a person at a terminal, when other processes keep the CPUs busy enough that llama.cpp's threads
    stall (engine.llama.busy_advice): measured while the model loaded (`fresh`), else since the last request.
    Said again only after a request finds the machine calm."""
    from ...engine.llama import busy_advice

    if fresh:
        advice = resident.loaded.busy
        resident.machine.busy()  # the next window starts now
    else:
        others = resident.machine.busy()
        advice = busy_advice(others, resident.engine.n_threads)
        if others is not None and advice is None:
            resident.told_busy = False
    if advice and tty and not resident.told_busy:
        resident.told_busy = True
        notice(advice)


def answer(resident, payload: dict[str, Any], *, fresh: float, on_notice: Callable[[str], None],
           cancelled: Callable[[], bool]) -> Iterator:
    """Answer a run request on `resident` (a model the pool loaded for run and chat, with its slots), as a
    run in-process would: with --no-cache from an empty slot, as a freshly loaded model starts.
    `fresh`: the seconds this request spent loading it or waiting for its load (pool.acquire; reported as its
    load duration; 0: it was already loaded)."""
    from ...engine import merge_options
    from ..generate import generate
    from ..request import Request

    unknown = set(payload) - set(RUN_FIELDS) - set(RUN_ONLY)
    if unknown:
        raise UsageError(f"unknown run request field {sorted(unknown)[0]!r}")
    loaded, scheduler = resident.loaded, resident.scheduler
    sampling = merge_options(loaded.defaults, payload.get("sampling") or {})
    fields = {k: payload[k] for k in RUN_FIELDS if k in payload}
    if payload.get("mmproj"):
        from ..images import use_projector

        use_projector(loaded.engine, payload["mmproj"], loaded.name, loaded.ref)
    if any(isinstance(m, dict) and m.get("images") for m in fields.get("messages") or ()):  # run --image: their bytes
        from ..images import live

        fields["messages"] = live(fields["messages"])
    request = Request(sampling=sampling, **fields)
    if loaded.capped:  # the --ctx this load was asked for is past the model's trained length: said to each run
        on_notice(loaded.capped)
    busy_notice(resident, fresh, bool(payload.get("tty")), on_notice)
    for response in generate(loaded, request, on_notice=on_notice, cancelled=cancelled, place=scheduler):
        if response.done:
            _settle(response, scheduler, cancelled, fresh, loaded.engine.n_threads)
        yield response


def converse(resident, payload: dict[str, Any], *, fresh: bool, put: Callable[[dict], None],
             cancelled: Callable[[], bool], gone: Callable[[], bool] = lambda: False) -> None:
    """Do what a chat client asks of its conversation on `resident`, as the REPL in-process would: `put`
    receives {"notice"}, {"warning"}, {"dropped": n}, {"progress"}, {"text"} items and the op's result. `cancelled`: the
    client asked to stop the answer (its first Ctrl-C: what was shown stays); `gone`: the client closed the
    connection (a second Ctrl-C: the REPL drops the message, and so does the conversation here and its session)."""
    from ...engine import merge_options
    from ..conversation import Conversation
    from ..images import images_in, live, live_images, stored

    op, key, messages = payload.get("op"), payload.get("conversation"), payload.get("messages")
    if op not in CONVERSE_OPS or not isinstance(key, str) or not isinstance(messages, list):
        raise UsageError(f"a conversation request needs op (one of {', '.join(CONVERSE_OPS)}), conversation and messages")
    loaded, scheduler = resident.loaded, resident.scheduler
    conv = _conversation(resident, key, lambda: Conversation(loaded, None, place=scheduler))
    with conv.busy:
        conv.mmproj = payload.get("mmproj") or None  # chat --mmproj: a path on this machine
        known = images_in(conv.messages)
        messages = live(messages, known)
        images = live_images(payload.get("images") or [], known)
        sent = {*images_in(messages), *(image.digest.hex() for image in images)}  # the client has these: not sent back

        def put_messages(item: dict) -> None:
            put({**item, "messages": stored(conv.messages, leave_out=sent)})

        if messages != conv.messages:
            conv.replace(messages)
        sampling = merge_options(loaded.defaults, payload.get("sampling") or {})
        if op == "info":
            if not conv.told:  # once a chat (it asks for its info as it starts, and again)
                conv.told = True
                if loaded.capped:
                    put({"notice": loaded.capped})
                busy_notice(resident, fresh, bool(payload.get("tty")), lambda m: put({"notice": m}))
            put({"info": {"name": loaded.name, "ref": loaded.ref, "path": str(conv.model_path), "n_ctx": conv.n_ctx,
                          "templated": conv.templated, "system": loaded.system, "messages": list(loaded.messages), "sampling": sampling.model_dump(mode="json")},
                 "kv_tokens": conv.kv_tokens, "context_used": conv.context_used()})
            return
        if op in ("save", "load"):
            said = conv.save(str(payload.get("name"))) if op == "save" else conv.load(str(payload.get("name")))
            put_messages({"said": said, "kv_tokens": conv.kv_tokens})
            return
        answer, final = conv.send(
            str(payload.get("text")), sampling, lambda piece: put({"text": piece}),
            cancelled=cancelled, on_dropped=lambda n: put({"dropped": n}),
            save_as=payload.get("session") or None, on_save_failed=lambda m: put({"warning": m}),
            on_thinking=lambda t: put({"thinking": t}), images=images, abandoned=gone,
            on_progress=lambda p: put({"progress": asdict(p)}),
        )
        _settle(final, scheduler, cancelled, fresh, loaded.engine.n_threads)
        put_messages({"done": wire(final), "kv_tokens": conv.kv_tokens})


_conversations_lock = threading.Lock()


def _conversation(resident, key: str, make: Callable[[], Any]):
    """The conversation `key` on this model (made now if it has none), as the most recently used; each has
    a lock (`busy`): one request of a chat at a time."""
    with _conversations_lock:
        kept = resident.conversations
        conv = kept.pop(key, None)
        if conv is None:
            conv = make()
            conv.busy = threading.Lock()
            conv.told = False  # what its load says to a chat (a capped context, a busy machine): said as it starts
        kept[key] = conv
        while len(kept) > CONVERSATIONS_KEPT:
            kept.popitem(last=False)
        return conv


def embed_on(resident, texts: list, *, truncate: bool = True, dimensions: Optional[int] = None):
    """Embeddings of `texts` (strings, or token id lists) on a model the pool loaded as an embeddings context
    (kind "embed"); its requests take turns, each batched (runtime.embed)."""
    from ..embed import embed

    with _turn(resident):
        return embed(resident.loaded, texts, truncate=truncate, dimensions=dimensions)


def rerank_on(resident, query: str, documents: Sequence[str], *, top_n: Optional[int] = None,
              return_documents: bool = False, truncate: bool = True):
    """Reranking (runtime.rerank) on a model the pool loaded with reranker_spec (kind "embed"): its requests take
    turns, each batched, as embeddings do."""
    from ..rerank import rerank

    with _turn(resident):
        return rerank(resident.loaded, query, documents, top_n=top_n, return_documents=return_documents, truncate=truncate)


@contextmanager
def _turn(resident) -> Iterator[Exclusive]:
    """Hold the model's one embeddings context (waiting while another request has it)."""
    runner = resident.scheduler
    with runner.turn:
        if runner.closed or runner.stopping:
            raise ServerStopping()
        runner.stats.running = 1
        try:
            yield runner
        finally:
            runner.stats.running = 0


def _settle(final, scheduler, cancelled: Callable[[], bool], fresh: float, threads: int) -> None:
    """An answer's last response as the client gets it: one the server's stop interrupted is an error
    (not a short answer), and a model that was loaded already took no load time for it; the CPU threads that
    decoded it go with its stats (wire)."""
    if final.finish_reason == "shutdown" or (final.finish_reason == "interrupted" and scheduler.stopping and not cancelled()):
        raise ServerStopping(during=True)
    if final.stats is not None:
        final.stats.threads = threads  # (not a Stats field: carried beside them on the wire, for --verbose)
        if not fresh:
            final.stats.load_s = 0.0
        elif fresh is not True:  # the seconds its request spent loading the model or waiting for its load
            final.stats.load_s = float(fresh)
