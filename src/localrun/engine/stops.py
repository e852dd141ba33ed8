"""Stop sequences over streamed text: emit everything that cannot be the start of a stop, hold back the rest."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import Phrase, UsageError


class StopMatcher:
    """Feed decoded text piece by piece; get back the text that is safe to show.

    Only a suffix of the pending text that is a prefix of some stop sequence is held back, so
    nothing is delayed longer than needed, and a stop split across tokens (or across the bytes
    of a multi-byte character, once decoded) is still found. The stop text and anything after
    it are never returned.
    """

    def __init__(self, stops: Iterable[str]):
        self.stops = tuple(dict.fromkeys(s for s in stops))
        for s in self.stops:
            if not s:
                raise UsageError(Phrase("empty stop sequence: give {stop} a non-empty string"))
        self._pending = ""
        self.stopped: str | None = None  # the stop sequence that ended the text, once found

    def feed(self, text: str) -> str:
        """Add `text`; return what can be emitted now ('' once stopped)."""
        if self.stopped is not None:
            return ""
        buf = self._pending + text
        cut, which = _earliest_stop(buf, self.stops)
        # A longer stop that starts before the one found may still complete: hold from its start.
        hold = _earliest_partial_start(buf, self.stops, cut if which is not None else len(buf))
        if which is not None and hold is None:
            self.stopped = which
            self._pending = ""
            return buf[:cut]
        if hold is None:
            hold = len(buf)
        self._pending = buf[hold:]
        return buf[:hold]

    def flush(self) -> str:
        """End of stream: release what was held back, up to a stop that did complete in it."""
        out, self._pending = self._pending, ""
        if self.stopped is not None:
            return ""
        cut, which = _earliest_stop(out, self.stops)
        if which is not None:
            self.stopped = which
            return out[:cut]
        return out

    @property
    def held(self) -> str:
        return self._pending


def _earliest_stop(buf: str, stops: tuple[str, ...]) -> tuple[int, str | None]:
    best, which = len(buf) + 1, None
    for s in stops:
        i = buf.find(s)
        if i != -1 and (i < best or (i == best and which is not None and len(s) > len(which))):
            best, which = i, s
    return best, which


def _earliest_partial_start(buf: str, stops: tuple[str, ...], limit: int) -> int | None:
    """The first position j < limit where buf[j:] is a proper prefix of some stop (it may still become one)."""
    longest = max(len(s) for s in stops) if stops else 0
    for j in range(max(0, len(buf) - longest + 1), min(limit, len(buf))):
        tail = buf[j:]
        if any(len(s) > len(tail) and s.startswith(tail) for s in stops):
            return j
    return None
