"""SIGTERM and SIGHUP end a command the way Ctrl-C does: through its `finally` blocks (the metrics file is
written, temp files are removed), with exit code 128 + the signal number (143 for SIGTERM), as a shell
reports a process the signal killed."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM or SIGHUP arrives."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        self.name = signal.Signals(signum).name
        super().__init__(f"terminated by {self.name}")


def _raise(signum: int, _frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Terminated; the previous handlers come back after it.
    Off the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 128 + N for a signal turned into Terminated."""
    return getattr(exc, "exit_code", 130)
