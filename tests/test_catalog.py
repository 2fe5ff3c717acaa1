"""read_catalog: layouts, multi-file inputs, inference, and every rule a catalog can break."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.catalog import fingerprint_files, first_duplicate_row, read_catalog
from zerogr_build.catalog import ids as catalog_ids
from zerogr_build.catalog import reader as catalog_reader
from zerogr_build.catalog._kernels import first_repeat_int64, has_repeat_partitioned, step_min_max

UINT16 = pa.uint16()


def list_column(sids: np.ndarray, value_type=UINT16, fixed: bool = False) -> pa.Array:
    n, length = sids.shape
    flat = pa.array(sids.reshape(-1), type=value_type)
    if fixed:
        return pa.FixedSizeListArray.from_arrays(flat, length)
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * length + 1, length, dtype=np.int32)), flat)


def write(path, sids, ids, *, value_type=UINT16, fixed=False, row_group_size=None, **extra) -> str:
    table = pa.table({"item_id": ids, "sid": list_column(np.asarray(sids), value_type, fixed), **extra})
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def random_catalog(n: int, length: int = 3, vocab: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, vocab, size=(n, length))
    ids = rng.permutation(np.arange(n, dtype=np.int64) * 7 + 3)
    return sids, ids


def raises_input(match: str):
    return pytest.raises(InputError, match=match)


def numba_from(monkeypatch, rows: int) -> None:
    """Use the numba kernels from `rows` rows on (1: always, as on large catalogs), in the reader's range
    check and in the duplicate check alike."""
    monkeypatch.setattr(catalog_reader, "NUMBA_MIN_ROWS", rows)
    monkeypatch.setattr(catalog_ids, "NUMBA_MIN_ROWS", rows)


# ------------------------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("value_type", [pa.int8(), pa.uint16(), pa.int32(), pa.int64(), pa.uint64()])
def test_list_and_fixed_size_list_of_any_integer_type(tmp_path, fixed, value_type):
    sids, ids = random_catalog(500, vocab=100)
    path = write(tmp_path / "c.parquet", sids, ids, value_type=value_type, fixed=fixed)
    cat = read_catalog(path, codebook_sizes=[100, 100, 100])
    np.testing.assert_array_equal(cat.sids, sids)
    assert cat.sids.dtype == np.uint8  # smallest unsigned dtype holding tokens < 100
    assert cat.item_ids.type == pa.int64()
    np.testing.assert_array_equal(cat.item_ids.to_numpy(), ids)
    assert cat.rows == 500 and cat.codebook_sizes == (100, 100, 100) and not cat.codebook_inferred
    assert cat.files == [path]


def test_large_list_column(tmp_path):
    sids, ids = random_catalog(100)
    col = pa.LargeListArray.from_arrays(
        pa.array(np.arange(0, 301, 3, dtype=np.int64)), pa.array(sids.reshape(-1), pa.int32())
    )
    pq.write_table(pa.table({"item_id": ids, "sid": col}), tmp_path / "c.parquet")
    np.testing.assert_array_equal(read_catalog(tmp_path / "c.parquet").sids, sids)


def test_separate_sid_columns(tmp_path):
    sids, ids = random_catalog(300, length=4, vocab=70000)
    table = pa.table(
        {
            "item_id": ids,
            "a": pa.array(sids[:, 0], pa.int32()),
            "b": pa.array(sids[:, 1], pa.uint32()),
            "c": pa.array(sids[:, 2], pa.int64()),
            "d": pa.array(sids[:, 3], pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "c.parquet")
    cat = read_catalog(tmp_path / "c.parquet", sid_columns=["a", "b", "c", "d"])
    np.testing.assert_array_equal(cat.sids, sids)
    assert cat.sids.dtype == np.uint32
    assert cat.codebook_inferred
    assert cat.codebook_sizes == tuple(int(v) + 1 for v in sids.max(axis=0))


def test_string_item_ids_keep_their_type(tmp_path):
    sids, _ = random_catalog(200)
    ids = pa.array([f"item-{i}" for i in range(200)], pa.string())
    cat = read_catalog(write(tmp_path / "c.parquet", sids, ids), codebook_sizes=[50] * 3)
    assert cat.item_ids.type == pa.string()
    assert cat.item_ids.to_pylist() == ids.to_pylist()


def test_custom_column_names(tmp_path):
    sids, ids = random_catalog(50)
    pq.write_table(pa.table({"pid": ids, "code": list_column(sids)}), tmp_path / "c.parquet")
    cat = read_catalog(tmp_path / "c.parquet", sid_column="code", item_column="pid", codebook_sizes=[50] * 3)
    np.testing.assert_array_equal(cat.sids, sids)


def test_many_row_groups_and_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_reader, "BATCH_ROWS", 64)  # several batches per row group
    numba_from(monkeypatch, 1)  # numba kernels, as on large catalogs
    sids, ids = random_catalog(2000, vocab=300)
    path = write(tmp_path / "c.parquet", sids, ids, row_group_size=300)
    assert pq.ParquetFile(path).num_row_groups == 7
    cat = read_catalog(path)
    np.testing.assert_array_equal(cat.sids, sids)
    np.testing.assert_array_equal(cat.item_ids.to_numpy(), ids)
    assert cat.sids.dtype == np.uint16


def test_directory_and_glob_read_files_in_sorted_order(tmp_path):
    sids, ids = random_catalog(900, vocab=40)
    d = tmp_path / "export"
    (d / "day=2").mkdir(parents=True)
    write(d / "part-1.parquet", sids[300:600], ids[300:600])
    write(d / "part-0.parquet", sids[:300], ids[:300])
    write(d / "day=2" / "part-0.parquet", sids[600:], ids[600:])
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".part-0.parquet.crc").write_bytes(b"junk")
    cat = read_catalog(d, codebook_sizes=[40] * 3)
    # os.walk-style sorted paths: day=2/part-0 sorts before part-0, part-1
    expected = np.concatenate([sids[600:], sids[:300], sids[300:600]])
    np.testing.assert_array_equal(cat.sids, expected)
    assert len(cat.files) == 3 and cat.rows == 900
    by_glob = read_catalog(str(d / "part-*.parquet"), codebook_sizes=[40] * 3)
    np.testing.assert_array_equal(by_glob.sids, sids[:600])
    np.testing.assert_array_equal(by_glob.item_ids.to_numpy(), ids[:600])


def test_mixed_integer_id_widths_across_files_widen(tmp_path):
    sids, ids = random_catalog(20)
    write(tmp_path / "a.parquet", sids[:10], pa.array(ids[:10], pa.int32()))
    write(tmp_path / "b.parquet", sids[10:], pa.array(ids[10:], pa.int64()))
    cat = read_catalog(tmp_path, codebook_sizes=[50] * 3)
    assert cat.item_ids.type == pa.int64()
    np.testing.assert_array_equal(cat.item_ids.to_numpy(), ids)


def test_inferred_codebooks_and_dtype_widening(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_reader, "BATCH_ROWS", 10)
    sids = np.zeros((40, 2), dtype=np.int64)
    sids[:, 0] = np.arange(40) % 7
    sids[25, 1] = 300  # first token > 255 appears after rows were stored as uint8
    sids[33, 1] = 70000  # and one > 65535
    numba_from(monkeypatch, 1)
    cat = read_catalog(write(tmp_path / "c.parquet", sids, np.arange(40), value_type=pa.int64()))
    assert cat.codebook_inferred and cat.codebook_sizes == (7, 70001)
    assert cat.sids.dtype == np.uint32
    np.testing.assert_array_equal(cat.sids, sids)


def test_items_sharing_a_sid_are_fine(tmp_path):
    sids = np.array([[1, 2], [1, 2], [3, 4]])
    cat = read_catalog(write(tmp_path / "c.parquet", sids, [10, 11, 12]), codebook_sizes=[5, 5])
    np.testing.assert_array_equal(cat.sids, sids)


def test_fingerprint_is_content_hash(tmp_path):
    sids, ids = random_catalog(100)
    a = write(tmp_path / "a.parquet", sids, ids)
    b = tmp_path / "renamed.parquet"
    b.write_bytes((tmp_path / "a.parquet").read_bytes())
    assert read_catalog(a).fingerprint == read_catalog(b).fingerprint == fingerprint_files([a])
    sids[0, 0] = (sids[0, 0] + 1) % 50
    c = write(tmp_path / "c.parquet", sids, ids)
    assert read_catalog(c).fingerprint != read_catalog(a).fingerprint
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", read_catalog(a).fingerprint)


# ------------------------------------------------------------------------------------- bad input


def test_missing_path(tmp_path):
    with raises_input(r"nope\.parquet: no such file or directory"):
        read_catalog(tmp_path / "nope.parquet")
    with raises_input("no files match"):
        read_catalog(str(tmp_path / "x-*.parquet"))
    (tmp_path / "empty").mkdir()
    with raises_input("holds no data files"):
        read_catalog(tmp_path / "empty")


def test_missing_columns(tmp_path):
    sids, ids = random_catalog(5)
    path = write(tmp_path / "c.parquet", sids, ids)
    # each says which option names the right column
    with raises_input(
        r"c\.parquet: column 'sids' not found \(columns: item_id, sid\); .*--sid-column .*--sid-columns"
    ):
        read_catalog(path, sid_column="sids")
    with raises_input(r"c\.parquet: column 'pid' not found .*; name the right one with --item-column$"):
        read_catalog(path, item_column="pid")
    with raises_input(r"c\.parquet: column 'c0' not found .*; name the right one with --sid-columns$"):
        read_catalog(path, sid_columns=["c0", "c1"])


def test_a_csv_file_is_refused_with_the_command_that_converts_it(tmp_path):
    import subprocess

    csv = tmp_path / "cat.csv"
    csv.write_text("item_id,c0,c1\n1,3,4\n2,5,6\n")
    with pytest.raises(InputError) as caught:
        read_catalog(csv, sid_columns=["c0", "c1"])
    message = str(caught.value)
    assert "\n" not in message and "not a readable Parquet file" in message
    command = message.split("convert it with: ", 1)[1].split(" (SID tokens", 1)[0]
    subprocess.run(
        command, shell=True, check=True, cwd=tmp_path, executable="/bin/bash"
    )  # it works as written
    converted = read_catalog(tmp_path / "cat.parquet", sid_columns=["c0", "c1"])
    assert converted.rows == 2 and converted.sids.tolist() == [[3, 4], [5, 6]]
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError) as caught:
        read_catalog(tmp_path / "garbage.parquet")
    assert "convert it" not in str(caught.value)  # the hint is for text tables only


def test_non_integer_types(tmp_path):
    sids, ids = random_catalog(5)
    path = write(tmp_path / "f.parquet", sids.astype(float), ids, value_type=pa.float32())
    with raises_input(r"f\.parquet: column 'sid' has type list<.*float>; a SID column must be a list"):
        read_catalog(path)
    pq.write_table(pa.table({"item_id": ids, "sid": ["a"] * 5}), tmp_path / "s.parquet")
    with raises_input(r"s\.parquet: column 'sid' has type string"):
        read_catalog(tmp_path / "s.parquet")
    pq.write_table(pa.table({"item_id": ids, "c0": [1.0] * 5}), tmp_path / "g.parquet")
    with raises_input(r"g\.parquet: column 'c0' has type double; SID token columns must be integers"):
        read_catalog(tmp_path / "g.parquet", sid_columns=["c0"])
    pq.write_table(pa.table({"item_id": [1.5] * 5, "sid": list_column(sids)}), tmp_path / "h.parquet")
    with raises_input(r"h\.parquet: column 'item_id' has type double; item ids must be integers or strings"):
        read_catalog(tmp_path / "h.parquet")


def test_null_sid_and_null_token(tmp_path):
    col = pa.array([[1, 2], None, [3, 4]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": [7, 8, 9], "sid": col}), tmp_path / "n.parquet")
    with raises_input(r"n\.parquet: column 'sid', row 1 \(item id 8\): SID is null"):
        read_catalog(tmp_path / "n.parquet")
    col = pa.array([[1, 2], [3, 4], [5, None]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": [7, 8, 9], "sid": col}), tmp_path / "t.parquet")
    with raises_input(r"t\.parquet: column 'sid', row 2 \(item id 9\): token 1 of the SID is null"):
        read_catalog(tmp_path / "t.parquet")
    table = pa.table({"item_id": [7, 8], "a": pa.array([1, 2]), "b": pa.array([None, 3], pa.int64())})
    pq.write_table(table, tmp_path / "u.parquet")
    with raises_input(r"u\.parquet: column 'b', row 0 \(item id 7\): SID token is null"):
        read_catalog(tmp_path / "u.parquet", sid_columns=["a", "b"])


def test_wrong_length(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_reader, "BATCH_ROWS", 4)
    col = pa.array([[1, 2, 3]] * 6 + [[1, 2]] + [[1, 2, 3]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": list(range(8)), "sid": col}), tmp_path / "w.parquet")
    with raises_input(r"w\.parquet: column 'sid', row 6 \(item id 6\): SID has 2 tokens, expected 3"):
        read_catalog(tmp_path / "w.parquet")
    col = pa.array([[]] * 2, pa.list_(pa.int32()))
    pq.write_table(pa.table({"item_id": [1, 2], "sid": col}), tmp_path / "e.parquet")
    with raises_input(r"e\.parquet: column 'sid', row 0: SID is empty"):
        read_catalog(tmp_path / "e.parquet")


def test_negative_and_out_of_codebook_tokens(tmp_path):
    sids = np.array([[1, 2], [3, 4], [5, -1]])
    path = write(tmp_path / "neg.parquet", sids, ["a", "b", "c"], value_type=pa.int16())
    with raises_input(r"neg\.parquet: column 'sid', row 2 \(item id 'c'\): token -1 at step 1 is negative"):
        read_catalog(path)
    sids = np.array([[1, 2], [3, 9], [5, 1]])
    path = write(tmp_path / "big.parquet", sids, [10, 20, 30])
    with raises_input(
        r"big\.parquet: column 'sid', row 1 \(item id 20\): token 9 at step 1 is >= codebook size 8"
    ):
        read_catalog(path, codebook_sizes=[16, 8])
    table = pa.table({"item_id": [1, 2], "p": [0, 1], "q": [2, 40]})
    pq.write_table(table, tmp_path / "cols.parquet")
    with raises_input(
        r"cols\.parquet: column 'q', row 1 \(item id 2\): token 40 at step 1 is >= codebook size 32"
    ):
        read_catalog(tmp_path / "cols.parquet", sid_columns=["p", "q"], codebook_sizes=[2, 32])


def test_token_beyond_int64_is_reported_as_written(tmp_path):
    sids = np.array([[1, 2, 3], [4, 2**63 + 5, 1]], dtype=np.uint64)
    path = write(tmp_path / "u.parquet", sids, [1, 2], value_type=pa.uint64())
    for sizes, bound in (([8, 8, 8], 8), (None, 2**31 - 1)):
        with raises_input(rf"row 1 \(item id 2\): token {2**63 + 5} at step 1 is >= codebook size {bound}"):
            read_catalog(path, codebook_sizes=sizes)


def test_empty_catalog(tmp_path):
    write(tmp_path / "e.parquet", np.zeros((0, 3), dtype=np.int64), pa.array([], pa.int64()))
    with raises_input("empty catalog"):
        read_catalog(tmp_path / "e.parquet")


def test_null_item_id(tmp_path):
    sids, _ = random_catalog(3)
    path = write(tmp_path / "c.parquet", sids, pa.array([1, None, 3], pa.int64()))
    with raises_input(r"c\.parquet: column 'item_id', row 1: item id is null"):
        read_catalog(path)


@pytest.mark.parametrize("numba_min_rows", [1, 1 << 16])
@pytest.mark.parametrize("kind", ["dense", "scattered", "string"])
def test_duplicate_item_id_names_both_rows_and_files(tmp_path, monkeypatch, kind, numba_min_rows):
    numba_from(monkeypatch, numba_min_rows)
    sids, _ = random_catalog(60)
    if kind == "dense":
        ids = list(range(60))
    elif kind == "scattered":
        ids = [int(x) for x in np.random.default_rng(1).integers(-(2**62), 2**62, size=60)]
    else:
        ids = [f"id{i}" for i in range(60)]
    ids[45] = ids[12]
    write(tmp_path / "a.parquet", sids[:30], ids[:30])
    write(tmp_path / "b.parquet", sids[30:], ids[30:])
    with raises_input(
        rf"b\.parquet: column 'item_id', row 15 \(item id {re.escape(repr(ids[12]))}\): duplicate item id "
        r"\(first seen at row 12 of .*a\.parquet\)"
    ):
        read_catalog(tmp_path)


def test_codebook_count_must_match_length(tmp_path):
    sids, ids = random_catalog(10)
    path = write(tmp_path / "c.parquet", sids, ids)
    with raises_input(r"c\.parquet: 2 codebook sizes given but column 'sid' holds SIDs of 3 tokens"):
        read_catalog(path, codebook_sizes=[50, 50])
    fixed = write(tmp_path / "f.parquet", sids, ids, fixed=True)
    with raises_input(r"f\.parquet: 4 codebook sizes given but column 'sid' holds SIDs of 3 tokens"):
        read_catalog(fixed, codebook_sizes=[50] * 4)
    table = pa.table({"item_id": ids, "p": sids[:, 0], "q": sids[:, 1]})
    pq.write_table(table, tmp_path / "cols.parquet")
    with raises_input(r"cols\.parquet: 3 codebook sizes given but 2 SID columns given"):
        read_catalog(tmp_path / "cols.parquet", sid_columns=["p", "q"], codebook_sizes=[50] * 3)
    with raises_input("codebook sizes must be"):
        read_catalog(path, codebook_sizes=[50, 0, 50])


def test_unreadable_truncated_and_non_parquet_files(tmp_path):
    (tmp_path / "text.parquet").write_text("item_id,sid\n1,2\n")
    with raises_input(r"text\.parquet: not a readable Parquet file"):
        read_catalog(tmp_path / "text.parquet")
    sids, ids = random_catalog(1000)
    path = write(tmp_path / "full.parquet", sids, ids)
    data = Path(path).read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with raises_input(r"cut\.parquet: not a readable Parquet file"):
        read_catalog(tmp_path / "cut.parquet")
    # A corrupt data page behind an intact footer: reading the rows fails, naming the file.
    corrupt = bytearray(data)
    for i in range(8, len(data) // 2):
        corrupt[i] ^= 0xFF
    (tmp_path / "bad.parquet").write_bytes(bytes(corrupt))
    with raises_input(r"bad\.parquet: unreadable Parquet data in row group 0 \(.+\)$"):
        read_catalog(tmp_path / "bad.parquet")
    # one bad file in a directory is named, not the directory
    (tmp_path / "dir").mkdir()
    write(tmp_path / "dir" / "a.parquet", sids, ids)
    (tmp_path / "dir" / "b.parquet").write_bytes(b"PAR1 not really")
    with raises_input(r"dir/b\.parquet: not a readable Parquet file"):
        read_catalog(tmp_path / "dir")


def test_mixed_item_kinds_across_files(tmp_path):
    sids, _ = random_catalog(4)
    write(tmp_path / "a.parquet", sids[:2], [1, 2])
    write(tmp_path / "b.parquet", sids[2:], ["x", "y"])
    with raises_input(r"b\.parquet: column 'item_id' has type string but .*a\.parquet has int64"):
        read_catalog(tmp_path)


# ---------------------------------------------------------------------------------------- kernels


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60)
    | st.lists(st.integers(-5, 40), max_size=60)
    | st.lists(st.integers(0, 2**40), max_size=3000)
)
def test_first_repeat_matches_brute_force(values):
    keys = np.array(values, dtype=np.int64)
    seen: set[int] = set()
    expected = -1
    for i, v in enumerate(values):
        if v in seen:
            expected = i
            break
        seen.add(v)
    assert first_repeat_int64(keys) == expected
    assert first_duplicate_row(pa.array(keys)) == expected
    assert first_duplicate_row(pa.array([str(v) for v in values], pa.string())) == expected


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=400)
    | st.lists(st.integers(-3, 30), max_size=80),
    chunks=st.integers(1, 9),
)
def test_partitioned_repeat_check_any_chunking_matches_brute_force(values, chunks):
    """The parallel count/scatter/probe finds a repeat exactly when one exists, however the rows are split
    into chunks (a twin in another chunk, the same bucket or another bucket group included)."""
    keys = np.array(values, dtype=np.int64)
    assert has_repeat_partitioned(keys, chunks=chunks) == (len(set(values)) < len(values))


def test_partitioned_duplicate_path_on_many_scattered_ids():
    rng = np.random.default_rng(3)
    keys = rng.integers(-(2**62), 2**62, size=200_000, dtype=np.int64)
    keys = np.unique(keys)
    rng.shuffle(keys)
    assert first_repeat_int64(keys) == -1
    keys[150_000] = keys[7]
    assert first_repeat_int64(keys) == 150_000


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 6), st.sampled_from([np.uint8, np.int16, np.uint32, np.int64]))
def test_step_min_max(n, length, dtype):
    block = np.random.default_rng(n * 7 + length).integers(0, 120, size=(n, length)).astype(dtype)
    lo, hi = step_min_max(block)
    np.testing.assert_array_equal(lo, block.min(axis=0))
    np.testing.assert_array_equal(hi, block.max(axis=0))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 120),
    length=st.integers(1, 5),
    vocab=st.sampled_from([1, 7, 256, 257, 70000]),
    layout=st.sampled_from(["list", "fixed", "columns"]),
    group=st.integers(1, 50),
    seed=st.integers(0, 2**16),
)
def test_round_trip_matches_input(tmp_path_factory, n, length, vocab, layout, group, seed):
    """Whatever the layout and row-group split, read_catalog returns the written SIDs and ids exactly,
    in the smallest unsigned dtype, with inferred sizes = max + 1 per step."""
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, vocab, size=(n, length))
    ids = rng.permutation(n).astype(np.int64) - n // 2
    path = tmp_path_factory.mktemp("rt") / "c.parquet"
    if layout == "columns":
        table = pa.table({"item_id": ids, **{f"c{t}": sids[:, t] for t in range(length)}})
        pq.write_table(table, path, row_group_size=group)
        cat = read_catalog(path, sid_columns=[f"c{t}" for t in range(length)])
    else:
        write(path, sids, ids, value_type=pa.int64(), fixed=layout == "fixed", row_group_size=group)
        cat = read_catalog(path)
    np.testing.assert_array_equal(cat.sids, sids)
    np.testing.assert_array_equal(cat.item_ids.to_numpy(), ids)
    assert cat.codebook_sizes == tuple(int(v) + 1 for v in sids.max(axis=0))
    expected_dtype = np.uint8 if sids.max() < 256 else np.uint16 if sids.max() < 65536 else np.uint32
    assert cat.sids.dtype == expected_dtype


@pytest.mark.parametrize("large", [False, True])
def test_string_duplicate_check_through_hashes(monkeypatch, large):
    numba_from(monkeypatch, 1)  # the hashed path, as on large catalogs
    values = [f"item-{i}" for i in range(3000)] + ["", "é", "e\u0301"]
    ids = pa.array(values, pa.large_string() if large else pa.string())
    assert first_duplicate_row(ids) == -1
    assert first_duplicate_row(ids.slice(7)) == -1
    with_dup = pa.array([*values, "item-17", "x"], ids.type)
    assert first_duplicate_row(with_dup) == len(values)
    assert first_duplicate_row(with_dup.slice(20)) == -1  # the twin of "item-17" is sliced away
    assert first_duplicate_row(pa.array(["", "a", ""], ids.type)) == 2
    as_bytes = pa.array(
        [v.encode() for v in with_dup.to_pylist()], pa.large_binary() if large else pa.binary()
    )
    assert first_duplicate_row(as_bytes) == len(values)  # offsets read at the binary type's width


def test_prefetch_thread_stops_when_a_batch_is_rejected(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(catalog_reader, "BATCH_ROWS", 10)
    sids, ids = random_catalog(500)
    sids[25, 0] = 60  # rejected in the third batch while later ones are being decoded
    path = write(tmp_path / "c.parquet", sids, ids, row_group_size=50)
    with raises_input(r"row 25 .* token 60 at step 0 is >= codebook size 50"):
        read_catalog(path, codebook_sizes=[50] * 3)
    assert not [t for t in threading.enumerate() if t.name.startswith("zerogr-")]
