"""What a rebuild run records in OUT's run history (bundle/run_history.py): its line as it starts, its
outcome as it ends (exit code, stage, reason, version, guards fired, the push's outcome). A history that
cannot be written is one log line: it never changes the run's outcome."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base.errors import one_line
from ..base.redact import redact
from ..bundle import run_history
from .outcome import RebuildResult

Log = Callable[[str], None]


def record_start(out: Path, result: RebuildResult, pid: int, host: str, log: Log) -> None:
    """The run's line, "running", once it holds the run lock; earlier "running" lines become "killed"."""
    run = {"run_id": result.run_id, "pid": pid, "host": host, "start": run_history.now_iso()}
    try:
        killed = run_history.record_start(out, run)
    except (OSError, ValueError, TypeError) as exc:
        log(f"could not write the run history {run_history.history_path(out)}: {one_line(exc)}")
        return
    if killed:
        log(f"run history: {', '.join(killed)} never ended: marked killed")


def record_end(
    out: Path, result: RebuildResult, push_url: str | None, log: Log, ended_by: BaseException | None = None
) -> None:
    """The run's outcome into its line. `ended_by`: the exception that ends the run instead of its result:
    Ctrl-C or a signal (a KeyboardInterrupt, its exit_code 128 + N when it carries one, else 130), or a
    crash (exit 1)."""
    run = end_record(result, push_url, ended_by)
    try:
        run_history.record_end(out, run)
    except (OSError, ValueError, TypeError) as exc:
        log(f"could not write the run history {run_history.history_path(out)}: {one_line(exc)}")


def end_record(result: RebuildResult, push_url: str | None, ended_by: BaseException | None) -> dict:
    """The fields a run's end adds to its line (module docstring of bundle/run_history.py)."""
    code, stage = result.exit_code, result.failure.stage if result.failure else None
    reason = result.failure.message if result.failure else None
    if isinstance(ended_by, KeyboardInterrupt):
        code, stage = getattr(ended_by, "exit_code", 130), "signal"
        reason = one_line(ended_by) or "interrupted"
    elif ended_by is not None:
        code, stage, reason = 1, "crash", f"{type(ended_by).__name__}: {one_line(ended_by)}"
    version = result.version_dir.name if result.version_dir is not None else None
    fired = [check.guard for check in result.guards.checks if check.fired] if result.guards else []
    return {
        "run_id": result.run_id,
        "end": run_history.now_iso(),
        "exit_code": code,
        "stage": stage,
        "reason": reason[:300] if reason else None,
        "version": version,
        "promoted": result.promoted,
        "unchanged": result.unchanged,
        "guards_fired": fired,
        "push": push_record(result, push_url),
    }


def push_record(result: RebuildResult, push_url: str | None) -> dict[str, Any] | None:
    """{url, outcome, remote_version, fleet_latest, expires} of the run's fleet step; None without --push.
    outcome: pushed, failed, renewed (the signed metadata renewed, nothing pushed), or none (nothing to
    push: the run failed first, or LATEST was on the fleet already)."""
    if push_url is None:
        return None
    failed = result.failure is not None and result.failure.stage in ("push", "renew")
    if result.pushed is not None:
        outcome = "pushed"
    elif failed:
        outcome = "failed"
    elif "renew" in result.stages:
        outcome = "renewed"
    else:
        outcome = "none"
    pushed = result.pushed
    return {
        "url": redact(push_url),
        "outcome": outcome,
        "remote_version": getattr(pushed, "version", None),
        "fleet_latest": result.fleet.get("latest"),
        "expires": result.fleet.get("expires"),
    }
