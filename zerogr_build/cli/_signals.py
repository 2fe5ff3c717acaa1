"""SIGTERM and SIGHUP end a command the way Ctrl-C does: through its `finally` blocks (the metrics file is
written, temp files are removed), with exit code 128 + the signal number (143 for SIGTERM), as a shell
reports a process the signal killed.

Python runs a signal handler only between bytecodes of the main thread: a main thread blocked in native code
(a storage client retrying a read for minutes) cannot raise there, and threads stuck in a read can keep the
interpreter from exiting once it has. So the signal also wakes a watchdog thread (signal.set_wakeup_fd),
which gives the command GRACE_SECONDS to end; past that it calls the command's `on_forced_exit(signum)`
(which writes the metrics file), prints one line and ends the process with the same exit code, its
remaining `finally` blocks not run (as a kill would leave them).

Before a command's own handlers exist, from the first line of `zerogr`'s main (ahead of the heavy imports),
`install_startup_handlers` makes the same signals end the process at once with 128 + N, after writing the
--metrics-file named in its arguments (cli/_early_metrics.py); so the window in which a signal ends zerogr
with its default action and leaves the previous run's metrics is the interpreter's own start. Once a run
has written its metrics (`run_ended`), they end the process with that run's exit status instead, leaving
its metrics file as it is; and once the interpreter starts its last clean-up (the last atexit callback),
they are ignored: Python puts the default actions back while it shuts down, and a signal then would
end the process as killed by it, not with the status its metrics file holds.

Within a command's block a signal raises Terminated once; a second one while the first unwinds is left to
the watchdog, so an `except` block that handles the first (writing the one line) is never cut short."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from ._early_metrics import write_terminated

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)
GRACE_SECONDS = 10.0
#: What the start-up handlers know: the raw arguments, when the process started (time.time()), whether a
#: command's block has begun (a signal is then no longer "during start-up"), whether a block received a
#: signal (the run is ending by it), and the exit status of a run that has written its metrics (None before).
_STARTUP: dict[str, object] = {"args": (), "started": 0.0, "began": False, "signalled": False, "ended": None}
_AT_EXIT: list[bool] = []  # the atexit callback, registered once per process


def signal_name(signum: int) -> str:
    """SIGTERM for 15; "signal N" for a number that names no signal here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM or SIGHUP arrives."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        self.name = signal_name(signum)
        super().__init__(f"terminated by {self.name}")


class Received:
    """The signal a command's block received (signals_as_interrupts yields it): `signum`, None before."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def handler(self, signum: int, _frame: object) -> None:
        """The block's handler: Terminated for the first signal; later ones are the watchdog's."""
        if self.signum is None:
            self.signum = signum
            _STARTUP["signalled"] = True
            raise Terminated(signum)


def install_startup_handlers(args: Sequence[str]) -> None:
    """From now on (until a command's signals_as_interrupts, and again after it), SIGTERM and SIGHUP end the
    process at once: with 128 + N after writing the --metrics-file of `args` (the raw command line), or,
    once a run has written its metrics (run_ended), with that run's exit status. Main thread only."""
    _STARTUP.update(args=tuple(args), started=time.time(), began=False, signalled=False, ended=None)
    for s in SIGNALS:
        signal.signal(s, _end_at_once)
    if not _AT_EXIT:  # registered first, so it runs last
        _AT_EXIT.append(True)
        atexit.register(_ignore_once_ended)


def _ignore_once_ended() -> None:
    """The last atexit callback: once a run has ended, SIGTERM and SIGHUP are ignored for the rest of the
    shut-down (the interpreter would put their default actions back), so its exit status stands."""
    if isinstance(_STARTUP["ended"], int):
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def run_ended(exit_status: int) -> None:
    """A command's run has written its metrics file with `exit_status`: a later SIGTERM or SIGHUP ends the
    process with that status, the file left as it is."""
    _STARTUP["ended"] = exit_status


def _end_at_once(signum: int, _frame: object) -> None:
    ended = _STARTUP["ended"]
    if isinstance(ended, int):
        _exit_now(ended)
    if _STARTUP["signalled"]:  # a block is ending by an earlier signal: its line and metrics are on the way
        return
    name = signal_name(signum)
    when = "" if _STARTUP["began"] else " during start-up"
    try:
        write_terminated(_STARTUP["args"], signum, name, _STARTUP["started"], when)  # type: ignore[arg-type]
        line = f"zerogr: terminated by {name}{when}\n"
    except OSError as exc:
        line = f"zerogr: terminated by {name}{when}; could not write the metrics file: {exc}\n"
    with contextlib.suppress(Exception):
        sys.stderr.write(line)
    _exit_now(128 + signum)


def _exit_now(code: int) -> None:
    """End the process with `code` at once (os._exit), what was printed flushed first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def signals_as_interrupts(
    on_forced_exit: Callable[[int], None] | None = None, grace: float = GRACE_SECONDS
) -> Iterator[Received]:
    """Within the block, the first SIGTERM or SIGHUP raises Terminated (later ones are left to the
    watchdog); the previous handlers come back after it. Yields the Received that names the signal once
    one came. After such a signal the watchdog (module docstring) ends the process `grace` seconds later
    unless it has ended by then, calling on_forced_exit(signum) first. Off the main thread (where Python
    cannot set handlers) it does nothing; without a free wakeup fd (another library holds it) there is no
    watchdog."""
    received = Received()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    _STARTUP["began"] = True
    watchdog = _Watchdog(on_forced_exit, grace)
    previous = {s: signal.signal(s, received.handler) for s in SIGNALS}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        watchdog.disarm()


class _Watchdog:
    """A daemon thread woken through the signal wakeup fd: after SIGTERM or SIGHUP it waits `grace` seconds,
    then calls on_forced_exit(signum) and os._exit(128 + signum). `disarm()` before a signal stops it."""

    def __init__(self, on_forced_exit: Callable[[int], None] | None, grace: float) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        if self.previous_fd != -1:  # someone else's (an event loop's): theirs stays, no watchdog
            signal.set_wakeup_fd(self.previous_fd)
            self._close(self.read_fd, self.write_fd)
            self.read_fd = self.write_fd = -1
            return
        thread = threading.Thread(
            target=self._run, args=(on_forced_exit, grace), name="zerogr-signal-watchdog", daemon=True
        )
        thread.start()

    def _run(self, on_forced_exit: Callable[[int], None] | None, grace: float) -> None:
        signum = None
        while signum is None:
            data = os.read(self.read_fd, 64)
            if not data or 0 in data:  # disarmed
                os.close(self.read_fd)
                return
            signum = next((n for n in data if n in SIGNALS), None)
        # The read end stays open until the process ends: a later signal's write to the wakeup fd would
        # otherwise fail with EPIPE, which Python reports on stderr with a traceback.
        time.sleep(grace)
        name = signal_name(signum)
        try:
            if on_forced_exit is not None:
                on_forced_exit(signum)
            sys.stderr.write(f"zerogr: terminated by {name}: not ended within {grace:g} s, ending now\n")
            sys.stderr.flush()
        finally:
            os._exit(128 + signum)

    def disarm(self) -> None:
        """Give the wakeup fd back and stop the thread, unless a signal already armed it."""
        if self.write_fd == -1:
            return
        signal.set_wakeup_fd(self.previous_fd)
        with contextlib.suppress(OSError):
            os.write(self.write_fd, b"\0")
        self._close(self.write_fd)

    @staticmethod
    def _close(*fds: int) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def interrupt_exit_code(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 128 + N for a signal turned into Terminated."""
    return getattr(exc, "exit_code", 130)
