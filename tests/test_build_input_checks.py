"""Build options refused as bad input (exit 2, one line) before any work they would spoil: --step-formats
syntax before the read (G19), a forced dense table larger than the memory this process may use (F18)."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zerogr_build.cli import app
from zerogr_build.testing import stderr_lines

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = stderr_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def small_catalog(path: Path, n: int = 60) -> Path:
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 6, size=(n, 3)).astype(np.uint16)
    pq.write_table(
        pa.table(
            {
                "item_id": pa.array(np.arange(n) + 1, pa.int64()),
                "sid": pa.FixedSizeListArray.from_arrays(pa.array(sids.reshape(-1)), 3),
            }
        ),
        path,
    )
    return path


# ------------------------------------------------------------------------------------------------ G19


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("\u00b2=dense", r"--step-formats: expected STEP=FORMAT, got '\u00b2=dense'"),
        ("abc", r"--step-formats: expected STEP=FORMAT, got 'abc'"),
        ("0=", r"--step-formats: unknown format '' for step 0"),
        ("-1=dense", r"--step-formats: expected STEP=FORMAT, got '-1=dense'"),
        ("0=dense,,1=sparse", r"--step-formats: expected STEP=FORMAT, got ''"),
        ("0=dense,0=sparse", r"--step-formats: step 0 named twice"),
        ("1=dens", r"--step-formats: unknown format 'dens' for step 1"),
    ],
)
def test_g19_step_formats_syntax_is_refused_before_the_read_without_codebook_sizes(tmp_path, spec, message):
    """Without --codebook-sizes (L unknown until the read) a malformed spec is still refused before the
    read: one line, no inferred-sizes warning, and a catalog that is not Parquet is never opened."""
    res = invoke(
        "build", small_catalog(tmp_path / "cat.parquet"), "-o", tmp_path / "OUT", "--step-formats", spec
    )
    assert re.search(message, one_error_line(res))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    res = invoke("build", tmp_path / "junk.parquet", "-o", tmp_path / "OUT", "--step-formats", spec)
    assert re.search(message, one_error_line(res))


def test_g19_a_step_out_of_range_is_still_found_once_the_length_is_known(tmp_path):
    res = invoke(
        "build", small_catalog(tmp_path / "cat.parquet"), "-o", tmp_path / "OUT", "--step-formats", "5=dense"
    )
    lines = stderr_lines(res.stderr)
    assert res.exit_code == 2 and lines[-1] == "error: --step-formats: step 5 out of range 0..2", res.stderr
