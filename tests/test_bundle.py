"""Bundle format v1: round trips, the reader's refusals, verify's invariants, add_bundle_files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import reference_steps
from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.bundle import (
    add_bundle_files,
    open_bundle,
    resolve_bundle,
    verify_bundle,
)
from zerogr_build.testing import fake_kernel_file, publish_catalog, random_catalog


def rehash(version_dir: Path, name: str) -> None:
    """Update the manifest's bytes/sha256 of `name` after a test rewrote it (so only the targeted check
    can catch the corruption)."""
    manifest_path = version_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = (version_dir / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))


def edit_manifest(version_dir: Path, change) -> None:
    path = version_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def rewrite_array(version_dir: Path, name: str, change) -> None:
    """Load an array, let `change` modify a writable copy, save it with the same dtype/shape, rehash."""
    array = np.array(np.load(version_dir / name))
    change(array)
    np.save(version_dir / name, array)
    rehash(version_dir, name)


# ------------------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize("string_ids", [False, True])
@pytest.mark.parametrize(
    "step_formats",
    ["auto", "0=dense,1=dense,2=dense", "0=sparse,1=sparse,2=sparse", "0=sparse,1=dense,2=sparse"],
)
def test_round_trip_equals_in_memory(tmp_path, step_formats, string_ids):
    catalog = random_catalog(seed=len(step_formats), string_ids=string_ids)
    index, published = publish_catalog(catalog, tmp_path / "out", step_formats=step_formats)
    bundle = open_bundle(tmp_path / "out")
    assert bundle.path == published.path == tmp_path / "out" / "v000001"
    assert bundle.version == published.version == 1
    assert bundle.manifest == published.manifest
    assert bundle.index.item_order is None
    assert bundle.index.codebook_sizes == index.codebook_sizes
    for mem, disk in zip(index.steps, bundle.index.steps, strict=True):
        assert (disk.format, disk.rows, disk.nnz, disk.max_slots) == (
            mem.format,
            mem.rows,
            mem.nnz,
            mem.max_slots,
        )
        assert mem.arrays().keys() == disk.arrays().keys()
        for role, array in mem.arrays().items():
            assert disk.arrays()[role].dtype == array.dtype
            np.testing.assert_array_equal(disk.arrays()[role], array)
            assert not disk.arrays()[role].flags.writeable
    np.testing.assert_array_equal(bundle.index.leaf_offsets, index.leaf_offsets)
    expected_items = catalog.item_ids.take(pa.array(index.item_order))
    assert bundle.items().type == catalog.item_ids.type
    assert bundle.items().equals(expected_items)
    manifest = bundle.manifest
    assert manifest["format"] == "zerogr-bundle" and manifest["format_version"] == 2
    assert manifest["catalog"] == {
        "path": "cat.parquet",
        "fingerprint": "sha256:test",
        "rows": catalog.rows,
        "distinct_sids": index.num_leaves,
    }
    assert manifest["model_version"] == "m-1"
    assert manifest["settings"]["out"] == str(tmp_path / "out")
    assert manifest["steps"][0]["valid_share"] == pytest.approx(index.steps[0].valid_share)
    on_disk = {p.relative_to(published.path).as_posix() for p in published.path.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    report = verify_bundle(tmp_path / "out", catalog)
    assert report["ok"] and report["catalog"]["item_order_matches"]


def test_wide_codebook_uses_int32_tokens(tmp_path):
    sizes = (3, 70000, 70000, 70000)  # 53 key bits, and 68 once step 0 is widened below
    catalog = random_catalog(seed=3, n=400, sizes=sizes)
    index, _ = publish_catalog(catalog, tmp_path, step_formats="1=sparse,2=sparse,3=sparse")
    bundle = open_bundle(tmp_path)
    assert bundle.manifest["steps"][1]["dtypes"]["tokens"] == "<i4"
    np.testing.assert_array_equal(bundle.index.steps[1].tokens, index.steps[1].tokens)
    verify_bundle(tmp_path, catalog)

    wide = random_catalog(seed=4, n=400, sizes=(70000,) * 4)  # SID keys too wide for one uint64
    publish_catalog(wide, tmp_path / "wide")
    verify_bundle(tmp_path / "wide", wide)
    sids = wide.sids.copy()
    sids[7, 3] = (sids[7, 3] + 1) % 70000
    object.__setattr__(wide, "sids", sids)
    with pytest.raises(BundleError, match=r"catalog row 7 .* is not in the bundle"):
        verify_bundle(tmp_path / "wide", wide)


@settings(max_examples=15, deadline=None)
@given(
    num_steps=st.integers(1, 4),
    n=st.integers(1, 60),
    seed=st.integers(0, 2**16),
    string_ids=st.booleans(),
)
def test_property_publish_open_matches_brute_force(tmp_path_factory, num_steps, n, seed, string_ids):
    rng = np.random.default_rng(seed)
    sizes = tuple(int(v) for v in rng.integers(1, 6, size=num_steps))
    catalog = random_catalog(seed=seed, n=n, sizes=sizes, string_ids=string_ids, dup_share=0.3)
    out = tmp_path_factory.mktemp("b")
    formats = ",".join(f"{t}={rng.choice(['sparse', 'dense'])}" for t in range(num_steps))
    publish_catalog(catalog, out, step_formats=formats)
    bundle = open_bundle(out)
    steps, leaves, leaf_items = reference_steps(catalog.sids)
    for t, table in enumerate(bundle.index.steps):
        got = [list(zip(*map(np.ndarray.tolist, table.children(r)), strict=True)) for r in range(table.rows)]
        assert got == steps[t]
    assert [tuple(s) for s in bundle.index.leaf_sids().tolist()] == leaves
    by_leaf = bundle.item_ids_for_leaves(np.arange(len(leaves))[::-1]).to_pylist()[::-1]
    assert by_leaf == [[catalog.item_ids[i].as_py() for i in leaf_items[j]] for j in range(len(leaves))]
    verify_bundle(out, catalog)


def test_item_ids_for_leaves(tmp_path):
    catalog = random_catalog(seed=5, n=300, dup_share=0.4)
    index, _ = publish_catalog(catalog, tmp_path)
    bundle = open_bundle(tmp_path)
    leaves = np.array([3, 0, 3, index.num_leaves - 1])
    got = bundle.item_ids_for_leaves(leaves).to_pylist()
    items = bundle.items().to_pylist()
    offsets = index.leaf_offsets
    assert got == [items[offsets[j] : offsets[j + 1]] for j in leaves]
    assert bundle.item_ids_for_leaves([]).to_pylist() == []
    with pytest.raises(IndexError, match="leaf"):
        bundle.item_ids_for_leaves([index.num_leaves])


# ---------------------------------------------------------------------------------------- resolving


def test_resolve_bundle(tmp_path, monkeypatch):
    catalog = random_catalog(n=100)
    publish_catalog(catalog, tmp_path / "bundles")
    publish_catalog(catalog, tmp_path / "bundles")
    v2 = tmp_path / "bundles" / "v000002"
    assert resolve_bundle(tmp_path / "bundles") == v2
    assert resolve_bundle(tmp_path / "bundles" / "v000001") == tmp_path / "bundles" / "v000001"
    monkeypatch.chdir(tmp_path)
    assert resolve_bundle(None).resolve() == v2
    with pytest.raises(InputError, match="nope"):
        resolve_bundle(tmp_path / "nope")
    with pytest.raises(InputError, match="not a bundle"):
        resolve_bundle(tmp_path)
    (tmp_path / "bundles" / "LATEST").write_text("../elsewhere\n")
    with pytest.raises(BundleError, match="LATEST"):
        resolve_bundle(tmp_path / "bundles")
    (tmp_path / "bundles" / "LATEST").write_text("v000009\n")
    with pytest.raises(BundleError, match="v000009"):
        open_bundle(tmp_path / "bundles")


# ------------------------------------------------------------------------------------ reader refusals


@pytest.fixture()
def bundle_dir(tmp_path):
    catalog = random_catalog(seed=11, n=800)
    _, published = publish_catalog(catalog, tmp_path / "out", step_formats="0=dense,1=sparse,2=sparse")
    return published.path


def test_tampered_file_is_refused_naming_it(bundle_dir):
    path = bundle_dir / "step1.tokens.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"step1\.tokens\.npy: sha256 mismatch"):
        open_bundle(bundle_dir)
    open_bundle(bundle_dir, verify_checksums=False)  # same size: only the checksum can tell
    with pytest.raises(BundleError, match=r"step1\.tokens\.npy"):
        verify_bundle(bundle_dir)


def test_truncated_or_missing_file_is_refused(bundle_dir):
    path = bundle_dir / "leaves.offsets.npy"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(BundleError, match=r"leaves\.offsets\.npy: .* bytes, manifest says"):
        open_bundle(bundle_dir, verify_checksums=False)
    (bundle_dir / "items.parquet").unlink()
    with pytest.raises(BundleError, match=r"items\.parquet: missing"):
        open_bundle(bundle_dir)


@pytest.mark.parametrize("bad_name", ["../escape.npy", "/etc/passwd", "a/../../x.npy", "./step1.tokens.npy"])
def test_manifest_path_traversal_refused(bundle_dir, bad_name):
    def change(m):
        m["files"][bad_name] = m["files"].pop("step1.tokens.npy")
        m["steps"][1]["files"]["tokens"] = bad_name

    edit_manifest(bundle_dir, change)
    with pytest.raises(BundleError, match="manifest.json"):
        open_bundle(bundle_dir)


def test_symlink_out_of_bundle_refused(bundle_dir, tmp_path):
    outside = tmp_path / "outside.npy"
    shutil.copy(bundle_dir / "step2.indptr.npy", outside)
    (bundle_dir / "step2.indptr.npy").unlink()
    os.symlink(outside, bundle_dir / "step2.indptr.npy")
    with pytest.raises(BundleError, match=r"step2\.indptr\.npy: resolves outside"):
        open_bundle(bundle_dir)


def test_wrong_dtype_or_shape_refused(bundle_dir):
    indptr = np.load(bundle_dir / "step1.indptr.npy")
    np.save(bundle_dir / "step1.indptr.npy", indptr.astype(np.int64))
    rehash(bundle_dir, "step1.indptr.npy")
    with pytest.raises(BundleError, match=r"step1\.indptr\.npy: dtype <i8, manifest implies <i4"):
        open_bundle(bundle_dir)
    np.save(bundle_dir / "step1.indptr.npy", np.append(indptr, indptr[-1]))
    rehash(bundle_dir, "step1.indptr.npy")
    with pytest.raises(BundleError, match=r"step1\.indptr\.npy: shape"):
        open_bundle(bundle_dir)
    np.save(bundle_dir / "step1.indptr.npy", np.asfortranarray(np.zeros((2, 3), dtype=np.int32)))
    rehash(bundle_dir, "step1.indptr.npy")
    with pytest.raises(BundleError, match=r"step1\.indptr\.npy: Fortran"):
        open_bundle(bundle_dir)
    (bundle_dir / "step1.indptr.npy").write_bytes(b"not an array at all")
    rehash(bundle_dir, "step1.indptr.npy")
    with pytest.raises(BundleError, match=r"step1\.indptr\.npy: not a \.npy"):
        open_bundle(bundle_dir)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(format="other"), "format is 'other'"),
        (lambda m: m.update(format_version=3), "format_version 3 is not supported"),
        (lambda m: m.pop("steps"), "missing field 'steps'"),
        (lambda m: m.update(num_steps=True), "num_steps"),
        (lambda m: m["steps"][1].update(rows=5), r"steps\[1\]: rows 5"),
        (lambda m: m["steps"][1]["dtypes"].update(tokens="<f4"), "dtype '<f4' of tokens not allowed"),
        (lambda m: m["steps"][0].update(format="sparse"), "a sparse step has files"),
        (lambda m: m["files"].pop("items.parquet"), "not listed in files"),
        (lambda m: m.update(version=7), "does not match dir name"),
        (lambda m: m["files"]["items.parquet"].update(sha256="XYZ"), "64 lowercase hex"),
    ],
)
def test_bad_manifest_refused(bundle_dir, change, message):
    edit_manifest(bundle_dir, change)
    with pytest.raises(BundleError, match=message):
        open_bundle(bundle_dir)


def test_manifest_not_json_refused(bundle_dir):
    (bundle_dir / "manifest.json").write_text("{")
    with pytest.raises(BundleError, match="manifest.json: not readable JSON"):
        open_bundle(bundle_dir)


# ----------------------------------------------------------------------------------- verify invariants


def _swap_first_two_in_row(a):
    a[0], a[1] = a[1], a[0]


CORRUPTIONS = {
    "indptr not increasing": ("step2.indptr.npy", lambda a: a.__setitem__(2, a[1]), "strictly increase"),
    "indptr wrong end": ("step1.indptr.npy", lambda a: a.__setitem__(-1, a[-1] - 1), "end at nnz"),
    "tokens not ascending": ("step1.tokens.npy", _swap_first_two_in_row, "not strictly ascending"),
    "token out of range": ("step2.tokens.npy", lambda a: a.__setitem__(-1, 300), "outside 0..299"),
    "dense not row numbering": (
        "step0.next.npy",
        lambda a: a.__setitem__((0, slice(0, 2)), a[0, 1::-1]),
        "numbering",
    ),
    "dense below -1": ("step0.next.npy", lambda a: a.__setitem__((0, 0), -2), "only -1"),
    "dense lost child": ("step0.next.npy", lambda a: a.__setitem__((0, 3), -1), "valid entries"),
    "leaf offsets not increasing": (
        "leaves.offsets.npy",
        lambda a: a.__setitem__(1, 0),
        "leaf 0 has 0 items",
    ),
}


@pytest.mark.parametrize("chunk", [1 << 20, 1, 3])
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_verify_catches_corruption(bundle_dir, kind, chunk, monkeypatch):
    """Each corruption named by its file; the structural checks also read in small chunks (row and
    chunk boundaries anywhere: the untouched version passes, the corrupted one fails alike)."""
    import zerogr_build.bundle.verify as verify

    monkeypatch.setattr(verify, "CHECK_CHUNK", chunk)
    name, change, message = CORRUPTIONS[kind]
    verify_bundle(bundle_dir)
    rewrite_array(bundle_dir, name, change)
    with pytest.raises(BundleError, match=re.escape(name) + ": .*" + message):
        verify_bundle(bundle_dir)


def test_verify_catches_duplicate_items(bundle_dir):
    table = pq.read_table(bundle_dir / "items.parquet")
    ids = table.column("item_id").to_pylist()
    ids[5] = ids[6]
    pq.write_table(
        pa.table({"item_id": pa.array(ids, type=table.schema.field("item_id").type)}),
        bundle_dir / "items.parquet",
    )
    rehash(bundle_dir, "items.parquet")
    with pytest.raises(
        BundleError,
        match=rf"items\.parquet: item id {re.escape(repr(ids[6]))} at position 6 repeats position 5",
    ):
        verify_bundle(bundle_dir)


def test_verify_against_catalog(tmp_path):
    catalog = random_catalog(seed=21, n=500, dup_share=0.3)
    _, published = publish_catalog(catalog, tmp_path)
    assert verify_bundle(tmp_path, catalog)["catalog"]["matched"]

    # Items of one leaf in another order: the same mapping, so it passes (flagged as reordered).
    leaf_rows = {}
    for i, sid in enumerate(map(tuple, catalog.sids.tolist())):
        leaf_rows.setdefault(sid, []).append(i)
    shared = next(rows for rows in leaf_rows.values() if len(rows) > 1)
    order = np.arange(catalog.rows)
    order[shared[0]], order[shared[1]] = shared[1], shared[0]
    reordered = random_catalog(seed=21, n=500, dup_share=0.3)
    object.__setattr__(reordered, "item_ids", catalog.item_ids.take(pa.array(order)))
    report = verify_bundle(tmp_path, reordered)
    assert report["catalog"]["matched"] and not report["catalog"]["item_order_matches"]

    # Two items of different leaves swapped: the mapping differs.
    lone = [rows[0] for rows in leaf_rows.values() if len(rows) == 1][:2]
    order = np.arange(catalog.rows)
    order[lone[0]], order[lone[1]] = lone[1], lone[0]
    object.__setattr__(reordered, "item_ids", catalog.item_ids.take(pa.array(order)))
    with pytest.raises(BundleError, match=r"items\.parquet: leaf \d+ holds item"):
        verify_bundle(tmp_path, reordered)

    # A catalog SID the bundle lacks, and one leaf the catalog lacks.
    changed = random_catalog(seed=21, n=500, dup_share=0.3)
    sids = changed.sids.copy()
    sids[lone[0]] = [3, 39, 299]
    while tuple(sids[lone[0]]) in leaf_rows:
        sids[lone[0], 2] -= 1
    object.__setattr__(changed, "sids", sids)
    with pytest.raises(BundleError, match=rf"catalog row {lone[0]} .* is not in the bundle"):
        verify_bundle(tmp_path, changed)
    object.__setattr__(changed, "sids", np.delete(catalog.sids, lone[0], axis=0))
    object.__setattr__(
        changed, "item_ids", catalog.item_ids.take(pa.array(np.delete(np.arange(500), lone[0])))
    )
    with pytest.raises(BundleError, match=r"leaves\.offsets\.npy: leaf \d+ .* has 1 items, the catalog 0"):
        verify_bundle(tmp_path, changed)


# ------------------------------------------------------------------------------------ add_bundle_files


def test_add_bundle_files_keeps_verify_passing(bundle_dir):
    plan = json.dumps({"device": "cpu", "entries": []}).encode()
    cubin = fake_kernel_file("cubin", "sm_90")
    add_bundle_files(bundle_dir.parent, {"plans/cpu.json": plan, "kernels/sm_90/selective.cubin": cubin})
    bundle = open_bundle(bundle_dir)
    assert bundle.plans() == {"cpu": "plans/cpu.json"}
    assert bundle.plan("cpu") == {"device": "cpu", "entries": []}
    assert bundle.files("kernels/") == ["kernels/sm_90/selective.cubin"]
    assert bundle.file("kernels/sm_90/selective.cubin").read_bytes() == cubin
    report = verify_bundle(bundle_dir)
    assert report["unlisted_files"] == [] and report["files"] == 9

    new_plan = json.dumps({"device": "cpu", "entries": [1]}).encode()
    manifest = add_bundle_files(bundle_dir, {"plans/cpu.json": new_plan, "plans/cuda-h100.json": b"{}"})
    assert manifest["files"]["plans/cpu.json"]["sha256"] == hashlib.sha256(new_plan).hexdigest()
    assert open_bundle(bundle_dir).plan("cpu")["entries"] == [1]
    assert sorted(open_bundle(bundle_dir).plans()) == ["cpu", "cuda-h100"]
    verify_bundle(bundle_dir)
    assert not [p for p in bundle_dir.rglob(".tmp-*")]


@pytest.mark.parametrize(
    "name", ["step0.next.npy", "items.parquet", "manifest.json", "../x.json", "/abs.json"]
)
def test_add_bundle_files_refuses_index_files_and_escapes(bundle_dir, name):
    with pytest.raises(BundleError):
        add_bundle_files(bundle_dir, {name: b"x"})
    verify_bundle(bundle_dir)


def test_add_bundle_files_refuses_symlinked_dir_out(bundle_dir, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", bundle_dir / "plans")
    for name in ("plans/cpu.json", "plans/deeper/cpu.json"):
        with pytest.raises(BundleError, match="outside"):
            add_bundle_files(bundle_dir, {name: b"{}"})
        assert not list((tmp_path / "elsewhere").iterdir())  # nothing written there, not even a dir
