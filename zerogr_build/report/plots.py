"""The report's plots, drawn by matplotlib (the optional extra `zerogr[report]`) as inline SVG markup.

Only numbers reach a plot (version numbers on the x axis, counts, shares and seconds): no string from a
bundle is drawn, so nothing untrusted ends up in the SVG. Text is drawn as paths, so the page needs no
fonts. Without matplotlib `available()` is False and the page has its tables only.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

from .facts import VersionFacts


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def version_plots(versions: Sequence[VersionFacts]) -> list[str]:
    """SVG markup of each plot across `versions` (oldest first; unreadable ones left out). Raises
    ImportError without matplotlib."""
    import matplotlib  # noqa: F401 - ImportError here without the extra; Figure needs no backend

    readable = [v for v in versions if v.error is None]
    xs = [v.number for v in readable]
    plots: list[str] = []

    def plot(title: str, series: dict[str, list[float | None]], ylabel: str, percent: bool = False) -> None:
        if not any(y is not None for ys in series.values() for y in ys):
            return
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator, PercentFormatter

        fig = Figure(figsize=(6.0, 3.0), layout="constrained")
        ax = fig.add_subplot()
        for label, ys in series.items():
            points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("version")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if percent:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize="small")
        plots.append(_svg(fig, f"zerogr-plot-{len(plots)}"))

    plot("Items and distinct SIDs", {
        "items": [v.items for v in readable],
        "distinct SIDs": [v.distinct_sids for v in readable],
    }, "count")  # fmt: skip
    plot("Items in shared SIDs", {"share": [v.shared_sid_share for v in readable]}, "share of items", True)
    num_steps = max((len(v.steps) for v in readable), default=0)
    plot("Fan-out per step", {
        f"step {t}": [v.steps[t].fan_out if t < len(v.steps) else None for v in readable]
        for t in range(num_steps)
    }, "children per prefix")  # fmt: skip
    plot("Quality gate: worst overlap@K", {
        "worst overlap": [min((g.worst_overlap for g in v.gates), default=None) for v in readable],
        "threshold": [max((g.min_overlap for g in v.gates), default=None) for v in readable],
    }, "overlap", True)  # fmt: skip
    plot("Build and tune time", {
        "build": [sum(v.build_timings.values()) if v.build_timings else None for v in readable],
        "tune (measured)": [_measured(v) for v in readable],
    }, "seconds")  # fmt: skip
    return plots


def _measured(version: VersionFacts) -> float | None:
    """The longest tune measurement of the version's plans (None when every plan was reused)."""
    return max((p.tune_seconds for p in version.plans if p.tune_seconds is not None), default=None)


def _svg(fig, prefix: str) -> str:
    """The figure as an <svg> element (no XML prolog). Every element id and every reference to one (glyphs,
    markers, clip paths: `id="x"`, `href="#x"`, `url(#x)`) gets `prefix`, so several plots on one page
    never share an id."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": prefix}):
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r'(\bid="|href="#|url\(#)', lambda m: f"{m.group(1)}{prefix}-", text)
