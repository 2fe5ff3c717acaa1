"""`zerogr report`: one self-contained HTML page on the last versions of an OUT dir, for the operator who
wants to see how a catalog moved across model updates without reading JSON.

    html = report_html("bundles", last=10)          # the page as a string
    write_report("bundles", "report.html", last=10) # written atomically

For each version: items, distinct SIDs, the share of items in shared SIDs, per-step fan-out, the quality
gate's overlap@K, build and tune durations, the catalog guards that fired; and the changes between the
last two versions (the item counts of `zerogr diff`). Beside them, the job's health: the last rebuild runs
from OUT's run history (refused, failed, killed runs included) and the fleet as the newest push saw it
(remote LATEST, when its signed metadata expires). A version, history line or section that cannot be read
is shown as such on the page; the page is always written. Plots (matplotlib, the `report` extra) come first
when it is installed; the tables are there either way.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .changes import version_changes
from .facts import GateFacts, VersionFacts, gate_facts, out_versions, version_facts
from .page import (
    diff_section,
    durations_section,
    esc,
    fleet_section,
    gate_section,
    guards_section,
    page,
    runs_section,
    steps_section,
    versions_section,
)
from .runs import DEFAULT_RUNS, fleet_facts, out_runs

DEFAULT_LAST = 10
COMPARE = "compare"  # report_html's default diff: compare the last two versions


def report_html(
    out: str | Path,
    last: int = DEFAULT_LAST,
    *,
    plots: bool | None = None,
    diff: Mapping[str, Any] | str | None = COMPARE,
    runs_shown: int = DEFAULT_RUNS,
) -> str:
    """The report page of the newest `last` versions of `out` (an OUT dir, or one version dir), and its
    newest `runs_shown` rebuild runs.

    plots: True draws them (ImportError without matplotlib), False leaves them out, None draws them when
    matplotlib is installed. diff: the changes between the last two versions as a mapping (its top-level
    keys become rows), COMPARE to count them now (version_changes), or None to leave them out."""
    from . import plots as plotting

    out = Path(out)
    versions = out_versions(out, last)
    runs = _or_none(lambda: out_runs(out, runs_shown)) or []
    draw = plotting.available() if plots is None else plots
    figures = _or_none(lambda: plotting.version_plots(versions)) if draw and versions else []
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if diff == COMPARE:
        diff = _or_none(lambda: _last_two_changes(out, versions))
    shown = f"{len(versions)} version{'s' if len(versions) != 1 else ''}"
    sections: list[Callable[[], str]] = [
        lambda: versions_section(versions),
        lambda: runs_section(runs),
        lambda: fleet_section(fleet_facts(runs), time.time()),
        lambda: steps_section(versions),
        lambda: gate_section(versions),
        lambda: durations_section(versions),
        lambda: guards_section(versions),
        lambda: diff_section([v.name for v in versions[-2:]], diff),  # type: ignore[arg-type]
    ]
    if not versions:
        sections = [lambda: "<p>No versions in this OUT dir yet.</p>", *sections[1:3]]
    bodies = [_section(make) for make in sections]
    return page(f"zerogr report: {out.resolve()}", f"{shown}, made {now}", bodies, figures or [])


def _or_none(make: Callable[[], Any]) -> Any:
    """make(), or None when it raises: one damaged input never loses the page."""
    try:
        return make()
    except Exception:  # noqa: BLE001 - the page is written whatever the inputs hold
        return None


def _section(make: Callable[[], str]) -> str:
    """A section's HTML, or one line saying why it could not be shown."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - the page is written whatever the inputs hold
        why = esc(f"{type(exc).__name__}: {exc}"[:300])
        return f'<p class="bad">This section could not be shown: {why}</p>'


def write_report(
    out: str | Path,
    path: str | Path,
    last: int = DEFAULT_LAST,
    *,
    plots: bool | None = None,
    diff: Mapping[str, Any] | str | None = COMPARE,
) -> Path:
    """Write report_html(...) to `path` atomically (a temp file beside it, then a rename); returns it."""
    from ..bundle.files import atomic_replace_bytes

    text = report_html(out, last, plots=plots, diff=diff)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_replace_bytes(target, text.encode("utf-8"))
    return target


def _last_two_changes(out: Path, versions: list[VersionFacts]) -> dict[str, Any] | None:
    """version_changes of the last two of `versions` (dirs of OUT `out`); None with fewer than two."""
    if len(versions) < 2:
        return None
    old, new = versions[-2:]
    return version_changes(out / old.name, out / new.name)


def gate_overlap(version_dir: str | Path) -> GateFacts | None:
    """The quality record of a version whose gate had the worst overlap, or None without one (what
    `zerogr rebuild --metrics-file` reports of the gate)."""
    from ..base.errors import ZerogrError
    from ..bundle import open_bundle

    try:
        gates = gate_facts(open_bundle(version_dir, verify_checksums=False))
    except (ZerogrError, OSError, ValueError):
        return None
    return min(gates, key=lambda g: g.worst_overlap) if gates else None


__all__ = [
    "COMPARE",
    "DEFAULT_LAST",
    "VersionFacts",
    "gate_overlap",
    "report_html",
    "version_changes",
    "version_facts",
    "write_report",
]
