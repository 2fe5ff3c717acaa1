"""HotSwap: background load beside the live version, one-assignment swap, failures keep the live one."""

from __future__ import annotations

import gc
import re
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from zerogr_build.runtime.serving.hotswap import HotSwap
from zerogr_build.runtime.stream import load_arrays_to_device
from zerogr_build.testing import FakeDeviceSink

CHUNK_BYTES = 64
REQUESTS_PER_PHASE = 25
PHASE_TIMEOUT_S = 60.0


def source_tables(name: str) -> dict[str, np.ndarray]:
    """The tables of version `name`, a pure function of the name: a reader can check what it got against
    them without trusting the version object (several chunks each, none with the 0xA5 poison pattern)."""
    rng = np.random.default_rng(int(name[1:]))
    return {
        "step0.next": rng.integers(-1, 100, size=(3, 50), dtype=np.int32),
        "step1.tokens": rng.integers(0, 2**15, size=700, dtype=np.uint16),
    }


class Tables:
    """A loaded version: `source_tables(path.name)` streamed through a FakeDeviceSink (`device`)."""

    def __init__(self, path: Path, sink: FakeDeviceSink):
        self.path = path
        self.device = load_arrays_to_device(source_tables(path.name), "fake", sink=sink)


def test_load_in_background_then_swap_with_readers_running():
    sinks: dict[str, FakeDeviceSink] = {}
    threads = []

    def loader(path, *, low_priority, gate=None):
        threads.append((threading.current_thread().name, low_priority))
        sinks[path.name] = FakeDeviceSink(CHUNK_BYTES, gate=gate)
        return Tables(path, sinks[path.name])

    live = HotSwap(loader)
    assert live.current is None
    first = live.load_next("v1", low_priority=False)
    live.swap()
    assert live.current.value.path.name == "v1" and first.done()
    assert threads[0][0].startswith("zerogr-hotswap") and threads[0][1] is False
    del first  # the Future of the first load holds its result too

    # Readers run requests: phase at start, then one read of live.current, then several reads of that
    # version. A request is torn if the tables differ from the source of the version it started on, or
    # the version's name changed under it. (An assert in a thread would not fail the test: readers
    # record, the test asserts.)
    phase = ["loading"]
    records: list[list[tuple[str, str, bool]]] = [[] for _ in range(3)]
    stop = threading.Event()

    def reader(log):
        while not stop.is_set():
            at_start = phase[0]
            version = live.current  # one read per request
            name = version.value.path.name
            expected = source_tables(name)
            device = version.value.device
            intact = all(np.array_equal(device[k].numpy(), v) for k, v in expected.items())
            log.append((at_start, name, intact and version.value.path.name == name))

    def run_phase(name: str) -> None:
        """Let every reader finish REQUESTS_PER_PHASE requests that started in phase `name`."""
        phase[0] = name
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while any(sum(r[0] == name for r in log) < REQUESTS_PER_PHASE for log in records):
            assert time.monotonic() < deadline, f"readers stalled in phase {name}"
            time.sleep(0.005)

    workers = [threading.Thread(target=reader, args=(log,)) for log in records]
    for w in workers:
        w.start()
    try:
        old_ref = weakref.ref(live.current.value)
        gate = threading.Event()
        pending = live.load_next("v2", gate=gate)
        with pytest.raises(RuntimeError):
            live.load_next("v3")  # one load at a time
        # v2's copies cannot complete until the gate opens: its load is visibly half done.
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while "v2" not in sinks or not any(e == "copy" for e, *_ in sinks["v2"].schedule):
            assert time.monotonic() < deadline, "the v2 load never started copying"
            time.sleep(0.005)
        assert (sinks["v2"].memory["step0.next"] == FakeDeviceSink.POISON).all()
        run_phase("loading")
        assert live.loading and not pending.done()

        gate.set()
        pending.result(timeout=PHASE_TIMEOUT_S)
        del pending
        run_phase("loaded")  # loaded but not swapped: readers must still get v1

        live.swap()
        run_phase("swapped")  # every request that starts after swap() returned must get v2
    finally:
        stop.set()
        for w in workers:
            w.join()

    assert threads[1][1] is True  # background loads default to low priority
    for log in records:
        torn = [r for r in log if not r[2]]
        assert torn == [], f"requests saw tables that differ from their version's source: {torn[:3]}"
        assert {name for p, name, _ in log if p in ("loading", "loaded")} == {"v1"}
        assert {name for p, name, _ in log if p == "swapped"} == {"v2"}
    assert live.current.value.path.name == "v2"
    gc.collect()
    assert old_ref() is None, "the old version must be freed once nothing uses it"
    live.close()


def test_failed_load_keeps_the_live_version():
    def loader(path, *, low_priority):
        if path.name == "bad":
            raise OSError("disk gone")
        return Tables(Path("v1"), FakeDeviceSink(CHUNK_BYTES))

    live = HotSwap(loader)
    live.load_next("good")
    live.swap()
    live.load_next("bad")
    with pytest.raises(OSError):
        live.swap()
    assert live.current.path.name == "good"
    with pytest.raises(RuntimeError):
        live.swap()  # nothing pending any more
    live.close()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_abandoned_loads_are_listed_until_they_end_and_never_pile_up():
    """abandon() drops a running load: `abandoned` lists it until it ends. One abandoned load may still run
    when a new one starts; with two still running load_next refuses (busy() says why) until one ends.
    close() abandons a load still running at its timeout the same way."""
    gates = {name: threading.Event() for name in ("v1", "v2", "v3", "v4")}

    def loader(path, *, low_priority):
        gates[path.name].wait(PHASE_TIMEOUT_S)
        return path.name

    live = HotSwap(loader)
    try:
        live.load_next("v1")
        live.abandon()
        assert live.abandoned == (Path("v1"),) and not live.loading and live.busy() is None
        live.load_next("v2")  # beside the one abandoned load
        assert "already loading" in live.busy()
        live.abandon()
        assert live.abandoned == (Path("v1"), Path("v2"))
        refusal = "2 abandoned loads (v1, v2) are still running; a new load starts once one of them ends"
        assert live.busy() == refusal
        with pytest.raises(RuntimeError, match=re.escape(refusal)):
            live.load_next("v3")
        gates["v1"].set()  # v1 ends late: never swapped in, no longer listed
        wait_until(lambda: live.abandoned == (Path("v2"),), "the end of v1")
        assert live.busy() is None and live.current is None
        live.load_next("v3")
        gates["v3"].set()
        assert live.swap(timeout=PHASE_TIMEOUT_S).value == "v3"
        live.load_next("v4")
        live.close(timeout=0.05)
        assert live.abandoned == (Path("v2"), Path("v4")) and live.current is None
    finally:
        for gate in gates.values():
            gate.set()
    wait_until(lambda: live.abandoned == (), "the abandoned loads to end")


def test_for_decoder_serves_bundle_versions(tmp_path):
    import pyarrow as pa
    import torch

    from zerogr_build.bundle import publish_bundle
    from zerogr_build.index import build_index

    rng = np.random.default_rng(2)
    paths = []
    for n in (40, 60):
        index = build_index(rng.integers(0, 6, (n, 2)), (6, 6))
        paths.append(publish_bundle(index, pa.array(np.arange(n)), tmp_path).path)
    weights = [torch.randn(6, 4), torch.randn(6, 4)]
    live = HotSwap.for_decoder(weights, device="cpu", plan=None)
    live.load_next(paths[0]).result()
    first = live.swap()
    assert first.version == 1 and first.decoder.bundle is first.bundle
    live.load_next(paths[1], weights=[w * 2 for w in weights])
    second = live.swap()
    assert second.version == 2 and live.current is second
    assert torch.equal(second.decoder.weights[0][0], weights[0] * 2)
    res = second.decoder.search(lambda step, prefixes, batch: torch.randn(prefixes.shape[0], 4), 2, 3)
    leaves = res.leaves[res.valid]
    assert leaves.numel() and int(leaves.max()) < second.bundle.index.num_leaves
    live.close()


def test_swap_cannot_publish_before_the_loads_device_work_completes():
    """D1: the load's completion marker (widening kernels after the copies) gates the swap: until the
    fake device finishes, swap() times out and the live version stays; then it publishes."""
    device_done = threading.Event()
    sinks: dict[str, FakeDeviceSink] = {}

    def loader(path, *, low_priority, done=None):
        sinks[path.name] = FakeDeviceSink(CHUNK_BYTES, device_done=done)
        tables = Tables(path, sinks[path.name])
        tables.loaded = sinks[path.name].load_marker()
        return tables

    live = HotSwap(loader)
    live.load_next("v1")
    live.swap()
    live.load_next("v2", done=device_done)
    with pytest.raises(TimeoutError):
        live.swap(timeout=0.3)
    assert live.current.value.path.name == "v1" and live.loading
    assert ("loaded", -1, -1) not in sinks["v2"].schedule
    device_done.set()
    assert live.swap(timeout=PHASE_TIMEOUT_S).value.path.name == "v2"
    assert sinks["v2"].schedule[-1] == ("loaded", -1, -1)  # after every copy completed
    live.close()


def test_a_decoder_carries_its_load_marker():
    """What HotSwap.for_decoder waits on: a Decoder's `loaded` (None on the CPU, where nothing is async)."""
    from zerogr_build.runtime.decoder import Decoder
    from zerogr_build.runtime.serving.hotswap import wait_loaded
    from zerogr_build.testing import random_catalog

    catalog = random_catalog(n=50, sizes=(3, 5))
    from zerogr_build.index import build_index

    index = build_index(catalog.sids, catalog.codebook_sizes)
    weights = [np.zeros((v, 4), np.float32) for v in catalog.codebook_sizes]
    import torch

    dec = Decoder(index, [torch.from_numpy(w) for w in weights])
    assert dec.loaded is None
    wait_loaded(("bundle", dec))

    class Marked:
        def __init__(self):
            self.loaded = FakeDeviceSink(CHUNK_BYTES).load_marker()

    marked = Marked()
    wait_loaded(("bundle", marked))
    assert marked.loaded.sink.schedule == [("loaded", -1, -1)]


class _FakeCudaTensor:
    """Stands in for a CUDA table tensor: records the streams record_stream was called with."""

    is_cuda = True
    device = "cuda:0"

    def __init__(self) -> None:
        self.recorded: list[str] = []

    def record_stream(self, stream: str) -> None:
        self.recorded.append(stream)


def test_swap_records_the_serving_stream_on_every_cuda_table(monkeypatch):
    """Tables freed after a swap must not be reused while the serving stream still reads them: swap() calls
    record_stream(current stream) on every CUDA step tensor of the version it publishes (CPU tensors and
    missing tables are skipped)."""
    import zerogr_build.runtime.serving.hotswap as hotswap_module

    class Step:
        def __init__(self, *tensors):
            self.indptr, self.tokens, self.next = tensors

    tables = [_FakeCudaTensor() for _ in range(3)]
    decoder = type("FakeDecoder", (), {})()
    decoder.steps = (
        Step(tables[0], tables[1], None),
        Step(None, None, tables[2]),
        Step(np.zeros(3), None, None),
    )
    real = hotswap_module.record_serving_stream
    monkeypatch.setattr(
        hotswap_module,
        "record_serving_stream",
        lambda value: real(value, current_stream=lambda device: f"serving-stream-of-{device}"),
    )
    swap = HotSwap(lambda path, low_priority: ("bundle", decoder))
    try:
        swap.load_next("v1")
        assert all(t.recorded == [] for t in tables)  # nothing is recorded before the swap
        swap.swap(timeout=30)
    finally:
        swap.close()
    assert [t.recorded for t in tables] == [["serving-stream-of-cuda:0"]] * 3
