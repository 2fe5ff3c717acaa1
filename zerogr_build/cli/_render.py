"""Everything the CLI draws: the consoles, byte sizes, and the rich tables of build/inspect (step tables),
tune (the plan); compare's report tables come from zerogr_build.compare.tables.

Pure presentation: each function takes the JSON-ready result a library call returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..base.printable import printable
from ..base.units import human_bytes  # noqa: F401 - the CLI's name for it

if TYPE_CHECKING:
    pass


def stderr_console() -> Console:
    # soft_wrap: never insert line breaks into a message (an error stays one line for log scrapers).
    return Console(stderr=True, soft_wrap=True, highlight=False)


def stdout_console() -> Console:
    console = Console(soft_wrap=True, highlight=False)
    if not console.is_terminal:  # piped or logged: rich would assume 80 columns and truncate table cells
        console = Console(soft_wrap=True, highlight=False, width=200)
    return console


def plain(text: object, style: str = "") -> Text:
    """Text that did not come from zerogr itself (paths, tags, file names, remote text, errors) as a table
    cell or title: never parsed as markup, its control characters escaped."""
    return Text(printable(text), style=style)


def steps_table(title: str, steps: list[dict[str, Any]]) -> Table:
    """The per-step rows of `build` / `inspect` (pipeline.step_rows). The title holds user text (the OUT
    path, the model tag), so it is plain Text: never parsed as rich markup."""
    table = Table(title=plain(title), title_justify="left")
    for name in ("step", "format", "V", "rows", "nnz", "max_slots", "valid", "bytes"):
        table.add_column(name, justify="left" if name == "format" else "right", no_wrap=True)
    for s in steps:
        table.add_row(
            str(s["step"]),
            plain(s["format"]),
            f"{s['codebook_size']:,}",
            f"{s['rows']:,}",
            f"{s['nnz']:,}",
            f"{s['max_slots']:,}",
            f"{s['valid_share']:.2e}" if s["valid_share"] < 0.001 else f"{s['valid_share']:.3f}",
            human_bytes(s["bytes"]),
        )
    return table


def plan_table(plan: dict) -> Table:
    """A tune plan: one row per dtype x step x batch size with the chosen mode, every mode's median ms and
    the chosen mode's speedup over `full`."""
    modes = list(dict.fromkeys(m for e in plan["entries"] for m in e["timings_ms"]))
    table = Table(title=plain(f"zerogr tune: {plan['device']['name']} ({plan['device_key']})"))
    for col in ("dtype", "step", "batch", "rows", "chosen", *[f"{m} ms" for m in modes], "vs full"):
        table.add_column(col, justify="right" if col not in ("dtype", "chosen") else "left")
    for e in plan["entries"]:
        t = e["timings_ms"]
        speedup = f"{t['full'] / t[e['mode']]:.2f}x" if "full" in t and t[e["mode"]] > 0 else "-"
        cells = [f"{t[m]:.3f}" if m in t else "-" for m in modes]
        table.add_row(
            plain(e["dtype"]),
            str(e["step"]),
            str(e["batch_size"]),
            str(e["rows"]),
            plain(e["mode"]),
            *cells,
            speedup,
        )
    return table


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _gate(rows: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"BROKEN {r['file']}" if "error" in r else f"{r['model_version']}: {r['order']}" for r in rows
    )


def status_table(report: dict[str, Any]) -> Table:
    """The versions of `zerogr status` (fleet.status.out_status): LATEST and unpromoted ones marked, age,
    size, model tag, plans, kernels, the quality gate's decision per model tag ("tag: filter_first";
    "BROKEN <file>" for a record that breaks the format) and the check's outcome. User text (paths, tags,
    errors) is plain Text."""
    check = {"full": "verified", "sizes": "sizes ok", "sha256": "sha256 ok"}[report["check"]]
    title = f"{report['out']}: LATEST -> {report['latest'] or '(none)'}"
    table = Table(title=plain(title), title_justify="left", caption_justify="left")
    fleet = report.get("fleet")
    if fleet:
        signers = ", ".join(fleet["signed_by"])
        table.caption = plain(f"signed metadata expires {fleet['expires_at']}; signed by {signers}")
    for name in ("version", "", "age", "size", "items", "model", "plans", "kernels", "gate", "check"):
        # Only the check column wraps: a long error there must not squeeze the other columns to nothing.
        table.add_column(
            name, justify="right" if name in ("age", "size", "items") else "left", no_wrap=name != "check"
        )
    for v in report["versions"]:
        outcome = check if v["ok"] else (v["error"] or "failed")
        table.add_row(
            plain(v["name"]),
            "LATEST" if v["latest"] else ("unpromoted" if v.get("unpromoted") else ""),
            _age(v["age_s"]),
            human_bytes(v["bytes"]) if v["bytes"] is not None else "-",
            f"{v['items']:,}" if v["items"] is not None else "-",
            plain(v["model_version"] or "-"),
            plain(", ".join(v["plans"]) or "-"),
            plain(", ".join(v["kernels"]) or "-"),
            plain(_gate(v.get("quality", [])) or "-"),
            plain(outcome, style="green" if v["ok"] else "red"),
        )
    return table
