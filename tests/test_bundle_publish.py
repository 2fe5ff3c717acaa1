"""Publishing under stress: concurrent builds into one OUT, kill -9 at every step of the protocol and at
random times, keep=N pruning, version numbers never reused, interrupted add_bundle_files rolled forward;
publishing without promoting and promote_bundle."""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.bundle import (
    add_bundle_files,
    list_versions,
    open_bundle,
    promote_bundle,
    prune_versions,
    publish_bundle,
    verify_bundle,
)
from zerogr_build.index import build_index
from zerogr_build.testing import publish_catalog, random_catalog

REPO = Path(__file__).resolve().parents[1]

PUBLISH_SCRIPT = """
import pickle, sys
from zerogr_build.bundle import publish_bundle
index, item_ids = pickle.load(open(sys.argv[1], "rb"))
keep = int(sys.argv[4]) if sys.argv[4] != "none" else None
for _ in range(int(sys.argv[3])):
    fields = {"model_version": "x"}
    published = publish_bundle(index, item_ids, sys.argv[2], manifest_fields=fields, keep=keep)
    print(published.version, flush=True)
"""

ADD_SCRIPT = """
import sys
from zerogr_build.bundle import add_bundle_files
from zerogr_build.testing import fake_kernel_file
cubin = fake_kernel_file("cubin", "sm_90", b"abc")
add_bundle_files(sys.argv[1], {"plans/cpu.json": b'{"new": true}', "kernels/sm_90/k.cubin": cubin})
"""


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), **extra)
    env.pop("ZEROGR_BUNDLE_KILL_AT", None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def pickled_index(tmp_path_factory):
    catalog = random_catalog(seed=7, n=3000, string_ids=True)
    index = build_index(catalog.sids, catalog.codebook_sizes, step_formats="0=dense,1=sparse,2=sparse")
    path = tmp_path_factory.mktemp("pickled") / "index.pkl"
    path.write_bytes(pickle.dumps((index, catalog.item_ids)))
    return path, catalog


def _publisher(pickled: Path, out: Path, times: int = 1, keep: int | None = None, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISH_SCRIPT, str(pickled), str(out), str(times), str(keep or "none")],
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_out_consistent(out: Path, catalog) -> list[int]:
    """Every visible version is complete and verifies against the catalog; LATEST names one of them."""
    versions = list_versions(out)
    assert versions, "no version visible"
    for version in versions:
        report = verify_bundle(out / f"v{version:06d}", catalog)
        assert report["unlisted_files"] == []
    latest = (out / "LATEST").read_text().strip()
    assert int(latest[1:]) in versions
    assert open_bundle(out).path.name == latest
    return versions


def test_concurrent_publishes_get_distinct_versions(tmp_path, pickled_index):
    pickled, catalog = pickled_index
    out = tmp_path / "out"
    procs = [_publisher(pickled, out, times=3) for _ in range(4)]
    printed = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        printed += [int(line) for line in stdout.split()]
    assert sorted(printed) == list(range(1, 13))
    assert assert_out_consistent(out, catalog) == list(range(1, 13))
    assert (out / "LATEST").read_text().strip() == "v000012"
    assert not list(out.glob(".tmp-*"))


KILL_POINTS = [
    "claimed",
    "file_written",
    "files_written",
    "manifest_written",
    "renamed",
    "latest_replaced",
    "pruning",
]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_9_at_each_protocol_step_leaves_only_complete_versions(tmp_path, pickled_index, point):
    pickled, catalog = pickled_index
    out = tmp_path / "out"
    first = _publisher(pickled, out, times=2)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    proc = _publisher(pickled, out, keep=1 if point == "pruning" else None, ZEROGR_BUNDLE_KILL_AT=point)
    assert proc.wait(timeout=120) == -signal.SIGKILL
    versions = assert_out_consistent(out, catalog)
    if point in ("renamed", "latest_replaced", "pruning"):
        assert 3 in versions  # the rename happened: v3 is complete and visible
    else:
        assert versions == [1, 2]
    # The next build cleans up what the dead one left and never reuses its number.
    _, published = publish_catalog(catalog, out)
    assert published.version == (4 if point in ("renamed", "latest_replaced", "pruning") else 3)
    assert not list(out.glob(".tmp-*"))
    assert_out_consistent(out, catalog)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's next stdout line ("" once it exited), failing after `timeout` seconds of silence."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"publisher printed nothing for {timeout} s"
    return proc.stdout.readline()


def test_kill_9_at_random_times(tmp_path, pickled_index):
    """A publisher looping publish(keep=3) is killed -9 at a random moment after 1-3 completed publishes
    (so inside a later publish, prune included), five times over one OUT: each child dies of the signal
    (it did not crash or finish), every visible version is complete and verifies against the catalog,
    LATEST names one, no published version is lost, and numbers are never reused."""
    pickled, catalog = pickled_index
    out = tmp_path / "out"
    rng = np.random.default_rng(0)
    printed: list[int] = []
    for _ in range(5):
        proc = _publisher(pickled, out, times=100_000, keep=3)
        for _ in range(int(rng.integers(1, 4))):
            line = _read_line(proc, timeout=120)
            assert line, f"publisher exited before publishing: {proc.stderr.read()}"
            printed.append(int(line))
        time.sleep(float(rng.uniform(0.0, 0.02)))  # a publish takes ~10 ms: land somewhere inside one
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        versions = assert_out_consistent(out, catalog)
        assert printed[-1] in versions  # the newest completed publish survives (keep=3 keeps the newest)
    assert printed == sorted(set(printed)), "a version number was reused"
    _, published = publish_catalog(catalog, out)
    assert published.version > printed[-1]
    assert_out_consistent(out, catalog)


def test_keep_prunes_old_versions_but_never_latest(tmp_path):
    catalog = random_catalog(n=200)
    out = tmp_path / "out"
    for _ in range(4):
        publish_catalog(catalog, out)
    _, published = publish_catalog(catalog, out, keep=2)
    assert list_versions(out) == [4, 5] and published.version == 5
    with pytest.raises(InputError, match="keep"):
        publish_catalog(catalog, out, keep=0)

    # LATEST pointed back at an older version (an operator rollback) survives pruning.
    (out / "LATEST").write_text("v000004\n")
    assert prune_versions(out, 1) == []
    assert list_versions(out) == [4, 5]
    (out / "LATEST").write_text("v000005\n")
    assert prune_versions(out, 1) == ["v000004"]

    # Numbers are never reused, even when the newest version is deleted by hand.
    import shutil

    shutil.rmtree(out / "v000005")
    (out / "LATEST").unlink()
    _, published = publish_catalog(catalog, out)
    assert published.version == 6


def test_publish_without_promote_leaves_latest(tmp_path):
    catalog = random_catalog(n=200)
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    _, hidden = publish_catalog(catalog, out, promote=False)
    assert hidden.version == 2 and not hidden.promoted and hidden.path == out / "v000002"
    assert (out / "LATEST").read_text() == "v000001\n"
    assert open_bundle(out).path.name == "v000001"  # readers following LATEST do not see it
    assert verify_bundle(hidden.path, catalog)["unlisted_files"] == []  # complete all the same
    assert not list(out.glob(".tmp-*"))
    # Numbers are never reused: the next publish counts the unpromoted version.
    _, shown = publish_catalog(catalog, out)
    assert shown.version == 3 and shown.promoted and (out / "LATEST").read_text() == "v000003\n"

    # Into an empty OUT, promote=False publishes the version and creates no LATEST.
    _, first = publish_catalog(catalog, tmp_path / "empty", promote=False)
    assert first.version == 1 and not (tmp_path / "empty" / "LATEST").exists()


def test_promote_points_latest_at_the_version_atomically(tmp_path):
    catalog = random_catalog(n=200)
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    _, hidden = publish_catalog(catalog, out, promote=False)
    with open(out / "LATEST") as before:  # a reader that opened LATEST before the promote
        assert promote_bundle(hidden.path) == hidden.path
        # Replaced by rename, not rewritten in place: the open file still holds the old name.
        assert before.read() == "v000001\n"
    assert (out / "LATEST").read_text() == "v000002\n"
    assert open_bundle(out).path.name == "v000002"
    assert not list(out.glob(".tmp-*"))
    # Pinning an older version is a promote too.
    promote_bundle(str(out / "v000001"))
    assert (out / "LATEST").read_text() == "v000001\n"


def test_promote_refuses_what_is_not_a_complete_version_dir(tmp_path):
    catalog = random_catalog(n=200)
    out = tmp_path / "out"
    publish_catalog(catalog, out)
    _, hidden = publish_catalog(catalog, out, promote=False)
    (out / "v000007").mkdir()  # a version-like dir with no manifest (never published)
    (out / "elsewhere").mkdir()
    for path in (out, out / "v000007", out / "elsewhere", out / "v000009", hidden.path / "items.parquet"):
        with pytest.raises(InputError, match="not a version dir"):
            promote_bundle(path)
    (hidden.path / "step1.tokens.npy").unlink()  # incomplete: a listed file is missing
    with pytest.raises(BundleError, match=r"step1\.tokens\.npy"):
        promote_bundle(hidden.path)
    manifest = hidden.path / "manifest.json"
    manifest.write_text(manifest.read_text()[:-20])  # corrupt manifest
    with pytest.raises(BundleError, match="manifest.json"):
        promote_bundle(hidden.path)
    assert (out / "LATEST").read_text() == "v000001\n"
    assert not list(out.glob(".tmp-*"))


def test_keep_spares_latest_and_the_new_unpromoted_version(tmp_path):
    catalog = random_catalog(n=200)
    out = tmp_path / "out"
    for _ in range(3):
        publish_catalog(catalog, out)
    promote_bundle(out / "v000001")  # LATEST on an old version (a pin)
    _, hidden = publish_catalog(catalog, out, keep=1, promote=False)
    assert list_versions(out) == [1, 4] and hidden.version == 4
    assert (out / "LATEST").read_text() == "v000001\n"
    _, hidden = publish_catalog(catalog, out, keep=1, promote=False)
    assert list_versions(out) == [1, 5]
    promote_bundle(hidden.path)
    publish_catalog(catalog, out, keep=1)
    assert list_versions(out) == [6] and (out / "LATEST").read_text() == "v000006\n"


def test_publish_refuses_bad_arguments(tmp_path):
    catalog = random_catalog(n=100)
    index = build_index(catalog.sids, catalog.codebook_sizes)
    with pytest.raises(InputError, match="item ids"):
        publish_bundle(index, catalog.item_ids[:50], tmp_path)
    with pytest.raises(ValueError, match="version"):
        publish_bundle(index, catalog.item_ids, tmp_path, manifest_fields={"version": 3})
    assert list_versions(tmp_path) == []
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("next_writer", ["publish", "promote"])
def test_interrupted_add_is_rolled_forward(tmp_path, pickled_index, next_writer):
    pickled, catalog = pickled_index
    out = tmp_path / "out"
    _, published = publish_catalog(catalog, out)
    add_bundle_files(published.path, {"plans/cpu.json": b'{"old": true}'})
    proc = subprocess.run(
        [sys.executable, "-c", ADD_SCRIPT, str(published.path)],
        env=_env(ZEROGR_BUNDLE_KILL_AT="add_renamed"),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL
    # Killed after replacing plans/cpu.json but before the manifest: the reader sees the half-done update.
    with pytest.raises(BundleError, match=r"plans/cpu\.json: sha256 mismatch"):
        open_bundle(published.path)
    # The next writer holding the lock completes it from the journal.
    if next_writer == "publish":
        publish_catalog(catalog, out)
    else:
        promote_bundle(published.path)
    bundle = open_bundle(published.path)
    assert json.loads(bundle.file("plans/cpu.json").read_bytes()) == {"new": True}
    assert bundle.files("kernels/") == ["kernels/sm_90/k.cubin"]
    assert verify_bundle(published.path, catalog)["unlisted_files"] == []
