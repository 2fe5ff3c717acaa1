"""Build options refused as bad input (exit 2, one line) before any work they would spoil: --step-formats
syntax before the read (G19), a forced dense table larger than the memory this process may use (F18)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.testing import stderr_lines

from .cli_runs import invoke, one_error_line


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
def test_step_formats_syntax_is_refused_before_the_read_without_codebook_sizes(tmp_path, spec, message):
    """Without --codebook-sizes (L unknown until the read) a malformed spec is still refused before the
    read: one line, no inferred-sizes warning, and a catalog that is not Parquet is never opened."""
    res = invoke(
        "build", small_catalog(tmp_path / "cat.parquet"), "-o", tmp_path / "OUT", "--step-formats", spec
    )
    assert re.search(message, one_error_line(res))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    res = invoke("build", tmp_path / "junk.parquet", "-o", tmp_path / "OUT", "--step-formats", spec)
    assert re.search(message, one_error_line(res))


def test_a_step_out_of_range_is_still_found_once_the_length_is_known(tmp_path):
    res = invoke(
        "build",
        small_catalog(tmp_path / "cat.parquet"),
        "-o",
        tmp_path / "OUT",
        "--step-formats",
        "5=dense",
        "--infer-codebook-sizes",
    )
    lines = stderr_lines(res.stderr)
    assert res.exit_code == 2 and lines[-1] == "error: --step-formats: step 5 out of range 0..2", res.stderr


# ------------------------------------------------------------------------------------------------ F18

REPO = Path(__file__).resolve().parent.parent


def test_a_forced_dense_table_over_the_address_space_limit_is_bad_input_naming_the_step(tmp_path):
    """Under `ulimit -v` (RLIMIT_AS) a forced dense table that fits the machine's memory but not the
    process's limit is exit 2, one line naming the step, before it is allocated. Before: exit 1, a
    MemoryError from numpy (the check knew physical memory only)."""
    import os
    import resource
    import subprocess
    import sys

    from zerogr_build.base.memlimit import physical_memory_bytes

    catalog = small_catalog(tmp_path / "cat.parquet")
    limit = 6 << 30
    table = 27 * 60_000_000 * 4  # step 2 of this catalog has 27 rows: 6.5 GB, more than the limit allows

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerogr_build.cli",
            "build",
            str(catalog),
            "-o",
            str(tmp_path / "OUT"),
            "-q",
            "--codebook-sizes",
            "6,6,60000000",
            "--step-formats",
            "2=dense",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=limited,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in stderr_lines(res.stderr) if not line.startswith("WARNING")]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "error: --step-formats forces a dense table for step 2:"
    ), lines
    if (physical_memory_bytes() or 0) > table:
        assert "address-space limit (ulimit -v)" in lines[0]
    assert not any((tmp_path / "OUT").glob("v0*"))


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_headroom_is_read_from_the_process_cgroup_and_its_ancestors(tmp_path, version):
    """cgroup v2 (memory.max / memory.current) and v1 (memory.limit_in_bytes / usage), the tightest of the
    process's cgroup and its ancestors; 'max' and v1's huge 'no limit' value are no limit."""
    from zerogr_build.base.memlimit import cgroup_headroom

    if version == 2:
        (tmp_path / "proc").write_text("0::/pod/app\n")
        base, limit_name, usage_name, unlimited = tmp_path, "memory.max", "memory.current", "max"
    else:
        (tmp_path / "proc").write_text("4:memory:/pod/app\n3:cpuset:/\n")
        base, limit_name, usage_name = tmp_path / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        unlimited = "9223372036854771712"
    (base / "pod" / "app").mkdir(parents=True)
    (base / limit_name).write_text(unlimited)
    (base / "pod" / limit_name).write_text(str(4 << 30))
    (base / "pod" / usage_name).write_text(str(1 << 30))
    (base / "pod" / "app" / limit_name).write_text(unlimited)
    assert cgroup_headroom(tmp_path, tmp_path / "proc") == 3 << 30
    (base / "pod" / "app" / limit_name).write_text(str(2 << 30))
    (base / "pod" / "app" / usage_name).write_text(str(512 << 20))
    assert cgroup_headroom(tmp_path, tmp_path / "proc") == (2 << 30) - (512 << 20)
    (tmp_path / "proc").write_text("0::/\n" if version == 2 else "4:memory:/\n")
    assert cgroup_headroom(tmp_path, tmp_path / "proc") is None


def test_the_tightest_limit_sets_the_forced_dense_check(monkeypatch):
    """memory_limit() is the smallest of physical memory, RLIMIT_AS headroom and cgroup headroom."""
    from zerogr_build.base import memlimit as _memlimit
    from zerogr_build.base.errors import InputError
    from zerogr_build.index import FormatPolicy, choose_format

    monkeypatch.setattr(_memlimit, "cgroup_headroom", lambda: 1 << 20)
    limit = _memlimit.memory_limit()
    assert limit.bytes == 1 << 20 and "cgroup" in limit.what
    policy = FormatPolicy(forced_dense_limit=limit.bytes, forced_dense_limit_what=limit.what)
    with pytest.raises(
        InputError,
        match=r"for step 1: 300 rows x 1000 tokens x 4 bytes = 1200000 bytes, more "
        r"than the headroom under this process's cgroup memory limit",
    ):
        choose_format(300, 300, 1000, "dense", policy, step=1)
    assert choose_format(300, 300, 1000, "auto", policy, step=1) == "sparse"
