"""Follow an OUT dir's LATEST from a serving process: load each new version in the background, swap it in
once it is ready, keep serving the old one when the new one is bad.

    follower = follow("/srv/bundles", weights, device="cuda:0")   # returns once a version is live
    ...
    dec = follower.decoder                   # per request: one read, then use `dec` to the end of it
    result = dec.search(step_fn, batch_size=8, beam_width=16)
    ...
    follower.stop()                          # or `with follow(...) as follower:`

A background thread reads OUT/LATEST every `poll_seconds`. When it names another version than the one last
acted on, the follower loads that version through a HotSwap (verified, opened and streamed to the device in
the HotSwap's loader thread; on CUDA on low-priority copy streams) and swaps it in with one assignment once
the load has completed. A request that read `follower.decoder` before the swap keeps its Decoder and finishes
on the version it started with.

A version that fails to open, verify or load (a bad checksum, a broken table, a missing file, a LATEST that
names something other than a version dir, out of device memory) is never swapped in: the live version keeps
serving, one error is logged (logger "zerogr_build.follow"; the traceback at DEBUG level), `last_error` says
what failed, and the follower tries again only when LATEST changes again (a re-promoted or newer version).
A load that has not finished after `load_timeout` seconds (a hung network mount, an `on_load` that never
returns, storage that is merely slow) fails the same way: it is dropped (abandoned), left to finish on its
own, and never swapped in, and the follower goes on following. Unlike a version that failed, a version
that timed out is tried again while LATEST still names it, after a backoff that doubles from
`poll_seconds` up to RETRY_CAP_SECONDS. An abandoned load still holds its thread and the device memory it
took until it ends; at most one may still run when a new load starts, so while an abandoned load and a new
one both run, or two abandoned ones do, no further load starts: the follower waits for one to end and says
so (`waiting`, `last_error`, `abandoned_loads`). Nothing the follower meets on disk raises into the serving
process, and nothing a load raises (`SystemExit` and other BaseExceptions included) ends the polling
thread. Log lines escape control characters of what they quote from disk (`base.printable`).

Optional gauges (prometheus-client, imported only when asked for): pass `registry=` a CollectorRegistry and
the follower registers a collector read at scrape time (the zerogr_follower_* gauges listed in gauges.py).
One follower per registry (the names would collide); `stop()` unregisters it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

from ...base.errors import BundleError, InputError, one_line
from ...base.printable import printable
from ...bundle.format import LATEST_NAME, parse_version_dir
from ...bundle.versions import read_latest
from .gauges import follower_collector
from .hotswap import HotSwap, LiveVersion

log = logging.getLogger("zerogr_build.follow")

DEFAULT_POLL_SECONDS = 1.0
DEFAULT_LOAD_TIMEOUT_SECONDS = 600.0
RETRY_CAP_SECONDS = 300.0  # the longest backoff before a version that timed out is tried again
EXIT_WAIT_CAP_SECONDS = 600.0  # the longest a `with` exit waits for a load in progress
WAIT_SLICE_SECONDS = 0.1  # how often a wait for a load checks whether stop() was called
_NOTHING = object()  # "no LATEST acted on yet" (None is a legitimate value: LATEST absent)


class _Load(NamedTuple):
    """The follower's own load in progress (one attribute, read without a lock)."""

    path: Path
    started: float  # time.monotonic()
    deadline: float | None  # time.monotonic() when load_timeout runs out; None: no limit


class _Retry(NamedTuple):
    """A version whose load timed out: tried again at `due` (time.monotonic()) while LATEST names it."""

    name: str
    due: float
    delay: float


class Follower:
    """Serve the version OUT/LATEST names and follow it as it moves (see the module docstring).

    out: the OUT dir (its LATEST is followed; a missing OUT or LATEST is waited for).
    weights: the model's per-step output layers, as for Decoder (ignored when `hotswap` is given).
    device, decoder_kwargs: passed to each version's Decoder (plan="auto" unless given; a version served
        without its tuned plan logs one warning saying what did not match, Decoder.plan_fallback).
    poll_seconds: how often LATEST is read.
    load_timeout: seconds a version may take to load before it counts as failed and is dropped (None: no
        limit, a load that never returns then holds up every later version). A version that timed out is
        tried again with a backoff while LATEST names it.
    verify: check every structural invariant of a new version (`verify_bundle`) before loading it, not only
        the checksums `open_bundle` checks anyway. On by default: a serving host should never load a
        version whose tables break the format, whatever wrote it. (With your own `hotswap`, its loader
        decides what is checked.)
    registry: a prometheus_client CollectorRegistry to export the follower's gauges on (None: no gauges).
    hotswap: a HotSwap of your own (its loader decides what a version is); default HotSwap.for_decoder.

    Attributes read by a serving process or a health check (plain reads, no lock): `current` (the live
    LiveVersion or None), `decoder`, `version`, `last_swap_at` (unix seconds or None), `last_error` (one
    line or None), `last_error_at`, `swaps`, `failures`, `loading`, `abandoned_loads`, `waiting` (why a
    load cannot start yet, or None); `status()` returns them all as a dict.

    Leaving a `with` block stops the follower, waiting for a load in progress only as long as its
    load_timeout has left to run (at most EXIT_WAIT_CAP_SECONDS, also with no load_timeout): a load still
    running then is abandoned. `stop()` with no timeout waits for it however long it takes.
    """

    def __init__(
        self,
        out: str | Path,
        weights: Any = None,
        *,
        device: str = "cpu",
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        load_timeout: float | None = DEFAULT_LOAD_TIMEOUT_SECONDS,
        verify: bool = True,
        registry: Any = None,
        hotswap: HotSwap | None = None,
        **decoder_kwargs: Any,
    ) -> None:
        if not (isinstance(poll_seconds, (int, float)) and poll_seconds > 0):
            raise InputError(f"poll_seconds must be a number > 0, got {poll_seconds!r}")
        if load_timeout is not None and not (isinstance(load_timeout, (int, float)) and load_timeout > 0):
            raise InputError(f"load_timeout must be a number > 0 or None, got {load_timeout!r}")
        if hotswap is None:
            if weights is None:
                raise InputError("follow needs the model's weights (or hotswap=HotSwap(your_loader))")
            hotswap = HotSwap.for_decoder(weights, device, verify=verify, **decoder_kwargs)
        self.out = Path(out)
        self.poll_seconds = float(poll_seconds)
        self.load_timeout = None if load_timeout is None else float(load_timeout)
        self._hotswap = hotswap
        self._poll_lock = threading.Lock()
        # Held to start or swap in a load, and by stop() to close the HotSwap: once stop() took it, the
        # polling thread, even one that has not ended yet, starts and swaps in nothing.
        self._swap_lock = threading.RLock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: Any = _NOTHING  # the LATEST value last acted on (a name, None, or an error marker)
        self._load: _Load | None = None
        self._retry: _Retry | None = None
        self.waiting: str | None = None
        self.last_swap_at: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.swaps = 0
        self.failures = 0
        self._registry = registry
        self._collector: Any = None
        if registry is not None:
            self._collector = follower_collector(self)
            registry.register(self._collector)

    # ------------------------------------------------------------------ what is live
    @property
    def current(self) -> LiveVersion | None:
        """The live version (None until the first load succeeded). Read it once per request."""
        return self._hotswap.current

    @property
    def decoder(self) -> Any:
        """The live version's Decoder (RuntimeError before the first version is live). Read it once per
        request and use that object to the end of the request."""
        live = self._hotswap.current
        if live is None:
            why = printable(self.last_error)
            raise RuntimeError(f"no version of {self.out} is live yet (last error: {why})")
        return live.decoder

    @property
    def version(self) -> int | None:
        """The live version number, or None."""
        return _version_number(self._hotswap.current)

    @property
    def loading(self) -> bool:
        """True while a new version is being loaded, or an abandoned load is still running."""
        return self._load is not None or bool(self._hotswap.abandoned)

    @property
    def abandoned_loads(self) -> tuple[Path, ...]:
        """The paths of loads dropped after load_timeout that are still running (at most two)."""
        return self._hotswap.abandoned

    def status(self) -> dict[str, Any]:
        """The follower's state as a JSON-ready dict (for a health endpoint or a log line)."""
        live = self._hotswap.current
        return {
            "out": str(self.out),
            "live_version": _version_number(live),
            "live_path": None if live is None else str(live.path),
            "last_swap_at": self.last_swap_at,
            "swaps": self.swaps,
            "failures": self.failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "loading": self.loading,
            "abandoned_loads": [str(path) for path in self.abandoned_loads],
            "waiting": self.waiting,
            "running": self._thread is not None and self._thread.is_alive(),
        }

    # ------------------------------------------------------------------ running
    def start(self) -> Follower:
        """Start the polling thread (the first poll happens at once). Returns self."""
        if self._stop.is_set():
            raise RuntimeError("this follower was stopped; make a new one")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zerogr-follow", daemon=True)
            self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> LiveVersion:
        """Block until a version is live; returns it. TimeoutError after `timeout` seconds, saying why
        (a load still running, no LATEST yet, or the last load error)."""
        if not self._ready.wait(timeout):
            why = printable(self._why_not_live())
            raise TimeoutError(f"no version of {self.out} became live within {timeout} s: {why}")
        live = self._hotswap.current
        assert live is not None
        return live

    def _why_not_live(self) -> str:
        load = self._load
        if load is not None:
            limit = "no limit" if self.load_timeout is None else f"load_timeout {self.load_timeout:g} s"
            why = f"{load.path} is still loading ({time.monotonic() - load.started:.1f} s so far, {limit})"
            return why if self.last_error is None else f"{why}; last error: {self.last_error}"
        why = self.last_error or f"{self.out / LATEST_NAME} names no version yet"
        abandoned = self.abandoned_loads
        if abandoned and self.waiting is None:  # a waiting message names them already
            why += f"; abandoned loads still running: {', '.join(p.name for p in abandoned)}"
        return why

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling and join the thread; a load in progress is waited for (loads cannot be
        interrupted) and then dropped. The live version is released too: stop serving before calling it.
        With `timeout`, returns within about that many seconds: a load still running then is left to
        finish on its own and dropped (abandoned), and a polling thread that has not ended yet ends on its
        own without loading or swapping anything. Safe to call twice."""
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._swap_lock:
            self._hotswap.close(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._collector is not None:
            self._registry.unregister(self._collector)
            self._collector = None

    def __enter__(self) -> Follower:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """stop(), waiting for a load in progress only as long as its load_timeout has left to run (at most
        EXIT_WAIT_CAP_SECONDS; that long too with no load_timeout, or for the polling thread to end)."""
        self._stop.set()
        with self._swap_lock:  # no load starts after this: the one in progress, if any, is the last
            load = self._load
        wait = EXIT_WAIT_CAP_SECONDS
        if load is not None and load.deadline is not None:
            wait = min(wait, max(0.0, load.deadline - time.monotonic()))
        self.stop(timeout=wait)

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            wait = self.poll_seconds
            try:
                self.poll()
            except BaseException as exc:  # noqa: BLE001 - only stop() ends the polling thread
                self._failed(f"{self.out}: unexpected error while polling: {_describe(exc)}")
                log.debug("traceback", exc_info=True)

    # ------------------------------------------------------------------ one poll
    def poll(self) -> bool:
        """Read LATEST once now and, if it names a version not acted on yet (or one whose load timed out and
        whose backoff is over), load and swap it in (blocks until then). The thread calls this every
        `poll_seconds`; tests and single-threaded servers may call it themselves. Returns True when a new
        version was swapped in."""
        with self._poll_lock:
            try:
                name = read_latest(self.out)
            except (BundleError, OSError) as exc:
                marker = ("unreadable", one_line(exc))
                if marker != self._seen:
                    self._seen = marker
                    self._failed(f"{self.out / LATEST_NAME}: cannot read: {one_line(exc)}")
                return False
            if name is None or (name == self._seen and not self._retry_due(name)):
                return False
            path = self.out / name
            live = self._hotswap.current
            if live is not None and live.path == path:
                self._acted_on(name)
                return False  # LATEST moved back to the version being served
            if parse_version_dir(name) is None:
                self._acted_on(name)
                self._failed(f"{self.out / LATEST_NAME} names {name[:80]!r}, not a version dir of this OUT")
                return False
            busy = self._hotswap.busy()
            if busy is not None:  # abandoned loads still run: LATEST is read again at the next poll
                self._wait_for_room(path, busy)
                return False
            self._acted_on(name)
            return self._load_and_swap(path)

    def _acted_on(self, name: str) -> None:
        self._seen = name
        self.waiting = None
        if self._retry is not None and self._retry.name != name:
            self._retry = None  # LATEST moved on: the timed-out version is no longer retried

    def _retry_due(self, name: str) -> bool:
        retry = self._retry
        return retry is not None and retry.name == name and time.monotonic() >= retry.due

    def _wait_for_room(self, path: Path, busy: str) -> None:
        message = f"{path}: not loading yet: {busy}"
        if message != self.waiting:
            self.waiting = self.last_error = message
            self.last_error_at = time.time()
            log.warning("zerogr follow: %s", printable(message))

    def _load_and_swap(self, path: Path) -> bool:
        try:
            with self._swap_lock:
                if self._stop.is_set():
                    return False
                started = time.monotonic()
                deadline = None if self.load_timeout is None else started + self.load_timeout
                self._load = _Load(path, started, deadline)  # before the loader thread starts
                future = self._hotswap.load_next(path)
            if not self._wait_for_load(future, path, deadline):
                return False
            error = future.exception()
            if error is not None:  # whatever the load raised, BaseExceptions included: this version failed
                self._hotswap.abandon()
                self._retry = None
                self._failed(f"{path}: {_describe(error)}")
                log.debug("traceback", exc_info=error)
                return False
            with self._swap_lock:
                if self._stop.is_set():
                    return False  # loaded after stop(): dropped, never swapped in (stop() closes the HotSwap)
                new = self._hotswap.swap()
        except Exception as exc:  # noqa: BLE001 - a bad version is logged and skipped, never raised
            self._failed(f"{path}: {_describe(exc)}")
            log.debug("traceback", exc_info=True)
            return False
        finally:
            self._load = None
        self._retry = None
        self.last_swap_at = time.time()
        self.swaps += 1
        self._ready.set()
        log.info(
            "zerogr follow %s: serving %s (version %s, loaded in %.2f s)",
            printable(self.out), printable(new.path.name), _version_number(new), new.load_seconds,
        )  # fmt: skip
        fallback = new.plan_fallback
        if fallback is not None:  # served, but not as tuned: the log says why, once per version
            log.warning("zerogr follow: %s: %s", printable(new.path.name), printable(fallback))
        return True

    def _wait_for_load(self, future: Future[Any], path: Path, deadline: float | None) -> bool:
        """Wait for the load; True once it is done. False when stop() was called (also after the load
        finished: it is dropped, never swapped in; stop() waits for a running load through
        HotSwap.close()) or when load_timeout ran out (the load is abandoned and tried again later)."""
        while True:
            if self._stop.is_set():
                return False
            if future.done():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._hotswap.abandon()
                delay = self._schedule_retry(path.name)
                self._failed(
                    f"{path}: not loaded within {self.load_timeout:g} s (load_timeout); dropped, it is left "
                    f"to finish on its own and never swapped in; tried again in {delay:g} s while LATEST "
                    "names it"
                )
                return False
            concurrent.futures.wait([future], timeout=min(WAIT_SLICE_SECONDS, left or WAIT_SLICE_SECONDS))

    def _schedule_retry(self, name: str) -> float:
        """Backoff for a version whose load timed out: poll_seconds, then doubling up to RETRY_CAP_SECONDS."""
        previous = self._retry
        if previous is None or previous.name != name:
            delay = self.poll_seconds
        else:
            delay = min(max(RETRY_CAP_SECONDS, self.poll_seconds), previous.delay * 2)
        self._retry = _Retry(name, time.monotonic() + delay, delay)
        return delay

    def _failed(self, message: str) -> None:
        self.failures += 1
        self.last_error = message
        self.last_error_at = time.time()
        live = self._hotswap.current
        keeping = f"still serving {live.path.name}" if live is not None else "nothing is served yet"
        log.error("zerogr follow: not loaded: %s (%s)", printable(message), printable(keeping))


def follow(
    out: str | Path,
    weights: Any = None,
    *,
    device: str = "cpu",
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    timeout: float | None = 300.0,
    load_timeout: float | None = DEFAULT_LOAD_TIMEOUT_SECONDS,
    verify: bool = True,
    registry: Any = None,
    hotswap: HotSwap | None = None,
    **decoder_kwargs: Any,
) -> Follower:
    """Start a Follower of OUT/LATEST and return it once the first version is live (see Follower for the
    arguments). TimeoutError after `timeout` seconds (None: wait forever) when no version could be loaded,
    naming a load still running or the last error; the follower is stopped then without waiting: a load
    still running is abandoned."""
    follower = Follower(
        out, weights, device=device, poll_seconds=poll_seconds, load_timeout=load_timeout, verify=verify,
        registry=registry, hotswap=hotswap, **decoder_kwargs,
    ).start()  # fmt: skip
    try:
        follower.wait_ready(timeout)
    except BaseException:
        follower.stop(timeout=0)  # timeout bounds follow(): a load still running is not waited for
        raise
    return follower


def _version_number(live: LiveVersion | None) -> int | None:
    if live is None:
        return None
    number = live.version
    return number if number is not None else parse_version_dir(live.path.name)


def _describe(exc: BaseException) -> str:
    text = one_line(exc)
    return text if isinstance(exc, (BundleError, InputError)) else f"{type(exc).__name__}: {text}"


__all__ = ["DEFAULT_LOAD_TIMEOUT_SECONDS", "DEFAULT_POLL_SECONDS", "Follower", "follow"]
