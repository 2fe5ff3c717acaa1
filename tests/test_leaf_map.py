"""The leaf -> items map of bundle format v2 (no offsets when every SID names one item, else int32 offsets
when they fit) against brute force, and format v1 bundles (tests/fixtures, written by the v1 writer) read,
verified and decoded exactly like the v2 bundle of the same catalog."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import BundleError
from zerogr_build.bundle import open_bundle, publish_bundle, verify_bundle
from zerogr_build.bundle.files import sha256_file
from zerogr_build.index import build_index
from zerogr_build.index.tables import leaf_map_dtype
from zerogr_build.runtime.decoder import Decoder

FIXTURES = Path(__file__).parent / "fixtures"
V1_BUNDLES = ("bundle_v1_shared", "bundle_v1_unique")


def _brute_force_leaves(sids: np.ndarray, ids: list) -> list[tuple[tuple[int, ...], list]]:
    """(SID, item ids in catalog order) of every distinct SID, SIDs ascending."""
    groups: dict[tuple[int, ...], list] = {}
    for row, item in zip(sids.tolist(), ids, strict=True):
        groups.setdefault(tuple(row), []).append(item)
    return sorted(groups.items())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    n=st.integers(1, 60),
)
def test_leaf_map_matches_brute_force(tmp_path_factory, data, sizes, n):
    # Half the examples draw distinct SIDs (the no-offsets case), the rest may repeat SIDs.
    unique_sids = data.draw(st.booleans())
    if unique_sids:
        n = min(n, int(np.prod(sizes)))
    rows = st.tuples(*[st.integers(0, v - 1) for v in sizes])
    sids = np.array(
        data.draw(st.lists(rows, min_size=n, max_size=n, unique=unique_sids)), dtype=np.int64
    ).reshape(n, len(sizes))
    ids = [int(i) * 7 + 3 for i in data.draw(st.permutations(range(n)))]
    index = build_index(sids, sizes)
    out = tmp_path_factory.mktemp("leafmap")
    published = publish_bundle(index, pa.array(ids, type=pa.int64()), out)
    bundle = open_bundle(published.path)
    expected = _brute_force_leaves(sids, ids)
    leaves = bundle.manifest["leaves"]
    unique = len(expected) == n
    assert leaves["dtype"] == (None if unique else "<i4")
    assert ("offsets" in leaves["files"]) is not unique
    assert (published.path / "leaves.offsets.npy").exists() is not unique
    assert bundle.index.leaf_map_bytes == (0 if unique else 4 * (len(expected) + 1))
    got = bundle.item_ids_for_leaves(np.arange(len(expected))).to_pylist()
    assert got == [items for _, items in expected]
    assert [tuple(s) for s in bundle.index.leaf_sids().tolist()] == [sid for sid, _ in expected]
    verify_bundle(published.path)


def test_leaf_map_dtype_rule():
    assert leaf_map_dtype(5, 5) is None
    assert leaf_map_dtype(4, 5) == "<i4"
    assert leaf_map_dtype(4, 2**31 - 1) == "<i4"
    assert leaf_map_dtype(4, 2**31) == "<i8"


def _rebuild_as_v2(v1: Path, out: Path):
    """The v1 fixture's catalog (leaf order, which is a catalog order giving the same leaf order) built and
    published again by the current writer. Returns the PublishedBundle."""
    old = open_bundle(v1)
    counts = np.diff(np.asarray(old.index.leaf_offsets, dtype=np.int64))
    sids = np.repeat(old.index.leaf_sids(), counts, axis=0)
    formats = ",".join(f"{t.step}={t.format}" for t in old.index.steps)
    index = build_index(sids, old.index.codebook_sizes, step_formats=formats)
    return publish_bundle(index, old.items(), out, manifest_fields={"model_version": "fixture-v1"})


def _step_fn(dim: int = 6):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(8, dim, generator=g)
    emb = torch.randn(64, dim, generator=g)

    def step_fn(step: int, prefixes: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        h = base[step].expand(prefixes.shape[0], dim) + base[batch % 8]
        for j in range(step):
            h = h + emb[(prefixes[:, j] * (j + 1)) % 64]
        return h

    return step_fn


@pytest.mark.parametrize("name", V1_BUNDLES)
def test_bundle_opens_verifies_and_decodes_like_v2(tmp_path, name):
    v1 = tmp_path / name
    shutil.copytree(FIXTURES / name, v1)
    old = open_bundle(v1)
    assert old.manifest["format_version"] == 1 and old.manifest["leaves"]["dtype"] == "<i8"
    assert old.index.leaf_offsets.dtype == np.int64
    assert verify_bundle(v1)["ok"]
    new = open_bundle(_rebuild_as_v2(v1, tmp_path / "out").path)
    assert new.manifest["format_version"] == 2
    n_leaves = old.index.num_leaves
    assert new.index.num_leaves == n_leaves and new.index.num_items == old.index.num_items
    np.testing.assert_array_equal(new.index.leaf_sids(), old.index.leaf_sids())
    np.testing.assert_array_equal(new.index.leaf_offsets, old.index.leaf_offsets)
    everything = np.arange(n_leaves)
    assert new.item_ids_for_leaves(everything).equals(old.item_ids_for_leaves(everything))
    padded = np.array([-1, n_leaves - 1, 0, -1])
    got, want = new.index.leaf_items(padded, new.items()), old.index.leaf_items(padded, old.items())
    for a, b in zip(got, want, strict=True):
        assert a.equals(b) if isinstance(a, pa.Array) else np.array_equal(a, b)

    g = torch.Generator().manual_seed(1)
    weights = [(torch.randn(v, 6, generator=g), None) for v in old.index.codebook_sizes]
    results = []
    for bundle in (old, new):
        decoder = Decoder(bundle, weights)
        res = decoder.search(_step_fn(), batch_size=3, beam_width=n_leaves + 2)
        results.append((res.leaves.clone(), res.scores.clone(), decoder.items(res)))
    torch.testing.assert_close(results[0][1], results[1][1])
    assert torch.equal(results[0][0], results[1][0]) and results[0][2] == results[1][2]


@pytest.mark.parametrize("name", V1_BUNDLES)
def test_changes_only_the_leaf_map_and_manifest(tmp_path, name):
    """Same catalog: every step file and items.parquet keep their bytes; the manifest changes
    format_version and the leaves entry; leaves.offsets.npy becomes int32 (shared) or disappears (unique)."""
    v1 = FIXTURES / name
    new = _rebuild_as_v2(v1, tmp_path / "out").path
    old_manifest = json.loads((v1 / "manifest.json").read_text())
    new_manifest = json.loads((new / "manifest.json").read_text())
    for file in old_manifest["files"]:
        if file == "leaves.offsets.npy":
            continue
        recorded = old_manifest["files"][file]["sha256"]
        assert sha256_file(new / file)[1] == sha256_file(v1 / file)[1] == recorded
    unique = old_manifest["leaves"]["count"] == old_manifest["leaves"]["items"]
    assert (new / "leaves.offsets.npy").exists() is not unique
    if not unique:
        old_offsets, new_offsets = np.load(v1 / "leaves.offsets.npy"), np.load(new / "leaves.offsets.npy")
        assert new_offsets.dtype == np.dtype("<i4")
        np.testing.assert_array_equal(new_offsets, old_offsets)
    changed = {k for k in old_manifest if old_manifest[k] != new_manifest.get(k)}
    assert changed <= {"format_version", "created_at", "leaves", "files"}
    want_leaves = dict(old_manifest["leaves"], dtype=None if unique else "<i4")
    if unique:
        want_leaves["files"] = {"items": "items.parquet"}
    assert new_manifest["leaves"] == want_leaves


def _rewrite_manifest(version_dir: Path, change) -> None:
    path = version_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        # v2 rules
        ("bundle_v1_shared", lambda m: m.update(format_version=2), "offsets dtype must be '<i4'"),
        ("bundle_v1_unique", lambda m: m.update(format_version=2), "offsets dtype must be None"),
        (
            "bundle_v1_unique",
            lambda m: (m.update(format_version=2), m["leaves"].pop("dtype")),
            "missing field 'dtype'",
        ),
        (
            "bundle_v1_unique",
            lambda m: (m.update(format_version=2), m["leaves"].update(dtype=None)),
            "files must name exactly 'items'",
        ),
        (
            "bundle_v1_shared",
            lambda m: (
                m.update(format_version=2),
                m["leaves"].update(dtype=None, files={"items": "items.parquet"}),
            ),
            "offsets dtype must be '<i4'",
        ),
        # v1 rules stay as they were
        ("bundle_v1_shared", lambda m: m["leaves"].update(dtype="<i4"), "offsets dtype must be '<i8'"),
        (
            "bundle_v1_unique",
            lambda m: m["leaves"].update(files={"items": "items.parquet"}),
            "files must name exactly 'items' and 'offsets'",
        ),
    ],
)
def test_hostile_leaf_map_manifests_are_refused(tmp_path, name, change, message):
    bundle = tmp_path / name
    shutil.copytree(FIXTURES / name, bundle)
    _rewrite_manifest(bundle, change)
    with pytest.raises(BundleError, match=message.replace("(", r"\(")):
        open_bundle(bundle, verify_checksums=False)


def test_offsets_file_with_wrong_header_dtype_is_refused(tmp_path):
    """A v2 manifest saying '<i4' over an int64 offsets file (a v1 file left in place)."""
    bundle = tmp_path / "b"
    shutil.copytree(FIXTURES / "bundle_v1_shared", bundle)
    _rewrite_manifest(bundle, lambda m: (m.update(format_version=2), m["leaves"].update(dtype="<i4")))
    with pytest.raises(BundleError, match="leaves.offsets.npy: dtype <i8, manifest implies <i4"):
        open_bundle(bundle, verify_checksums=False)


def test_fixture_hashes_are_intact():
    """The fixtures are what the v1 writer wrote: every listed file still has its recorded sha256."""
    for name in V1_BUNDLES:
        manifest = json.loads((FIXTURES / name / "manifest.json").read_text())
        for file, entry in manifest["files"].items():
            assert hashlib.sha256((FIXTURES / name / file).read_bytes()).hexdigest() == entry["sha256"]
