"""The request path for one loaded model in this process: prompt tokens, the session or the prefix cache,
the engine's decode loop with the model's strategy, and the state saved after."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Optional

from ..engine import Response
from ..errors import SessionError
from .loader import Loaded
from .request import Prompt, Request, prompt_for, with_stops, with_system
from .seats import InProcess
from .sessions import Sessions, cache_skipped


def generate(loaded: Loaded, request: Request, *, on_notice: Optional[Callable[[str], None]] = None,
             cancelled: Optional[Callable[[], bool]] = None, place=None,
             on_admitted: Optional[Callable[["Prompt"], None]] = None) -> Iterator[Response]:
    """Answer `request`: continue its named session (KV state restored from disk, saved again after), or else
    look up the automatic prefix cache before prefilling and store the result after. Streams responses; the
    last one has the finish reason and stats. `place`: where it is answered (a resident server's slots; by
    default this process). `on_admitted(prompt)` hears once that the request was taken, before its first
    response: its prompt fits and it has a slot or waits for one (a request refused raises before that;
    what fails after it, a bad grammar or the server stopping, raises as well)."""
    from ..store.sessions import check_name

    engine = loaded.engine
    place = place or InProcess(loaded)
    sessions = None
    if request.session:
        check_name(request.session)
        sessions = Sessions.open(writing=request.session, on_wait=on_notice, cancelled=cancelled)  # held until closed
    elif request.use_cache and request.tokens is None:
        sessions = optional_cache(Sessions.open, on_notice)
    try:
        lora = _scales(engine, request.lora)
        if request.tokens is None:
            history = _history(sessions, request.session, engine, place.n_ctx, lora) if request.session else []
            if request.raw is None:
                request = replace(request, raw=engine.chat_template is None)
                if request.raw and on_notice:
                    on_notice(f"{loaded.name} has no chat template (a base model): running plain completion")
            request = replace(request, messages=with_system(request, loaded.system, history, loaded.messages))
            if request.think is not None and on_notice and not request.raw:
                from ..engine.thinking import has_switch

                if not has_switch(engine.chat_template):
                    # (worded for every caller: the server's dialects ask by think, thinking or reasoning_effort)
                    on_notice(f"{loaded.name}'s chat template has no thinking switch: asking it "
                              f"{'to think' if request.think else 'not to think'} changes nothing")
        prompt = prompt_for(engine, request, n_ctx=place.n_ctx)
        sampling = request.sampling
        if sampling.grammar is not None or sampling.json_schema is not None or sampling.logit_bias:
            # What llama.cpp may refuse (a grammar that does not parse, a token out of the vocabulary) is refused
            # before the request is taken: an HTTP client gets its 400, not a 200 stream that ends in an error.
            from ..engine.sampling import Sampler

            Sampler(engine, sampling).close()
        admitted = False

        def admit() -> None:
            nonlocal admitted
            if on_admitted is not None and not admitted:
                on_admitted(prompt)
            admitted = True

        def waiting() -> None:
            admit()
            if on_notice:
                on_notice(f"every slot of {loaded.name} on the server is busy: waiting for one")

        snapshot = None
        with place.hold(prompt.tokens, on_wait=waiting, cancelled=cancelled, lora=lora) as seat:
            admit()
            if not request.use_cache and not request.session:
                seat.reset()  # --no-cache: from an empty context, as a freshly loaded model starts
            if request.session and history:
                sessions.load(request.session, engine, seat, on_notice=on_notice)
            elif sessions is not None and not request.session:
                optional_cache(lambda: sessions.lookup_prefix(engine, prompt.tokens, on_notice=on_notice, seat=seat), on_notice)
            answer: list[str] = []
            final = None
            responses = seat.generate(prompt.tokens, with_stops(request.sampling, prompt.stops), cancelled=cancelled,
                                      thinking=prompt.splitter(request.sampling), top_logprobs=request.top_logprobs,
                                      draft_max=request.draft_max)
            for response in responses:
                answer.append(response.text)
                if response.done:
                    final = response
                yield response
            if final is None or sessions is None or final.finish_reason in ("interrupted", "error", "shutdown"):
                return
            if request.session:
                messages = request.messages + [{"role": "assistant", "content": "".join(answer)}]
                from .images import stored

                sessions.save(request.session, engine, stored(messages), model_ref=loaded.ref, seat=seat)
                return
            # Only what must be read from the seat while it is held: which chunks the cache lacks (the index),
            # and the KV state when it lacks any.
            snapshot = optional_cache(lambda: sessions.prefix_snapshot(engine, seat), on_notice)
        # The seat is given back first: a server's next request (an agent's next turn) takes the slot while
        # this answer's chunks are cut and written. In a server they are written on a thread of their own, so
        # that the request is over now; in this process (a run that exits next) before it returns.
        if snapshot is not None:
            if isinstance(place, InProcess):
                optional_cache(lambda: sessions.store_prefix(engine, snapshot), on_notice)
            else:
                optional_cache(lambda: sessions.store_prefix_later(engine, snapshot, on_notice), on_notice)
    finally:
        if sessions is not None:
            sessions.close()


def _scales(engine, asked: Optional[Sequence[float]]) -> tuple[float, ...]:
    """The LoRA scales a request is answered under: those it asks for (one per adapter the model loaded), else the
    model's own."""
    if asked is None:
        return tuple(engine.lora_defaults)
    from .lora import check_scales

    return check_scales(engine, asked)


def _history(sessions: Sessions, name: str, engine, n_ctx: int, lora: Sequence[float] = ()) -> list[dict]:
    """A session's messages (its KV state is restored once the prompt is known); none for a new session."""
    try:
        sessions.show(name)
    except SessionError:
        return []  # a new session: created after this answer
    from .images import live

    return live(sessions.messages(name, engine, n_ctx, lora))  # refused here when made by another model or settings; images as chat keeps them


def optional_cache(action, on_notice):
    """The prefix cache only saves time: when its index is damaged or its disk full, say so once and answer
    without it. (A model file removed during the answer is no failure: its cache is skipped quietly.)"""
    try:
        return action()
    except (SessionError, sqlite3.DatabaseError, OSError) as exc:
        if on_notice:
            on_notice(cache_skipped(exc))
        return None
