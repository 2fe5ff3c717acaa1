"""The report as one self-contained HTML page: inline CSS, no scripts, nothing fetched, so it opens offline
and from a mail attachment. Every string that comes from a bundle (model tags, guard names, device keys,
error text, the diff) is untrusted and HTML-escaped; plots arrive as SVG markup made by the plotting
library (plots.py) from numbers only.
"""

from __future__ import annotations

import html
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .facts import VersionFacts
from .runs import FleetFacts, RunFacts, duration_s, expired

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 78rem; padding: 0 1rem; color: #1d2327; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.sub { color: #5f6b73; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #d5dadd; padding: 0.25rem 0.6rem; text-align: right; vertical-align: top; }
th { background: #f1f3f4; } td.text, th.text { text-align: left; }
tr.latest td { background: #eef6ee; } .bad { color: #a4161a; font-weight: 600; } .muted { color: #7a858c; }
.wide { overflow-x: auto; } .plots { display: flex; flex-wrap: wrap; gap: 1rem; }
.plots figure { margin: 0; } .plots svg { width: 30rem; height: auto; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
pre { background: #f6f8f9; padding: 0.6rem; overflow-x: auto; }
"""


def esc(value: Any) -> str:
    """Any value as escaped HTML text (quotes included)."""
    return html.escape(str(value), quote=True)


def fmt(value: float | int | None, digits: int = 0) -> str:
    """A number for a table cell: thousands separators, `digits` decimals; an em dash when unknown."""
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def table(head: Sequence[str], rows: Sequence[Sequence[str]], *, text: Collection[int] = (0,),
          row_classes: Sequence[str] = ()) -> str:  # fmt: skip
    """An HTML table; `head` is escaped here, the cells are HTML already (escape them before). The columns
    numbered in `text` are left-aligned, the others (numbers) right-aligned."""

    def cls(i: int) -> str:
        return ' class="text"' if i in text else ""

    out = ['<div class="wide"><table><thead><tr>']
    out += [f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for n, row in enumerate(rows):
        css = row_classes[n] if n < len(row_classes) and row_classes[n] else ""
        out.append(f'<tr class="{css}">' if css else "<tr>")
        out += [f"<td{cls(i)}>{cell}</td>" for i, cell in enumerate(row)]
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _version_cell(v: VersionFacts) -> str:
    return esc(v.name) + (" <strong>LATEST</strong>" if v.latest else "")


def _when(created_at: str | None) -> str:
    """An ISO 8601 time to the second ("2026-12-06 09:01:51"), as recorded when it is not one."""
    if created_at is None:
        return "—"
    iso = len(created_at) >= 19 and created_at[10] == "T"
    return created_at[:19].replace("T", " ") if iso else created_at


def _tune_cell(v: VersionFacts) -> str:
    cells = []
    for p in v.plans:
        if p.error is not None:
            what = '<span class="bad">unreadable</span>'
        elif p.reused_from is not None:
            what = f"reused from v{p.reused_from:06d}"
        elif p.tune_seconds is not None:
            what = f"{p.tune_seconds:,.1f} s"
        else:
            what = '<span class="muted">not recorded</span>'
        cells.append(f"{esc(p.device_key)}: {what}")
    return "<br>".join(cells) or '<span class="muted">untuned</span>'


def _gate_cell(v: VersionFacts) -> str:
    cells = []
    for g in v.gates:
        verdict = "passed" if g.passed else '<span class="bad">failed</span>'
        cells.append(f"{esc(g.model_version)}: {verdict}, worst {share(g.worst_overlap)} ({esc(g.order)})")
    return "<br>".join(cells) or '<span class="muted">no gate</span>'


def _guards_cell(v: VersionFacts) -> str:
    fired = [g.name for g in v.guards if g.fired]
    if not v.guards:
        return '<span class="muted">not recorded</span>'
    if not fired:
        return "none fired"
    text = '<span class="bad">' + esc(", ".join(fired)) + "</span>"
    if v.change_accepted:
        text += f" (accepted: {esc(v.change_accepted)})"
    return text


def versions_section(versions: Sequence[VersionFacts]) -> str:
    head = ["version", "created", "model", "items", "distinct SIDs", "items in shared SIDs", "index bytes",
            "build s", "tune", "quality gate", "guards fired"]  # fmt: skip
    rows, classes = [], []
    for v in versions:
        if v.error is not None:
            rows.append([_version_cell(v), f'<span class="bad">unreadable: {esc(v.error)}</span>']
                        + [""] * (len(head) - 2))  # fmt: skip
        else:
            build = sum(v.build_timings.values()) if v.build_timings else None
            rows.append([
                _version_cell(v), esc(_when(v.created_at)), esc(v.model_version or "—"), fmt(v.items),
                fmt(v.distinct_sids), f"{fmt(v.items_in_shared_sids)} ({share(v.shared_sid_share)})",
                fmt(v.index_bytes), fmt(build, 2), _tune_cell(v), _gate_cell(v), _guards_cell(v),
            ])  # fmt: skip
        classes.append("latest" if v.latest else "")
    return "<h2>Versions</h2>" + table(head, rows, text=(0, 1, 2, 8, 9, 10), row_classes=classes)


def steps_section(versions: Sequence[VersionFacts]) -> str:
    """Per-step fan-out (children per prefix) and the widest row, one row per version."""
    readable = [v for v in versions if v.error is None]
    num_steps = max((len(v.steps) for v in readable), default=0)
    head = ["version"] + [f"step {t}: fan-out (max)" for t in range(num_steps)]
    rows = []
    for v in readable:
        cells = [
            f'{s.fan_out:,.2f} ({s.max_slots:,}) <span class="muted">{esc(s.format)}</span>' for s in v.steps
        ]
        rows.append([_version_cell(v), *cells, *[""] * (num_steps - len(cells))])
    note = "<p>Fan-out: the mean number of valid next tokens per prefix (children / rows) at each step.</p>"
    return "<h2>Steps</h2>" + note + table(head, rows)


def gate_section(versions: Sequence[VersionFacts]) -> str:
    ks = sorted({k for v in versions for g in v.gates for k in g.overlap})
    rows = []
    for v in versions:
        for g in v.gates:
            cells = [share(g.overlap.get(k)) for k in ks]
            rows.append([_version_cell(v), esc(g.model_version), esc(g.order), share(g.min_overlap), *cells])
    if not rows:
        return "<h2>Quality gate</h2><p>No version records a quality gate (zerogr rebuild --gate-...).</p>"
    head = ["version", "model", "order", "threshold", *[f"overlap@{k}" for k in ks]]
    return "<h2>Quality gate</h2>" + table(head, rows, text=(0, 1, 2))


def durations_section(versions: Sequence[VersionFacts]) -> str:
    stages = list(dict.fromkeys(s for v in versions for s in v.build_timings))  # in the build's order
    rows = []
    for v in versions:
        if v.error is None:
            rows.append([_version_cell(v), *[fmt(v.build_timings.get(s), 3) for s in stages], _tune_cell(v)])
    head = ["version", *[f"build: {s} s" for s in stages], "tune"]
    return "<h2>Build and tune durations</h2>" + table(head, rows, text=(0, len(stages) + 1))


def guards_section(versions: Sequence[VersionFacts]) -> str:
    rows = []
    for v in versions:
        for g in v.guards:
            fired = '<span class="bad">fired</span>' if g.fired else "ok"
            rows.append([_version_cell(v), esc(g.name), fired, fmt(g.value, 4), fmt(g.threshold, 4)])
    if not rows:
        return "<h2>Catalog guards</h2><p>No version records the catalog guards' measurements.</p>"
    head = ["version", "guard", "", "value", "threshold"]
    return "<h2>Catalog guards</h2>" + table(head, rows, text=(0, 1, 2))


def _exit_cell(run: RunFacts) -> str:
    if run.status == "killed":
        return '<span class="bad">killed</span> <span class="muted">(never ended)</span>'
    if run.status == "running":
        return '<span class="muted">running, or killed (no end yet)</span>'
    if run.exit_code is None:
        return '<span class="muted">unknown</span>'
    meaning = f' <span class="muted">{esc(run.meaning)}</span>' if run.meaning else ""
    code = f"{run.exit_code}" if run.exit_code == 0 else f'<span class="bad">{run.exit_code}</span>'
    return code + meaning


def _push_cell(run: RunFacts) -> str:
    if run.push_outcome is None:
        return '<span class="muted">—</span>'
    text = esc(run.push_outcome)
    return f'<span class="bad">{text}</span>' if run.push_outcome == "failed" else text


def runs_section(runs: Sequence[RunFacts]) -> str:
    """The last rebuild runs, newest first: outcome, stage and reason, version, guards, push."""
    title = "<h2>Rebuild runs</h2>"
    if not runs:
        return title + "<p>No run history in this OUT dir (zerogr rebuild records its runs).</p>"
    head = ["run", "started", "took", "exit", "failed stage", "reason", "version", "guards fired", "push"]
    rows, classes = [], []
    for run in reversed(runs):
        took = duration_s(run.start, run.end)
        version = esc(run.version or "—") + (' <span class="muted">unchanged</span>' if run.unchanged else "")
        fired = esc(", ".join(run.guards_fired)) if run.guards_fired else '<span class="muted">none</span>'
        rows.append([
            esc(run.run_id), esc(_when(run.start)), fmt(took, 1), _exit_cell(run), esc(run.stage or ""),
            esc(run.reason or ""), version, fired, _push_cell(run),
        ])  # fmt: skip
        classes.append("")
    return title + table(head, rows, text=(0, 1, 3, 4, 5, 6, 7, 8), row_classes=classes)


def fleet_section(fleet: FleetFacts | None, now: float) -> str:
    """The fleet as the newest push (or renewal) saw it: remote LATEST and the signed metadata's expiry."""
    import datetime as _dt

    title = "<h2>Fleet</h2>"
    if fleet is None:
        return title + "<p>No run in the history pushed to a fleet (zerogr rebuild --push).</p>"
    latest = f"v{fleet.latest:06d}" if fleet.latest is not None else "unknown"
    if fleet.expires is None:
        expires = "unknown"
    else:
        try:
            when = _dt.datetime.fromtimestamp(fleet.expires, _dt.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S UTC"
            )
        except (OverflowError, OSError, ValueError):
            when = "unknown"
        expires = f'<span class="bad">{when} (expired)</span>' if expired(fleet.expires, now) else esc(when)
    head = ["remote OUT", "remote LATEST", "signed metadata expires", "seen by run", "at"]
    row = [esc(fleet.url or "unknown"), esc(latest), expires, esc(fleet.run_id), esc(_when(fleet.seen))]
    return title + table(head, [row], text=(0, 1, 2, 3, 4))


def diff_section(names: Sequence[str], diff: Mapping[str, Any] | None) -> str:
    """The difference between the last two versions (`names`: old, new), from a diff's JSON form: counts
    for lists, the value for anything else."""
    title = "<h2>Changes between the last two versions</h2>"
    if len(names) < 2:
        return title + "<p>Only one version: nothing to compare.</p>"
    if diff is None:
        return title + f"<p>{esc(names[0])} → {esc(names[1])}: no diff available.</p>"
    rows = []
    for key, value in diff.items():
        if isinstance(value, Sequence) and not isinstance(value, str):
            shown = ", ".join(str(x) for x in list(value)[:20]) + (" …" if len(value) > 20 else "")
            cell = f"{len(value):,}" + (f' <span class="muted">{esc(shown)}</span>' if shown else "")
        elif isinstance(value, Mapping):
            cell = f"<code>{esc(json.dumps(value, sort_keys=True, default=str)[:2000])}</code>"
        else:
            cell = esc(value)
        rows.append([esc(key), cell])
    return title + f"<p>{esc(names[0])} → {esc(names[1])}</p>" + table(["", ""], rows, text=(0, 1))


def page(title: str, subtitle: str, sections: Sequence[str], plots: Sequence[str] = ()) -> str:
    """The whole document. `plots`: SVG markup (plots.py), shown first; `sections`: HTML bodies."""
    figures = "".join(f"<figure>{svg}</figure>" for svg in plots)
    plot_block = f'<h2>Across versions</h2><div class="plots">{figures}</div>' if plots else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No script runs and nothing loads from elsewhere, even if an escape were missed.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{esc(title)}</h1><p class="sub">{esc(subtitle)}</p>'
        f"{plot_block}{''.join(sections)}</body></html>\n"
    )
