"""follow(): a serving process follows OUT/LATEST, swaps in good versions, keeps serving through bad ones."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import zerogr_build as zg
from zerogr_build.bundle import open_bundle, promote_bundle, publish_bundle
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.serving import follow as follow_module
from zerogr_build.runtime.serving.follow import Follower, follow
from zerogr_build.runtime.serving.hotswap import HotSwap
from zerogr_build.testing import SeededModel

SIZES = (16, 16, 16)
BATCH, BEAM = 2, 4
WAIT_S = 60.0


def publish_version(out: Path, seed: int, *, promote: bool = True) -> Path:
    """Publish a version whose SIDs and item ids are a pure function of `seed`; returns its dir."""
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, 16, size=(300, 3))
    items = pa.array(seed * 10_000 + np.arange(300), type=pa.int64())
    return publish_bundle(build_index(sids, SIZES), items, out, promote=promote).path


def corrupt_a_table(vdir: Path) -> str:
    """Flip one data byte of a step table (size and header intact: only the checksum can tell)."""
    manifest = json.loads((vdir / "manifest.json").read_text())
    name = max(manifest["steps"][-1]["files"].values(), key=lambda n: manifest["files"][n]["bytes"])
    path = vdir / name
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    return name


def outcome(decoder, model) -> tuple:
    """A search's full outcome: SIDs, leaves, items (exact) and scores (rounded)."""
    res = decoder.search(model.step_fn, BATCH, BEAM)
    return (
        tuple(res.sids.flatten().tolist()),
        tuple(res.leaves.flatten().tolist()),
        json.dumps(decoder.items(res)),
        tuple(np.round(res.scores.flatten().numpy().astype(np.float64), 4).tolist()),
    )


def reference(vdir: Path, model) -> tuple:
    return outcome(Decoder(open_bundle(vdir), model.layers()), model)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def polling_thread_waits_long(monkeypatch) -> threading.Event:
    """Make the follower wait for a load in one long slice (it does not see a stop() mid-wait); the Event
    returned is set once the polling thread is about to enter that wait, past its last look at stop()."""
    import concurrent.futures
    import types

    entering = threading.Event()

    def wait(futures, timeout=None):
        entering.set()
        return concurrent.futures.wait(futures, timeout=timeout)

    monkeypatch.setattr(follow_module, "WAIT_SLICE_SECONDS", WAIT_S)
    monkeypatch.setattr(
        follow_module, "concurrent", types.SimpleNamespace(futures=types.SimpleNamespace(wait=wait))
    )
    return entering


def test_searches_from_4_threads_through_3_good_swaps_and_1_bad_version(tmp_path, caplog):
    """Every search succeeds and equals the reference search of exactly one complete version - the one it
    read - while the follower swaps v1 -> v2, refuses v3 (a flipped byte), then swaps v4 and v5."""
    caplog.set_level(logging.INFO, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=7, batch_size=BATCH)
    versions = {"v000001": publish_version(out, 1)}
    follower = Follower(out, model.layers(), poll_seconds=0.02, plan=None).start()
    follower.wait_ready(WAIT_S)
    assert follower.version == 1 and follower.swaps == 1 and follower.last_error is None

    stop = threading.Event()
    logs: list[list[tuple]] = [[] for _ in range(4)]

    def serve(log: list) -> None:
        while not stop.is_set():
            live = follower.current  # one read per request
            try:
                log.append((live.path.name, outcome(live.decoder, model)))
            except Exception as exc:  # noqa: BLE001 - recorded; the test asserts there are none
                log.append((live.path.name, exc))

    threads = [threading.Thread(target=serve, args=(log,)) for log in logs]
    for t in threads:
        t.start()

    def served_after(count: list[int], name: str) -> bool:
        return all(sum(r[0] == name for r in log[n:]) >= 3 for log, n in zip(logs, count, strict=True))

    try:
        for seed in (2, 3, 4, 5):
            marks = [len(log) for log in logs]
            if seed == 3:
                bad = publish_version(out, seed, promote=False)
                corrupted = corrupt_a_table(bad)
                promote_bundle(bad)  # promote checks sizes and headers, not hashes: it moves LATEST
                wait_for(lambda: follower.failures == 1, "the bad version to be refused")
                assert follower.version == 2 and follower.current.path.name == "v000002"
                assert "v000003" in follower.last_error and corrupted in follower.last_error
                assert "sha256" in follower.last_error
                wait_for(lambda m=marks: served_after(m, "v000002"), "searches after the refusal")
                versions["v000003"] = bad
            else:
                vdir = publish_version(out, seed)
                versions[vdir.name] = vdir
                wait_for(lambda v=vdir: follower.current.path == v, f"the swap to {vdir.name}")
                wait_for(lambda m=marks, v=vdir: served_after(m, v.name), f"searches on {vdir.name}")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
    follower.stop()
    assert not follower.status()["running"] and follower.current is None

    assert follower.swaps == 4 and follower.failures == 1 and follower.version is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "v000003" in errors[0].getMessage()  # one error for the bad version

    # The bad version's reference: the same catalog, published cleanly elsewhere.
    refs = {name: reference(vdir, model) for name, vdir in versions.items() if name != "v000003"}
    refs["v000003"] = reference(publish_version(tmp_path / "clean", 3), model)
    assert len(set(refs.values())) == len(refs)  # the versions are told apart by their results
    results = [r for log in logs for r in log]
    assert not [r for r in results if isinstance(r[1], Exception)]
    for name, got in results:
        matching = [v for v, ref in refs.items() if ref == got]
        assert matching == [name], (name, matching)
    assert {name for name, _ in results} == {"v000001", "v000002", "v000004", "v000005"}


def test_a_search_started_before_a_swap_finishes_on_its_version(tmp_path):
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    v1 = publish_version(out, 1)
    follower = Follower(out, model.layers(), plan=None)  # no thread: polled by hand
    assert follower.poll() is True
    dec = follower.decoder  # the request's one read
    state = dec.start(BATCH, BEAM)
    state = dec.step(state, model.step_fn(0, state.prefixes, state.batch))
    v2 = publish_version(out, 2)
    assert follower.poll() is True and follower.current.path == v2
    for t in range(1, len(SIZES)):
        state = dec.step(state, model.step_fn(t, state.prefixes, state.batch))
    res = dec.finish(state)
    ref = Decoder(open_bundle(v1), model.layers()).search(model.step_fn, BATCH, BEAM)
    assert torch.equal(res.sids, ref.sids) and torch.equal(res.leaves, ref.leaves)
    assert dec.items(res) == Decoder(open_bundle(v1), model.layers()).items(ref)
    follower.stop()


def test_a_bad_version_is_logged_once_and_retried_only_when_latest_changes(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    v1 = publish_version(out, 1)
    follower = Follower(out, model.layers(), plan=None)
    assert follower.poll() is True
    bad = publish_version(out, 2, promote=False)
    corrupt_a_table(bad)
    promote_bundle(bad)
    assert follower.poll() is False and follower.poll() is False  # LATEST unchanged: not retried
    assert follower.failures == 1 and len(caplog.records) == 1 and follower.current.path == v1
    promote_bundle(v1)  # rollback to the live version: nothing to load
    assert follower.poll() is False and follower.failures == 1
    promote_bundle(bad)  # LATEST changed again: tried again, refused again
    assert follower.poll() is False and follower.failures == 2 and len(caplog.records) == 2
    v3 = publish_version(out, 3)
    assert follower.poll() is True and follower.current.path == v3 and follower.swaps == 2
    assert "v000002" in follower.last_error  # the last error stays readable after a good swap
    follower.stop()


@pytest.mark.parametrize("latest", ["../x", "v000001/../v000001", "not-a-version", "v000009"])
def test_a_latest_naming_no_version_dir_is_refused_and_the_live_version_kept(tmp_path, latest):
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    v1 = publish_version(out, 1)
    (tmp_path / "x").mkdir()
    follower = Follower(out, model.layers(), plan=None)
    assert follower.poll() is True
    (out / "LATEST").write_text(latest + "\n")
    assert follower.poll() is False
    assert follower.failures == 1 and follower.current.path == v1
    assert str(out / "LATEST") in follower.last_error or "v000009" in follower.last_error
    follower.stop()


def test_structural_damage_with_matching_checksums_is_refused_by_the_default_verify(tmp_path):
    """A version whose manifest was rewritten to match a damaged table passes the checksums; verify=True
    (the default) still refuses it, verify=False would load it."""
    import hashlib

    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    v1 = publish_version(out, 1)
    follower = Follower(out, model.layers(), plan=None)
    assert follower.poll() is True
    bad = publish_version(out, 2, promote=False)
    manifest = json.loads((bad / "manifest.json").read_text())
    step = manifest["steps"][1]
    assert step["format"] == "sparse"
    name = step["files"]["tokens"]
    data = bytearray((bad / name).read_bytes())
    width = np.dtype(step["dtypes"]["tokens"]).itemsize
    data[-width:] = (16).to_bytes(width, "little")  # a token = V_t: out of range
    (bad / name).write_bytes(bytes(data))
    manifest["files"][name]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (bad / "manifest.json").write_text(json.dumps(manifest))
    promote_bundle(bad)
    assert follower.poll() is False and follower.current.path == v1
    assert name in follower.last_error
    follower.stop()


def test_follow_waits_for_a_first_version_and_times_out_saying_why(tmp_path):
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    with pytest.raises(TimeoutError, match="LATEST names no version yet"):
        follow(tmp_path / "nothing-here", model.layers(), poll_seconds=0.01, timeout=0.2, plan=None)
    out = tmp_path / "bundles"
    bad = publish_version(out, 1, promote=False)
    corrupt_a_table(bad)
    promote_bundle(bad)
    with pytest.raises(TimeoutError, match="sha256"):
        follow(out, model.layers(), poll_seconds=0.01, timeout=0.5, plan=None)
    good = publish_version(out, 2)
    with zg.follow(out, model.layers(), poll_seconds=0.01, timeout=WAIT_S, plan=None) as follower:
        assert follower.current.path == good and follower.status()["running"]
    assert not follower.status()["running"] and follower.current is None


def test_stop_joins_while_a_load_is_running(tmp_path, monkeypatch):
    """stop() during a load waits for it and drops it: no swap, even when the follower's wait on the load
    returns only because the load finished (one long wait slice, so it never sees the stop mid-wait)."""
    in_wait = polling_thread_waits_long(monkeypatch)
    out = tmp_path / "bundles"
    publish_version(out, 1)
    entered, release = threading.Event(), threading.Event()

    def slow_loader(path, *, low_priority):
        entered.set()
        release.wait(WAIT_S)
        return path.name

    follower = Follower(out, hotswap=HotSwap(slow_loader), poll_seconds=0.01).start()
    assert entered.wait(WAIT_S) and in_wait.wait(WAIT_S) and follower.loading
    stopper = threading.Thread(target=follower.stop)
    stopper.start()
    assert follower._stop.wait(WAIT_S)  # stop() has been asked before the load finishes
    time.sleep(0.1)
    assert stopper.is_alive()  # waits for the load: loads cannot be interrupted
    release.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive() and not follower.status()["running"]
    assert follower.swaps == 0 and follower.current is None  # stopped before the swap


def test_gauges_on_a_registry(tmp_path):
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    publish_version(out, 1)
    registry = CollectorRegistry()
    follower = Follower(out, model.layers(), plan=None, registry=registry)

    def scrape() -> dict:
        text = generate_latest(registry).decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    assert scrape() == {"zerogr_follower_swaps_total": 0, "zerogr_follower_failures_total": 0,
                        "zerogr_follower_loading": 0, "zerogr_follower_abandoned_loads": 0}  # fmt: skip
    follower.poll()
    bad = publish_version(out, 2, promote=False)
    corrupt_a_table(bad)
    promote_bundle(bad)
    follower.poll()
    publish_version(out, 3)
    follower.poll()
    got = scrape()
    assert got["zerogr_follower_live_version"] == 3
    assert got["zerogr_follower_swaps_total"] == 2 and got["zerogr_follower_failures_total"] == 1
    assert got["zerogr_follower_last_swap_timestamp_seconds"] == pytest.approx(follower.last_swap_at)
    assert got["zerogr_follower_last_failure_timestamp_seconds"] == pytest.approx(follower.last_error_at)
    with pytest.raises(ValueError):  # one follower per registry
        Follower(out, model.layers(), plan=None, registry=registry)
    follower.stop()
    assert generate_latest(registry) == b""  # stop() unregistered it


def _on_load_blocking_version(number: int, entered: threading.Event, release: threading.Event):
    """An on_load callback (HotSwap.for_decoder) that blocks on `release` for one version: a hung load."""

    def on_load(bundle, decoder) -> None:
        if bundle.version == number:
            entered.set()
            release.wait(WAIT_S)

    return on_load


def test_a_hung_load_is_dropped_after_load_timeout_and_the_newer_latest_is_followed(tmp_path, caplog):
    """v2's load never returns while LATEST moves on to v3: v1 keeps serving, v2 fails after load_timeout,
    v3 is loaded and swapped in, and v2 finishing late is never swapped in."""
    caplog.set_level(logging.INFO, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    v1 = publish_version(out, 1)
    entered, release = threading.Event(), threading.Event()
    on_load = _on_load_blocking_version(2, entered, release)
    hotswap = HotSwap.for_decoder(model.layers(), on_load=on_load, plan=None)
    follower = Follower(out, hotswap=hotswap, poll_seconds=0.01, load_timeout=1.0).start()
    try:
        follower.wait_ready(WAIT_S)
        publish_version(out, 2)
        assert entered.wait(WAIT_S) and follower.loading
        v3 = publish_version(out, 3)
        assert follower.current.path == v1 and outcome(follower.decoder, model) == reference(v1, model)
        wait_for(lambda: follower.current.path == v3, "the swap to v3 past the hung v2")
        assert follower.failures == 1 and "v000002" in follower.last_error
        assert "not loaded within 1 s" in follower.last_error
        assert outcome(follower.decoder, model) == reference(v3, model)
        release.set()  # the hung load finishes now: dropped, never swapped in
        time.sleep(0.3)
        assert follower.current.path == v3 and follower.swaps == 2 and follower.status()["running"]
    finally:
        release.set()
        follower.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "v000002" in errors[0] and "still serving v000001" in errors[0]


def test_stop_with_a_timeout_returns_while_a_load_hangs(tmp_path):
    """With no load_timeout a load may hang forever; stop(timeout) still returns within about the timeout,
    leaves the load to finish on its own and drops it."""
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    publish_version(out, 1)
    entered, release = threading.Event(), threading.Event()
    hotswap = HotSwap.for_decoder(
        model.layers(), on_load=_on_load_blocking_version(2, entered, release), plan=None
    )
    follower = Follower(out, hotswap=hotswap, poll_seconds=0.01, load_timeout=None).start()
    try:
        follower.wait_ready(WAIT_S)
        publish_version(out, 2)
        assert entered.wait(WAIT_S)
        t0 = time.monotonic()
        follower.stop(timeout=1.0)
        assert time.monotonic() - t0 < 3.0
        assert not follower.status()["running"] and follower.current is None
    finally:
        release.set()
    time.sleep(0.3)
    assert follower.current is None and follower.swaps == 1  # the late load was never swapped in


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_load_raising_a_base_exception_fails_that_version_and_following_goes_on(tmp_path, caplog, raised):
    """SystemExit, KeyboardInterrupt or any other BaseException from an on_load callback is a failed
    version (counted, logged, last_error), not the end of the polling thread."""
    import asyncio

    caplog.set_level(logging.INFO, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    model = SeededModel(SIZES, seed=3, batch_size=BATCH)
    v1 = publish_version(out, 1)
    failing = {2: raised, 3: asyncio.CancelledError()}

    def on_load(bundle, decoder) -> None:
        if bundle.version in failing:
            raise failing[bundle.version]

    hotswap = HotSwap.for_decoder(model.layers(), on_load=on_load, plan=None)
    follower = Follower(out, hotswap=hotswap, poll_seconds=0.01).start()
    try:
        follower.wait_ready(WAIT_S)
        for number in (2, 3):
            publish_version(out, number)
            wait_for(lambda n=number: follower.failures == n - 1, f"v{number} to fail")
            assert type(failing[number]).__name__ in follower.last_error
            assert f"v00000{number}" in follower.last_error
            assert follower.current.path == v1 and follower.status()["running"]
        v4 = publish_version(out, 4)
        wait_for(lambda: follower.current.path == v4, "the swap to v4")
    finally:
        follower.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all("still serving v000001" in e for e in errors)


def test_a_base_exception_in_the_polling_thread_is_counted_and_polling_goes_on(tmp_path):
    """A HotSwap of one's own whose swap raises SystemExit once: one failure, logged; the thread lives on."""

    class FlakySwap(HotSwap):
        raised = False

        def swap(self, **kwargs):
            if not FlakySwap.raised:
                FlakySwap.raised = True
                raise SystemExit("swap refused")
            return super().swap(**kwargs)

    out = tmp_path / "bundles"
    publish_version(out, 1)
    follower = Follower(out, hotswap=FlakySwap(lambda path, low_priority: path.name), poll_seconds=0.01)
    follower.start()
    try:
        wait_for(lambda: follower.failures == 1, "the failed swap to be counted")
        assert "SystemExit: swap refused" in follower.last_error and follower.status()["running"]
        publish_version(out, 2)
        wait_for(lambda: follower.current is not None and follower.current.value == "v000002", "v2")
    finally:
        follower.stop()


class HangingLoader:
    """A HotSwap loader whose loads of the versions in `hang` block until released, one Event per attempt
    (attempt numbers count from 1 per version); `succeed_from` makes attempts from that number on return
    at once. Records each attempt's start time."""

    def __init__(self, hang: set[str], succeed_from: int | None = None) -> None:
        self.hang, self.succeed_from = hang, succeed_from
        self.starts: dict[str, list[float]] = {}
        self.releases: dict[tuple[str, int], threading.Event] = {}
        self._lock = threading.Lock()

    def __call__(self, path: Path, *, low_priority: bool) -> str:
        with self._lock:
            starts = self.starts.setdefault(path.name, [])
            starts.append(time.monotonic())
            attempt = len(starts)
            release = self.releases.setdefault((path.name, attempt), threading.Event())
        if path.name in self.hang and (self.succeed_from is None or attempt < self.succeed_from):
            release.wait(WAIT_S)
        return path.name

    def attempts(self, name: str) -> int:
        return len(self.starts.get(name, ()))

    def release(self, name: str | None = None, attempt: int | None = None) -> None:
        with self._lock:
            for (n, a), event in self.releases.items():
                if (name is None or n == name) and (attempt is None or a == attempt):
                    event.set()


def wait_briefly(condition, what: str, seconds: float = 15.0) -> None:
    """wait_for with a shorter limit, for conditions that never come true when a fix is missing."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_follow_times_out_on_a_hung_first_load_saying_it_is_still_loading(tmp_path):
    """follow(timeout=T) returns within about T even when the first load never returns: the TimeoutError
    says the load is still running, and that load is abandoned, not waited for."""
    out = tmp_path / "bundles"
    v1 = publish_version(out, 1)
    loader = HangingLoader({"v000001"})
    hotswap = HotSwap(loader)
    late = threading.Timer(10.0, loader.release)  # a bounded test: follow() would otherwise wait forever
    late.start()
    try:
        t0 = time.monotonic()
        still_loading = r"v000001 is still loading \(.* s so far, load_timeout 600 s\)"
        with pytest.raises(TimeoutError, match=still_loading):
            follow(out, hotswap=hotswap, poll_seconds=0.01, timeout=0.5)
        assert time.monotonic() - t0 < 5.0
        assert loader.attempts("v000001") == 1 and hotswap.abandoned == (v1,) and hotswap.current is None
    finally:
        late.cancel()
        loader.release()


@pytest.mark.parametrize("load_timeout", [1.0, None])
def test_leaving_a_with_block_waits_for_a_hung_load_no_longer_than_its_load_timeout(
    tmp_path, monkeypatch, load_timeout
):
    """`with Follower(...)` exits once the load in progress has used up its load_timeout (with no
    load_timeout: after EXIT_WAIT_CAP_SECONDS), abandoning it; it never waits for a hung load forever."""
    monkeypatch.setattr(follow_module, "EXIT_WAIT_CAP_SECONDS", 1.0)
    out = tmp_path / "bundles"
    v1 = publish_version(out, 1)
    loader = HangingLoader({"v000001"})
    hotswap = HotSwap(loader)
    late = threading.Timer(10.0, loader.release)
    late.start()
    try:
        with Follower(out, hotswap=hotswap, poll_seconds=0.01, load_timeout=load_timeout) as follower:
            wait_for(lambda: follower.loading and loader.attempts("v000001") == 1, "the load to start")
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 5.0
        assert not follower.status()["running"] and follower.current is None and follower.swaps == 0
        assert hotswap.abandoned == (v1,)
    finally:
        late.cancel()
        loader.release()


def test_a_version_whose_load_timed_out_is_retried_with_a_doubling_backoff(tmp_path, caplog):
    """A slow version (over load_timeout) is tried again while LATEST names it: poll_seconds after the first
    timeout, then twice and four times that; the fourth attempt loads and is swapped in."""
    caplog.set_level(logging.ERROR, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    publish_version(out, 1)
    loader = HangingLoader({"v000002"}, succeed_from=4)
    poll, load_timeout = 0.1, 0.2
    follower = Follower(out, hotswap=HotSwap(loader), poll_seconds=poll, load_timeout=load_timeout).start()
    try:
        follower.wait_ready(WAIT_S)
        v2 = publish_version(out, 2)
        # Each new attempt lets the one before it end, so no more than one abandoned load runs.
        for attempt in (2, 3, 4):
            wait_briefly(lambda a=attempt: loader.attempts("v000002") >= a, f"attempt {attempt} of v2")
            loader.release("v000002", attempt - 1)
        wait_briefly(lambda: follower.current.path == v2, "v2 swapped in on its fourth attempt")
    finally:
        loader.release()
        follower.stop()
    starts = loader.starts["v000002"]
    assert len(starts) == 4 and follower.failures == 3 and follower.swaps == 2
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    for gap, backoff in zip(gaps, (poll, 2 * poll, 4 * poll), strict=True):
        assert gap >= load_timeout + backoff - 0.05, (gaps, backoff)
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 3 and all("not loaded within 0.2 s" in e for e in errors)
    assert [e.split("tried again in ")[1].split(" s")[0] for e in errors] == ["0.1", "0.2", "0.4"]


def test_a_timed_out_version_is_not_retried_once_latest_moves_on(tmp_path):
    out = tmp_path / "bundles"
    publish_version(out, 1)
    loader = HangingLoader({"v000002"})
    follower = Follower(out, hotswap=HotSwap(loader), poll_seconds=0.01, load_timeout=0.2)
    try:
        assert follower.poll() is True
        publish_version(out, 2)
        assert follower.poll() is False and "tried again" in follower.last_error
        v3 = publish_version(out, 3)
        time.sleep(0.05)  # the backoff of v2 is over, but LATEST names v3 now
        assert follower.poll() is True and follower.current.path == v3
        promote_bundle(out / "v000002")
        assert follower.poll() is False  # named again: a fresh try (it hangs again)
        assert loader.attempts("v000002") == 2 and follower.failures == 2
    finally:
        loader.release()
        follower.stop()


def test_hung_loads_never_pile_up_and_the_follower_says_it_waits(tmp_path, caplog):
    """Every load of v2 hangs. The first times out and is abandoned, the retry starts beside it and times
    out too; with two abandoned loads still running no third starts: `waiting`, `last_error`, status() and
    the gauges say so, v1 keeps serving. Once one of them ends the next try starts."""
    caplog.set_level(logging.WARNING, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    v1 = publish_version(out, 1)
    v2 = out / "v000002"
    loader = HangingLoader({"v000002"}, succeed_from=3)
    registry = CollectorRegistry()
    follower = Follower(out, hotswap=HotSwap(loader), poll_seconds=0.01, load_timeout=0.2, registry=registry)

    def gauges() -> dict:
        text = generate_latest(registry).decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    follower.start()
    try:
        follower.wait_ready(WAIT_S)
        publish_version(out, 2)
        wait_briefly(lambda: follower.waiting is not None, "the follower to wait for an abandoned load")
        time.sleep(1.0)  # many polls and backoffs: still no third load
        assert loader.attempts("v000002") == 2 and follower.current.path == v1
        status = follower.status()
        assert status["abandoned_loads"] == [str(v2), str(v2)] and status["loading"] is True
        assert status["waiting"] == follower.last_error and "v000002: not loading yet" in status["waiting"]
        assert "2 abandoned loads (v000002, v000002) are still running" in status["waiting"]
        assert follower.failures == 2  # the two timeouts; waiting is not a failure
        got = gauges()
        assert got["zerogr_follower_abandoned_loads"] == 2 and got["zerogr_follower_loading"] == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "not loading yet" in warnings[0]  # said once, not every poll

        loader.release("v000002", 1)  # one abandoned load ends: the third try starts, and loads
        wait_briefly(lambda: follower.current.path == v2, "the third try of v2 to be swapped in")
        assert loader.attempts("v000002") == 3 and follower.waiting is None
        loader.release()
        wait_briefly(lambda: not follower.abandoned_loads, "the abandoned loads to end")
        got = gauges()
        assert got["zerogr_follower_abandoned_loads"] == 0 and got["zerogr_follower_loading"] == 0
    finally:
        loader.release()
        follower.stop()


def test_log_lines_escape_control_characters_read_from_disk(tmp_path, caplog):
    """An error text read from disk reaches the log with its control and bidi characters escaped."""
    caplog.set_level(logging.INFO, logger="zerogr_build.follow")
    out = tmp_path / "bundles"
    publish_version(out, 1)

    def loader(path, *, low_priority):
        if path.name == "v000002":
            raise OSError("table \x1b]0;owned\x07 unreadable \u202e")
        return path.name

    follower = Follower(out, hotswap=HotSwap(loader))
    assert follower.poll() is True
    publish_version(out, 2)
    assert follower.poll() is False
    follower.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert any("\\x1b]0;owned\\x07 unreadable \\u202e" in line for line in lines)
    assert not any(c in line for line in lines for c in "\x1b\x07\u202e")


def test_stop_with_a_timeout_releases_the_versions_even_before_the_polling_thread_ends(tmp_path, monkeypatch):
    """A polling thread that does not see the stop in time (one long wait slice) does not hold stop(timeout)
    up or keep the live version: stop() returns, drops both versions, and the load that finishes later is
    never swapped in by the thread that outlived the stop."""
    in_wait = polling_thread_waits_long(monkeypatch)
    out = tmp_path / "bundles"
    publish_version(out, 1)
    loader = HangingLoader({"v000002"})
    follower = Follower(out, hotswap=HotSwap(loader), poll_seconds=0.01, load_timeout=None).start()
    try:
        follower.wait_ready(WAIT_S)
        in_wait.clear()  # set by the wait for v1's load, if it had to wait
        publish_version(out, 2)
        wait_for(lambda: loader.attempts("v000002") == 1, "the v2 load to start")
        assert in_wait.wait(WAIT_S)  # past its last look at stop(): the thread outlives the stop below
        t0 = time.monotonic()
        follower.stop(timeout=0.5)
        assert time.monotonic() - t0 < 3.0
        assert follower.status()["running"] and follower.current is None  # the thread still waits
        loader.release()
        wait_for(lambda: not follower.status()["running"], "the polling thread to end")
        assert follower.current is None and follower.swaps == 1
    finally:
        loader.release()
