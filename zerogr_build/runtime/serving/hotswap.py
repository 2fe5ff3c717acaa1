"""Serve one bundle version while the next one loads beside it, then switch with one reference assignment.

    live = HotSwap.for_decoder(weights, device="cuda:0")      # or HotSwap(my_loader)
    live.load_next("bundles/v000007").result()                 # first version: load and wait
    live.swap()
    ...
    dec = live.current.decoder                                 # request path: one attribute read, no lock
    ...
    live.load_next("bundles", weights=new_weights)             # new model version: loads in a background
                                                               # thread on a low-priority copy stream
    live.swap()                                                # waits for the load, then switches

To follow an OUT dir's LATEST from a serving process (poll, load, swap, keep the old version when the new
one is bad), use `follow()` in follow.py, which drives a HotSwap.

Readers take `live.current` once per request and use that object to the end of the request, so a request
never mixes two versions. After `swap()` the handle drops its reference to the old version; its device
memory is freed when the last request holding it finishes (CPython frees on the last reference), and
`swap(release=True)` also hands the CUDA caching allocator's free blocks back to the driver.

Ordering on CUDA: a load's copies are host-synchronised and its widening kernels are queued on the loader
thread's stream; the Decoder records a `loaded` marker (an event) after them and the load's Future completes
only once that event has, so a swapped-in version is whole on every stream. Tables are allocated on the
loader's stream: a request must not drop its last reference to a version before its own GPU work on it has
finished (reading the results to the host does that), or the allocator may hand the memory to the next load
while those kernels still run. CUDA graphs: capture with `capture_error_mode="thread_local"` while a
background load may run (a global-mode capture forbids the loader thread's allocations and pinned memory),
or capture before starting `load_next`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LiveVersion:
    """One loaded version: where it came from, the loader's product and how long the load took.

    `value` is what the loader returned; with `HotSwap.for_decoder` it is a (bundle, decoder) pair, also
    reachable as `.bundle` and `.decoder`."""

    path: Path
    value: Any
    load_seconds: float

    @property
    def bundle(self) -> Any:
        return self.value[0]

    @property
    def decoder(self) -> Any:
        return self.value[1]

    @property
    def version(self) -> int | None:
        return getattr(self.bundle, "version", None) if isinstance(self.value, tuple) else None

    @property
    def plan_fallback(self) -> str | None:
        """The decoder's line on why it follows no tuned plan (Decoder.plan_fallback), for a version loaded
        by HotSwap.for_decoder; None otherwise."""
        if not (isinstance(self.value, tuple) and len(self.value) == 2):
            return None
        fallback = getattr(self.value[1], "plan_fallback", None)
        return fallback if isinstance(fallback, str) else None


Loader = Callable[..., Any]
"""loader(path: Path, *, low_priority: bool, **kwargs) -> value"""


class HotSwap:
    """A handle on the live version plus at most one version loading next to it.

    Thread safety: `current` is a plain attribute read (atomic in CPython); `load_next` and `swap` take an
    internal lock, so concurrent callers see one consistent order of loads and swaps.

    Each load runs in a daemon thread of its own. Whatever it raises (`SystemExit` and other
    BaseExceptions included) ends up in its Future, never silently in the thread. A load that never returns
    can be dropped with `abandon()`: it then finishes on its own, if ever, and is never swapped in, and it
    does not keep the process from exiting. Until it ends it still holds its thread and whatever device
    memory it has taken, and `abandoned` lists it. At most MAX_ABANDONED_RUNNING (one) abandoned load may
    still run when a new load starts: with more, `load_next` refuses (`busy()` says why) until one ends, so
    at most two loads ever run at once and hung loads never pile up.
    """

    MAX_ABANDONED_RUNNING = 1
    """Abandoned loads that may still be running when `load_next` starts a new one."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._lock = threading.Lock()
        self._next: Future[LiveVersion] | None = None
        self._next_path: Path | None = None
        self._abandoned_lock = threading.Lock()  # guards _abandoned only; never held while taking _lock
        self._abandoned: dict[Future[LiveVersion], Path] = {}  # abandoned loads still running, oldest first
        self.current: LiveVersion | None = None

    @classmethod
    def for_decoder(
        cls,
        weights: Any,
        device: str = "cpu",
        on_load: Callable[[Any, Any], None] | None = None,
        *,
        verify: bool = False,
        **decoder_kwargs: Any,
    ) -> HotSwap:
        """A handle whose versions are (bundle, Decoder) pairs: the bundle is opened (checksums checked) and
        a Decoder built over it (plan="auto" unless given), its tables streamed to `device` (on low-priority
        copy streams for background loads). verify=True also checks every structural invariant of the
        version (`verify_bundle`) before loading it. `load_next(path, weights=...)` replaces the weights
        for that version (a new model goes with a new bundle).

        Item constraints are not carried across a swap: a mask or sets object names positions in one
        bundle's item order and another version refuses it, so each version's Decoder starts with every
        item available and no item sets. `on_load(bundle, decoder)` runs in the loader thread before the
        version can be swapped in: build and set its constraints there, from item ids (e.g.
        `decoder.set_availability(ItemMask.from_ids(bundle, in_stock_ids))`)."""
        default_weights = weights
        decoder_kwargs.setdefault("plan", "auto")

        def load(path: Path, *, low_priority: bool, weights: Any = None) -> tuple[Any, Any]:
            from ...bundle import open_bundle, verify_bundle
            from ..decoder import Decoder

            if verify:
                verify_bundle(path)  # checksums and invariants; the open below need not hash again
            bundle = open_bundle(path, verify_checksums=not verify)
            decoder = Decoder(
                bundle,
                default_weights if weights is None else weights,
                device=device,
                low_priority=low_priority,
                **decoder_kwargs,
            )
            if on_load is not None:
                on_load(bundle, decoder)
            return bundle, decoder

        return cls(load)

    def load_next(self, path: str | Path, *, low_priority: bool = True, **kwargs: Any) -> Future[LiveVersion]:
        """Start loading `path` in the background; returns a Future of the LiveVersion (it references the
        version too: don't keep it around after swapping). Replaces a loaded but not yet swapped version;
        refuses (RuntimeError, saying why) while another load is still running, or while more than
        MAX_ABANDONED_RUNNING abandoned loads still run."""
        with self._lock:
            refusal = self._refusal()
            if refusal is not None:
                raise RuntimeError(refusal)

            future: Future[LiveVersion] = Future()
            future.set_running_or_notify_cancel()

            def task() -> None:
                t0 = time.perf_counter()
                try:
                    value = self._loader(Path(path), low_priority=low_priority, **kwargs)
                    wait_loaded(value)  # the Future completes, so swap() publishes, after the device work
                    loaded = LiveVersion(Path(path), value, time.perf_counter() - t0)
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the Future
                    future.set_exception(exc)
                else:
                    future.set_result(loaded)

            self._next, self._next_path = future, Path(path)
            threading.Thread(target=task, name="zerogr-hotswap", daemon=True).start()
            return future

    @property
    def loading(self) -> bool:
        """True while a load started by load_next, and not abandoned, is still running."""
        nxt = self._next
        return nxt is not None and not nxt.done()

    @property
    def abandoned(self) -> tuple[Path, ...]:
        """The paths of abandoned loads that are still running, oldest first."""
        with self._abandoned_lock:
            return tuple(path for future, path in self._abandoned.items() if not future.done())

    def busy(self) -> str | None:
        """Why `load_next` would refuse to start a load now (one line), or None when it would start one."""
        with self._lock:
            return self._refusal()

    def _refusal(self) -> str | None:
        if self._next is not None and not self._next.done():
            return "a version is already loading; swap() or wait for it first"
        running = self.abandoned
        if len(running) > self.MAX_ABANDONED_RUNNING:
            names = ", ".join(path.name for path in running)
            return (
                f"{len(running)} abandoned loads ({names}) are still running; a new load starts once one "
                "of them ends"
            )
        return None

    def swap(self, *, timeout: float | None = None, release: bool = False) -> LiveVersion:
        """Wait for the pending load (re-raising its error, in which case the live version stays), then
        make it current with one assignment. Returns the new current version."""
        with self._lock:
            if self._next is None:
                raise RuntimeError("nothing to swap in: call load_next first")
            pending = self._next
            try:
                new = pending.result(timeout=timeout)
            finally:
                if pending.done():
                    self._next = self._next_path = None
            record_serving_stream(new.value)
            old = self.current
            self.current = new
        del old  # the handle's reference; requests that still hold it keep it alive until they finish
        if release:
            _release_cached_device_memory()
        return new

    def abandon(self) -> None:
        """Drop the pending load without waiting for it (a failed or finished one too): a load still running
        finishes on its own and is never swapped in, and is listed in `abandoned` until it ends. The live
        version stays."""
        with self._lock:
            self._abandon_locked()

    def _abandon_locked(self) -> None:
        pending, path = self._next, self._next_path
        self._next = self._next_path = None
        if pending is None or pending.done() or path is None:
            return
        with self._abandoned_lock:
            self._abandoned[pending] = path
        # Forgotten as soon as it ends, so its result (device memory) is freed with its thread. A load that
        # ended meanwhile runs the callback here at once: _abandoned_lock is free again by then.
        pending.add_done_callback(self._forget_abandoned)

    def _forget_abandoned(self, future: Future[LiveVersion]) -> None:
        with self._abandoned_lock:
            self._abandoned.pop(future, None)

    def close(self, timeout: float | None = None) -> None:
        """Wait for a running load (at most `timeout` seconds; None: until it ends), then drop both
        versions; a load still running then is abandoned. Abandoned loads are not waited for."""
        pending = self._next
        if pending is not None:
            wait([pending], timeout=timeout)
        with self._lock:
            self._abandon_locked()
            self.current = None


def wait_loaded(value: Any) -> None:
    """Wait (in the loader thread; a sleeping wait for low-priority loads) until the device work of a loaded
    value is complete: its `loaded` marker (stream.LoadMarker; a Decoder has one), or that of the second
    item of a (bundle, decoder) pair. Values without a marker are complete when the loader returns."""
    holder = value[1] if isinstance(value, tuple) and len(value) == 2 else value
    marker = getattr(holder, "loaded", None)
    if marker is not None:
        marker.wait()


def record_serving_stream(value: Any, current_stream: Callable[[Any], Any] | None = None) -> None:
    """Mark every CUDA step-table tensor of a loaded value (a Decoder, or a (bundle, decoder) pair) as used
    by the swapping caller's current stream (`tensor.record_stream`).

    The tables were allocated on the loader's stream. Without this, when the last request holding an old
    version drops it while kernels queued on the serving stream still read its tables, the caching
    allocator could hand those blocks to the next load at once. With it, a freed block waits for the work
    queued on the serving stream at the time of the free. Requests served on other streams must keep their
    version referenced until their work completes (or record their own stream the same way).
    current_stream(device) -> stream; torch.cuda.current_stream by default (injectable for tests).
    """
    holder = value[1] if isinstance(value, tuple) and len(value) == 2 else value
    tensors = [
        t
        for step in getattr(holder, "steps", None) or ()
        for t in (getattr(step, "indptr", None), getattr(step, "tokens", None), getattr(step, "next", None))
        if t is not None and getattr(t, "is_cuda", False)
    ]
    if not tensors:
        return
    if current_stream is None:
        import torch

        current_stream = torch.cuda.current_stream
    for t in tensors:
        t.record_stream(current_stream(t.device))


def _release_cached_device_memory() -> None:
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
