"""zerogr_build.synthetic (and its CLI, scripts/make_catalog.py): deterministic, well-typed, round-trips
through Parquet, has collisions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build import synthetic

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mode", ["skewed", "uniform"])
def test_deterministic_per_seed(mode):
    a = synthetic.generate_sids(5000, [64, 32, 128], seed=3, mode=mode)
    b = synthetic.generate_sids(5000, [64, 32, 128], seed=3, mode=mode)
    c = synthetic.generate_sids(5000, [64, 32, 128], seed=4, mode=mode)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    ("sizes", "dtype"),
    [([256, 256], np.uint8), ([8192] * 3, np.uint16), ([2048, 70000, 5, 9, 300], np.uint32)],
)
@pytest.mark.parametrize("mode", ["skewed", "uniform"])
def test_shape_dtype_and_range(sizes, dtype, mode):
    sids = synthetic.generate_sids(3000, sizes, seed=1, mode=mode)
    assert sids.shape == (3000, len(sizes))
    assert sids.dtype == dtype
    assert (sids.max(axis=0) < np.array(sizes)).all()


def test_codebook_of_one_token():
    sids = synthetic.generate_sids(100, [1, 3], seed=0)
    assert (sids[:, 0] == 0).all() and sids[:, 1].max() < 3


def test_skewed_has_heavy_tails_and_collisions():
    sids = synthetic.generate_sids(100_000, [1024, 1024, 1024], seed=0)
    stats = synthetic.children_stats(sids)
    first, last = stats[1], stats[-1]
    # Heavy tails: the largest row dwarfs the typical one at every step after the first.
    assert first["max"] > 10 * first["mean"]
    assert last["max"] > 20 * last["p99"]
    # Several items per leaf somewhere, but most SIDs are unique.
    assert last["collided_items"] > 0 and last["max_items_per_leaf"] > 2
    assert last["leaves"] > 0.8 * sids.shape[0]


def test_uniform_is_flat():
    sids = synthetic.generate_sids(50_000, [64, 64], seed=0, mode="uniform")
    counts = np.bincount(sids[:, 0], minlength=64)
    assert counts.min() > 0.7 * counts.mean() and counts.max() < 1.3 * counts.mean()


def test_children_stats_against_brute_force():
    sids = synthetic.generate_sids(400, [5, 4, 6], seed=2)
    stats = synthetic.children_stats(sids)
    rows = [tuple(r) for r in sids.tolist()]
    for t in range(3):
        children: dict[tuple, set] = {}
        for row in rows:
            children.setdefault(row[:t], set()).add(row[t])
        counts = np.array([len(v) for v in children.values()])
        assert stats[t]["rows"] == len(children)
        assert stats[t]["nnz"] == counts.sum()
        assert stats[t]["max"] == counts.max()
    assert stats[-1]["leaves"] == len(set(rows))


@pytest.mark.parametrize("item_ids", ["int64", "string"])
@pytest.mark.parametrize("fixed", [False, True])
def test_parquet_round_trip(tmp_path, item_ids, fixed):
    path = tmp_path / "cat.parquet"
    sids = synthetic.write_catalog(
        path,
        2500,
        [300, 40, 70000],
        seed=5,
        item_id_type=item_ids,
        row_group_size=1000,
        fixed_size_list=fixed,
    )
    meta = pq.ParquetFile(path).metadata
    assert meta.num_rows == 2500 and meta.num_row_groups == 3
    table = pq.read_table(path)
    assert table.column_names == ["item_id", "sid"]
    sid_type = table.schema.field("sid").type
    assert pa.types.is_fixed_size_list(sid_type) if fixed else pa.types.is_list(sid_type)
    assert sid_type.value_type == pa.int32()  # a token past 65535 -> int32
    back = np.array(table.column("sid").combine_chunks().flatten()).reshape(2500, 3)
    assert np.array_equal(back, sids)
    ids = table.column("item_id")
    assert ids.type == (pa.int64() if item_ids == "int64" else pa.string())
    assert len(set(ids.to_pylist())) == 2500


def test_uint16_tokens_and_cli(tmp_path):
    path = tmp_path / "cli.parquet"
    script = [sys.executable, str(REPO / "scripts" / "make_catalog.py")]
    done = subprocess.run(
        [*script, str(path), "-n", "300", "-L", "3", "-V", "8192", "--seed", "7", "--stats"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["step 0", "step 1", "step 2"]
    table = pq.read_table(path)
    assert table.schema.field("sid").type == pa.list_(pa.uint16())
    back = np.array(table.column("sid").combine_chunks().flatten()).reshape(300, 3)
    assert np.array_equal(back, synthetic.generate_sids(300, [8192] * 3, seed=7))
    bad = subprocess.run([*script, str(tmp_path / "x.parquet"), "-V", "8,x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "expected comma-separated integers" in bad.stderr


def test_sid_type_too_narrow_is_refused():
    sids = np.array([[3, 65536]], dtype=np.uint32)
    ids = synthetic.make_item_ids(1)
    with pytest.raises(ValueError, match="token 65536 does not fit sid type uint16"):
        synthetic.catalog_table(sids, ids, sid_type="uint16")
    column = synthetic.catalog_table(sids, ids, sid_type="int32").column("sid")
    assert column.to_pylist() == [[3, 65536]]
