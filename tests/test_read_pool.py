"""A build's packed read on a thread pool (catalog.row_groups.read_on_pool) holds exactly what the in-order
read holds, and refuses bad input with exactly the in-order read's error (the lowest bad row's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.catalog import read_catalog
from zerogr_build.errors import InputError

SIZES = [5, 7, 3]


@st.composite
def catalogs(draw):
    files = draw(st.integers(1, 3))
    rows = [draw(st.integers(0, 60)) for _ in range(files)]
    if sum(rows) == 0:
        rows[0] = 1
    group = draw(st.integers(1, 13))
    strings = draw(st.booleans())
    fixed = draw(st.booleans())
    bad = draw(st.lists(st.integers(0, sum(rows) - 1), max_size=3))
    return rows, group, strings, fixed, bad, draw(st.integers(0, 2**31))


def _write(tmp, rows, group, strings, fixed, bad, seed):
    rng = np.random.default_rng(seed)
    total = sum(rows)
    sids = np.stack([rng.integers(0, v, total) for v in SIZES], axis=1)
    for row in bad:
        sids[row, row % 3] = SIZES[row % 3] + row  # out of its codebook
    ids = rng.permutation(10 * total)[:total] - 3 * total
    start = 0
    for k, n in enumerate(rows):
        part = slice(start, start + n)
        sid_type = pa.list_(pa.int16(), 3) if fixed else pa.list_(pa.int16())
        table = pa.table({
            "item_id": pa.array([f"i{v}" for v in ids[part]], pa.string()) if strings
            else pa.array(ids[part], pa.int64()),
            "sid": pa.array(sids[part].tolist(), sid_type),
        })
        pq.write_table(table, tmp / f"part-{k}.parquet", row_group_size=group)
        start += n
    return tmp


def _read(path, workers):
    try:
        return read_catalog(path, codebook_sizes=SIZES, pack=True, workers=workers), None
    except InputError as exc:
        return None, str(exc)


@settings(max_examples=40, deadline=None)
@given(case=catalogs())
def test_pooled_packed_read_equals_the_in_order_read(tmp_path_factory, case):
    path = _write(tmp_path_factory.mktemp("cat"), *case)
    in_order, in_order_error = _read(path, 1)
    pooled, pooled_error = _read(path, 3)
    assert pooled_error == in_order_error
    if in_order is None:
        assert case[4], in_order_error  # only the injected bad tokens make a read fail
        return
    np.testing.assert_array_equal(pooled.packed.first, in_order.packed.first)
    np.testing.assert_array_equal(pooled.packed.words, in_order.packed.words)
    assert pooled.item_ids.equals(in_order.item_ids)
    assert pooled.fingerprint == in_order.fingerprint and pooled.rows == in_order.rows


def test_pool_reports_the_lowest_bad_row_of_many(tmp_path):
    """Bad tokens in the last and an early row group: the error names the early one, as the in-order read."""
    rows = 400
    table = pa.table({
        "item_id": pa.array(np.arange(rows), pa.int64()),
        "sid": pa.array([[1, 1, 1]] * rows, pa.list_(pa.int64())),
    })
    sids = table.column("sid").to_pylist()
    sids[390], sids[57] = [1, 9, 1], [4, 1, 8]
    table = table.set_column(1, "sid", pa.array(sids, pa.list_(pa.int64())))
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=10)
    with pytest.raises(InputError, match=r"row 57 \(item id 57\): token 8 at step 2 is >= codebook size 3"):
        read_catalog(tmp_path / "c.parquet", codebook_sizes=SIZES, pack=True, workers=4)
