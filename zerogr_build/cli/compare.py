"""`zerogr compare`: filter-first vs score-first (and unconstrained) top-K lists with the user's model."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ._errors import cli_errors, warnings_on_stderr
from ._options import AvailableOpt, BundleArg, ConfigOpt, JsonOpt, bundle_path
from ._progress import progress_for
from ._render import report_tables, stdout_console


def compare(
    bundle: BundleArg = None,
    model: Annotated[
        str,
        typer.Option("--model", help="module:function -> (weights, step_fn); see zerogr_build.compare"),
    ] = ...,  # type: ignore[assignment]
    requests: Annotated[
        str, typer.Option("--requests", help="Parquet: request_id (+ optional target_item for recall)")
    ] = ...,  # type: ignore[assignment]
    beam_width: Annotated[
        int | None,
        typer.Option("--beam-width", help="Beams per request M [default: max K]", show_default=False),
    ] = None,
    k: Annotated[str, typer.Option("--k", help="Cutoffs K")] = "1,5,10,20",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests per search")] = 64,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda:N")] = "cpu",
    request_column: Annotated[str, typer.Option("--request-column")] = "request_id",
    target_column: Annotated[str, typer.Option("--target-column")] = "target_item",
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    available: AvailableOpt = None,
) -> None:
    """Decode the requests filter-first, score-first and unconstrained with your model and compare top-K
    lists (overlap@K, Recall@K, NDCG@K, invalid probability mass per step). --available decodes every order
    under that availability mask (invalid mass is still measured against the catalog)."""
    with cli_errors(), warnings_on_stderr():
        # Imported when the command runs: compare decodes with torch, `zerogr --help` should not load it.
        from ..compare import parse_ks, run_compare
        from ..runtime.device import check_device

        check_device(device)
        with progress_for(json_out) as progress:
            report = run_compare(
                bundle_path(bundle, config), model, requests, beam_width=beam_width, ks=parse_ks(k),
                batch_size=batch_size, device=device, request_column=request_column,
                target_column=target_column, progress=progress, available=available,
            )  # fmt: skip
        if json_out:
            sys.stdout.write(json.dumps(report.to_dict(), default=str) + "\n")
            return
        console = stdout_console()
        title = f"{report.requests} requests, beam {report.beam_width}: filter-first vs score-first"
        for renderable in report_tables(report, title):
            console.print(renderable)
