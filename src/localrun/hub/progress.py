"""Byte progress of a pull on stderr: one Rich row per file, or a callable that hears each change (the server's
/api/pull streams them), or nothing."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from ..console import err

# What `pull(progress=...)` takes: True draws the bars, False nothing; a callable hears (file, total bytes, bytes done).
Progress = Union[bool, Callable[[str, Optional[int], int], None]]


class Bars:
    """Byte progress on stderr with Rich, one row per file; does nothing when disabled.

    huggingface_hub draws its own tqdm bars unless given a `tqdm_class`; `tqdm_class(task)` returns a class with the
    part of tqdm's interface that its HTTP and Xet downloaders use, so their byte counts land in a Rich row and no
    tqdm output appears (also when progress is off).
    """

    def __init__(self, enabled: Progress):
        """`enabled`: True draws the bars, False nothing; a callable gets (file, total bytes, bytes done)
        instead, at each change (the server's /api/pull streams them)."""
        self._progress: Any = None
        self._report = enabled if callable(enabled) else None
        self._rows: dict[int, list] = {}  # reporting: task -> [name, total, completed]
        if enabled is True:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=err.real(),
            )

    def __enter__(self) -> Bars:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _row(self, task: Optional[int], *, total: Optional[int] = None, advance: int = 0, completed: Optional[int] = None) -> None:
        if self._report is None or task not in self._rows:
            return
        row = self._rows[task]
        row[1] = total if total is not None else row[1]
        row[2] = completed if completed is not None else row[2] + advance
        if row[1] is not None:
            row[2] = min(row[2], row[1])  # as the bars show it: huggingface_hub may count a resent chunk twice
        self._report(row[0], row[1], row[2])

    def add(self, name: str, total: Optional[int]) -> Optional[int]:
        if self._report is not None:
            task = len(self._rows)
            self._rows[task] = [name, total, 0]
            self._row(task)
            return task
        if self._progress is None:
            return None
        from rich.markup import escape

        return self._progress.add_task(escape(name), total=total, name=escape(name))

    def advance(self, task: Optional[int], n: int) -> None:
        self._row(task, advance=n)
        if task is not None and self._progress is not None:
            self._progress.advance(task, n)

    def set_total(self, task: Optional[int], total: Optional[int]) -> None:
        if total is not None:
            self._row(task, total=total)
        if task is not None and total is not None and self._progress is not None:
            self._progress.update(task, total=total)

    def restart(self, task: Optional[int]) -> None:
        self._row(task, completed=0)
        if task is not None and self._progress is not None:
            self._progress.update(task, description=self._progress.tasks[task].fields["name"], completed=0)

    def verifying(self, task: Optional[int], total: Optional[int]) -> None:
        if task is not None and self._progress is not None:
            name = self._progress.tasks[task].fields["name"]
            self._progress.update(task, description=f"{name} [dim]verifying[/dim]", completed=0, total=total)

    def done(self, task: Optional[int]) -> None:
        if self._report is not None and task in self._rows:
            self._row(task, completed=self._rows[task][1] or self._rows[task][2])
        if task is not None and self._progress is not None:
            t = self._progress.tasks[task]
            self._progress.update(task, description=f"{t.fields['name']} [ok]verified[/ok]", completed=t.total)

    def tqdm_class(self, task: Optional[int]) -> type:
        bars = self

        class _HubBar:
            def __init__(self, *args: object, total: Optional[int] = None, initial: int = 0, **kwargs: object):
                self.n = initial
                self._total = total
                bars.set_total(task, total)
                bars.advance(task, initial)

            @property
            def total(self) -> Optional[int]:
                return self._total

            @total.setter
            def total(self, value: Optional[int]) -> None:
                self._total = value
                bars.set_total(task, value)

            def __enter__(self) -> _HubBar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def update(self, n: int = 1) -> None:
                self.n += n
                bars.advance(task, n)

            # Xet reports network bytes separately (smaller than the file after dedup); the row counts file bytes.
            def update_transfer(self, n: int = 1) -> None:
                return None

            def set_postfix_str(self, *args: object, **kwargs: object) -> None:
                return None

            set_transfer_postfix_str = set_postfix_str

            def refresh(self) -> None:
                return None

            def close(self) -> None:
                return None

        return _HubBar
