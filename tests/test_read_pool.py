"""A build's packed read on a thread pool (catalog.row_groups.read_on_pool) holds exactly what the in-order
read holds, and refuses bad input with exactly the in-order read's error (the lowest bad row's)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.catalog import read_catalog

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
        table = pa.table(
            {
                "item_id": pa.array([f"i{v}" for v in ids[part]], pa.string())
                if strings
                else pa.array(ids[part], pa.int64()),
                "sid": pa.array(sids[part].tolist(), sid_type),
            }
        )
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
    table = pa.table(
        {
            "item_id": pa.array(np.arange(rows), pa.int64()),
            "sid": pa.array([[1, 1, 1]] * rows, pa.list_(pa.int64())),
        }
    )
    sids = table.column("sid").to_pylist()
    sids[390], sids[57] = [1, 9, 1], [4, 1, 8]
    table = table.set_column(1, "sid", pa.array(sids, pa.list_(pa.int64())))
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=10)
    with pytest.raises(InputError, match=r"row 57 \(item id 57\): token 8 at step 2 is >= codebook size 3"):
        read_catalog(tmp_path / "c.parquet", codebook_sizes=SIZES, pack=True, workers=4)


def test_pool_reports_the_lowest_bad_row_when_a_later_one_fails_first(tmp_path, monkeypatch):
    """The late row group is made to fail before the early one is even decoded: the error is still the
    early one's (futures are collected in catalog order, not as they complete)."""
    from zerogr_build.catalog import reader as reader_module
    from zerogr_build.catalog import row_groups

    rows = 400
    sids = [[1, 1, 1]] * rows
    sids[57], sids[390] = [4, 1, 8], [1, 9, 1]
    ids = pa.array(np.arange(rows), pa.int64())
    table = pa.table({"item_id": ids, "sid": pa.array(sids, pa.list_(pa.int64()))})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=10)
    late_failed = threading.Event()
    plain_iter, plain_add = row_groups.iter_batches, reader_module.BatchReader.add_batch

    def iter_batches(name, pf, columns, groups=None, use_threads=True):
        if groups == [5]:  # rows 50..59: wait until the late group has raised
            assert late_failed.wait(10)
        yield from plain_iter(name, pf, columns, groups, use_threads)

    def add_batch(self, name, batch, file_row, row):
        try:
            plain_add(self, name, batch, file_row, row)
        finally:
            if row == 390:
                late_failed.set()

    monkeypatch.setattr(row_groups, "iter_batches", iter_batches)
    monkeypatch.setattr(reader_module.BatchReader, "add_batch", add_batch)
    with pytest.raises(InputError, match=r"row 57 \(item id 57\)"):
        read_catalog(tmp_path / "c.parquet", codebook_sizes=SIZES, pack=True, workers=4)
    assert late_failed.is_set()


def test_pool_reads_files_without_row_groups(tmp_path):
    """A Parquet file closed without any write has no row group at all; it is read as 0 rows."""
    schema = pa.schema([("item_id", pa.int64()), ("sid", pa.list_(pa.int16()))])
    pq.ParquetWriter(tmp_path / "a.parquet", schema).close()
    pq.write_table(
        pa.table(
            {
                "item_id": pa.array([5, 6, 7], pa.int64()),
                "sid": pa.array([[1, 2, 0], [0, 0, 1], [4, 6, 2]], pa.list_(pa.int16())),
            }
        ),
        tmp_path / "b.parquet",
        row_group_size=1,
    )
    in_order, pooled = _read(tmp_path, 1), _read(tmp_path, 3)
    assert in_order[1] is None and pooled[1] is None
    np.testing.assert_array_equal(pooled[0].packed.words, in_order[0].packed.words)
    assert pooled[0].item_ids.to_pylist() == [5, 6, 7]


def test_pool_fixes_the_sid_length_from_the_first_rows_even_after_an_empty_file(tmp_path):
    """An empty first file (one row group of 0 rows), then 4-token SIDs where 3 codebooks are given: the
    pooled read refuses it with the in-order read's words, not with a length taken from a later row."""
    sid_type = pa.list_(pa.int16())
    pq.write_table(
        pa.table({"item_id": pa.array([], pa.int64()), "sid": pa.array([], sid_type)}), tmp_path / "a.parquet"
    )
    sids = [[1, 1, 1, 1]] * 200 + [[1, 1, 1]] * 2
    table = pa.table({"item_id": pa.array(np.arange(202), pa.int64()), "sid": pa.array(sids, sid_type)})
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=10)
    _, in_order_error = _read(tmp_path, 1)
    assert "3 codebook sizes given but column 'sid' holds SIDs of 4 tokens" in in_order_error
    for _ in range(5):
        assert _read(tmp_path, 4)[1] == in_order_error


def test_pool_reads_row_groups_large_enough_for_the_numba_range_check(tmp_path):
    """Row groups above NUMBA_MIN_ROWS run the nogil range check on several threads at once."""
    from zerogr_build.catalog import NUMBA_MIN_ROWS

    rows = 3 * NUMBA_MIN_ROWS + 17
    rng = np.random.default_rng(1)
    sids = np.stack([rng.integers(0, v, rows) for v in SIZES], axis=1).astype(np.int16)
    sids[rows - 5, 1] = 7  # out of range in the last group: the error names it on both paths
    table = pa.table(
        {
            "item_id": pa.array(np.arange(rows), pa.int64()),
            "sid": pa.FixedSizeListArray.from_arrays(pa.array(sids.reshape(-1)), 3),
        }
    )
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=NUMBA_MIN_ROWS)
    assert _read(tmp_path / "c.parquet", 3)[1] == _read(tmp_path / "c.parquet", 1)[1]
    assert f"row {rows - 5} " in _read(tmp_path / "c.parquet", 3)[1]
    sids[rows - 5, 1] = 0
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(sids.reshape(-1)), 3)
    pq.write_table(table.set_column(1, "sid", fixed), tmp_path / "c.parquet", row_group_size=NUMBA_MIN_ROWS)
    pooled, in_order = _read(tmp_path / "c.parquet", 3)[0], _read(tmp_path / "c.parquet", 1)[0]
    np.testing.assert_array_equal(pooled.packed.words, in_order.packed.words)
    np.testing.assert_array_equal(pooled.packed.first, in_order.packed.first)


# ------------------------------------------------------------------------------------------------- G3 / G9


def _catalog_table(rows, seed):
    rng = np.random.default_rng(seed)
    sids = np.stack([rng.integers(0, v, rows) for v in SIZES], axis=1).astype(np.int16)
    return pa.table(
        {
            "item_id": pa.array(np.arange(rows) + 100_000 * seed, pa.int64()),
            "sid": pa.FixedSizeListArray.from_arrays(pa.array(sids.reshape(-1)), 3),
        }
    )


class _OnStage:
    """A Progress that runs `action` when the read stage starts (after the footers, before any data)."""

    def __init__(self, action):
        self.action = action

    def stage(self, name, total=None):
        if name == "read":
            self.action()

    def advance(self, n=1):
        pass


@pytest.mark.parametrize("workers", [1, 3])
def test_a_catalog_replaced_after_its_footer_was_read_is_refused(tmp_path, workers):
    """The exporter renames a new catalog over the old one between the footer pass and the data: the
    read refuses it naming the file (before: the new rows were read under the old footer, exit 0)."""
    path, new = tmp_path / "c.parquet", tmp_path / "next.parquet"
    pq.write_table(_catalog_table(300, 1), path, row_group_size=10)
    pq.write_table(_catalog_table(300, 2), new, row_group_size=10)
    replace = _OnStage(lambda: os.replace(new, path))
    with pytest.raises(InputError, match=r"c\.parquet: the file changed while it was being read"):
        read_catalog(path, codebook_sizes=SIZES, pack=True, workers=workers, progress=replace)


def test_a_catalog_replaced_during_the_pooled_read_is_never_mixed(tmp_path, monkeypatch):
    """The review's reproducer: the new file is renamed over the catalog at the third ParquetFile made for
    it. The read is the old file whole (with the old file's fingerprint) or a refusal naming the file;
    never rows of both (before: 10 old rows and 290 new ones, exit 0)."""
    path, new = tmp_path / "c.parquet", tmp_path / "next.parquet"
    pq.write_table(_catalog_table(300, 1), path, row_group_size=10)
    old = read_catalog(path, codebook_sizes=SIZES, pack=True, workers=1)
    pq.write_table(_catalog_table(300, 2), new, row_group_size=10)
    made = []
    plain_init = pq.ParquetFile.__init__

    def init(self, source, *args, **kwargs):
        made.append(source)
        if len(made) == 3:
            os.replace(new, path)
        plain_init(self, source, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    try:
        pooled = read_catalog(path, codebook_sizes=SIZES, pack=True, workers=3)
    except InputError as exc:
        assert "c.parquet: the file changed while it was being read" in str(exc)
        return
    assert pooled.item_ids.equals(old.item_ids)
    np.testing.assert_array_equal(pooled.packed.words, old.packed.words)
    assert pooled.fingerprint == old.fingerprint


def test_a_catalog_rewritten_in_place_while_read_is_refused(tmp_path):
    """Rewritten in place (same inode) after its first rows were read: refused at the end of the file."""
    path = tmp_path / "c.parquet"
    pq.write_table(_catalog_table(300, 1), path, row_group_size=10)
    os.utime(path, (1_000_000_000, 1_000_000_000))  # an mtime the rewrite cannot share
    other = tmp_path / "other.parquet"
    pq.write_table(_catalog_table(300, 2), other, row_group_size=10)

    class Rewrite:
        done = False

        def stage(self, name, total=None):
            pass

        def advance(self, n=1):
            if not self.done:
                self.done = True
                path.write_bytes(other.read_bytes())

    with pytest.raises(InputError, match=r"c\.parquet: the file changed while it was being read"):
        read_catalog(path, codebook_sizes=SIZES, pack=True, workers=1, progress=Rewrite())


@pytest.mark.parametrize("workers", [1, 3])
def test_each_footer_is_parsed_once_and_each_file_opened_once_for_its_data(tmp_path, monkeypatch, workers):
    """A file of 400 row groups: the footer (which lists all 400) is parsed once, in the footer pass, and
    the data pass opens the file once. Before, every pooled task reopened the file and parsed the whole
    footer again: quadratic in the row groups (20,000 groups did not finish in 300 s)."""
    pq.write_table(_catalog_table(2000, 1), tmp_path / "a.parquet", row_group_size=5)
    pq.write_table(_catalog_table(2000, 2), tmp_path / "b.parquet", row_group_size=5)
    footers, opens = [], []
    plain_init, plain_open = pq.ParquetFile.__init__, pa.OSFile

    def init(self, source, *args, metadata=None, **kwargs):
        if metadata is None:
            footers.append(source)
        plain_init(self, source, *args, metadata=metadata, **kwargs)

    def os_file(name, *args, **kwargs):
        opens.append(name)
        return plain_open(name, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", init)
    monkeypatch.setattr(pa, "OSFile", os_file)
    catalog = read_catalog(tmp_path, codebook_sizes=SIZES, pack=True, workers=workers)
    assert catalog.rows == 4000
    assert len(footers) == 2  # one per file: the footer pass
    assert len(opens) <= 4  # footer pass + data pass, one open each per file


def test_bench_catalog_read_smoke():
    """scripts/bench_catalog_read.py --smoke prints its table (in order beside pooled) in a few seconds."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    res = subprocess.run(
        [sys.executable, str(repo / "scripts" / "bench_catalog_read.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "| 200 row groups of 10 rows" in res.stdout and "pooled / in order" in res.stdout
