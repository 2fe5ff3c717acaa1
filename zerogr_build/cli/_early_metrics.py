"""The metrics file of a run ended by a signal before its command started: written from the raw arguments
(--metrics-file PATH, the command's name as the job), with the standard library only, since it runs while
the command's imports (prometheus-client among them) may be half done.

It holds what cli/_metrics.py's JobMetrics.write(128 + N) would: the run's time, exit status and duration,
`zerogr_job_failure_info{stage="signal"}`, the failures in a row, and the last success and the fleet's
last known view carried over from the file it replaces. The file is replaced atomically, with mode 644,
and only ever over a regular file, as cli/_metrics.py does.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Sequence

PREFIX = "zerogr"
LAST_SUCCESS = f"{PREFIX}_job_last_success_timestamp_seconds"
CONSECUTIVE_FAILURES = f"{PREFIX}_job_consecutive_failures"
#: The fleet's last known view, carried over by every metrics file (cli/_metrics.py too): name -> help.
FLEET_GAUGES = {
    "metadata_expires_timestamp_seconds": "When the fleet's signed timestamp expires (unix seconds): hosts "
    "refuse it from then on.",
    "latest_version": "The version the fleet's signed metadata names as LATEST.",
    "latest_seen_timestamp_seconds": "When that LATEST was read off the fleet's signed metadata (unix "
    "seconds).",
}
#: The job label: the command's name as job_metrics names it (build, rebuild, pull, ...).
JOB_RE = re.compile(r"[a-z][a-z0-9-]{0,39}\Z")
#: A metrics file larger than this is not read for its last success (as cli/_metrics.previous_success).
MAX_PREVIOUS_BYTES = 1 << 20


def metrics_path(args: Sequence[str]) -> str | None:
    """--metrics-file's value in raw arguments (before, or without, option parsing)."""
    for i, arg in enumerate(args):
        if arg == "--metrics-file" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--metrics-file="):
            return arg.split("=", 1)[1]
    return None


def job_name(args: Sequence[str]) -> str | None:
    """The command named in raw arguments (the first one that is not an option), if it is a plain name."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    return command if command is not None and JOB_RE.match(command) else None


def write_terminated(
    args: Sequence[str], signum: int, name: str, started: float, when: str = " during start-up"
) -> str | None:
    """Write the metrics file named in `args` for a run ended by signal `signum` (called `name`) outside its
    command's block (before it started, `when` " during start-up"; or as it ended, `when` ""): exit status
    128 + signum. Returns the path written, None without --metrics-file or a command name; OSError when it
    cannot be written (a non-regular file at the path is left as it is)."""
    path, job = metrics_path(args), job_name(args)
    if not path or job is None:
        return None
    now = time.time()
    series = [
        ("job_last_run_timestamp_seconds", "When the last run ended (unix seconds).", {}, now),
        ("job_exit_status", "Exit code of the last run (0 = ok).", {}, 128 + signum),
        ("job_duration_seconds", "Wall time of the last run.", {}, now - started),
        (
            "job_failure_info",
            "What failed in the last run.",
            {"reason": f"terminated by {name}{when}", "stage": "signal"},
            1,
        ),
    ]
    previous = _previous_values(path, job)
    last_success = previous.get(LAST_SUCCESS)
    if last_success is not None:
        doc = "When the last successful run ended (unix seconds)."
        series.insert(1, (LAST_SUCCESS.removeprefix(f"{PREFIX}_"), doc, {}, last_success))
    doc = "Runs in a row, the last one included, that exited non-zero (0 after a success)."
    series.append(("job_consecutive_failures", doc, {}, previous.get(CONSECUTIVE_FAILURES, 0.0) + 1))
    fleet = {
        name: previous[f"{PREFIX}_fleet_{name}"]
        for name in FLEET_GAUGES
        if f"{PREFIX}_fleet_{name}" in previous
    }
    if "latest_seen_timestamp_seconds" not in fleet:
        fleet.pop("latest_version", None)
    series += [(f"fleet_{name}", FLEET_GAUGES[name], {}, value) for name, value in fleet.items()]
    lines = []
    for metric, doc, labels, value in series:
        full = f"{PREFIX}_{metric}"
        shown = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted({"job": job, **labels}.items()))
        lines += [f"# HELP {full} {doc}", f"# TYPE {full} gauge", f"{full}{{{shown}}} {float(value)!r}"]
    _replace_regular_file(path, ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _previous_values(path: str, job: str) -> dict[str, float]:
    """{metric name: finite value} of the series labelled only with `job` in the file at `path`, if it is
    a small regular file ({} otherwise)."""
    pattern = re.compile(rf'^({PREFIX}_[a-z0-9_]+){{job="{re.escape(job)}"}} (\S+)$', re.MULTILINE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PREVIOUS_BYTES:
            return {}
        text = f.read().decode("utf-8", "replace")
    values = {}
    for name, shown in pattern.findall(text):
        try:
            value = float(shown)
        except ValueError:
            continue
        if value == value and abs(value) != float("inf"):
            values[name] = value
    return values


def _replace_regular_file(path: str, data: bytes) -> None:
    """Replace the regular file `path` (or create it) with `data`: a temp file beside it, fsync, rename.
    Anything but a regular file at `path` (lstat) is left as it is: OSError."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise OSError(f"{path}: not a regular file; left as it is")
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".tmp-{os.getpid()}-{os.urandom(4).hex()}-{os.path.basename(path)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # whatever the umask: node_exporter, another user, reads it
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
