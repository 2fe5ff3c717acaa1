"""scripts/rebuild.sh: build (unpromoted) -> verify -> tune -> promote -> the new version on stdout, and its
exit codes."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .cli_runs import REPO, TUNE_ARGS, run_rebuild


@pytest.fixture
def catalog(tmp_path):
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 16, (800, 3)).tolist()
    table = pa.table({"item_id": pa.array(np.arange(800, dtype=np.int64)), "sid": pa.array(sids)})
    path = tmp_path / "catalog.parquet"
    pq.write_table(table, path)
    return path


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
    done = run_rebuild(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines == [str((out / "v000001").resolve())]
    assert (out / "LATEST").read_text() == "v000001\n"
    manifest = json.loads((out / "v000001" / "manifest.json").read_text())
    assert any(name.startswith("plans/") for name in manifest["files"])


def test_rebuild_exit_codes(catalog, tmp_path):
    out = tmp_path / "bundles"
    sizes = ("--codebook-sizes", "16,16,16")
    assert run_rebuild(tmp_path / "missing.parquet", "--out", out, *sizes, cwd=tmp_path).returncode == 2
    assert not out.exists() or not any(out.glob("v*"))
    bad_tune = run_rebuild(
        catalog, "--out", out, *sizes, "--device", "cpu", "--tune-args", "--iters 0", cwd=tmp_path
    )
    assert bad_tune.returncode == 5  # exit 5 prints the (valid, promoted) version too
    assert bad_tune.stdout == f"{(out / 'v000001').resolve()}\n"
    assert (out / "v000001" / "manifest.json").is_file()  # published and verified, just not tuned
    assert (out / "LATEST").read_text() == "v000001\n"  # ... and promoted: it is valid
    assert run_rebuild(catalog, cwd=tmp_path, env={"ZEROGR": "/nonexistent/zerogr"}).returncode == 6


def test_failed_verify_never_moves_latest(catalog, tmp_path):
    """A zerogr whose build output gets corrupted before verify: exit 4, and LATEST named the previous
    version at every zerogr call after the build (never the new one), with --keep 1 sparing both."""
    out = tmp_path / "bundles"
    seen = tmp_path / "latest_seen.txt"
    cli = REPO / "cli.py"
    corrupting = tmp_path / "zerogr_corrupting_build.sh"
    corrupting.write_text(
        f'[ "$1" = --help ] || echo "$1 $(cat "{out}/LATEST" 2>/dev/null || echo none)" >> "{seen}"\n'
        f'"{sys.executable}" "{cli}" "$@" || exit $?\n'
        'if [ "$1" = build ]; then\n'
        f'    newest=$(ls -d "{out}"/v* | sort | tail -n 1)\n'
        f'    echo "after-build $(cat "{out}/LATEST" 2>/dev/null || echo none)" >> "{seen}"\n'
        '    printf x >> "$newest/items.parquet"\n'
        "fi\n"
    )
    args = [catalog, "--out", out, "--codebook-sizes", "16,16,16", "--device", "cpu", "--keep", "1"]
    args += ["--tune-args", TUNE_ARGS]
    bad_env = {"ZEROGR": f"bash {corrupting}"}

    first_bad = run_rebuild(*args, cwd=tmp_path, env=bad_env)
    assert first_bad.returncode == 4 and first_bad.stdout == "", first_bad.stderr
    assert "LATEST was not moved" in first_bad.stderr
    assert (out / "v000001").is_dir() and not (out / "LATEST").exists()
    assert seen.read_text().split("\n")[:-1] == ["build none", "after-build none", "verify none"]

    good = run_rebuild(*args, cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert (out / "LATEST").read_text() == "v000002\n"

    seen.unlink()
    bad = run_rebuild(*args, cwd=tmp_path, env=bad_env)
    assert bad.returncode == 4 and bad.stdout == "", bad.stderr
    assert (out / "LATEST").read_text() == "v000002\n"
    assert sorted(p.name for p in out.glob("v*")) == ["v000002", "v000003"]  # keep 1 spared LATEST's
    assert seen.read_text().split("\n")[:-1] == ["build v000002", "after-build v000002", "verify v000002"]

    again = run_rebuild(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == str((out / "v000004").resolve())
    assert (out / "LATEST").read_text() == "v000004\n"
    assert sorted(p.name for p in out.glob("v*")) == ["v000002", "v000004"]  # v2 was LATEST while pruning
