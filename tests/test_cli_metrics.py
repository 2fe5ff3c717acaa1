"""--metrics-file on build, verify, tune, promote and `zerogr rebuild`, parsed back with prometheus-client's
parser; rebuild's progress on stderr, its stdout on exit 5 and its plan reuse."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from zerogr_build.bundle import verify_bundle
from zerogr_build.cli import app

from .cli_runs import TUNE_ARGS, run_rebuild

ROOT = Path(__file__).resolve().parent.parent


def metrics(path: Path) -> dict:
    """{(name, labels...): value} of a metrics file."""
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def value(got: dict, name: str, job: str, **labels) -> float:
    return got[(f"zerogr_{name}", *sorted({"job": job, **labels}.items()))]


def write_catalog(path: Path, n: int = 800, seed: int = 0) -> Path:
    sids = np.random.default_rng(seed).integers(0, 16, (n, 3)).tolist()
    pq.write_table(pa.table({"item_id": pa.array(np.arange(n, dtype=np.int64)), "sid": pa.array(sids)}), path)
    return path


def test_build_verify_tune_promote_write_their_metrics(tmp_path):
    catalog = write_catalog(tmp_path / "catalog.parquet")
    out, m = tmp_path / "bundles", tmp_path / "metrics"
    runner = CliRunner()

    done = runner.invoke(
        app,
        [
            "build",
            str(catalog),
            "--out",
            str(out),
            "--codebook-sizes",
            "16,16,16",
            "--no-promote",
            "--json",
            "--metrics-file",
            str(m / "build.prom"),
        ],
    )
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout)
    got = metrics(m / "build.prom")
    assert value(got, "job_exit_status", "build") == 0
    assert value(got, "bundle_items", "build") == 800
    assert value(got, "bundle_distinct_sids", "build") == summary["distinct_sids"]
    assert value(got, "bundle_index_bytes", "build") == summary["index_bytes"]
    assert value(got, "bundle_version", "build") == 1
    for stage in ("read", "build", "publish"):  # the library's own stage timings
        assert value(got, "job_stage_duration_seconds", "build", stage=stage) == summary["timings"][stage]
    assert value(got, "job_last_success_timestamp_seconds", "build") > 0

    vdir = str(out / "v000001")
    verified = runner.invoke(app, ["verify", vdir, "--quiet", "--metrics-file", str(m / "verify.prom")])
    assert verified.exit_code == 0
    got = metrics(m / "verify.prom")
    assert value(got, "job_exit_status", "verify") == 0 and value(got, "bundle_version", "verify") == 1
    assert value(got, "bundle_items", "verify") == 800
    assert value(got, "bundle_index_bytes", "verify") == summary["index_bytes"]
    assert value(got, "job_stage_duration_seconds", "verify", stage="verify") > 0

    tuned = runner.invoke(
        app,
        [
            "tune",
            vdir,
            "--device",
            "cpu",
            *TUNE_ARGS.split(),
            "--quiet",
            "--metrics-file",
            str(m / "tune.prom"),
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    got = metrics(m / "tune.prom")
    assert value(got, "job_exit_status", "tune") == 0 and value(got, "bundle_version", "tune") == 1
    assert value(got, "job_stage_duration_seconds", "tune", stage="tune") > 0

    assert runner.invoke(app, ["promote", vdir, "--metrics-file", str(m / "promote.prom")]).exit_code == 0
    got = metrics(m / "promote.prom")
    assert value(got, "job_exit_status", "promote") == 0 and value(got, "bundle_version", "promote") == 1

    # A failed run: its exit code, no bundle facts, the last success of the run before kept.
    ok_at = value(metrics(m / "build.prom"), "job_last_success_timestamp_seconds", "build")
    bad = runner.invoke(
        app,
        [
            "build",
            str(tmp_path / "missing.parquet"),
            "--out",
            str(out),
            "--metrics-file",
            str(m / "build.prom"),
        ],
    )
    assert bad.exit_code == 2
    got = metrics(m / "build.prom")
    assert value(got, "job_exit_status", "build") == 2
    assert value(got, "job_last_success_timestamp_seconds", "build") == ok_at
    assert not [k for k in got if k[0].startswith("zerogr_bundle_")]
    for job, target in (("verify", tmp_path / "nope"), ("promote", out)):
        failed = runner.invoke(app, [job, str(target), "--metrics-file", str(m / f"{job}.prom")])
        assert failed.exit_code == 2 and value(metrics(m / f"{job}.prom"), "job_exit_status", job) == 2


def test_rebuild_metrics_progress_plan_reuse_and_exit_5(tmp_path):
    catalog = write_catalog(tmp_path / "catalog.parquet")
    out, prom = tmp_path / "bundles", tmp_path / "textfile" / "zerogr_rebuild.prom"
    common = [catalog, "--out", out, "--codebook-sizes", "16,16,16", "--device", "cpu"]
    common += ["--metrics-file", prom]

    usage = run_rebuild(catalog, *common[1:], "--gate-model", tmp_path, cwd=tmp_path)  # gate files missing
    assert usage.returncode == 2 and "--gate-requests" in usage.stderr
    assert value(metrics(prom), "job_exit_status", "rebuild") == 2  # a usage error is reported too
    prom.unlink()
    bad = run_rebuild(tmp_path / "missing.parquet", *common[1:], cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    got = metrics(prom)
    assert value(got, "job_exit_status", "rebuild") == 2
    assert ("zerogr_job_last_success_timestamp_seconds", ("job", "rebuild")) not in got
    stages = [k[2] for k in got if k[0] == "zerogr_job_stage_duration_seconds"]
    assert sorted(stages) == [("stage", "build"), ("stage", "setup")]
    (failure,) = [dict(k[1:]) for k in got if k[0] == "zerogr_job_failure_info"]
    assert failure["stage"] == "build" and "missing.parquet" in failure["reason"]

    first = run_rebuild(*common, "--tune-args", TUNE_ARGS, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"{(out / 'v000001').resolve()}\n"
    assert "zerogr: write plan into the bundle done in" in first.stderr  # tune's progress lines
    got = metrics(prom)
    assert value(got, "job_exit_status", "rebuild") == 0
    for stage in ("build", "verify", "tune", "promote"):
        assert value(got, "job_stage_duration_seconds", "rebuild", stage=stage) > 0
    assert value(got, "bundle_version", "rebuild") == 1 and value(got, "bundle_items", "rebuild") == 800
    stages = sum(v for k, v in got.items() if k[0] == "zerogr_job_stage_duration_seconds")
    assert stages <= value(got, "job_duration_seconds", "rebuild")
    ok_at = value(got, "job_last_success_timestamp_seconds", "rebuild")
    assert not list(tmp_path.glob("textfile/.*")) and not list(tmp_path.glob("textfile/*.tmp*"))

    def plan_of(version: str) -> dict:
        (name,) = (out / version / "plans").glob("*.json")
        return json.loads(name.read_text())

    second = run_rebuild(*common, "--force", "--tune-args", TUNE_ARGS, cwd=tmp_path)  # same shapes: reused
    assert second.returncode == 0, second.stderr
    assert "reused the plan of" in second.stderr and "write plan into the bundle" not in second.stderr
    assert plan_of("v000002")["reused_from"]["bundle_version"] == 1
    assert verify_bundle(out / "v000002")["ok"]
    assert value(metrics(prom), "bundle_version", "rebuild") == 2

    third = run_rebuild(*common, "--force", "--retune", "--tune-args", TUNE_ARGS, cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert "reused" not in third.stderr and "reused_from" not in plan_of("v000003")
    ok_at = value(metrics(prom), "job_last_success_timestamp_seconds", "rebuild")

    failed_tune = run_rebuild(*common, "--force", "--retune", "--tune-args", "--iters 0", cwd=tmp_path)
    assert failed_tune.returncode == 5
    assert failed_tune.stdout == f"{(out / 'v000004').resolve()}\n"  # valid and promoted: printed
    assert (out / "LATEST").read_text() == "v000004\n"
    got = metrics(prom)
    assert value(got, "job_exit_status", "rebuild") == 5 and value(got, "bundle_version", "rebuild") == 4
    assert value(got, "job_last_success_timestamp_seconds", "rebuild") == ok_at


def _special_files(folder: Path) -> dict[str, Path]:
    """A FIFO, a socket, a directory, a symlink to a regular file and (as root) a null character device."""
    import os
    import socket

    made = {"fifo": folder / "fifo", "socket": folder / "sock", "directory": folder / "dir"}
    os.mkfifo(made["fifo"])
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(made["socket"]))
    server.close()
    made["directory"].mkdir()
    (folder / "target.prom").write_text("untouched\n")
    made["symlink"] = folder / "link.prom"
    made["symlink"].symlink_to(folder / "target.prom")
    if os.geteuid() == 0:
        made["device"] = folder / "null"
        os.mknod(made["device"], 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 3))
    return made


def test_a_metrics_path_that_is_not_a_regular_file_is_left_as_it_is(tmp_path):
    """--metrics-file over a device, FIFO, socket, directory or symlink: one warning line, the command's own
    exit code, and the thing at PATH unchanged (as root, a device stays a device)."""
    import os
    import stat

    catalog = write_catalog(tmp_path / "catalog.parquet")
    for kind, path in _special_files(tmp_path).items():
        before = os.lstat(path)
        done = CliRunner().invoke(
            app,
            ["build", str(catalog), "--out", str(tmp_path / f"out-{kind}"), "--codebook-sizes", "16,16,16",
             "-q", "--metrics-file", str(path)],
        )  # fmt: skip
        assert done.exit_code == 0, (kind, done.output)
        warnings = [line for line in done.stderr.splitlines() if "metrics file" in line]
        assert len(warnings) == 1 and "not a regular file" in warnings[0], (kind, done.stderr)
        after = os.lstat(path)
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino, (
            kind
        )
    assert (tmp_path / "target.prom").read_text() == "untouched\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # no temp file left behind
