"""`zerogr rebuild`: build (unpromoted) -> verify -> tune -> promote -> the new version on stdout, and its
exit codes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .cli_runs import TUNE_ARGS, invoke, run_rebuild


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


def test_failed_verify_never_moves_latest(catalog, tmp_path, monkeypatch):
    """A build whose output gets corrupted before verify: exit 4, LATEST never names the new version (it
    still names the previous one at verify time), the bad version is kept for inspection and marked
    unpromoted by status, and --keep 1 spares both LATEST's version and the new one."""
    import zerogr_build.pipeline as pipeline
    from zerogr_build.fleet.status import out_status

    out = tmp_path / "bundles"
    real_build, real_verify = pipeline.build_bundle, pipeline.verify_with_catalog
    seen = []

    def corrupting_build(*args, **kwargs):
        summary = real_build(*args, **kwargs)
        seen.append(
            ("after-build", (out / "LATEST").read_text().strip() if (out / "LATEST").exists() else None)
        )
        with open(f"{summary['bundle']}/items.parquet", "ab") as f:
            f.write(b"x")
        return summary

    def watching_verify(*args, **kwargs):
        seen.append(("verify", (out / "LATEST").read_text().strip() if (out / "LATEST").exists() else None))
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(pipeline, "verify_with_catalog", watching_verify)
    args = [catalog, "--out", out, "--codebook-sizes", "16,16,16", "--device", "cpu", "--keep", "1"]
    args += ["--force", "--tune-args", TUNE_ARGS]

    def run(corrupt: bool):
        monkeypatch.setattr(pipeline, "build_bundle", corrupting_build if corrupt else real_build)
        return invoke("rebuild", *args)

    first_bad = run(corrupt=True)
    assert first_bad.exit_code == 4 and first_bad.stdout == "", first_bad.stderr
    assert "LATEST was not moved" in first_bad.stderr and "kept for inspection" in first_bad.stderr
    assert (out / "v000001").is_dir() and not (out / "LATEST").exists()
    assert seen == [("after-build", None), ("verify", None)]
    assert [v["unpromoted"] for v in out_status(out)["versions"]] == [True]

    good = run(corrupt=False)
    assert good.exit_code == 0, good.stderr
    assert (out / "LATEST").read_text() == "v000002\n"

    seen.clear()
    bad = run(corrupt=True)
    assert bad.exit_code == 4 and bad.stdout == "", bad.stderr
    assert (out / "LATEST").read_text() == "v000002\n"
    assert sorted(p.name for p in out.glob("v*")) == ["v000002", "v000003"]  # keep 1 spared LATEST's
    assert seen == [("after-build", "v000002"), ("verify", "v000002")]
    status = {v["name"]: v for v in out_status(out)["versions"]}
    assert status["v000003"]["unpromoted"] and not status["v000002"]["unpromoted"]

    again = run(corrupt=False)
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip() == str((out / "v000004").resolve())
    assert (out / "LATEST").read_text() == "v000004\n"
    assert sorted(p.name for p in out.glob("v*")) == ["v000002", "v000004"]  # v2 was LATEST while pruning
