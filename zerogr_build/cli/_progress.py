"""base.progress.Progress rendered on stderr: rich bars on a terminal, one line per stage in logs."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from ..base.progress import NullProgress
from ._render import stderr_console


class RichProgress:
    """zerogr_build.base.progress.Progress rendered as rich progress bars on stderr (one line per stage)."""

    def __init__(self, console: Console) -> None:
        self._bars = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._finish_task()
        else:  # keep stderr to the one error line: drop the unfinished bars instead of printing them
            for task in self._bars.tasks:
                self._bars.update(task.id, visible=False)
            self._bars.live.transient = True
        self._bars.stop()

    def _finish_task(self) -> None:
        if self._task is not None:
            task = self._bars.tasks[self._task]
            done = task.total if task.total is not None else max(task.completed, 1)
            self._bars.update(self._task, total=done, completed=done)
            self._task = None

    def stage(self, name: str, total: float | None = None) -> None:
        self._finish_task()
        self._task = self._bars.add_task(name, total=total)

    def advance(self, n: float = 1) -> None:
        if self._task is not None:
            self._bars.advance(self._task, n)


HEARTBEAT_SECONDS = 10.0
"""A stage that runs longer than this gets a plain progress line at most this often (long tunes in cron)."""


class LineProgress:
    """Progress for a non-terminal stderr (cron logs, CI): one plain line per finished stage, and in a
    long stage a line with its progress at most every `heartbeat` seconds, so a log never goes silent."""

    def __init__(self, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self._stage: str | None = None
        self._started = 0.0
        self._done = 0.0
        self._total: float | None = None
        self._heartbeat = heartbeat
        self._last_line = 0.0

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._finish()

    def _finish(self) -> None:
        if self._stage is not None:
            done = f" ({self._done:,.0f})" if self._done else ""
            sys.stderr.write(
                f"zerogr: {self._stage} done in {time.perf_counter() - self._started:.2f} s{done}\n"
            )
            self._stage = None

    def stage(self, name: str, total: float | None = None) -> None:
        self._finish()
        self._stage, self._started, self._done, self._total = name, time.perf_counter(), 0.0, total
        self._last_line = self._started

    def advance(self, n: float = 1) -> None:
        self._done += n
        now = time.perf_counter()
        if self._stage is not None and now - self._last_line >= self._heartbeat:
            self._last_line = now
            of = f" of {self._total:,.0f}" if self._total else ""
            sys.stderr.write(
                f"zerogr: {self._stage}: {self._done:,.0f}{of} after {now - self._started:.0f} s\n"
            )


class QuietProgress(NullProgress):
    """NullProgress usable as a context manager, like the other two."""

    def __enter__(self) -> QuietProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_for(quiet: bool) -> RichProgress | LineProgress | QuietProgress:
    """The renderer a command uses: nothing when quiet, else bars on a terminal, lines otherwise."""
    if quiet:
        return QuietProgress()
    console = stderr_console()
    return RichProgress(console) if console.is_terminal else LineProgress()
