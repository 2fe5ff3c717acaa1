"""What the report shows of the job's health: the last runs of `zerogr rebuild` from OUT's run history
(bundle/run_history.py), and the fleet as the newest push saw it (its remote LATEST and when the signed
metadata expires). The history is untrusted data like a version: every field is checked here and shown
as unknown when it is not what a run writes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.numbers import finite
from ..bundle.run_history import read_runs

DEFAULT_RUNS = 20
#: What a rebuild exit code tells a scheduler (`zerogr rebuild --help` has the full text).
EXIT_MEANINGS = {
    0: "ok", 1: "crash", 2: "bad input or set-up", 3: "failed, retry later", 4: "verify failed",
    5: "promoted, untuned", 6: "refused by the guards", 7: "OUT locked by another run", 8: "disk full",
    10: "promoted, quality gate failed", 11: "quality gate could not run", 12: "promoted, push failed",
    129: "ended by SIGHUP", 130: "interrupted", 143: "ended by SIGTERM",
}  # fmt: skip
MAX_TEXT = 300
#: Version numbers past this many digits are not shown (a fleet's numbers have at most 9).
MAX_NUMBER = 10**12


@dataclass(frozen=True)
class FleetFacts:
    """The fleet as the run `run_id` saw it when it pushed or renewed: its remote OUT (credentials
    redacted), the version its signed metadata names as LATEST, when that metadata expires (unix s)."""

    url: str | None
    latest: int | None
    expires: float | None
    run_id: str
    seen: str | None


@dataclass(frozen=True)
class RunFacts:
    """One run of the history, every field None when unknown. status: running, ended, killed (a line
    still "running" behind a newer run: it never ended)."""

    run_id: str
    status: str
    start: str | None = None
    end: str | None = None
    exit_code: int | None = None
    stage: str | None = None
    reason: str | None = None
    version: str | None = None
    unchanged: bool = False
    guards_fired: tuple[str, ...] = ()
    push_outcome: str | None = None
    push_url: str | None = None
    fleet: FleetFacts | None = None

    @property
    def meaning(self) -> str | None:
        return EXIT_MEANINGS.get(self.exit_code) if self.exit_code is not None else None


def out_runs(out: str | Path, last: int = DEFAULT_RUNS) -> list[RunFacts]:
    """The newest `last` runs of OUT's history, oldest first ([] without a history)."""
    records = read_runs(out)
    facts = [run_facts(record) for record in records]
    facts = [
        RunFacts(**{**f.__dict__, "status": "killed"}) if f.status == "running" and i < len(facts) - 1 else f
        for i, f in enumerate(facts)
    ]
    return facts[-last:] if last > 0 else []


def run_facts(record: Mapping[str, Any]) -> RunFacts:
    """A history line as the report shows it; a field of the wrong type or size is None."""
    push = record.get("push") if isinstance(record.get("push"), Mapping) else {}
    fleet = None
    latest, expires = _whole(push.get("fleet_latest")), finite(push.get("expires"))
    if latest is not None or expires is not None:
        seen = _text(record.get("end")) or _text(record.get("start"))
        fleet = FleetFacts(_text(push.get("url")), latest, expires, _text(record["run_id"]) or "?", seen)
    fired = record.get("guards_fired")
    return RunFacts(
        run_id=_text(record["run_id"]) or "?",
        status=str(record.get("status")),
        start=_text(record.get("start")),
        end=_text(record.get("end")),
        exit_code=_exit_code(record.get("exit_code")),
        stage=_text(record.get("stage")),
        reason=_text(record.get("reason")),
        version=_text(record.get("version")),
        unchanged=record.get("unchanged") is True,
        guards_fired=tuple(t for t in map(_text, fired[:20]) if t) if isinstance(fired, Sequence) else (),
        push_outcome=_text(push.get("outcome")),
        push_url=_text(push.get("url")),
        fleet=fleet,
    )


def fleet_facts(runs: Sequence[RunFacts]) -> FleetFacts | None:
    """The fleet as the newest run that pushed or renewed saw it; None when no run of `runs` did."""
    return next((run.fleet for run in reversed(runs) if run.fleet is not None), None)


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value[:MAX_TEXT]
    return None


def _whole(value: Any) -> int | None:
    """A non-negative int below MAX_NUMBER (a version number), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_NUMBER:
        return value
    return None


def _exit_code(value: Any) -> int | None:
    number = _whole(value)
    return number if number is not None and number <= 255 else None


def expired(expires: float, now: float) -> bool:
    return math.isfinite(expires) and expires <= now


def duration_s(start: str | None, end: str | None) -> float | None:
    """Seconds from `start` to `end` (ISO 8601 times), None when either is not one."""
    import datetime as _dt

    if start is None or end is None:
        return None
    try:
        seconds = (_dt.datetime.fromisoformat(end) - _dt.datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if seconds >= 0 else None
