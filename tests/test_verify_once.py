"""Verify hashes each file once per rebuild: bundle/files.HashCache keeps the sha256 of a file only while
its device, inode, size, mtime and ctime stay the same, so a file changed in any way (in place with its
size and mtime put back, or replaced by a rename) is hashed again and a wrong byte is still caught; a
rebuild passes one cache to its verifications after build, tune and the gate. The catalog comparison's
sort (a radix sort) is numpy's stable argsort exactly."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zerogr_build.bundle.files as files
from zerogr_build.base.errors import BundleError
from zerogr_build.bundle import verify_bundle
from zerogr_build.bundle.files import HashCache

from .cli_runs import TUNE_ARGS, invoke


def _rewrite_in_place_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_the_cache_hashes_an_unchanged_file_once_and_a_changed_one_again(tmp_path, monkeypatch):
    hashed = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: hashed.append(p) or real(p))
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    cache = HashCache()
    first = cache.sha256(path)
    assert first == (1000, hashlib.sha256(b"a" * 1000).hexdigest())
    assert cache.sha256(path) == first and len(hashed) == 1

    _rewrite_in_place_keeping_size_and_mtime(path)  # ctime moves: hashed again, the new bytes seen
    assert cache.sha256(path)[1] == hashlib.sha256(path.read_bytes()).hexdigest() != first[1]
    assert len(hashed) == 2

    replacement = tmp_path / "g.bin"
    replacement.write_bytes(b"b" * 1000)
    st = path.stat()
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(replacement, path)  # same name, size and mtime; another inode
    assert cache.sha256(path)[1] == hashlib.sha256(b"b" * 1000).hexdigest()
    assert len(hashed) == 3 and cache.hashed == 3


def test_verify_with_a_warm_cache_still_catches_a_changed_file(tmp_path):
    from zerogr_build.bundle import publish_bundle
    from zerogr_build.index import build_index

    sids = np.random.default_rng(0).integers(0, 8, (300, 3))
    index = build_index(sids, (8, 8, 8), workers=1)
    vdir = publish_bundle(index, pa.array(np.arange(300)), tmp_path / "out").path
    cache = HashCache()
    verify_bundle(vdir, hash_cache=cache)
    listed = len(json.loads((vdir / "manifest.json").read_text())["files"])
    assert cache.hashed == listed
    verify_bundle(vdir, hash_cache=cache)
    assert cache.hashed == listed  # nothing hashed twice
    _rewrite_in_place_keeping_size_and_mtime(vdir / "items.parquet")
    with pytest.raises(BundleError, match="sha256 mismatch"):
        verify_bundle(vdir, hash_cache=cache)


def test_the_structural_checks_run_again_only_when_a_file_they_read_changed(tmp_path, monkeypatch):
    import zerogr_build.bundle.verify as verify
    from zerogr_build.bundle import publish_bundle
    from zerogr_build.index import build_index

    checked = []
    real = verify.check_unique_items
    monkeypatch.setattr(
        verify, "check_unique_items", lambda items, path: checked.append(path) or real(items, path)
    )
    index = build_index(np.random.default_rng(1).integers(0, 8, (300, 3)), (8, 8, 8), workers=1)
    vdir = publish_bundle(index, pa.array(np.arange(300)), tmp_path / "out").path
    cache = HashCache()
    verify_bundle(vdir, hash_cache=cache)
    verify_bundle(vdir, hash_cache=cache)
    assert len(checked) == 1
    verify_bundle(vdir)  # without the run's cache: every check
    assert len(checked) == 2
    items = vdir / "items.parquet"
    os.utime(items, ns=(items.stat().st_atime_ns, items.stat().st_mtime_ns + 1))  # touched: checked again
    verify_bundle(vdir, hash_cache=cache)
    assert len(checked) == 3


@pytest.fixture
def catalog(tmp_path):
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 16, (800, 3)).tolist()
    path = tmp_path / "catalog.parquet"
    pq.write_table(pa.table({"item_id": np.arange(800, dtype=np.int64), "sid": sids}), path)
    return path


def _rebuild(catalog: Path, out: Path):
    args = [
        catalog,
        "--out",
        out,
        "--codebook-sizes",
        "16,16,16",
        "--device",
        "cpu",
        "--tune-args",
        TUNE_ARGS,
    ]
    return invoke("rebuild", *args)


def test_a_rebuild_hashes_each_file_of_its_version_once(catalog, tmp_path, monkeypatch):
    hashed: list[str] = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    out = tmp_path / "bundles"
    done = _rebuild(catalog, out)
    assert done.exit_code == 0, done.stderr
    listed = json.loads((out / "v000001" / "manifest.json").read_text())["files"]
    assert sorted(Path(name).name for name in listed) == sorted(hashed)  # the plan added by tune too


def test_a_file_changed_after_the_first_verification_fails_the_rebuild(catalog, tmp_path, monkeypatch):
    """The tune stage (real, then the items file rewritten in place with its size and mtime put back):
    the verification after tune hashes it again and refuses the version (exit 4, kept, not promoted)."""
    import zerogr_build.rebuild.run as run

    real_tune = run.tune_stage

    def tune_then_corrupt(request, vdir, *args, **kwargs):
        tuned = real_tune(request, vdir, *args, **kwargs)
        _rewrite_in_place_keeping_size_and_mtime(vdir / "items.parquet")
        return tuned

    monkeypatch.setattr(run, "tune_stage", tune_then_corrupt)
    out = tmp_path / "bundles"
    done = _rebuild(catalog, out)
    assert done.exit_code == 4, done.stderr
    assert "verify after tune failed" in done.stderr and "sha256 mismatch" in done.stderr
    assert not (out / "LATEST").exists() and (out / "v000001").is_dir()


@settings(deadline=None, max_examples=150)
@given(st.integers(1, 64), st.data())
def test_the_radix_argsort_is_numpys_stable_argsort(bits, data):
    """verify's catalog sort: the same order as np.argsort(kind="stable") (equal keys in input order)."""
    from zerogr_build.bundle.verify_math import stable_argsort_keys

    values = data.draw(st.lists(st.integers(0, 2**bits - 1), max_size=300))
    if values and data.draw(st.booleans()):  # many repeats
        values = [values[i % min(len(values), 3)] for i in range(len(values))]
    keys = np.array(values, dtype=np.uint64)
    want = np.argsort(keys, kind="stable")
    for overwrite in (False, True):
        order, ordered = stable_argsort_keys(keys.copy(), bits, overwrite=overwrite)
        assert order.tolist() == want.tolist() and ordered.tolist() == keys[want].tolist()
