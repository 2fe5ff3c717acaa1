"""Everything the CLI draws: the consoles, byte sizes, and the rich tables of build/inspect (step tables),
tune (the plan) and compare (the report). scripts/quality_ml100k.py prints compare's tables from here too.

Pure presentation: each function takes the JSON-ready result a library call returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ..compare import CompareReport


def stderr_console() -> Console:
    # soft_wrap: never insert line breaks into a message (an error stays one line for log scrapers).
    return Console(stderr=True, soft_wrap=True, highlight=False)


def stdout_console() -> Console:
    console = Console(soft_wrap=True, highlight=False)
    if not console.is_terminal:  # piped or logged: rich would assume 80 columns and truncate table cells
        console = Console(soft_wrap=True, highlight=False, width=200)
    return console


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def steps_table(title: str, steps: list[dict[str, Any]]) -> Table:
    """The per-step rows of `build` / `inspect` (pipeline.step_rows). The title holds user text (the OUT
    path, the model tag), so it is plain Text: never parsed as rich markup."""
    table = Table(title=Text(title), title_justify="left")
    for name in ("step", "format", "V", "rows", "nnz", "max_slots", "valid", "bytes"):
        table.add_column(name, justify="left" if name == "format" else "right", no_wrap=True)
    for s in steps:
        table.add_row(
            str(s["step"]),
            Text(s["format"]),
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
    table = Table(title=Text(f"zerogr tune: {plan['device']['name']} ({plan['device_key']})"))
    for col in ("dtype", "step", "batch", "rows", "chosen", *[f"{m} ms" for m in modes], "vs full"):
        table.add_column(col, justify="right" if col not in ("dtype", "chosen") else "left")
    for e in plan["entries"]:
        t = e["timings_ms"]
        speedup = f"{t['full'] / t[e['mode']]:.2f}x" if "full" in t and t[e["mode"]] > 0 else "-"
        cells = [f"{t[m]:.3f}" if m in t else "-" for m in modes]
        table.add_row(
            Text(e["dtype"]),
            str(e["step"]),
            str(e["batch_size"]),
            str(e["rows"]),
            Text(e["mode"]),
            *cells,
            speedup,
        )
    return table


def report_tables(report: CompareReport, title: str) -> list[Any]:
    """A compare report as rich renderables: the metric table (`title`, a column per K), the invalid-mass
    table (a column per step) and a line with the unconstrained invalid-SID rate."""
    metrics = Table(title=Text(title))
    metrics.add_column("metric")
    for k in report.ks:
        metrics.add_column(f"K={k}", justify="right")
    for row in report_rows(report):
        metrics.add_row(*row)
    mass = Table(title="invalid probability mass per step (full softmax over V_t; beams alive at the step)")
    mass.add_column("order")
    mass.add_column("")
    for t, v in enumerate(report.codebook_sizes):
        mass.add_column(f"step {t} (V={v})", justify="right")
    for row in mass_rows(report):
        mass.add_row(*row)
    rate = 100 * report.unconstrained_invalid_rate
    return [metrics, mass, Text(f"unconstrained decoding: {rate:.2f}% of final beams name no catalog SID")]


def report_rows(report: CompareReport) -> list[list[str]]:
    """Rows [metric, value per K...] of the metric table. Orders appear as the report holds them
    (compare fills its dicts in decoder order: filter_first, score_first, unconstrained)."""
    rows = [["overlap (ff top-K in sf top-K)"] + [f"{100 * report.overlap[k]:.2f}%" for k in report.ks]]
    rows.append(
        ["requests with different top-K"] + [f"{100 * report.requests_differing[k]:.2f}%" for k in report.ks]
    )
    for order, gaps in report.score_gap.items():
        cells = [f"{gaps[k]:.3f}" if k in gaps else "-" for k in report.ks]
        rows.append([f"score gap beam 1..K (nats) {order}"] + cells)
    for metric, values in (("Recall", report.recall), ("NDCG", report.ndcg)):
        for order, per_k in values.items():
            rows.append([f"{metric}@K {order}"] + [f"{per_k[k]:.4f}" for k in report.ks])
    return rows


def mass_rows(report: CompareReport) -> list[list[str]]:
    """Rows [order, statistic, value per step...] of the invalid-mass table (the constrained orders)."""
    rows = []
    for order, mean in report.invalid_mass.items():
        rows.append([order, "mean"] + [f"{v:.4f}" for v in mean])
        rows.append([order, "max"] + [f"{v:.4f}" for v in report.invalid_mass_max[order]])
        rows.append([order, "boost spread (nats)"] + [f"{v:.3f}" for v in report.boost_spread[order]])
    return rows


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
    """The versions of `zerogr status` (bundle.status.out_status): LATEST marked, age, size, model tag,
    plans, kernels, the quality gate's decision per model tag ("tag: filter_first"; "BROKEN <file>" for a
    record that breaks the format) and the check's outcome. User text (paths, tags, errors) is plain Text."""
    check = {"full": "verified", "sizes": "sizes ok", "sha256": "sha256 ok"}[report["check"]]
    title = f"{report['out']}: LATEST -> {report['latest'] or '(none)'}"
    table = Table(title=Text(title), title_justify="left")
    for name in ("version", "", "age", "size", "items", "model", "plans", "kernels", "gate", "check"):
        # Only the check column wraps: a long error there must not squeeze the other columns to nothing.
        table.add_column(
            name, justify="right" if name in ("age", "size", "items") else "left", no_wrap=name != "check"
        )
    for v in report["versions"]:
        outcome = check if v["ok"] else (v["error"] or "failed")
        table.add_row(
            v["name"],
            "LATEST" if v["latest"] else "",
            _age(v["age_s"]),
            human_bytes(v["bytes"]) if v["bytes"] is not None else "-",
            f"{v['items']:,}" if v["items"] is not None else "-",
            Text(str(v["model_version"] or "-")),
            Text(", ".join(v["plans"]) or "-"),
            Text(", ".join(v["kernels"]) or "-"),
            Text(_gate(v.get("quality", [])) or "-"),
            Text(outcome, style="green" if v["ok"] else "red"),
        )
    return table
