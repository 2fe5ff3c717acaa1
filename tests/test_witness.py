"""A version checked against the catalog as its build read it, through the build's leaf order (bundle/
witness.py): accepted exactly when its (SID, item) pairs are the catalog's, whatever the witness says."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import BundleError
from zerogr_build.bundle import open_bundle, publish_bundle
from zerogr_build.bundle.verify import check_against_catalog, check_against_witness
from zerogr_build.bundle.witness import BuildWitness, spilled_copy, witness_order, witness_sids
from zerogr_build.index import build_index
from zerogr_build.index.pack import pack_sids, packable

from .cli_runs import TUNE_ARGS, invoke


@st.composite
def catalogs(draw):
    """(sids int [N, L], item ids pa.Array, codebook sizes): few distinct tokens, so SIDs repeat."""
    num_steps = draw(st.integers(1, 3))
    # SIDs in a 64-bit key (the witness holds keys); past 64 bits but packed (it holds PackedSids); too
    # wide to pack (it holds [N, L] tokens).
    kind = draw(st.sampled_from(["key", "packed", "tokens"]))
    if kind == "key":
        sizes = tuple(draw(st.sampled_from([2, 3, 5])) for _ in range(num_steps))
    else:
        sizes = (2**31 - 1, 2**31 - 1, 5) if kind == "packed" else (2**31 - 1,) * 3
    n = draw(st.integers(3, 40))
    pool = draw(st.integers(1, 4))
    tokens = np.array([[draw(st.integers(0, v - 1)) for v in sizes] for _ in range(pool)], dtype=np.int64)
    sids = tokens[np.array(draw(st.lists(st.integers(0, pool - 1), min_size=n, max_size=n)))]
    ids = np.random.default_rng(draw(st.integers(0, 99))).permutation(10 * n)[:n]
    item_ids = pa.array(ids) if draw(st.booleans()) else pa.array([f"item-{i}" for i in ids])
    return sids, item_ids, sizes


def _version(tmp_path, sids, item_ids, sizes, spill: bool = False):
    """(opened version, its witness) of a real build of the catalog; the witness packed when it can be."""
    index = build_index(sids, sizes)
    published = publish_bundle(index, item_ids, tmp_path / "out", manifest_fields={})
    witness = BuildWitness(
        sizes,
        **_witness_sids(sids, sizes, tmp_path if spill else None),
        item_ids=item_ids,
        item_order=index.item_order,
    )
    return open_bundle(published.path, verify_checksums=False), witness, index


def _witness_sids(sids, sizes, spill_dir=None) -> dict:
    """The SID fields of the witness a build that read `sids` keeps (as the build keeps them; spilled to
    a file in spill_dir when given)."""
    return witness_sids(pack_sids(sids, sizes) if packable(len(sids), sizes) else None, sids, spill_dir)


def _pairs(sids, item_ids):
    return sorted((tuple(s), i) for s, i in zip(sids.tolist(), item_ids.to_pylist(), strict=True))


def _same_as_catalog(bundle, sids, item_ids) -> bool:
    """The brute-force reference: the version's (SID, item) pairs equal the catalog's as multisets."""
    leaf_sids = bundle.index.leaf_sids()
    per_item = np.repeat(leaf_sids, np.diff(bundle.index.leaf_offsets), axis=0)
    return _pairs(per_item, bundle.items()) == _pairs(sids, item_ids)


def _items_path(bundle):
    return bundle.path / bundle.manifest["leaves"]["files"]["items"]


def _published(tmp_path_factory, index, item_ids):
    """A version written from `index` and `item_ids` (items.parquet = item_ids in index.item_order)."""
    published = publish_bundle(index, item_ids, tmp_path_factory.mktemp("bad") / "out", manifest_fields={})
    return open_bundle(published.path, verify_checksums=False)


SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(
    data=catalogs(),
    pick=st.randoms(use_true_random=False),
    batch=st.integers(1, 8),
    workers=st.integers(1, 3),
)
def test_the_real_build_passes_and_every_corruption_is_refused(tmp_path_factory, data, pick, batch, workers):
    sids, item_ids, sizes = data
    # batches of a few items, checked on up to three threads at once: leaves and the catalog-order test
    # cross batch edges
    check_order = functools.partial(witness_order, batch_rows=batch, workers=workers)
    spill = pick.random() < 0.5
    bundle, witness, built = _version(tmp_path_factory.mktemp("w"), sids, item_ids, sizes, spill)
    index, items_path = bundle.index, _items_path(bundle)
    assert check_order(index, items_path, witness) is True and _same_as_catalog(bundle, sids, item_ids)
    assert check_against_witness(bundle, witness) == check_against_catalog(bundle, witness.as_catalog())
    n = len(sids)

    # The witness order with a row twice (and one missing): refused, though the version is right.
    order = witness.item_order.copy()
    a, b = pick.sample(range(n), 2)
    order[a] = order[b]
    assert check_order(index, items_path, dataclasses.replace(witness, item_order=order)) is None
    order = witness.item_order.copy()
    order[a] = n  # out of range
    assert check_order(index, items_path, dataclasses.replace(witness, item_order=order)) is None
    # ... and verify, falling back to the full comparison, still accepts the right version.
    assert check_against_witness(bundle, dataclasses.replace(witness, item_order=order))["matched"]

    # A catalog row whose SID the copy changed: refused by both.
    changed = sids.copy()
    row, step = pick.randrange(n), pick.randrange(len(sizes))
    changed[row, step] = (changed[row, step] + 1) % sizes[step]
    other = dataclasses.replace(witness, **_witness_sids(changed, sizes))
    assert check_order(index, items_path, other) is None
    assert not _same_as_catalog(bundle, changed, item_ids)
    with pytest.raises(BundleError):
        check_against_witness(bundle, other)

    # A leaf boundary moved by one (a leaf count off): refused wherever two leaves hold different SIDs.
    offsets = np.asarray(index.leaf_offsets).copy()
    movable = [k for k in range(1, len(offsets) - 1) if offsets[k] - offsets[k - 1] > 1]
    if movable:
        offsets[pick.choice(movable)] -= 1
        assert check_order(dataclasses.replace(index, leaf_offsets=offsets), items_path, witness) is None

    # A version whose items.parquet holds a wrong id, then one with two items of different leaves swapped.
    wrong = item_ids.to_pylist()
    wrong[pick.randrange(n)] = 10**9 if isinstance(wrong[0], int) else "not-in-the-catalog"
    written = _published(tmp_path_factory, built, pa.array(wrong, type=item_ids.type))
    assert check_order(index, _items_path(written), witness) is None
    leaf_of = np.repeat(np.arange(index.num_leaves), np.diff(index.leaf_offsets))
    pairs = [(x, y) for x in range(n) for y in range(x + 1, n) if leaf_of[x] != leaf_of[y]]
    if pairs:
        x, y = pick.choice(pairs)
        swapped = witness.item_order.copy()
        swapped[[x, y]] = swapped[[y, x]]
        written = _published(tmp_path_factory, dataclasses.replace(built, item_order=swapped), item_ids)
        assert check_order(index, _items_path(written), witness) is None
        assert not _same_as_catalog(written, sids, item_ids)
        with pytest.raises(BundleError, match="holds item") as raised:
            check_against_witness(written, witness)
        with pytest.raises(BundleError) as reference:
            check_against_catalog(written, witness.as_catalog())
        assert str(raised.value) == str(reference.value)  # the same message as verify --catalog
    # Two items of one leaf in each other's place, in the version and the witness: accepted, reported.
    same = [(x, y) for x in range(n) for y in range(x + 1, n) if leaf_of[x] == leaf_of[y]]
    if same:
        x, y = pick.choice(same)
        swapped = witness.item_order.copy()
        swapped[[x, y]] = swapped[[y, x]]
        written = _published(tmp_path_factory, dataclasses.replace(built, item_order=swapped), item_ids)
        moved = dataclasses.replace(witness, item_order=swapped)
        assert check_order(index, _items_path(written), moved) is False
        report = check_against_witness(written, moved)
        assert report == check_against_catalog(written, witness.as_catalog())
        assert not report["item_order_matches"]
        # A sort that named one row twice in a leaf (and another never) wrote a version that agrees with
        # its witness everywhere but in the permutation: refused.
        twice = witness.item_order.copy()
        twice[x] = twice[y]
        written = _published(tmp_path_factory, dataclasses.replace(built, item_order=twice), item_ids)
        assert not _same_as_catalog(written, sids, item_ids)
        assert (
            check_order(index, _items_path(written), dataclasses.replace(witness, item_order=twice)) is None
        )
        with pytest.raises(BundleError):
            check_against_witness(written, dataclasses.replace(witness, item_order=twice))


def test_a_spilled_copy_is_equal_and_leaves_no_file(tmp_path):
    array = np.arange(3 * 1000, dtype=np.int64).reshape(1000, 3)
    copy = spilled_copy(array, tmp_path)
    assert isinstance(copy, np.memmap) and np.array_equal(copy, array)
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing left after a crash


def test_a_catalog_sid_not_in_the_version_is_named_as_verify_names_it(tmp_path):
    sids = np.array([[0, 1], [2, 3], [0, 1], [1, 1]])
    item_ids = pa.array([10, 11, 12, 13])
    bundle, witness, _ = _version(tmp_path, sids, item_ids, (4, 4))
    changed = sids.copy()
    changed[3] = [3, 3]
    other = dataclasses.replace(witness, **_witness_sids(changed, (4, 4)))
    with pytest.raises(BundleError, match=r"catalog row 3 \(item 13\) SID \[3, 3\] is not in the bundle"):
        check_against_witness(bundle, other)


@pytest.fixture
def catalog(tmp_path):
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 16, (800, 3)).tolist()
    table = pa.table({"item_id": pa.array(np.arange(800, dtype=np.int64)), "sid": pa.array(sids)})
    path = tmp_path / "catalog.parquet"
    pq.write_table(table, path)
    return path


def test_a_rebuild_refuses_a_version_its_sort_got_wrong_without_reading_the_catalog_twice(
    catalog, tmp_path, monkeypatch
):
    """A sort that puts two items in each other's leaf writes a wrong version with a witness that agrees
    with it: the rebuild refuses it (exit 4, kept, LATEST not moved), from the one catalog read."""
    import zerogr_build.index.sort as sort
    import zerogr_build.pipeline as pipeline

    real_layout, real_read = sort.layout_from_packed, pipeline._read_catalog
    reads = []

    def wrong_layout(*args, **kwargs):
        layout = real_layout(*args, **kwargs)
        order, offsets = layout.item_order, layout.leaf_offsets
        order[0], order[offsets[-2]] = order[offsets[-2]], order[0]  # first and last leaf swap an item
        return layout

    def counting_read(*args, **kwargs):
        reads.append(args[0])
        return real_read(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_read_catalog", counting_read)
    out = tmp_path / "bundles"
    args = [catalog, "--out", out, "--codebook-sizes", "16,16,16", "--device", "cpu", "--force"]
    good = invoke("rebuild", *args, "--tune-args", TUNE_ARGS)
    assert good.exit_code == 0, good.stderr
    assert len(reads) == 1  # verify compared with the catalog as the build read it
    monkeypatch.setattr(sort, "layout_from_packed", wrong_layout)
    bad = invoke("rebuild", *args, "--tune-args", TUNE_ARGS)
    assert bad.exit_code == 4, bad.stderr
    assert "holds item" in bad.stderr and "kept for inspection" in bad.stderr
    assert (out / "LATEST").read_text() == "v000001\n" and (out / "v000002").is_dir()
