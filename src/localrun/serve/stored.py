"""The Responses API's responses, kept: the last few hundred in memory whatever `store` says (a client that sends
`previous_response_id` expects it to be found), and those stored (`store` true, its default) on disk too
(store.responses), so that they continue after a restart and GET /v1/responses/{id} reads them."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Optional

from ..store.responses import delete_response, item_index, load_response, response_item, response_items, save_response

KEPT = 256  # responses kept in memory for previous_response_id
STORED = 1024  # and on disk (store.responses.KEEP)


class Kept:
    """Recent responses by id: the conversation that led to each with its answer (for previous_response_id,
    whatever `store` said) and, for those stored, the Response object (for GET /v1/responses/{id}) and the
    request's input items (for GET .../input_items); in memory, and the stored ones on disk too. A stored
    response still being answered reads as in progress."""

    def __init__(self, size: int = KEPT):
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()
        self.deleted: OrderedDict = OrderedDict()  # ids deleted while being answered or written
        self.running: dict[str, tuple[dict, list[dict]]] = {}  # stored responses being answered: (in-progress Response, input items)
        self.by_item: OrderedDict = OrderedDict()  # item id -> the item, of the stored responses' input and output (item_reference)
        self.item_ids: dict[str, list[str]] = {}  # stored response id -> its items' ids (what a delete forgets)
        self.on_disk: Optional[OrderedDict] = None  # item id -> stored response id, read from the disk at the first miss

    def begin(self, rid: str, response: dict, input_items: Optional[list[dict]] = None) -> None:
        """Stored response `rid` is being answered: GET reads `response` (status in_progress) until it ends."""
        with self.lock:
            self.running[rid] = (response, input_items or [])
            while len(self.running) > self.size:  # one whose end never came (a stream never started) goes first
                self.running.pop(next(iter(self.running)))

    def end(self, rid: str) -> None:
        """Response `rid` is no longer being answered (kept by `put`, or failed: then it is not kept)."""
        with self.lock:
            self.running.pop(rid, None)

    def put(self, rid: str, messages: list[dict], store: bool = True, response: Optional[dict] = None,
            input_items: Optional[list[dict]] = None) -> None:
        with self.lock:
            self.running.pop(rid, None)
            if rid in self.deleted:  # deleted while it was being answered
                return
            self.items[rid] = (messages, response, input_items or []) if store else (messages, None, None)
            while len(self.items) > self.size:
                self.items.popitem(last=False)
            if store:
                for item in response_items(input_items, response):
                    self._remember(item, rid)
                    if self.on_disk is not None:  # (once read, the disk's index follows what is stored)
                        self.on_disk[item["id"]] = rid
                while self.on_disk is not None and len(self.on_disk) > STORED * 64:
                    self.on_disk.popitem(last=False)
        if store:  # written beside the answer, not before it: a slow disk holds up no client
            threading.Thread(target=self._store, args=(rid, messages, response, input_items or []),
                             name="localrun-store-response", daemon=True).start()

    def _found(self, rid: str) -> Optional[tuple[Optional[list[dict]], Optional[dict], Optional[list[dict]]]]:
        """(the conversation, the Response object, the input items; the last two None when not stored) of
        response `rid`: from memory, else from the disk; no conversation while a stored one is being answered."""
        with self.lock:
            found = self.items.get(rid)
            running = self.running.get(rid)
        if found is not None:
            return found
        if running is not None:
            return None, *running
        return load_response(rid)

    def get(self, rid: str) -> Optional[list[dict]]:
        """The conversation of response `rid` with its answer, to continue from."""
        found = self._found(rid)
        return found[0] if found else None  # (None while it is being answered: not yet an answer to continue)

    def envelope(self, rid: str) -> Optional[dict]:
        """The Response object of stored response `rid` (None: unknown, not stored, or deleted)."""
        found = self._found(rid)
        return found[1] if found else None

    def input_items(self, rid: str) -> Optional[list[dict]]:
        """The input items of stored response `rid`, in the order given (None: unknown, not stored, or deleted;
        [] for one stored before they were kept)."""
        found = self._found(rid)
        return (found[2] or []) if found and found[1] is not None else None

    def _remember(self, item: dict, rid: str) -> None:
        """(the lock held) Item `item` of stored response `rid`, for item_reference: kept in memory (capped), and
        listed under `rid` for a delete to forget."""
        self.by_item[item["id"]] = item
        self.item_ids.setdefault(rid, []).append(item["id"])
        while len(self.by_item) > self.size * 8:
            self.by_item.popitem(last=False)
        while len(self.item_ids) > STORED:
            self.item_ids.pop(next(iter(self.item_ids)))

    def item(self, item_id: str) -> Optional[dict]:
        """An input or output item of a stored response by its id (what an item_reference names), in memory, else
        on the disk (after a restart); None when no stored response has it."""
        with self.lock:
            found = self.by_item.get(item_id)
        if found is not None:
            return found
        with self.lock:  # once: every miss after reads the index, not the files (a put meanwhile waits, then adds to it)
            if self.on_disk is None:
                self.on_disk = OrderedDict(item_index())
                while len(self.on_disk) > STORED * 64:
                    self.on_disk.popitem(last=False)
            rid = self.on_disk.get(item_id)
        found = response_item(rid, item_id) if rid is not None else None
        if found is not None:  # read from the disk once: the next look (the request's input items) finds it here
            with self.lock:
                if rid not in self.deleted:
                    self._remember(found, rid)
        return found

    def delete(self, rid: str) -> bool:
        """Forget stored response `rid` (in memory and on disk); whether it was stored."""
        with self.lock:
            found = self.items.get(rid)
            if found is not None and found[1] is None:
                return False  # not stored: nothing to delete (it may still be continued, as OpenAI's)
            self.items.pop(rid, None)
            running = self.running.pop(rid, None) is not None
            self.deleted[rid] = True
            for item_id in self.item_ids.pop(rid, []):  # its items are no longer there to refer to
                self.by_item.pop(item_id, None)
            if self.on_disk is not None:
                for item_id in [i for i, r in self.on_disk.items() if r == rid]:
                    del self.on_disk[item_id]
            while len(self.deleted) > self.size:
                self.deleted.popitem(last=False)
        return delete_response(rid) or found is not None or running

    def _store(self, rid: str, messages: list[dict], response: Optional[dict], input_items: list[dict]) -> None:
        try:
            save_response(rid, messages, response, input_items=input_items)
        except OSError as exc:  # a full or read-only disk: the response is still kept in memory
            print(f"warning: could not store response {rid} ({exc}): it continues only while this server runs", file=sys.stderr, flush=True)
            return
        with self.lock:
            if rid in self.deleted:  # deleted while this was being written
                delete_response(rid)
