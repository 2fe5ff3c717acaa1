"""SIGTERM swept over a real `zerogr rebuild` (cron's `timeout`, systemd's stop): while its command body
imports the rebuild modules (torch among them, before the command's error handling), during the inputs
check, during the build, and around its end. Wherever it lands, the exit code is the metrics file's
`zerogr_job_exit_status`: 143 with one line naming SIGTERM, or, once the run has written its metrics, the
run's own code (a signal during the interpreter's shut-down included), never Ctrl-C's 130 or a death by
the signal."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from .cli_runs import REPO, TUNE_ARGS, run_rebuild, zerogr_command
from .test_cli_metrics import metrics, value, write_catalog

WAIT_S = 120.0


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """An OUT with v000001 built by rebuild, its catalog, and the rebuild arguments that built it."""
    root = tmp_path_factory.mktemp("sigterm-rebuild")
    catalog = write_catalog(root / "catalog.parquet", n=600)
    args = [catalog, "--out", root / "OUT", "--codebook-sizes", "16,16,16", "--device", "cpu"]
    args += ["--tune-args", TUNE_ARGS]
    done = run_rebuild(*args, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return root, [str(a) for a in args]


def mapped(pid: int, library: str) -> bool:
    """True once `library` (a file name's start) is mapped into process `pid`."""
    try:
        return f"/{library}" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def start(args: list[str], prom: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*zerogr_command(), "rebuild", *args, "--metrics-file", str(prom)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for_line(process: subprocess.Popen, marker: str) -> list[str]:
    """stderr's lines up to and including the first that holds `marker` (all of them if it never comes)."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if marker in line:
            break
    return lines


def ended_as_its_metrics_say(process: subprocess.Popen, prom: Path, seen: list[str], own: int) -> int:
    """Wait for the process; assert its exit code is the metrics file's, `own` (the run's own code) or 143,
    and that a 143 says why in exactly one line. Returns the code."""
    _, err = process.communicate(timeout=WAIT_S)
    stderr = "".join(seen) + err
    code = process.returncode
    assert code == value(metrics(prom), "job_exit_status", "rebuild"), stderr
    assert code in (own, 143), stderr
    terminated = [line for line in stderr.splitlines() if "terminated by" in line]
    if code == 143:
        assert len(terminated) == 1, stderr
        said = terminated[0]
        assert said.endswith(("zerogr: terminated by SIGTERM", "terminated by SIGTERM during start-up")), said
        assert "Traceback" not in stderr, stderr
    else:
        assert terminated == [], stderr
    return code


def test_sigterm_while_the_command_imports_its_modules_is_143_with_one_line(rebuilt):
    root, args = rebuilt
    prom = root / "imports.prom"
    process = start(args, prom)
    deadline = time.monotonic() + WAIT_S
    # numba's LLVM library is loaded as the command imports its modules, before any stage starts.
    while not mapped(process.pid, "libllvmlite") and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert process.poll() is None, "the run ended before its modules were imported"
    process.send_signal(signal.SIGTERM)
    assert ended_as_its_metrics_say(process, prom, [], own=0) == 143


@pytest.mark.parametrize(
    ("stage", "marker", "extra"),
    [("inputs", "holding", ()), ("build", "rebuild: build ", ("--force",))],
)
def test_sigterm_during_a_stage_is_143_with_one_line(rebuilt, stage, marker, extra):
    root, args = rebuilt
    prom = root / f"{stage}.prom"
    process = start([*args, *extra], prom)
    seen = wait_for_line(process, marker)
    process.send_signal(signal.SIGTERM)
    assert ended_as_its_metrics_say(process, prom, seen, own=0) == 143
    assert (root / "OUT" / "LATEST").read_text() == "v000001\n"
    assert sorted(p.name for p in (root / "OUT").glob("v*")) == ["v000001"]


@pytest.mark.parametrize("delay", [0.0, 0.03])
def test_sigterms_as_the_run_ends_never_change_the_code_its_metrics_hold(rebuilt, delay):
    """From `delay` s after `ready:` until the process is gone, a SIGTERM every 2 ms: before the metrics
    are written they end the run with 143; after, the run's own 0 stands, through the interpreter's
    shut-down, when its default action would end the process as killed by the signal."""
    root, args = rebuilt
    prom = root / "end.prom"
    process = start(args, prom)
    seen = wait_for_line(process, "ready:")
    time.sleep(delay)
    while process.poll() is None:
        process.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    ended_as_its_metrics_say(process, prom, seen, own=0)
