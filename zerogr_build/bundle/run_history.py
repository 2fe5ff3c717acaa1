"""The run history of an OUT dir: one JSON line per `zerogr rebuild` run in OUT/.rebuild-history.jsonl,
oldest first, the newest MAX_RUNS kept, for the report page (whether the job is healthy, not only what
changed).

A run writes its line as it starts, holding OUT's run lock (`status: "running"`, no end), and rewrites it
as it ends (end time, exit code, the stage that failed and why, the version, the guards that fired, the
push's outcome). A line still "running" when the next run holds the lock belongs to a run that never
ended (kill -9, a power cut): that run marks it "killed". Only a holder of the run lock writes, so
writers never race; each write replaces the file atomically (a temp file beside it, fsync, rename) while
holding OUT's lock, as every temp file in OUT is written.

The file is data any OUT writer could have damaged: it is read with a size limit, never through a
special file (a FIFO cannot hang the run), and a line that is not a run record is dropped, never an error.
A file that cannot be read or written never fails the run: the caller logs one line and carries on.

Record fields (every one optional for a reader): run_id, status ("running", "ended", "killed"), pid,
host, start and end (ISO 8601 UTC), exit_code, stage and reason (why it failed), version (vNNNNNN),
unchanged (inputs unchanged, nothing built), guards_fired (names), push ({url, outcome, remote_version,
fleet_latest, expires}: expires in unix seconds).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

HISTORY_NAME = ".rebuild-history.jsonl"
#: Runs kept: the newest this many (about 200 kB of lines).
MAX_RUNS = 200
#: The most bytes read of the file; a larger one is read from its end (its newest lines).
MAX_BYTES = 1 << 20
#: A line longer than this is not a run record.
MAX_LINE = 8192
STATUSES = ("running", "ended", "killed")


def history_path(out: str | os.PathLike) -> Path:
    return Path(out) / HISTORY_NAME


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_runs(out: str | os.PathLike) -> list[dict[str, Any]]:
    """The run records of OUT's history, oldest first: the lines that are JSON objects naming a run_id
    (a string) and a known status; anything else is dropped. [] when there is no history, or it cannot
    be read (a directory, a FIFO, a device, a symlink, no permission)."""
    path = history_path(out)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return []
        if info.st_size > MAX_BYTES:
            f.seek(info.st_size - MAX_BYTES)
            f.readline()  # a partial first line
        data = f.read(MAX_BYTES)
    runs = []
    for raw in data.split(b"\n"):
        record = _record(raw)
        if record is not None:
            runs.append(record)
    return runs[-MAX_RUNS:]


def _record(raw: bytes) -> dict[str, Any] | None:
    if not raw.strip() or len(raw) > MAX_LINE:
        return None
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return None
    return record if record.get("status") in STATUSES else None


def write_runs(out: str | os.PathLike, runs: Iterable[Mapping[str, Any]]) -> None:
    """Replace OUT's history with `runs` (the newest MAX_RUNS), atomically, holding OUT's lock (whose
    holders sweep stray temp files). OSError when it cannot be written (anything but a regular file at the
    path is never replaced)."""
    from .lock import replace_out_file

    lines = [json.dumps(dict(run), sort_keys=True, default=str) for run in runs]
    text = "".join(f"{line}\n" for line in lines[-MAX_RUNS:])
    replace_out_file(Path(out), history_path(out), text.encode("utf-8"))


def record_start(out: str | os.PathLike, run: Mapping[str, Any]) -> list[str]:
    """Append the line of a run that starts (`run`: run_id, pid, host, start ...; status "running"), and
    mark every earlier line still "running" as "killed": the caller holds the run lock, so their runs
    ended without writing their end. Returns the ids marked killed. OSError when it cannot be written."""
    runs, killed = [], []
    for old in read_runs(out):
        if old.get("status") == "running" and old.get("run_id") != run.get("run_id"):
            old = {**old, "status": "killed"}
            killed.append(str(old["run_id"]))
        if old.get("run_id") != run.get("run_id"):
            runs.append(old)
    runs.append({**run, "status": "running"})
    write_runs(out, runs)
    return killed


def record_end(out: str | os.PathLike, run: Mapping[str, Any]) -> None:
    """Rewrite the line of run `run["run_id"]` as ended (appended when the history lost it). OSError when
    it cannot be written."""
    runs, found = [], False
    for old in read_runs(out):
        if old.get("run_id") == run.get("run_id"):
            old, found = {**old, **run, "status": "ended"}, True
        runs.append(old)
    if not found:
        runs.append({**run, "status": "ended"})
    write_runs(out, runs)
