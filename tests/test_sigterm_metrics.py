"""Every command that takes --metrics-file, run in its own process and sent SIGTERM mid-run (cron's
`timeout`, systemd's stop): exit 143, the metrics file replaced with exit status 143 and a failure on the
`signal` stage, never the previous run's file. Object storage that hangs (an endpoint that accepts
connections and never answers, as a stuck network does) holds push, pull and a remote promote in Python
socket reads, and build and verify in the storage client's native code, where only the signal watchdog can
end them. `zerogr rebuild` is covered in test_rebuild.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.cli._metrics import JobMetrics
from zerogr_build.cli._signals import GRACE_SECONDS

from .cli_runs import TUNE_ARGS, invoke, zerogr_command
from .test_cli_metrics import metrics, value

WAIT_S = 120.0


@pytest.fixture()
def hung_s3():
    """AWS_* variables naming an S3 endpoint on 127.0.0.1 that accepts connections and never answers, and
    an Event set once a client has connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    connected, held = threading.Event(), []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            connected.set()

    threading.Thread(target=accept, daemon=True).start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.getsockname()[1]}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    yield env, connected
    server.close()
    for conn in held:
        conn.close()


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    """A built local OUT (v000001) and its catalog."""
    root = tmp_path_factory.mktemp("sigterm")
    sids = np.random.default_rng(0).integers(0, 16, (800, 3)).tolist()
    pq.write_table(pa.table({"item_id": np.arange(800, dtype=np.int64), "sid": sids}), root / "c.parquet")
    done = invoke("build", root / "c.parquet", "-o", root / "OUT", "--codebook-sizes", "16,16,16", "-q")
    assert done.exit_code == 0, done.output
    return root / "OUT"


def _terminated_mid_run(args: list, job: str, tmp_path, ready, env: dict | None = None) -> tuple[str, dict]:
    """Run `zerogr ARGS --metrics-file M` (M holding a previous successful run), send SIGTERM once
    ready(stderr lines) holds, and check the exit and the file; returns stderr and the metrics."""
    prom = tmp_path / "m.prom"
    JobMetrics(job, prom).write(0)
    before = value(metrics(prom), "job_last_run_timestamp_seconds", job)
    proc = subprocess.Popen(
        [*zerogr_command(), *map(str, args), "--metrics-file", str(prom)], cwd=tmp_path,
        env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + WAIT_S
    while not ready(lines):
        assert proc.poll() is None, (proc.returncode, lines)
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    time.sleep(0.3)
    assert proc.poll() is None, lines  # still running: the signal lands mid-run
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=WAIT_S)
    took = time.monotonic() - sent
    reader.join(WAIT_S)
    stderr = "".join(lines)
    assert proc.returncode == 143, stderr
    assert took < GRACE_SECONDS + 15, took
    assert "terminated by SIGTERM" in stderr
    got = metrics(prom)
    assert value(got, "job_exit_status", job) == 143
    assert value(got, "job_last_run_timestamp_seconds", job) > before
    (failure,) = [dict(k[1:]) for k in got if k[0] == "zerogr_job_failure_info"]
    assert failure["stage"] == "signal" and "SIGTERM" in failure["reason"]
    return stderr, got


def test_tune_killed_while_measuring(version, tmp_path):
    args = ["tune", version, "--device", "cpu", *TUNE_ARGS.replace("--iters 1", "--iters 1000000").split()]
    _terminated_mid_run(args, "tune", tmp_path, lambda lines: any("done in" in line for line in lines))


@pytest.mark.parametrize(
    ("job", "args"),
    [
        ("push", ["push", "{version}/v000001", "s3://bucket/fleet"]),
        ("pull", ["pull", "s3://bucket/fleet", "{tmp}/HOST", "--allow-unsigned"]),
        ("promote", ["promote", "s3://bucket/fleet/v000001", "--allow-unsigned"]),
    ],
)
def test_fleet_commands_killed_while_the_store_hangs(version, tmp_path, hung_s3, job, args):
    """boto3 waits in Python socket reads: the signal ends the command through its own `finally` blocks."""
    env, connected = hung_s3
    args = [a.format(version=version, tmp=tmp_path) for a in args]
    stderr, _ = _terminated_mid_run(args, job, tmp_path, lambda _: connected.is_set(), env)
    assert "not ended within" not in stderr  # ended at once, not by the watchdog


@pytest.mark.parametrize(
    ("job", "args"),
    [
        ("build", ["build", "s3://bucket/catalog/", "-o", "{tmp}/OUT", "--codebook-sizes", "16,16,16"]),
        ("verify", ["verify", "{version}/v000001", "--catalog", "s3://bucket/catalog/"]),
    ],
)
def test_catalog_reads_killed_while_the_store_hangs_end_after_the_grace_period(
    version, tmp_path, hung_s3, job, args
):
    """pyarrow's S3 client retries inside native code, where Python cannot run a signal handler: the
    watchdog writes the metrics and ends the process after the grace period, not minutes later."""
    env, connected = hung_s3
    args = [a.format(version=version, tmp=tmp_path) for a in args]
    stderr, _ = _terminated_mid_run(args, job, tmp_path, lambda _: connected.is_set(), env)
    assert f"not ended within {GRACE_SECONDS:g} s" in stderr
    assert not (tmp_path / "OUT").exists() or not list((tmp_path / "OUT").glob("v*"))
