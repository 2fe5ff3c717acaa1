"""A compare report as rich tables: what `zerogr compare` prints and the experiments print beside their
own lines. Pure presentation: renderables out, nothing printed here."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from ..base.printable import printable
from .report import CompareReport


def report_tables(report: CompareReport, title: str) -> list[Any]:
    """A compare report as rich renderables: the metric table (`title`, a column per K), the invalid-mass
    table (a column per step) and a line with the unconstrained invalid-SID rate."""
    metrics = Table(title=Text(printable(title)))
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
