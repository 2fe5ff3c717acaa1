"""`zerogr report`: one self-contained HTML page on the last versions of an OUT dir, for the operator who
wants to see how a catalog moved across model updates without reading JSON.

    html = report_html("bundles", last=10)          # the page as a string
    write_report("bundles", "report.html", last=10) # written atomically

For each version: items, distinct SIDs, the share of items in shared SIDs, per-step fan-out, the quality
gate's overlap@K, build and tune durations, the catalog guards that fired; and the changes between the
last two versions (the item counts of `zerogr diff`). Plots (matplotlib, the `report` extra) come first
when it is installed; the tables are there either way.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .changes import version_changes
from .facts import GateFacts, VersionFacts, gate_facts, out_versions, version_facts
from .page import (
    diff_section,
    durations_section,
    gate_section,
    guards_section,
    page,
    steps_section,
    versions_section,
)

DEFAULT_LAST = 10
COMPARE = "compare"  # report_html's default diff: compare the last two versions


def report_html(
    out: str | Path,
    last: int = DEFAULT_LAST,
    *,
    plots: bool | None = None,
    diff: Mapping[str, Any] | str | None = COMPARE,
) -> str:
    """The report page of the newest `last` versions of `out` (an OUT dir, or one version dir).

    plots: True draws them (ImportError without matplotlib), False leaves them out, None draws them when
    matplotlib is installed. diff: the changes between the last two versions as a mapping (its top-level
    keys become rows), COMPARE to count them now (version_changes), or None to leave them out."""
    from . import plots as plotting

    out = Path(out)
    versions = out_versions(out, last)
    draw = plotting.available() if plots is None else plots
    figures = plotting.version_plots(versions) if draw and versions else []
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if diff == COMPARE:
        diff = _last_two_changes(out, versions)
    shown = f"{len(versions)} version{'s' if len(versions) != 1 else ''}"
    sections = [
        versions_section(versions),
        steps_section(versions),
        gate_section(versions),
        durations_section(versions),
        guards_section(versions),
        diff_section([v.name for v in versions[-2:]], diff),
    ]
    if not versions:
        sections = ["<p>No versions in this OUT dir yet.</p>"]
    return page(f"zerogr report: {out.resolve()}", f"{shown}, made {now}", sections, figures)


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
