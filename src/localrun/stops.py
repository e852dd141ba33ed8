"""Stop sequences over streamed text: emit everything that cannot be the start of a stop, hold back the rest."""

from __future__ import annotations

from collections.abc import Iterable

from .errors import UsageError


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
                raise UsageError("empty stop sequence: give --stop a non-empty string")
        self._pending = ""
        self.stopped: str | None = None  # the stop sequence that ended the text, once found

    def feed(self, text: str) -> str:
        """Add `text`; return what can be emitted now ('' once stopped)."""
        if self.stopped is not None:
            return ""
        buf = self._pending + text
        cut, which = _earliest_stop(buf, self.stops)
        if which is not None:
            self.stopped = which
            self._pending = ""
            return buf[:cut]
        keep = _longest_stop_prefix_suffix(buf, self.stops)
        self._pending = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """End of stream without a stop: release what was held back."""
        out, self._pending = self._pending, ""
        return "" if self.stopped is not None else out

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


def _longest_stop_prefix_suffix(buf: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of some stop."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(buf)), longest, -1):
            if buf.endswith(s[:n]):
                longest = n
                break
    return longest
