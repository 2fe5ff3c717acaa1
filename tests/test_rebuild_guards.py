"""`zerogr rebuild` left alone from cron, one test per bad day (real runs: the CLI in this process where
that proves as much, real processes for the lock and kill -9, moto for the push, a real small tmpfs for
the full disk):

- a truncated export or collapsed SIDs: exit 6, LATEST, the fleet's LATEST and its versions untouched;
  a model update and normal churn promote; --accept-change lets an intended change through, recorded
- the same inputs twice: one version (exit 0, the live version printed); --force builds anyway
- two runs at once: the second exits 7 at once naming the holder; kill -9: the metrics file says started
  and never finished, and the next run removes the killed run's version (never an operator's)
- the push credentials missing, a metrics path that cannot be written: exit 2 in seconds, nothing built
- a full disk: versions beyond --keep pruned first; exit 8 naming the path when that is not enough
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.bundle import load_manifest

from .cli_runs import REPO, TUNE_ARGS, invoke, zerogr_command
from .test_cli_metrics import metrics, value
from .test_guards import write_catalog


@pytest.fixture(scope="module")
def catalogs(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """The catalogs of test_guards' scenarios: name -> (path, model tag)."""
    root = tmp_path_factory.mktemp("catalogs")
    names = ("base", "truncated", "collapsed", "model-update", "churn")
    return {name: write_catalog(root / f"{name}.parquet", name) for name in names}


def rebuild(catalogs, name: str, out: Path, *extra):
    path, tag = catalogs[name]
    args = [path, "--out", out, "--codebook-sizes", "32,32,32", "--model-version", tag, "--device", "cpu"]
    return invoke("rebuild", *args, "--tune-args", TUNE_ARGS, *extra)


def versions(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("v0*"))


def test_a_truncated_export_is_refused_and_the_fleet_keeps_its_version(catalogs, tmp_path, s3_bucket):
    out, prom, url = tmp_path / "out", tmp_path / "m.prom", f"s3://{s3_bucket}/fleet"
    assert rebuild(catalogs, "base", out, "--push", url).exit_code == 0
    s3 = boto3.client("s3")

    def remote() -> tuple[bytes, set[str]]:
        names = {o["Key"].split("/")[1] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]}
        return s3.get_object(Bucket=s3_bucket, Key="fleet/LATEST")["Body"].read(), names

    before = remote()
    done = rebuild(catalogs, "truncated", out, "--push", url, "--metrics-file", prom)
    assert done.exit_code == 6, done.output
    assert done.stdout == "" and remote() == before == (b"v000001\n", {"LATEST", "v000001"})
    assert (out / "LATEST").read_text() == "v000001\n" and versions(out) == ["v000001"]
    lines = done.stderr.splitlines()
    run_id = lines[0].split()[0]
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", run_id) and all(
        line.startswith(run_id) for line in lines
    )
    log = done.stderr
    assert "items share" in log and "guard items_ratio 0.4000 (min 0.8000): FIRED" in log
    assert "guard shared_sid_items" in log and "removed the unpromoted version v000002" in log
    got = metrics(prom)
    assert value(got, "job_exit_status", "rebuild") == 6 and value(got, "job_running", "rebuild") == 0
    assert value(got, "rebuild_guard_fired", "rebuild", guard="items_ratio") == 1
    assert value(got, "rebuild_guard_fired", "rebuild", guard="shared_sid_items") == 0
    assert value(got, "rebuild_guard_threshold", "rebuild", guard="items_removed") == 0.2
    assert value(got, "job_run_info", "rebuild", run_id=run_id) == 1
    assert 0 <= value(got, "rebuild_guard_value", "rebuild", guard="shared_sid_items") < 0.2
    assert value(got, "bundle_version", "rebuild") == 1  # LATEST's: the refused version never served

    accepted = rebuild(catalogs, "truncated", out, "--push", url, "--metrics-file", prom,
                       "--accept-change", "the catalog lost a market on purpose")  # fmt: skip
    assert accepted.exit_code == 0, accepted.output
    assert (out / "LATEST").read_text() == "v000003\n" and remote()[0] == b"v000003\n"
    assert load_manifest(out / "v000003")["accept_change"]["reason"] == "the catalog lost a market on purpose"
    got = metrics(prom)
    reason = "the catalog lost a market on purpose"
    assert value(got, "rebuild_change_accepted_info", "rebuild", reason=reason) == 1
    assert value(got, "rebuild_guard_fired", "rebuild", guard="items_ratio") == 1


def test_collapse_refused_updates_promoted_and_the_same_inputs_publish_one_version(catalogs, tmp_path):
    out, prom = tmp_path / "out", tmp_path / "m.prom"
    assert rebuild(catalogs, "base", out).exit_code == 0
    again = rebuild(catalogs, "base", out, "--metrics-file", prom)
    assert again.exit_code == 0, again.output
    assert again.stdout == f"{(out / 'v000001').resolve()}\n" and versions(out) == ["v000001"]
    assert "inputs unchanged since LATEST v000001" in again.stderr
    got = metrics(prom)
    assert value(got, "rebuild_unchanged", "rebuild") == 1 and value(got, "bundle_version", "rebuild") == 1

    collapsed = rebuild(catalogs, "collapsed", out, "--metrics-file", prom)
    assert collapsed.exit_code == 6 and "guard shared_sid_items" in collapsed.stderr
    assert value(metrics(prom), "rebuild_guard_fired", "rebuild", guard="shared_sid_items") == 1
    assert (out / "LATEST").read_text() == "v000001\n"
    for name, version in (("model-update", "v000003"), ("churn", "v000004")):
        done = rebuild(catalogs, name, out, "--metrics-file", prom)
        assert done.exit_code == 0, done.output
        assert (out / "LATEST").read_text() == f"{version}\n"
        assert value(metrics(prom), "rebuild_unchanged", "rebuild") == 0
    forced = rebuild(catalogs, "churn", out, "--force")
    assert forced.exit_code == 0 and (out / "LATEST").read_text() == "v000005\n"


SLOW_GATE = """
import pathlib, time
from tests.compare_models import model_fn

def slow(bundle, request_ids):
    pathlib.Path("gate-started").write_text("1")
    time.sleep(600)
    return model_fn(bundle, request_ids)
"""


def test_a_second_run_exits_7_and_a_killed_run_is_visible_and_cleaned_up(catalogs, tmp_path):
    """Real processes: run A (killed with -9 in its gate), run B while A runs, then a run after A."""
    out, prom = tmp_path / "out", tmp_path / "m.prom"
    assert rebuild(catalogs, "base", out, "--metrics-file", prom).exit_code == 0
    succeeded_at = value(metrics(prom), "job_last_success_timestamp_seconds", "rebuild")
    (tmp_path / "slow_gate.py").write_text(SLOW_GATE)
    pq.write_table(pa.table({"request_id": list(range(4))}), tmp_path / "requests.parquet")
    path, tag = catalogs["base"]
    args = [*map(str, (path, "--out", out, "--codebook-sizes", "32,32,32", "--model-version", tag))]
    args += ["--device", "cpu", "--tune-args", TUNE_ARGS, "--metrics-file", str(prom)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    gate = ["--gate-model-fn", "slow_gate:slow", "--gate-requests", "requests.parquet", "--force"]
    first = subprocess.Popen(
        [*zerogr_command(), "rebuild", *args, *gate], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "gate-started").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        running = prom.read_text()
        started = time.monotonic()
        second = subprocess.run(
            [*zerogr_command(), "rebuild", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert second.returncode == 7, second.stderr
        assert f"pid {first.pid} on {socket.gethostname()}, started 20" in second.stderr
        assert time.monotonic() - started < 60 and prom.read_text() == running  # left to the holder
    finally:
        first.send_signal(signal.SIGKILL)
        _, killed_log = first.communicate(timeout=60)
    killed_run = killed_log.split()[0]
    got = metrics(prom)
    assert (
        value(got, "job_running", "rebuild") == 1
        and ("zerogr_job_exit_status", ("job", "rebuild")) not in got
    )
    assert value(got, "job_run_info", "rebuild", run_id=killed_run) == 1
    assert value(got, "job_last_success_timestamp_seconds", "rebuild") == succeeded_at
    assert (
        versions(out) == ["v000001", "v000002"]
        and load_manifest(out / "v000002")["rebuild_run"] == killed_run
    )

    operator = invoke("build", path, "--out", out, "--codebook-sizes", "32,32,32", "--no-promote", "-q")
    assert operator.exit_code == 0  # an operator's unpromoted version: never a rebuild's to remove
    after = rebuild(catalogs, "base", out, "--metrics-file", prom)
    assert after.exit_code == 0, after.output
    assert "never finished" in after.stderr and "removed v000002" in after.stderr
    assert versions(out) == ["v000001", "v000003"] and (out / "LATEST").read_text() == "v000001\n"
    assert value(metrics(prom), "job_running", "rebuild") == 0 and (out / ".rebuild.lock").read_text() == ""


def test_missing_push_credentials_and_an_unwritable_metrics_path_exit_2_in_seconds(
    catalogs, tmp_path, s3_bucket, monkeypatch
):
    out = tmp_path / "out"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    started = time.monotonic()
    done = rebuild(catalogs, "base", out, "--push", f"s3://{s3_bucket}/fleet")
    assert done.exit_code == 2 and "no AWS credentials" in done.stderr, done.output
    assert time.monotonic() - started < 30 and not versions(out)
    (tmp_path / "file").write_text("")
    blocked = rebuild(catalogs, "base", out, "--metrics-file", tmp_path / "file" / "m.prom")
    assert blocked.exit_code == 2 and "is not a writable directory" in blocked.stderr and not versions(out)


@pytest.fixture
def small_fs(tmp_path):
    """A real 8 MiB tmpfs (skipped where it cannot be mounted: not root, no CAP_SYS_ADMIN)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def _leave_free(mount: Path, free: int) -> None:
    """Fill the file system until `free` bytes are left (a ballast file, really allocated)."""
    ballast = mount / "ballast"
    now = os.statvfs(mount)
    size = (ballast.stat().st_size if ballast.exists() else 0) + now.f_bavail * now.f_frsize - free
    ballast.unlink(missing_ok=True)
    with open(ballast, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(size, 1))


def test_a_full_disk_prunes_beyond_keep_then_exits_8_naming_the_path(catalogs, tmp_path, small_fs):
    from zerogr_build.rebuild.preflight import needed_bytes, version_bytes

    out = small_fs / "out"
    path, tag = catalogs["base"]
    for _ in range(3):
        built = invoke("build", path, "--out", out, "--codebook-sizes", "32,32,32", "--model-version", tag,
                       "--keep", "3", "-q")  # fmt: skip
        assert built.exit_code == 0, built.output
    need = needed_bytes(out / "v000003")
    _leave_free(small_fs, int(need - version_bytes(out / "v000001") / 2))
    pruned = rebuild(catalogs, "base", out, "--keep", "3", "--force")
    assert pruned.exit_code == 0, pruned.output
    assert "short of space" in pruned.stderr and "pruned v000001" in pruned.stderr
    assert versions(out) == ["v000002", "v000003", "v000004"]  # LATEST's and the one before spared

    _leave_free(small_fs, int(need / 3))
    full = rebuild(catalogs, "base", out, "--force")
    assert full.exit_code == 8 and f"{out}: disk full" in full.stderr and "retrying alone" in full.stderr
    assert versions(out) == ["v000002", "v000003", "v000004"] and (out / "LATEST").read_text() == "v000004\n"

    _leave_free(small_fs, 16 * 1024)  # a first version: nothing to estimate from; the build runs out
    fresh = small_fs / "fresh"
    first = rebuild(catalogs, "base", fresh)
    assert first.exit_code == 8, first.output
    assert f"disk full writing {fresh}" in first.stderr and not versions(fresh)
    assert not [p for p in fresh.iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
    assert json.loads(invoke("status", out, "--json").stdout)["latest"] == "v000004"
