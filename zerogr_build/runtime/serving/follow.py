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
returns) fails the same way: it is dropped, left to finish on its own, and never swapped in, and the
follower goes on following. Nothing the follower meets on disk raises into the serving process, and
nothing a load raises (`SystemExit` and other BaseExceptions included) ends the polling thread.

Optional gauges (prometheus-client, imported only when asked for): pass `registry=` a CollectorRegistry and
the follower registers a collector read at scrape time:

    zerogr_follower_live_version                      the version number being served (absent: none yet)
    zerogr_follower_last_swap_timestamp_seconds       when the live version was swapped in (unix seconds)
    zerogr_follower_swaps_total                       swaps done, the first load included
    zerogr_follower_failures_total                    versions that failed to load (or unreadable LATESTs)
    zerogr_follower_last_failure_timestamp_seconds    when the last failure happened
    zerogr_follower_loading                           1 while a version is loading, else 0

One follower per registry (the names would collide); `stop()` unregisters it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...base.errors import BundleError, InputError, one_line
from ...bundle.format import LATEST_NAME, parse_version_dir
from ...bundle.versions import read_latest
from .hotswap import HotSwap, LiveVersion

log = logging.getLogger("zerogr_build.follow")

DEFAULT_POLL_SECONDS = 1.0
DEFAULT_LOAD_TIMEOUT_SECONDS = 600.0
WAIT_SLICE_SECONDS = 0.1  # how often a wait for a load checks whether stop() was called
_NOTHING = object()  # "no LATEST acted on yet" (None is a legitimate value: LATEST absent)


class Follower:
    """Serve the version OUT/LATEST names and follow it as it moves (see the module docstring).

    out: the OUT dir (its LATEST is followed; a missing OUT or LATEST is waited for).
    weights: the model's per-step output layers, as for Decoder (ignored when `hotswap` is given).
    device, decoder_kwargs: passed to each version's Decoder (plan="auto" unless given).
    poll_seconds: how often LATEST is read.
    load_timeout: seconds a version may take to load before it counts as failed and is dropped (None: no
        limit, a load that never returns then holds up every later version).
    verify: check every structural invariant of a new version (`verify_bundle`) before loading it, not only
        the checksums `open_bundle` checks anyway. On by default: a serving host should never load a
        version whose tables break the format, whatever wrote it. (With your own `hotswap`, its loader
        decides what is checked.)
    registry: a prometheus_client CollectorRegistry to export the follower's gauges on (None: no gauges).
    hotswap: a HotSwap of your own (its loader decides what a version is); default HotSwap.for_decoder.

    Attributes read by a serving process or a health check (plain reads, no lock): `current` (the live
    LiveVersion or None), `decoder`, `version`, `last_swap_at` (unix seconds or None), `last_error` (one
    line or None), `last_error_at`, `swaps`, `failures`; `status()` returns them all as a dict.
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
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: Any = _NOTHING  # the LATEST value last acted on (a name, None, or an error marker)
        self._loading = False
        self.last_swap_at: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.swaps = 0
        self.failures = 0
        self._registry = registry
        self._collector: Any = None
        if registry is not None:
            self._collector = _follower_collector(self)
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
            raise RuntimeError(f"no version of {self.out} is live yet (last error: {self.last_error})")
        return live.decoder

    @property
    def version(self) -> int | None:
        """The live version number, or None."""
        return _version_number(self._hotswap.current)

    @property
    def loading(self) -> bool:
        """True while a new version is being loaded."""
        return self._loading

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
            "loading": self._loading,
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
        (no LATEST yet, or the last load error)."""
        if not self._ready.wait(timeout):
            why = self.last_error or f"{self.out / LATEST_NAME} names no version yet"
            raise TimeoutError(f"no version of {self.out} became live within {timeout} s: {why}")
        live = self._hotswap.current
        assert live is not None
        return live

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling and join the thread; a load in progress is waited for (loads cannot be
        interrupted) and then dropped. The live version is released too: stop serving before calling it.
        With `timeout`, returns within about that many seconds: a load still running then is left to
        finish on its own and dropped. Safe to call twice."""
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self._hotswap.close(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._collector is not None:
            self._registry.unregister(self._collector)
            self._collector = None

    def __enter__(self) -> Follower:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        """Read LATEST once now and, if it names a version not acted on yet, load and swap it in (blocks
        until then). The thread calls this every `poll_seconds`; tests and single-threaded servers may
        call it themselves. Returns True when a new version was swapped in."""
        with self._poll_lock:
            try:
                name = read_latest(self.out)
            except (BundleError, OSError) as exc:
                marker = ("unreadable", one_line(exc))
                if marker != self._seen:
                    self._seen = marker
                    self._failed(f"{self.out / LATEST_NAME}: cannot read: {one_line(exc)}")
                return False
            if name is None or name == self._seen:
                return False
            self._seen = name
            live = self._hotswap.current
            if live is not None and live.path == self.out / name:
                return False  # LATEST moved back to the version being served
            if parse_version_dir(name) is None:
                self._failed(f"{self.out / LATEST_NAME} names {name[:80]!r}, not a version dir of this OUT")
                return False
            return self._load_and_swap(self.out / name)

    def _load_and_swap(self, path: Path) -> bool:
        self._loading = True
        try:
            future = self._hotswap.load_next(path)
            deadline = None if self.load_timeout is None else time.monotonic() + self.load_timeout
            while True:
                if self._stop.is_set():
                    # Also after the load finished: it is dropped, never swapped in (stop() waits for a
                    # running load through HotSwap.close()).
                    return False
                if future.done():
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._hotswap.abandon()
                    self._failed(
                        f"{path}: not loaded within {self.load_timeout:g} s (load_timeout); dropped, it is "
                        "left to finish on its own and never swapped in"
                    )
                    return False
                concurrent.futures.wait([future], timeout=min(WAIT_SLICE_SECONDS, left or WAIT_SLICE_SECONDS))
            error = future.exception()
            if error is not None:  # whatever the load raised, BaseExceptions included: this version failed
                self._hotswap.abandon()
                self._failed(f"{path}: {_describe(error)}")
                log.debug("traceback", exc_info=error)
                return False
            new = self._hotswap.swap()
        except Exception as exc:  # noqa: BLE001 - a bad version is logged and skipped, never raised
            self._failed(f"{path}: {_describe(exc)}")
            log.debug("traceback", exc_info=True)
            return False
        finally:
            self._loading = False
        self.last_swap_at = time.time()
        self.swaps += 1
        self._ready.set()
        log.info(
            "zerogr follow %s: serving %s (version %s, loaded in %.2f s)",
            self.out, new.path.name, _version_number(new), new.load_seconds,
        )  # fmt: skip
        return True

    def _failed(self, message: str) -> None:
        self.failures += 1
        self.last_error = message
        self.last_error_at = time.time()
        live = self._hotswap.current
        keeping = f"still serving {live.path.name}" if live is not None else "nothing is served yet"
        log.error("zerogr follow: not loaded: %s (%s)", message, keeping)


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
    naming the last error; the follower is stopped then."""
    follower = Follower(
        out, weights, device=device, poll_seconds=poll_seconds, load_timeout=load_timeout, verify=verify,
        registry=registry, hotswap=hotswap, **decoder_kwargs,
    ).start()  # fmt: skip
    try:
        follower.wait_ready(timeout)
    except BaseException:
        follower.stop()
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


def _follower_collector(follower: Follower) -> Any:
    """A prometheus_client collector reading the follower's state at scrape time."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class FollowerCollector:
        def describe(self) -> Iterator[Any]:
            return self._families(with_values=False)

        def collect(self) -> Iterator[Any]:
            return self._families(with_values=True)

        def _families(self, with_values: bool) -> Iterator[Any]:
            def gauge(name: str, doc: str, value: float | None) -> Any:
                family = GaugeMetricFamily(name, doc)
                if with_values and value is not None:
                    family.add_metric([], value)
                return family

            def counter(name: str, doc: str, value: float) -> Any:
                family = CounterMetricFamily(name, doc)
                if with_values:
                    family.add_metric([], value)
                return family

            yield gauge("zerogr_follower_live_version", "The bundle version being served.", follower.version)
            yield gauge(
                "zerogr_follower_last_swap_timestamp_seconds",
                "When the live version was swapped in (unix seconds).",
                follower.last_swap_at,
            )
            yield counter("zerogr_follower_swaps", "Versions swapped in, the first included.", follower.swaps)
            yield counter(
                "zerogr_follower_failures", "Versions that failed to load (kept serving the old one).",
                follower.failures,
            )  # fmt: skip
            yield gauge(
                "zerogr_follower_last_failure_timestamp_seconds",
                "When the last version failed to load (unix seconds).",
                follower.last_error_at,
            )
            yield gauge("zerogr_follower_loading", "1 while a version is loading.", float(follower.loading))

    return FollowerCollector()


__all__ = ["DEFAULT_LOAD_TIMEOUT_SECONDS", "DEFAULT_POLL_SECONDS", "Follower", "follow"]
