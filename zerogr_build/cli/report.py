"""`zerogr report`: the HTML page of an OUT dir's last versions (zerogr_build.report)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..base.errors import InputError
from ..base.printable import safe_text
from ._errors import cli_errors

PLOTS_HELP = (
    "Draw plots (needs matplotlib: pip install the zerogr wheel with its [report] extra); "
    "--no-plots for tables only. [default: plots when matplotlib is installed]"
)


def report(
    out: Annotated[
        Path, typer.Argument(help="An OUT dir (its newest versions), or one version dir.", metavar="OUT")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Where to write the page (HTML).", show_default=False)
    ],
    last: Annotated[int, typer.Option("--last", "-n", help="How many of the newest versions to show.")] = 10,
    plots: Annotated[
        bool | None, typer.Option("--plots/--no-plots", help=PLOTS_HELP, show_default=False)
    ] = None,
) -> None:
    """Write one self-contained HTML page on the newest versions of OUT: items, distinct SIDs, the share of
    items in shared SIDs, per-step fan-out, the quality gate's overlap@K, build and tune durations, the
    catalog guards that fired, and the changes between the last two versions; beside them the last
    rebuild runs from OUT's run history (exit code, failed stage, guards fired, push; killed runs marked)
    and the fleet as the newest push saw it (remote LATEST, signed metadata expiry). A version that
    cannot be read is its own row's error; the page is always written. Nothing on the page loads from
    elsewhere: it opens offline. Prints the page's path."""
    with cli_errors():
        written = write_out_report(out, output, last, plots)
        sys.stdout.write(f"{written}\n")


def write_out_report(out: Path, output: Path, last: int, plots: bool | None) -> Path:
    """Check the arguments and write the page (also what `rebuild --report` calls)."""
    from ..report import write_report

    if last < 1:
        raise InputError(f"--last must be >= 1, got {last}")
    if not out.is_dir():
        raise InputError(f"{safe_text(out)}: no such OUT or version dir")
    if plots:
        from ..report.plots import available

        if not available():
            raise InputError("--plots needs matplotlib: install zerogr with its [report] extra")
    return write_report(out, output, last, plots=plots)
