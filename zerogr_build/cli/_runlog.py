"""A run's log lines tagged with its run id: while a `zerogr rebuild` runs, every line it writes to a
stderr that is not a terminal (a cron log) starts with the run id, its progress, warnings and errors
included, so the lines of two runs in one log file can be told apart."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO


class PrefixedLines:
    """A text stream that writes `prefix` at the start of every line into `stream`."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self.stream, self.prefix = stream, prefix
        self._line_start = True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            if self._line_start:
                pieces.append(self.prefix)
            pieces.append(piece)
            self._line_start = piece.endswith(("\n", "\r"))
        self.stream.write("".join(pieces))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> object:  # encoding, errors, ... of the stream underneath
        return getattr(self.stream, name)


@contextlib.contextmanager
def run_id_on_stderr(run_id: str) -> Iterator[None]:
    """Prefix every stderr line with `run_id` while the block runs (not on a terminal: bars stay bars)."""
    original = sys.stderr
    if original is None or original.isatty():
        yield
        return
    sys.stderr = PrefixedLines(original, f"{run_id} ")  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = original
