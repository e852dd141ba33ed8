"""The request path for one loaded model in this process: prompt tokens, the session or the prefix cache,
the engine's decode loop with the model's strategy, and the state saved after."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from collections.abc import Callable, Iterator
from typing import Optional

from ..engine import Response, generate as engine_generate
from ..errors import SessionError
from .loader import Loaded
from .request import Request, prompt_for, with_stops, with_system
from .sessions import Sessions


def generate(loaded: Loaded, request: Request, *, on_notice: Optional[Callable[[str], None]] = None,
             cancelled: Optional[Callable[[], bool]] = None) -> Iterator[Response]:
    """Answer `request`: continue its named session (KV state restored from disk, saved again after), or else
    look up the automatic prefix cache before prefilling and store the result after. Streams responses; the
    last one has the finish reason and stats."""
    from ..store.sessions import check_name

    engine = loaded.engine
    sessions = None
    if request.session:
        check_name(request.session)
        sessions = Sessions.open()
    elif request.use_cache and request.tokens is None:
        sessions = optional_cache(Sessions.open, on_notice)
    try:
        if request.tokens is None:
            history = _history(sessions, request.session, engine) if request.session else []
            if request.raw is None:
                request = replace(request, raw=engine.chat_template is None)
                if request.raw and on_notice:
                    on_notice(f"{loaded.name} has no chat template (a base model): running plain completion")
            request = replace(request, messages=with_system(request, loaded.system, history))
            if request.think is not None and on_notice and not request.raw:
                from ..engine.thinking import has_switch

                if not has_switch(engine.chat_template):
                    on_notice(f"{loaded.name}'s chat template has no thinking switch: --{'' if request.think else 'no-'}think changes nothing")
        prompt = prompt_for(engine, request)
        if sessions is not None and not request.session:
            optional_cache(lambda: sessions.lookup_prefix(engine, prompt.tokens, on_notice=on_notice), on_notice)
        answer: list[str] = []
        final = None
        for response in engine_generate(engine, prompt.tokens, with_stops(request.sampling, prompt.stops),
                                        strategy=loaded.strategy, cancelled=cancelled, thinking=prompt.splitter(request.sampling)):
            answer.append(response.text)
            if response.done:
                final = response
            yield response
        if final is None or sessions is None or final.finish_reason == "interrupted":
            return
        if request.session:
            messages = request.messages + [{"role": "assistant", "content": "".join(answer)}]
            sessions.save(request.session, engine, messages, model_ref=loaded.ref)
        else:
            optional_cache(lambda: sessions.save_prefix(engine), on_notice)
    finally:
        if sessions is not None:
            sessions.close()


def _history(sessions: Sessions, name: str, engine) -> list[dict]:
    """A session's messages, its KV state restored into the engine; none for a new session."""
    try:
        sessions.show(name)
    except SessionError:
        return []  # a new session: created after this answer
    return sessions.load(name, engine)


def optional_cache(action, on_notice):
    """The prefix cache only saves time: when its index is damaged, say so once and answer without it."""
    try:
        return action()
    except (SessionError, sqlite3.DatabaseError) as exc:
        if on_notice:
            on_notice(f"prefix cache skipped: {getattr(exc, 'message', exc)}")
        return None
