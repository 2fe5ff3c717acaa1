"""Sort keys packed as the catalog is read (index.pack) build the same index as the [N, L] path, a catalog
read packed holds the same SIDs, and build memory follows the catalog, not the first codebook (F5)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.bundle.publish import ITEMS_ROW_GROUP_ROWS, ItemsWriter, write_items_in_leaf_order
from zerogr_build.catalog import read_catalog
from zerogr_build.index import build_index
from zerogr_build.index.build import build_index_packed
from zerogr_build.index.pack import pack_sids, packable
from zerogr_build.index.sort import _lexsort_layout, layout_from_packed, sort_and_mark


def _assert_same_index(a, b) -> None:
    assert a.codebook_sizes == b.codebook_sizes
    np.testing.assert_array_equal(a.leaf_offsets, b.leaf_offsets)
    np.testing.assert_array_equal(a.item_order, b.item_order)
    for x, y in zip(a.steps, b.steps, strict=True):
        assert (x.format, x.rows, x.nnz, x.max_slots) == (y.format, y.rows, y.nnz, y.max_slots)
        for role, array in x.arrays().items():
            assert y.arrays()[role].dtype == array.dtype
            np.testing.assert_array_equal(y.arrays()[role], array)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    sizes=st.lists(st.sampled_from([1, 2, 3, 7, 300, 70_000, 2**31 - 1]), min_size=1, max_size=3),
    n=st.integers(1, 80),
)
def test_packed_build_matches_lexsort_reference(data, sizes, n):
    """Against the numpy lexsort layout (brute-force order), including first codebooks far larger than the
    catalog (the renumbered first tokens of F5)."""
    sids = np.array(
        [
            [data.draw(st.integers(0, min(v, 5) - 1 if data.draw(st.booleans()) else v - 1)) for v in sizes]
            for _ in range(n)
        ],
        dtype=np.int64,
    ).reshape(n, len(sizes))
    if not packable(n, sizes):
        return
    packed = pack_sids(sids, sizes)
    np.testing.assert_array_equal(packed.unpack(), sids)
    reference = _lexsort_layout(sids)
    # the in-memory path (packed and scattered from [N, L] in one pass) and the packed path (as read)
    for layout in (sort_and_mark(sids, sizes, workers=2), layout_from_packed(packed, workers=2)):
        np.testing.assert_array_equal(layout.item_order, reference.item_order)
        np.testing.assert_array_equal(layout.leaf_offsets, reference.leaf_offsets)
        for got, want in zip(layout.prefix_tokens, reference.prefix_tokens, strict=True):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(layout.prefix_starts, reference.prefix_starts, strict=True):
            np.testing.assert_array_equal(got, want)
    _assert_same_index(build_index_packed(packed, workers=2), build_index(sids, sizes, workers=2))


def test_build_memory_follows_the_catalog_not_the_first_codebook():
    """F5: 200 items with V0 = 2^31 - 1 used to allocate [threads, V0] int64 histograms (MemoryError)."""
    rng = np.random.default_rng(5)
    sids = np.stack([rng.integers(0, 2**31 - 1, 200), rng.integers(0, 8, 200)], axis=1)
    sizes = [2**31 - 1, 8]
    build_index(sids[:3], sizes, workers=2)  # numba compiles outside the measurement
    tracemalloc.start()
    try:
        index = build_index(sids, sizes, workers=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, peak  # was 2 x 2^31 x 8 bytes of histograms
    np.testing.assert_array_equal(index.leaf_sids(), np.unique(sids, axis=0))


def test_catalog_read_packed_holds_the_same_sids(tmp_path):
    rng = np.random.default_rng(2)
    sids = rng.integers(0, [5, 300, 9], size=(5000, 3))
    path = tmp_path / "cat.parquet"
    table = pa.table({"item_id": pa.array(np.arange(5000) * 2), "sid": pa.array(sids.tolist())})
    pq.write_table(table, path, row_group_size=700)
    plain = read_catalog(path, codebook_sizes=[5, 300, 9])
    packed = read_catalog(path, codebook_sizes=[5, 300, 9], pack=True)
    assert plain.packed is None and packed.sids is None and packed.num_steps == 3
    np.testing.assert_array_equal(packed.packed.unpack(), plain.sids)
    assert packed.item_ids.equals(plain.item_ids)
    inferred = read_catalog(path, pack=True)  # sizes unknown while reading: tokens kept as [N, L]
    assert inferred.packed is None
    np.testing.assert_array_equal(inferred.sids, plain.sids)
    _assert_same_index(build_index_packed(packed.packed), build_index(plain.sids, plain.codebook_sizes))
    consumed = build_index_packed(packed.packed, consume=True)  # the sort takes the words over
    assert packed.packed.num_items == 0 and packed.packed.words.size == 0
    _assert_same_index(consumed, build_index(plain.sids, plain.codebook_sizes))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(0, 40), group=st.integers(1, 7), strings=st.booleans())
def test_items_written_a_row_group_at_a_time_equal_a_whole_take(tmp_path_factory, data, n, group, strings):
    """items.parquet holds item_ids.take(item_order) in order, across row-group boundaries, for integer and
    string ids, with `group` rows per row group."""
    order = np.array(data.draw(st.permutations(range(n))), dtype=np.int32)
    numbers = np.arange(n, dtype=np.int64) * 7 - 3
    ids = pa.array([f"item-{v}" for v in numbers] if strings else numbers)
    path = tmp_path_factory.mktemp("items") / "items.parquet"
    write_items_in_leaf_order(str(path), ids, order, rows_per_group=group)
    written = pq.ParquetFile(path)
    assert written.read().column("item_id").to_pylist() == ids.take(pa.array(order)).to_pylist()
    assert written.schema_arrow.field("item_id").type == ids.type
    assert [written.metadata.row_group(g).num_rows for g in range(written.num_row_groups)] == (
        [min(group, n - s) for s in range(0, n, group)] or [0]
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(0, 40), group=st.integers(1, 7), strings=st.booleans())
def test_items_appended_in_any_pieces_give_the_bytes_of_one_append(tmp_path_factory, data, n, group, strings):
    """ItemsWriter carries a part-filled row group from one piece to the next (a partitioned build appends
    one partition's ids at a time): any cut of the ids into pieces, empty ones included, writes the file
    that one append of all of them writes."""
    numbers = np.arange(n, dtype=np.int64) * 5 + 1
    ids = pa.array([f"id-{v}" for v in numbers] if strings else numbers)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    folder = tmp_path_factory.mktemp("pieces")
    with ItemsWriter(str(folder / "whole.parquet"), ids.type, group) as whole:
        whole.append(ids)
    with ItemsWriter(str(folder / "pieces.parquet"), ids.type, group) as pieces:
        for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
            pieces.append(ids.slice(lo, hi - lo))
    assert (folder / "pieces.parquet").read_bytes() == (folder / "whole.parquet").read_bytes()


def test_items_file_is_the_one_a_whole_table_write_makes(tmp_path):
    """Written a row group at a time, items.parquet is byte-identical to pq.write_table of the leaf-order
    ids (what bundles before the row-group writer hold), here over two default-sized row groups."""
    n = ITEMS_ROW_GROUP_ROWS + 1000
    ids = pa.array(np.arange(n, dtype=np.int64) * 3)
    order = np.random.default_rng(0).permutation(n).astype(np.int32)
    write_items_in_leaf_order(str(tmp_path / "a.parquet"), ids, order)
    pq.write_table(
        pa.table({"item_id": ids.take(pa.array(order))}),
        tmp_path / "b.parquet",
        use_dictionary=False,
        compression="snappy",
    )
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
