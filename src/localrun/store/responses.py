"""Stored responses of the OpenAI Responses API (`store: true`, its default): the conversation that led to
each and its answer, and the Response object the client was given, one JSON file per response id under
LOCALRUN_HOME/responses, so that a `previous_response_id` still continues after the server restarts (its
KV state comes back through the prefix cache) and `GET /v1/responses/{id}` still finds it. Written
atomically; the newest KEEP are kept."""

from __future__ import annotations

import json
import sys
import re
from pathlib import Path
from typing import Optional

from .files import atomic_write_bytes
from .paths import home

KEEP = 1024  # stored responses kept on disk, the least recently written dropped first
_ID = re.compile(r"^resp_[0-9a-f]{24}$")  # what this server hands out: nothing else names a file


def folder() -> Path:
    return home() / "responses"


def save_response(rid: str, messages: list[dict], response: Optional[dict] = None, keep: int = KEEP,
                  input_items: Optional[list[dict]] = None) -> None:
    """Store response `rid`: its conversation (its messages, the answer last), the Response object it was
    answered with and its request's input items (for GET .../input_items); drop the oldest beyond `keep`."""
    if not _ID.match(rid):
        raise ValueError(f"not a response id: {rid!r}")
    where = folder()
    where.mkdir(parents=True, exist_ok=True)
    record = {"messages": messages, "response": response, "input": input_items}
    atomic_write_bytes(where / f"{rid}.json", json.dumps(record, ensure_ascii=False).encode("utf-8"))
    stored = _by_age()
    for old in stored[: max(0, len(stored) - keep)]:
        old.unlink(missing_ok=True)


def load_response(rid: str) -> Optional[tuple[list[dict], Optional[dict], Optional[list[dict]]]]:
    """Stored response `rid`: (its conversation, the Response object it was answered with, its input items;
    either of the last two None in a file written before it was kept), or None when it was not stored (or
    is no longer, or is unreadable)."""
    if not _ID.match(rid):
        return None
    path = folder() / f"{rid}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return _unreadable(path, exc)
    if isinstance(record, list):  # written before the Response object was kept beside the conversation
        record = {"messages": record, "response": None}
    if not isinstance(record, dict):
        return _unreadable(path, "not a stored response")
    messages, response, items = record.get("messages"), record.get("response"), record.get("input")
    if not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
        return _unreadable(path, "no messages")
    listed = isinstance(items, list) and all(isinstance(i, dict) for i in items)
    return messages, response if isinstance(response, dict) else None, items if listed else None


_said: set = set()


def _unreadable(path: Path, why) -> None:
    """A stored response that cannot be read (damaged, truncated): answered as not stored, said once in the log."""
    if path not in _said:
        _said.add(path)
        print(f"warning: the stored response {path} is unreadable ({why}): it is answered as not found; delete it",
              file=sys.stderr, flush=True)
    return None


def delete_response(rid: str) -> bool:
    """Forget stored response `rid`; whether there was one."""
    if not _ID.match(rid):
        return False
    try:
        (folder() / f"{rid}.json").unlink()
    except FileNotFoundError:
        return False
    return True


def _by_age() -> list[Path]:
    """The stored responses' files, the least recently written first (one deleted meanwhile left out)."""
    stored = []
    for path in folder().glob("resp_*.json") if folder().is_dir() else []:
        try:
            stored.append((path.stat().st_mtime_ns, path))
        except OSError:  # deleted meanwhile
            continue
    return [path for _, path in sorted(stored)]


def response_items(input_items: Optional[list], response: Optional[dict]) -> list[dict]:
    """The items of a stored response an item_reference may name: its input items and its output, each with an
    id (a reference itself is not one)."""
    return [item for item in [*(input_items or []), *((response or {}).get("output") or [])]
            if isinstance(item, dict) and isinstance(item.get("id"), str) and item.get("type") != "item_reference"]


def item_index() -> dict[str, str]:
    """item id -> the stored response holding it (an input or an output item), read from every stored response
    once (the server keeps it from then on): what an item_reference after a restart is looked up in."""
    index: dict[str, str] = {}
    for path in _by_age():  # the newest last: an id in two responses names the newest's
        found = load_response(path.stem)
        if found is not None:
            index.update((item["id"], path.stem) for item in response_items(found[2], found[1]))
    return index


def response_item(rid: str, item_id: str) -> Optional[dict]:
    """Item `item_id` of stored response `rid` (its input or output), or None."""
    found = load_response(rid)
    return next((item for item in response_items(found[2], found[1]) if item["id"] == item_id), None) if found else None
