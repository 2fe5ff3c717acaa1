"""A tiny progress protocol, so library code can report long work without printing (the CLI renders it)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives the stages of a long job. `stage` starts a new stage (total units if known); `advance`
    moves the current stage forward by n units."""

    def stage(self, name: str, total: float | None = None) -> None: ...

    def advance(self, n: float = 1) -> None: ...


class NullProgress:
    """Progress that goes nowhere (the default for library calls)."""

    def stage(self, name: str, total: float | None = None) -> None:
        pass

    def advance(self, n: float = 1) -> None:
        pass


NULL_PROGRESS = NullProgress()
