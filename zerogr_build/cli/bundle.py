"""`zerogr inspect` (a bundle's step tables and its size against STATIC's) and `zerogr verify` (checksums,
invariants and, with --catalog, exact equality with a catalog)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..base.printable import safe_text
from ..config import load_settings
from ..fleet.signed_view import check_local_version
from ..fleet.signing import Trust
from ..pipeline import inspect_bundle, verify_with_catalog
from ._errors import cli_errors, warnings_on_stderr
from ._metrics import job_metrics
from ._options import (
    AvailableOpt,
    BundleArg,
    ConfigOpt,
    ItemColumnOpt,
    JsonOpt,
    MetricsFileOpt,
    SidColumnOpt,
    SidColumnsOpt,
    TrustedKeysOpt,
    bundle_path,
    catalog_column_overrides,
    with_help,
)
from ._progress import progress_for
from ._render import human_bytes, stderr_console, stdout_console, steps_table

# verify words the shared column options for the catalog it checks against.
CatalogSidColumnOpt = with_help(SidColumnOpt, "SID list column of --catalog")
CatalogSidColumnsOpt = with_help(SidColumnsOpt, "SID token columns of --catalog")
CatalogItemColumnOpt = with_help(ItemColumnOpt, "Item id column of --catalog")


def inspect(
    bundle: BundleArg = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    available: AvailableOpt = None,
) -> None:
    """Show a bundle's step tables (format, rows, nnz, max_slots, valid share, bytes) and how its index size
    compares with STATIC's layout for the same catalog, and the quality gate's recorded decision per model
    (filter_first or score_first); with --available, the prefixes and leaves that keep an available item."""
    with cli_errors(), warnings_on_stderr():
        report = inspect_bundle(bundle_path(bundle, config))
        if available is not None:
            from ..runtime.items.constraints import available_prefixes

            report["available"] = available_prefixes(report["bundle"], available)
        if json_out:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
            return
        console = stdout_console()
        title = f"bundle {report['bundle']} (version {report['version']}"
        title += f", model {report['model_version']})" if report["model_version"] else ")"
        console.print(steps_table(title, report["steps"]))
        console.print(
            f"{report['items']:,} items on {report['distinct_sids']:,} distinct SIDs "
            f"({report['collisions']:,} beyond one per SID); "
            f"leaf offsets {human_bytes(report['leaf_offsets_bytes'])}",
            markup=False,
        )
        line = f"index bytes: {report['index_bytes']:,} ({human_bytes(report['index_bytes'])})"
        if report["static_bytes"]:
            static_total = report["static_bytes"]["total"]
            line += (
                f"; STATIC layout for the same catalog: {static_total:,} "
                f"({human_bytes(static_total)}), ours = {report['ratio_to_static']:.2f}x"
            )
        console.print(line, markup=False)
        for row in report["quality"]:
            if "error" in row:
                line = f"quality gate record {row['file']}: BROKEN, ignored (order='auto' uses filter_first)"
                warning = f"WARNING: {safe_text(row['error'])}"
                stderr_console().print(warning, style="bold yellow", markup=False)
            else:
                verdict = "passed" if row["passed"] else "FAILED"
                line = (
                    f"quality gate, model {row['model_version']}: order {row['order']} ({verdict}: worst "
                    f"overlap {100 * row['worst_overlap']:.2f}%, min {100 * row['min_overlap']:.2f}%)"
                )
            console.print(safe_text(line), markup=False)
        if not report["quality"]:
            console.print("quality gate: no record (order='auto' uses filter_first)", markup=False)
        if "available" in report:
            mask = report["available"]
            totals = [row["rows"] for row in report["steps"][1:]] + [report["distinct_sids"]]
            per_step = ", ".join(
                f"length {s}: {n:,} of {total:,}"
                for s, (n, total) in enumerate(zip(mask["valid_prefixes"], totals, strict=True), start=1)
            )
            console.print(
                f"available ({safe_text(mask['file'])}): {mask['items']:,} of {report['items']:,} items; "
                f"prefixes with an available item by length (the last = leaves): {per_step}",
                markup=False,
            )


def verify(
    bundle: BundleArg = None,
    catalog: Annotated[
        str | None,
        typer.Option(
            "--catalog",
            help="Also check the bundle equals this catalog exactly (SID set and item -> SID mapping); a "
            "local path or a URI such as s3://bucket/prefix/.",
            show_default=False,
        ),
    ] = None,
    config: ConfigOpt = None,
    sid_column: CatalogSidColumnOpt = None,
    sid_columns: CatalogSidColumnsOpt = None,
    item_column: CatalogItemColumnOpt = None,
    trusted_keys: TrustedKeysOpt = None,
    json_out: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")] = False,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Check a bundle: every file's sha256, the structural invariants of every step table and the leaf map,
    and with --catalog exact equality with the catalog. With --trusted-keys (a pulled version) also its
    proof, manifest.json.sig: the fleet's signed metadata that listed it, checked against the root
    metadata its pull kept (OUT/.tuf) and the trusted keys: exit 4 when it is unsigned, signed by a key the
    fleet does not trust (or no longer trusts) or changed after signing. Exits non-zero naming the first
    bad file."""
    with job_metrics("verify", metrics_file) as metrics, cli_errors():
        overrides = catalog_column_overrides(sid_column, sid_columns, item_column)
        settings = load_settings(config, overrides)
        trust = Trust.from_files(trusted_keys) if trusted_keys else None
        quiet_progress = quiet or json_out or catalog is None  # only reading has stages
        with progress_for(quiet_progress) as progress, metrics.stage("verify"):
            report = verify_with_catalog(
                bundle if bundle is not None else settings.out,
                catalog,
                config_file=config,
                overrides=overrides,
                progress=progress,
            )
            if trust is not None:
                report["signed_by"] = check_local_version(Path(report["bundle"]), trust)
        metrics.bundle(
            items=report["items"], distinct_sids=report["leaves"],
            index_bytes=sum(step["bytes"] for step in report["steps"]), version=report["version"],
        )  # fmt: skip
        if json_out:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
        elif not quiet:
            what = "checksums and invariants"
            if trust is not None:
                what += f", signed by {report['signed_by']}"
            if catalog is not None:
                what += f", equal to catalog {safe_text(catalog)}"
            stdout_console().print(
                f"OK {report['bundle']} (version {report['version']}): {report['files']} files, "
                f"{human_bytes(report['bytes'])}, {what}",
                markup=False,
            )
            if report.get("unlisted_files"):
                unlisted = safe_text(", ".join(report["unlisted_files"]))
                stderr_console().print(f"note: files not listed in the manifest: {unlisted}", markup=False)
