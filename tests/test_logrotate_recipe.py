"""deploy/logrotate/zerogr, the crontab lines' log rotation, run by logrotate itself on logs under a temp
dir (the documented /var/log/zerogr/ mapped there): the debug run accepts it, forced rotations rename and
compress the logs the way the file says, and a cron line's `>>` makes the next log. Skipped where logrotate
is not installed (.ci/run installs it)."""

from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "deploy" / "logrotate" / "zerogr"
LOG_DIR = "/var/log/zerogr/"

pytestmark = pytest.mark.skipif(
    shutil.which("logrotate") is None, reason="logrotate is not installed (.ci/run installs it)"
)


def _local(tmp_path: Path) -> tuple[Path, Path]:
    """(the recipe with its log dir mapped under tmp_path, that dir)."""
    text = RECIPE.read_text()
    assert f"{LOG_DIR}*.log {{" in text
    logs = tmp_path / "log"
    logs.mkdir()
    conf = tmp_path / "zerogr.logrotate"
    conf.write_text(text.replace(LOG_DIR, f"{logs}/"))
    conf.chmod(0o644)
    return conf, logs


def _logrotate(conf: Path, *flags: str) -> subprocess.CompletedProcess:
    state = conf.parent / "logrotate.state"
    return subprocess.run(
        ["logrotate", *flags, "-s", str(state), str(conf)], capture_output=True, text=True, timeout=60
    )


def test_logrotate_accepts_the_recipe(tmp_path: Path) -> None:
    conf, logs = _local(tmp_path)
    (logs / "rebuild.log").write_text("a run\n")
    done = _logrotate(conf, "-d")
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr.lower(), done.stderr
    assert f"rotating pattern: {logs}/*.log" in done.stderr and "weekly" in done.stderr


def test_forced_rotations_rename_compress_and_keep_empty_logs(tmp_path: Path) -> None:
    conf, logs = _local(tmp_path)
    rebuild, pull = logs / "rebuild.log", logs / "pull.log"
    rebuild.write_text("run 1\n")
    pull.write_text("")
    first = _logrotate(conf, "-f")
    assert first.returncode == 0, first.stderr
    assert not rebuild.exists()  # renamed, not copied (nocreate): the next cron run makes it
    assert (logs / "rebuild.log.1").read_text() == "run 1\n"  # delaycompress: the newest stays plain
    assert pull.exists() and not (logs / "pull.log.1").exists()  # notifempty
    cron = subprocess.run(["/bin/sh", "-c", f"echo 'run 2' >>{rebuild}"], capture_output=True)
    assert cron.returncode == 0 and rebuild.read_text() == "run 2\n"
    second = _logrotate(conf, "-f")
    assert second.returncode == 0, second.stderr
    assert (logs / "rebuild.log.1").read_text() == "run 2\n"
    assert gzip.decompress((logs / "rebuild.log.2.gz").read_bytes()) == b"run 1\n"


def test_the_recipe_keeps_eight_logs(tmp_path: Path) -> None:
    conf, logs = _local(tmp_path)
    for run in range(11):
        (logs / "rebuild.log").write_text(f"run {run}\n")
        done = _logrotate(conf, "-f")
        assert done.returncode == 0, done.stderr
    kept = sorted(p.name for p in logs.iterdir())
    assert kept == sorted(["rebuild.log.1", *(f"rebuild.log.{n}.gz" for n in range(2, 9))]), kept
    assert (logs / "rebuild.log.1").read_text() == "run 10\n"
    assert gzip.decompress((logs / "rebuild.log.8.gz").read_bytes()) == b"run 3\n"
