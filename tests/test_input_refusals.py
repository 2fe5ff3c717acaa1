"""Hostile and careless input to the catalog reader, the config and the CLI: a catalog is read exactly or
refused with exit 2, nothing hangs, exit codes mean what the README says, and user text is never rich
markup."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.base.errors import InputError
from zerogr_build.bundle import open_bundle
from zerogr_build.catalog import read_catalog
from zerogr_build.testing import finishes

from .cli_runs import invoke, one_error_line


def small_catalog(path: Path, n: int = 60) -> Path:
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 6, size=(n, 3))
    col = pa.ListArray.from_arrays(
        pa.array(np.arange(0, n * 3 + 1, 3, dtype=np.int32)), pa.array(sids.reshape(-1), pa.uint16())
    )
    pq.write_table(pa.table({"item_id": pa.array(np.arange(n) + 1, pa.int64()), "sid": col}), path)
    return path


# ------------------------------------------------------------------------------------------------ F2


def mixed_columns(path: Path, c0: list[int], rows: int = 2) -> Path:
    reps = rows // len(c0)
    table = pa.table(
        {
            "item_id": pa.array(np.arange(rows) + 100, pa.int64()),
            "c0": pa.array(np.tile(np.asarray(c0, dtype=np.uint64), reps), pa.uint64()),
            "c1": pa.array(np.tile(np.asarray([3, 5], dtype=np.int64), reps), pa.int64()),
        }
    )
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("rows", [2, 70_000], ids=["numpy", "numba"])
def test_uint64_token_beside_a_signed_column_is_refused_not_wrapped(tmp_path, rows):
    path = mixed_columns(tmp_path / "cat.parquet", [1, 2**64 - 1], rows)
    with pytest.raises(InputError) as info:
        read_catalog(path, sid_columns=["c0", "c1"], codebook_sizes=[8, 8])
    assert str(info.value).endswith(
        "column 'c0', row 1 (item id 101): token 18446744073709551615 at step 0 is >= codebook size 8"
    )
    res = invoke(
        "build", path, "--out", tmp_path / "out", "--sid-columns", "c0,c1", "--codebook-sizes", "8,8"
    )
    assert "token 18446744073709551615 at step 0" in one_error_line(res)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("v0*"))


def test_valid_uint64_beside_a_signed_column_reads_exactly(tmp_path):
    path = mixed_columns(tmp_path / "cat.parquet", [1, 7])
    catalog = read_catalog(path, sid_columns=["c0", "c1"], codebook_sizes=[8, 8])
    assert catalog.sids.tolist() == [[1, 3], [7, 5]]
    out = tmp_path / "out"
    sid_args = ("--sid-columns", "c0,c1", "--codebook-sizes", "8,8")
    assert invoke("build", path, "--out", out, *sid_args).exit_code == 0
    res = invoke("verify", out, "--catalog", path, "--sid-columns", "c0,c1")
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------------------------------------ F4


@pytest.mark.parametrize("kind", ["dir_with_dev_zero", "fifo"])
def test_special_catalog_files_are_refused_at_once(tmp_path, kind):
    if kind == "fifo":
        catalog = tmp_path / "cat.parquet"
        os.mkfifo(catalog)
        name = catalog
    else:
        catalog = tmp_path / "cat"
        catalog.mkdir()
        small_catalog(catalog / "a.parquet")
        (catalog / "b.parquet").symlink_to("/dev/zero")
        name = catalog / "b.parquet"
    with pytest.raises(InputError, match=re.escape(f"{name}: not a regular file")):
        finishes(lambda: read_catalog(catalog, codebook_sizes=[6, 6, 6]))
    res = finishes(lambda: invoke("build", catalog, "--out", tmp_path / "out", "--codebook-sizes", "6,6,6"))
    assert "not a regular file" in one_error_line(res)


def test_a_bad_file_does_not_wait_for_the_hash_of_the_others(tmp_path):
    catalog = tmp_path / "cat"
    catalog.mkdir()
    pq.write_table(pa.table({"item_id": [1], "sid": [1]}), catalog / "a.parquet")  # sid not a list
    small_catalog(catalog / "b.parquet")
    with open(catalog / "c.parquet", "wb") as f:  # 24 GiB sparse: seconds of hashing, no disk
        f.truncate(24 << 30)
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"a\.parquet: column 'sid' has type int64"):
        finishes(lambda: read_catalog(catalog), timeout=60)
    assert time.perf_counter() - start < 3.0


# ------------------------------------------------------------------------------------------ F12, F23


@pytest.mark.parametrize(
    "args, message",
    [
        (["--codebook-sizes", "6,6,2147483648"], r"codebook sizes must be 1\.\.2147483647"),
        (["--codebook-sizes", ""], r"--codebook-sizes: expected comma-separated integers"),
        (["--codebook-sizes", ",,,"], r"--codebook-sizes: expected comma-separated integers"),
        (["--codebook-sizes", "1_0,6,6"], r"--codebook-sizes: expected comma-separated integers"),
        (["--codebook-sizes", "6,6,6", "--step-formats", "\u00b2=dense"], r"expected STEP=FORMAT"),
        (["--codebook-sizes", "6,6,6", "--step-formats", "0=dense,0=sparse"], r"step 0 named twice"),
    ],
    ids=["codebook_2_31", "empty", "commas", "underscore", "superscript", "twice"],
)
def test_bad_options_exit_2_before_the_read(tmp_path, args, message):
    res = invoke("build", small_catalog(tmp_path / "cat.parquet"), "--out", tmp_path / "out", *args)
    line = one_error_line(res)
    assert re.search(message, line), line
    assert "read" not in res.stderr.replace(line, "")  # refused before any progress line


def test_largest_codebook_is_accepted(tmp_path):
    path = small_catalog(tmp_path / "cat.parquet")
    res = invoke("build", path, "--out", tmp_path / "out", "--codebook-sizes", "6,6,2147483647", "-q")
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------------------------------ F13, F21


@pytest.mark.parametrize("kind", ["file", "under_file", "version_dir"])
def test_an_out_that_cannot_hold_versions_is_a_usage_error_before_the_read(tmp_path, kind):
    path = small_catalog(tmp_path / "cat.parquet")
    (tmp_path / "afile").write_text("x")
    if kind == "file":
        out = tmp_path / "afile"
    elif kind == "under_file":
        out = tmp_path / "afile" / "bundles"
    else:
        assert invoke("build", path, "--out", tmp_path / "b", "--codebook-sizes", "6,6,6").exit_code == 0
        out = tmp_path / "b" / "v000001"
    before = sorted(p.relative_to(out) for p in out.rglob("*")) if kind == "version_dir" else None
    res = invoke("build", path, "--out", out, "--codebook-sizes", "6,6,6")
    line = one_error_line(res)
    assert str(out) in line and "read" not in res.stderr.replace(line, "")
    if kind == "version_dir":  # nothing was written into the published version
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


# ------------------------------------------------------------------------------------------------ F11


def test_user_text_is_never_rich_markup(tmp_path):
    path = small_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "OUT[/]x"
    res = invoke("build", path, "--out", out, "--codebook-sizes", "6,6,6", "--model-version", "ckpt[/]v2")
    assert res.exit_code == 0, res.output
    assert f"bundle {out}/v000001 (version 1)" in res.stdout
    res = invoke("inspect", out)
    assert res.exit_code == 0, res.output
    assert "model ckpt[/]v2)" in res.stdout
    out2 = tmp_path / "o2"
    res = invoke("build", path, "--out", out2, "--codebook-sizes", "6,6,6", "--model-version", "run[bold]7")
    assert res.exit_code == 0 and open_bundle(out2).model_version == "run[bold]7"
    assert "model run[bold]7)" in invoke("inspect", out2).stdout


# ------------------------------------------------------------------------------------------ F17, F19


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "deep", "huge"])
def test_hostile_config_file_exits_2_naming_it(tmp_path, kind):
    config = tmp_path / "c.toml"
    if kind == "dev_zero":
        config.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(config)
    elif kind == "deep":
        config.write_text("[build]\nx = " + "[" * 50_000 + "]" * 50_000 + "\n")
    else:
        with open(config, "wb") as f:
            f.truncate(8 << 30)
    catalog = small_catalog(tmp_path / "cat.parquet")
    res = finishes(lambda: invoke("build", catalog, "--codebook-sizes", "6,6,6", "--config", config))
    line = one_error_line(res)
    assert str(config) in line


# ------------------------------------------------------------------------------------------ F16, F24


def footer_says_fewer_rows(path: Path, rows: int = 2000) -> Path:
    """A Parquet file whose footer num_rows says 1000 while its one row group holds `rows` = 2000: the
    FileMetaData num_rows field (compact thrift: header 0x16, zigzag varint) precedes the row groups'."""
    table = pa.table(
        {
            "item_id": pa.array(np.arange(rows), pa.int64()),
            "sid": pa.array([[1, 2, 3]] * rows, pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, path)
    data = bytearray(path.read_bytes())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.index(b"\x16\xa0\x1f", footer_start)  # 2000 -> 1000
    data[at : at + 3] = b"\x16\xd0\x0f"
    path.write_bytes(bytes(data))
    assert pq.ParquetFile(path).metadata.num_rows == 1000
    return path


def test_footer_row_count_smaller_than_its_row_groups_is_bad_input(tmp_path):
    path = footer_says_fewer_rows(tmp_path / "cat.parquet")
    with pytest.raises(InputError, match=r"cat\.parquet: footer says 1000 rows but its row groups hold more"):
        read_catalog(path, codebook_sizes=[4, 4, 4])
    res = invoke("build", path, "--out", tmp_path / "out", "--codebook-sizes", "4,4,4")
    assert "footer says 1000 rows" in one_error_line(res)


def test_duplicate_column_names_are_named_as_such(tmp_path):
    table = pa.Table.from_arrays(
        [pa.array([1, 2]), pa.array([[1], [2]]), pa.array([[1], [3]])], names=["item_id", "sid", "sid"]
    )
    pq.write_table(table, tmp_path / "cat.parquet")
    with pytest.raises(InputError, match=r"column 'sid' appears 2 times"):
        read_catalog(tmp_path / "cat.parquet", codebook_sizes=[4])


def test_a_huge_item_id_is_cut_in_the_message(tmp_path):
    big = "x" * 2_000_000
    pq.write_table(pa.table({"item_id": ["a", big], "sid": [[1, 2], [1, 9]]}), tmp_path / "cat.parquet")
    with pytest.raises(InputError) as info:
        read_catalog(tmp_path / "cat.parquet", codebook_sizes=[4, 4])
    message = str(info.value)
    assert len(message) < 500 and "(2000002 chars)" in message and "token 9 at step 1" in message


# ------------------------------------------------------------------------------------------------ F18


def test_an_impossible_forced_dense_table_is_bad_input_before_it_is_allocated(tmp_path):
    """`--step-formats 2=dense` with V_2 = 2^31-1: rows x V x 4 bytes (hundreds of GiB) is refused as bad
    input (exit 2, one line naming the table's size), not a MemoryError (exit 1); nothing is published."""
    path = small_catalog(tmp_path / "cat.parquet")
    out = tmp_path / "OUT"
    sizes = "6,6,2147483647"
    res = invoke("build", path, "-q", "--out", out, "--codebook-sizes", sizes, "--step-formats", "2=dense")
    line = one_error_line(res)
    assert "dense table" in line and "2147483647 tokens" in line
    assert not any(p.name.startswith("v0") for p in out.glob("*"))


# ------------------------------------------------------------------------------------------------ F25


def test_output_layers_with_d_zero_are_refused():
    """Weights of shape [V_t, 0] (d = 0) are bad input, not a search over empty dot products."""
    import torch

    from zerogr_build.base.errors import InputError
    from zerogr_build.runtime.weights import normalize_weights

    with pytest.raises(InputError, match=r"has shape \[6, 0\], expected \[6, d\] with d >= 1"):
        normalize_weights([torch.zeros(6, 0), torch.zeros(6, 0)], (6, 6), "cpu")
    assert len(normalize_weights([torch.zeros(6, 1), torch.zeros(6, 1)], (6, 6), "cpu")) == 2


# ------------------------------------------------------------------------------------------------ F24


def test_a_catalog_whose_name_is_not_utf8_is_read(tmp_path):
    """Arrow takes UTF-8 paths only; a valid catalog named with a non-UTF-8 byte builds and verifies."""
    import os

    name = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"cat\xff.parquet"))
    os.replace(small_catalog(tmp_path / "plain.parquet"), name)
    out = tmp_path / "OUT"
    res = invoke("build", name, "-q", "--out", out, "--codebook-sizes", "6,6,6")
    assert res.exit_code == 0, res.output
    assert invoke("verify", out, "--catalog", name, "-q").exit_code == 0
