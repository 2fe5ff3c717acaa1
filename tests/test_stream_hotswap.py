"""HotSwap: background load beside the live version, one-assignment swap, failures keep the live one."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from zerogr_build.runtime.hotswap import HotSwap
from zerogr_build.runtime.stream import load_arrays_to_device
from zerogr_build.testing import FakeDeviceSink


class Tables:
    """A loaded version: real tables streamed through the fake device sink."""

    def __init__(self, path, seed):
        rng = np.random.default_rng(seed)
        self.source = {"step0.next": rng.integers(-1, 100, size=(3, 50), dtype=np.int32)}
        self.device = load_arrays_to_device(self.source, "fake", sink=FakeDeviceSink(64))
        self.path = path


def test_load_in_background_then_swap_with_readers_running():
    gate = threading.Event()
    threads = []

    def loader(path, *, low_priority, seed=0):
        threads.append((threading.current_thread().name, low_priority))
        gate.wait(5)
        return Tables(path, seed)

    live = HotSwap(loader)
    assert live.current is None
    first = live.load_next("v1", low_priority=False, seed=1)
    assert live.loading
    gate.set()
    live.swap()
    assert live.current.value.path.name == "v1" and first.done()
    assert threads[0][0].startswith("zerogr-hotswap") and threads[0][1] is False

    seen: list[str] = []
    torn: list[str] = []  # an assert in a thread would not fail the test: readers report here instead
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            version = live.current  # one read per request
            if not np.array_equal(
                version.value.device["step0.next"].numpy(), version.value.source["step0.next"]
            ):
                torn.append(version.value.path.name)
            seen.append(version.value.path.name)

    gate.clear()
    workers = [threading.Thread(target=reader) for _ in range(3)]
    for w in workers:
        w.start()
    old_ref = weakref.ref(live.current.value)
    live.load_next("v2", seed=2)
    with pytest.raises(RuntimeError):
        live.load_next("v3")  # one load at a time
    assert live.current.value.path.name == "v1"  # still serving the old version while loading
    gate.set()
    live.swap()
    stop.set()
    for w in workers:
        w.join()
    assert live.current.value.path.name == "v2"
    assert threads[1][1] is True  # background loads default to low priority
    assert set(seen) <= {"v1", "v2"} and "v1" in seen
    assert torn == [], f"readers saw tables that differ from their version's source: {torn}"
    import gc

    del first  # the Future of the first load holds its result too
    gc.collect()
    assert old_ref() is None, "the old version must be freed once nothing uses it"
    live.close()


def test_failed_load_keeps_the_live_version():
    def loader(path, *, low_priority):
        if path.name == "bad":
            raise OSError("disk gone")
        return Tables(path, 0)

    live = HotSwap(loader)
    live.load_next("good")
    live.swap()
    live.load_next("bad")
    with pytest.raises(OSError):
        live.swap()
    assert live.current.value.path.name == "good"
    with pytest.raises(RuntimeError):
        live.swap()  # nothing pending any more
    live.close()


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
