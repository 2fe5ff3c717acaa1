"""Property: whatever sequence of publishes (promoted or not, with keep), prunes, promotions (pins) and
kill -9'd publishes runs against one OUT, every concurrent reader of OUT always gets a complete version
(all items, every array readable), never an error, and a version a reader holds stays readable after it
is pruned (docs/bundle-format.md, sections 8 and 11)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.bundle import list_versions, open_bundle, promote_bundle, prune_versions, verify_bundle
from zerogr_build.bundle.lock import out_lock
from zerogr_build.index import build_index
from zerogr_build.testing import publish_catalog, random_catalog

REPO = Path(__file__).resolve().parents[1]
KILL_POINTS = ("claimed", "file_written", "manifest_written", "renamed", "latest_replaced", "pruning")
KILLED_PUBLISH = """
import pickle, sys
from zerogr_build.bundle import publish_bundle
index, item_ids = pickle.load(open(sys.argv[1], "rb"))
publish_bundle(index, item_ids, sys.argv[2], manifest_fields={"model_version": "killed"}, keep=1)
"""

OPS = st.one_of(
    st.tuples(st.just("publish"), st.sampled_from([None, 1, 2]), st.booleans()),  # keep, promote
    st.tuples(st.just("prune"), st.integers(1, 2), st.just(None)),
    st.tuples(st.just("pin"), st.integers(0, 5), st.just(None)),  # promote the k-th oldest version
    st.tuples(st.just("kill"), st.sampled_from(KILL_POINTS), st.just(None)),
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    catalog = random_catalog(seed=11, n=400, sizes=(4, 8, 16))
    index = build_index(catalog.sids, catalog.codebook_sizes)
    pickled = tmp_path_factory.mktemp("property") / "index.pkl"
    pickled.write_bytes(pickle.dumps((index, catalog.item_ids)))
    return catalog, pickled, sorted(catalog.item_ids.to_pylist())


class Readers:
    """Threads opening OUT in a loop; each opened version must be complete. Keeps every bundle opened."""

    def __init__(self, out: Path, expected_items: list, threads: int = 2):
        self.out, self.expected = out, expected_items
        self.errors: list[str] = []
        self.held: list = []
        self.opens = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _check(self, bundle) -> None:
        assert sorted(bundle.items().to_pylist()) == self.expected
        offsets = np.asarray(bundle.index.leaf_offsets)
        assert offsets[0] == 0 and offsets[-1] == len(self.expected)
        for step in bundle.index.steps:
            for array in step.arrays().values():
                np.asarray(array).sum()  # every mapped page readable

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                bundle = open_bundle(self.out)
                self._check(bundle)
                self.opens += 1
                if len(self.held) < 20:
                    self.held.append(bundle)
            except Exception as exc:  # noqa: BLE001 - every failure is a finding
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Readers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=2, max_size=6).filter(lambda ops: sum(o[0] == "kill" for o in ops) <= 2))
def test_readers_always_see_a_complete_version(world, ops):
    catalog, pickled, expected = world
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        publish_catalog(catalog, out)
        first = open_bundle(out)  # held across the whole sequence (v000001 is often pruned under it)
        with Readers(out, expected) as readers:
            for op, arg, promote in ops:
                if op == "publish":
                    publish_catalog(catalog, out, keep=arg, promote=promote)
                elif op == "prune":
                    with out_lock(out):
                        prune_versions(out, arg)
                elif op == "pin":
                    versions = list_versions(out)
                    promote_bundle(out / f"v{versions[min(arg, len(versions) - 1)]:06d}")
                else:
                    env = dict(os.environ, PYTHONPATH=str(REPO), ZEROGR_BUNDLE_KILL_AT=arg)
                    proc = subprocess.run(
                        [sys.executable, "-c", KILLED_PUBLISH, str(pickled), str(out)],
                        env=env,
                        capture_output=True,
                        timeout=120,
                    )
                    assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert readers.errors == [], readers.errors[:3]
        assert readers.opens > 0
        for bundle in [first, *readers.held]:  # pruned or not, a held version keeps its arrays and items
            readers._check(bundle)
        publish_catalog(catalog, out)  # the next writer cleans up after any killed one
        assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
        for version in list_versions(out):
            assert verify_bundle(out / f"v{version:06d}", catalog)["unlisted_files"] == []
