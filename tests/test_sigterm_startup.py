"""SIGTERM in the first second of `zerogr`, while its commands' modules are still importing (cron's
`timeout`, systemd's stop, a scheduler's kill arriving early): exit 143 and the --metrics-file says 143
(read from the raw arguments), never the previous run's status 0. And a signal after the run has written
its metrics ends the process with that run's status, leaving the file as it is."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from zerogr_build.cli._metrics import JobMetrics

from .test_cli_metrics import metrics, value

ZEROGR = str(Path(sys.executable).with_name("zerogr"))


def previous_success(path: Path, job: str) -> float:
    """A metrics file as a successful earlier run left it; returns its last-success time."""
    earlier = JobMetrics(job, path)
    earlier.write(0)
    return value(metrics(path), "job_last_success_timestamp_seconds", job)


def numpy_is_loading(pid: int) -> bool:
    """True once numpy's compiled core is mapped into process `pid`: the commands' imports are under way."""
    try:
        return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sigterm_while_the_commands_import_writes_143_to_the_metrics_file(tmp_path):
    prom = tmp_path / "m" / "rebuild.prom"
    prom.parent.mkdir()
    success = previous_success(prom, "rebuild")
    args = ["rebuild", str(tmp_path / "cat.parquet"), "--out", str(tmp_path / "OUT")]
    args += ["--metrics-file", str(prom)]
    process = subprocess.Popen([ZEROGR, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not numpy_is_loading(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert err.strip() == "zerogr: terminated by SIGTERM during start-up" and not out
    got = metrics(prom)
    assert value(got, "job_exit_status", "rebuild") == 143
    assert value(got, "job_last_success_timestamp_seconds", "rebuild") == success
    reason = {"reason": "terminated by SIGTERM during start-up", "stage": "signal"}
    assert value(got, "job_failure_info", "rebuild", **reason) == 1
    assert 0 <= value(got, "job_duration_seconds", "rebuild") < 60
    # the same series as a run that fails in its body writes (label values aside)
    failed = tmp_path / "failed.prom"
    previous_success(failed, "rebuild")
    JobMetrics("rebuild", failed).write(143)
    assert {key[0] for key in got} - {"zerogr_job_failure_info"} == {key[0] for key in metrics(failed)}


def test_a_signal_after_the_run_wrote_its_metrics_ends_with_the_runs_status(tmp_path):
    prom = tmp_path / "verify.prom"
    script = f"""
import os, signal, sys, time
from zerogr_build.cli._signals import install_startup_handlers
from zerogr_build.cli._metrics import job_metrics
install_startup_handlers(["verify", "x", "--metrics-file", {str(prom)!r}])
with job_metrics("verify", {str(prom)!r}):
    pass
sys.stdout.write("done")
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "done"), result.stderr
    assert value(metrics(prom), "job_exit_status", "verify") == 0
