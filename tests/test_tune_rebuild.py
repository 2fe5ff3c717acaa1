"""scripts/rebuild.sh: build -> verify -> tune -> the new version on stdout, and its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "rebuild.sh"
TUNE_ARGS = "--batch-sizes 2 --beam-width 4 --warmup 0 --iters 1 --hidden-dim 8"


@pytest.fixture
def catalog(tmp_path):
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 16, (800, 3)).tolist()
    table = pa.table({"item_id": pa.array(np.arange(800, dtype=np.int64)), "sid": pa.array(sids)})
    path = tmp_path / "catalog.parquet"
    pq.write_table(table, path)
    return path


def _run(*args, cwd, env=None):
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_rebuild_prints_the_tuned_verified_version(catalog, tmp_path):
    out = tmp_path / "bundles"
    args = [
        catalog,
        "--out",
        out,
        "--codebook-sizes",
        "16,16,16",
        "--device",
        "cpu",
        "--tune-args",
        TUNE_ARGS,
    ]
    done = _run(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines == [str((out / "v000001").resolve())]
    manifest = json.loads((out / "v000001" / "manifest.json").read_text())
    assert any(name.startswith("plans/") for name in manifest["files"])


def test_rebuild_exit_codes(catalog, tmp_path):
    out = tmp_path / "bundles"
    assert _run(tmp_path / "missing.parquet", "--out", out, cwd=tmp_path).returncode == 2
    assert not out.exists() or not any(out.glob("v*"))
    bad_tune = _run(catalog, "--out", out, "--device", "cpu", "--tune-args", "--iters 0", cwd=tmp_path)
    assert bad_tune.returncode == 5 and bad_tune.stdout == ""
    assert (out / "v000001" / "manifest.json").is_file()  # published and verified, just not tuned
    assert _run(catalog, cwd=tmp_path, env={"ZEROGR": "/nonexistent/zerogr"}).returncode == 6


@pytest.mark.parametrize("keep", [["--keep", "1"], ["--keep=1"], ["--keep", "x"]])
def test_keep_below_two_is_refused_before_anything_is_built(catalog, tmp_path, keep):
    """build prunes before verify: --keep 1 would delete the version a failed verify rolls back to."""
    out = tmp_path / "bundles"
    done = _run(catalog, "--out", out, "--device", "cpu", *keep, cwd=tmp_path)
    assert done.returncode == 2 and "--keep must be 0" in done.stderr
    assert not out.exists()


def test_failed_verify_points_latest_back_at_the_previous_version(catalog, tmp_path):
    """A zerogr whose build output gets corrupted before verify: exit 4 and LATEST back where it was."""
    out = tmp_path / "bundles"
    cli = Path(__file__).resolve().parent.parent / "cli.py"
    corrupting = tmp_path / "zerogr_corrupting_build.sh"
    corrupting.write_text(
        f'"{sys.executable}" "{cli}" "$@" || exit $?\n'
        'if [ "$1" = build ]; then\n'
        f'    printf x >> "{out}/$(cat "{out}/LATEST")/items.parquet"\n'
        "fi\n"
    )
    args = [catalog, "--out", out, "--device", "cpu", "--tune-args", TUNE_ARGS]
    bad_env = {"ZEROGR": f"bash {corrupting}"}

    first_bad = _run(*args, cwd=tmp_path, env=bad_env)  # nothing to go back to
    assert first_bad.returncode == 4 and first_bad.stdout == "", first_bad.stderr
    assert (out / "LATEST").read_text() == "v000001\n"
    assert "LATEST still names it" in first_bad.stderr

    good = _run(*args, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert (out / "LATEST").read_text() == "v000002\n"

    bad = _run(*args, cwd=tmp_path, env=bad_env)
    assert bad.returncode == 4 and bad.stdout == "", bad.stderr
    assert (out / "v000003").is_dir()  # published, then verify found the corrupted file
    assert (out / "LATEST").read_text() == "v000002\n"
    assert "LATEST points back at v000002" in bad.stderr


def test_restore_latest_only_replaces_the_version_it_was_asked_to(tmp_path):
    from zerogr_build.bundle import publish_bundle
    from zerogr_build.bundle.writer import restore_latest
    from zerogr_build.index import build_index

    sids = np.array([[0, 1], [1, 0], [1, 1]])
    out = tmp_path / "bundles"
    for _ in range(3):
        publish_bundle(build_index(sids, (2, 2)), pa.array([10, 11, 12]), out)
    latest = out / "LATEST"
    assert not restore_latest(out, "v000001", replacing="v000002")  # LATEST has moved on to v000003
    assert latest.read_text() == "v000003\n"
    assert not restore_latest(out, "v000009", replacing="v000003")  # no such version
    assert latest.read_text() == "v000003\n"
    assert restore_latest(out, "v000001", replacing="v000003")
    assert latest.read_text() == "v000001\n"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
