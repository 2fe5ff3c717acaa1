"""`zerogr build` (read, validate, index and publish a catalog) and `zerogr promote` (move LATEST)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ..base.errors import InputError
from ..base.printable import safe_text
from ..bundle import promote_bundle
from ..bundle.format import MANIFEST_NAME, parse_version_dir
from ..bundle.guards import check_reason, enforce_guards
from ..bundle.versions import check_out_dir
from ..config import INFER_CODEBOOK_SIZES, BuildSettings, load_guard_thresholds, load_settings, parse_int_list
from ..fleet.pull_record import read_record
from ..fleet.remote import is_remote
from ..fleet.signed_view import check_local_version
from ..fleet.signing import host_trust
from ..pipeline import build_bundle
from ._errors import cli_errors, warnings_on_stderr
from ._metrics import job_metrics
from ._options import (
    AcceptChangeOpt,
    AllowUnsignedOpt,
    ConfigOpt,
    ItemColumnOpt,
    JsonOpt,
    MetricsFileOpt,
    PromoteConfigOpt,
    SidColumnOpt,
    SidColumnsOpt,
    TrustedKeysOpt,
    catalog_column_overrides,
)
from ._progress import progress_for
from ._render import human_bytes, stderr_console, stdout_console, steps_table
from ._run_metrics import report_guards
from .fleet import promote_remote


def build(
    catalog: Annotated[
        str,
        typer.Argument(
            help="Parquet catalog: a file, a directory of Parquet files, or a glob such as 'part-*.parquet'; "
            "local or on object storage (s3://bucket/prefix/, gs://...; credentials from the standard "
            "environment such as AWS_ACCESS_KEY_ID and AWS_ENDPOINT_URL, never in the URI).",
            metavar="CATALOG",
            show_default=False,
        ),
    ],
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="OUT dir for versioned bundles [config: bundles]")
    ] = None,
    config: ConfigOpt = None,
    codebook_sizes: Annotated[
        str | None,
        typer.Option(
            "--codebook-sizes",
            help="V per step: your model's output layer size at each step, e.g. 2048,2048,2048. Required "
            "(here or as codebook_sizes in the config), unless --infer-codebook-sizes.",
            show_default=False,
        ),
    ] = None,
    infer_codebook_sizes: Annotated[
        bool,
        typer.Option(
            "--infer-codebook-sizes",
            help='Use max token + 1 per step as V (config: codebook_sizes = "infer"). A V smaller than the '
            "model's output layer misaligns dense steps with it; the summary shows the sizes inferred.",
        ),
    ] = False,
    sid_column: SidColumnOpt = None,
    sid_columns: SidColumnsOpt = None,
    item_column: ItemColumnOpt = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-j", help="CPU threads to read and build with [config: 0 = all cores]"),
    ] = None,
    step_formats: Annotated[
        str | None,
        typer.Option(
            "--step-formats",
            help="auto, or force formats per step: 0=dense,2=sparse (unnamed steps stay auto) [config: auto]",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu, or cuda:N to also stream the tables to that GPU [config: cpu]"),
    ] = None,
    model_version: Annotated[
        str | None,
        typer.Option("--model-version", help="Free-text tag recorded in the manifest", show_default=False),
    ] = None,
    keep: Annotated[
        int | None,
        typer.Option(
            "--keep", help="Keep only the newest N versions after publishing [config: 0 = keep all]"
        ),
    ] = None,
    promote: Annotated[
        bool | None,
        typer.Option(
            "--promote/--no-promote",
            help="Point LATEST at the new version. --no-promote publishes it without moving LATEST; run "
            "`zerogr promote OUT/vNNNNNN` after your own checks [config: promote = true]",
            show_default=False,
        ),
    ] = None,
    kernel_archs: Annotated[
        str | None,
        typer.Option(
            "--kernel-archs",
            help="CUDA archs to ship compiled kernels for when nvcc is found, e.g. sm_80,sm_90; '' ships "
            "none "
            "[config: sm_80,sm_90]",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="local: build in this process. ray: a partitioned build on a Ray cluster (needs "
            "zerogr[ray]), for catalogs past one machine; the same bundle, byte for byte [config: local]",
            show_default=False,
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="--engine ray: the cluster's head as host:port (or ray://host:port), or auto for the "
            "cluster started here with `ray start --head`; not given: a Ray instance on this machine for "
            "this build [config: ray_address]",
            show_default=False,
        ),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            help="--engine ray: partitions of the catalog, each built by one task; raise it when a "
            "partition does not fit a worker's memory [config: 0 = one per CPU of the cluster]",
            show_default=False,
        ),
    ] = None,
    guards: Annotated[
        bool,
        typer.Option(
            "--guards",
            help="Compare the new version with the one LATEST names before promoting it (the guards of "
            "zerogr rebuild; thresholds in the config's [guards] table): exit 6 when one fires, the "
            "version removed (kept with --no-promote).",
        ),
    ] = False,
    accept_change: AcceptChangeOpt = None,
    json_out: JsonOpt = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress or table; print only the bundle path.")
    ] = False,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Build the per-step index of a Parquet SID catalog and publish it as the next bundle version.

    Reads CATALOG (streamed by row group), validates it, builds every step table (--workers threads) and
    publishes OUT/vNNNNNN atomically, then points OUT/LATEST at it (not with --no-promote). Bad input exits
    with code 2 and one line naming file, column, row and item id; nothing is published then.

    With --guards the new version is compared with the one LATEST names before it is promoted (the
    guards of zerogr rebuild, thresholds in the config's [guards] table): when one fires, exit 6, LATEST
    untouched and the version removed (kept with --no-promote); --accept-change REASON lets it through.

    With --engine ray the catalog is read, validated and indexed in --partitions partitions on a Ray
    cluster and the version is written here, the same files as a local build. A cluster that cannot be
    reached within ZEROGR_RAY_CONNECT_TIMEOUT_S (60 s) or fails exits with code 3 (retry); one that refuses
    the driver's token with code 2 (set RAY_AUTH_TOKEN; a token at ~/.ray/auth_token is used as Ray's CLI
    uses it); a partition too large for a worker's memory with code 2 (raise --partitions).
    """
    with job_metrics("build", metrics_file) as metrics, cli_errors():
        settings = build_settings(
            config, out=out, codebook_sizes=codebook_sizes, infer_codebook_sizes=infer_codebook_sizes,
            sid_column=sid_column, sid_columns=sid_columns, item_column=item_column, workers=workers,
            step_formats=step_formats, device=device, model_version=model_version, keep=keep,
            promote=promote, kernel_archs=kernel_archs, engine=engine, ray_address=ray_address,
            partitions=partitions,
        )  # fmt: skip
        check_out_dir(settings.out)  # an OUT that cannot hold versions is a usage error, before the read
        thresholds = _guard_thresholds(config, guards, accept_change)
        with progress_for(quiet) as progress, warnings_on_stderr():
            summary = build_bundle(
                catalog, replace(settings, promote=settings.promote and not guards), progress=progress,
                load_to_device=_device_load(settings),
            )  # fmt: skip
        metrics.add_stages(summary["timings"])  # the library's own per-stage timings
        metrics.bundle(
            items=summary["items"], distinct_sids=summary["distinct_sids"],
            index_bytes=summary["index_bytes"], version=summary["version"],
            shared_sid_items_ratio=summary["items_in_shared_sids"] / summary["items"],
        )  # fmt: skip
        if thresholds is not None:
            with metrics.stage("guards"):
                report = enforce_guards(
                    summary["bundle"], thresholds, accept_change=accept_change,
                    discard_refused=settings.promote, on_report=lambda r: _show_guards(r, metrics),
                )  # fmt: skip
            if settings.promote:
                promote_bundle(summary["bundle"])
                summary["promoted"] = True
            summary["guards"] = report.to_json()
        _print_build_summary(summary, json_out=json_out, quiet=quiet)


def _guard_thresholds(config: Path | None, guards: bool, accept_change: str | None) -> Any:
    """The guards' thresholds of --guards (None without it); --accept-change alone is a usage error."""
    if not guards:
        if accept_change is not None:
            raise InputError("--accept-change lets fired guards through: it needs --guards")
        return None
    check_reason(accept_change)
    return load_guard_thresholds(config)


def _show_guards(report: Any, metrics: Any) -> None:
    """What the guards measured: one line each on stderr, and into the metrics."""
    for line in report.lines():
        stderr_console().print(safe_text(line), markup=False)
    report_guards(metrics, report)


def build_settings(
    config: Path | None,
    *,
    codebook_sizes: str | None = None,
    infer_codebook_sizes: bool = False,
    sid_column: str | None = None,
    sid_columns: str | None = None,
    item_column: str | None = None,
    **options: Any,
) -> BuildSettings:
    """The BuildSettings of `build`'s options (`options`: out, workers, step_formats, device,
    model_version, keep, promote, kernel_archs, engine, ray_address, partitions; None = the config's
    value) over the config file."""
    overrides: dict[str, Any] = {**catalog_column_overrides(sid_column, sid_columns, item_column), **options}
    if codebook_sizes is not None and infer_codebook_sizes:
        raise InputError("--codebook-sizes and --infer-codebook-sizes are mutually exclusive")
    if codebook_sizes is not None:
        overrides["codebook_sizes"] = parse_int_list(codebook_sizes, "--codebook-sizes")
    elif infer_codebook_sizes:
        overrides["codebook_sizes"] = INFER_CODEBOOK_SIZES
    return load_settings(config, overrides)


def _print_build_summary(summary: dict[str, Any], *, json_out: bool, quiet: bool) -> None:
    if json_out:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    if quiet:
        sys.stdout.write(summary["bundle"] + "\n")
        return
    console = stdout_console()
    console.print(steps_table(f"bundle {summary['bundle']} (version {summary['version']})", summary["steps"]))
    console.print(
        f"{summary['items']:,} items, {summary['distinct_sids']:,} distinct SIDs, index "
        f"{human_bytes(summary['index_bytes'])}, {summary['seconds']:.2f} s "
        f"({summary['items_per_second'] or 0:,} items/s)",
        markup=False,
    )
    if summary["codebook_inferred"]:
        sizes = ",".join(map(str, summary["codebook_sizes"]))
        console.print(
            f"codebook sizes inferred from the data: {sizes} (max token + 1 per step; pass --codebook-sizes "
            f"{sizes} to pin them)",
            markup=False,
        )
    if summary["collisions"]:
        console.print(
            f"{summary['items_in_shared_sids']:,} items share {summary['shared_sids']:,} SIDs with other "
            f"items ({summary['collisions']:,} beyond one per SID); decoding a shared SID yields all.",
            markup=False,
        )
    console.print(summary["bundle"], markup=False)


def promote(
    version_dir: Annotated[
        str,
        typer.Argument(
            help="A published version dir OUT/vNNNNNN (not an OUT dir), or a remote version "
            "s3://bucket/prefix/vNNNNNN.",
            metavar="VERSION_DIR",
            show_default=False,
        ),
    ],
    trusted_keys: TrustedKeysOpt = None,
    allow_unsigned: AllowUnsignedOpt = False,
    guards: Annotated[
        bool,
        typer.Option(
            "--guards",
            help="First compare VERSION_DIR with the version LATEST names (the guards of zerogr rebuild; "
            "thresholds in the [guards] table of --config): exit 6 and LATEST untouched when one fires.",
        ),
    ] = False,
    accept_change: AcceptChangeOpt = None,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            "--signing-key",
            help="A remote version only: sign the rollback into the fleet's metadata with this Ed25519 "
            "private key (the build box's); hosts with --trusted-keys follow only signed metadata.",
            show_default=False,
        ),
    ] = None,
    config: PromoteConfigOpt = None,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Point OUT/LATEST at VERSION_DIR, atomically under the OUT lock.

    For publishing a version after your own checks: `zerogr build --no-promote` publishes OUT/vNNNNNN
    without moving LATEST, you verify or test it, then promote it. Also pins an older version (rollback);
    on an OUT that `zerogr pull` installs into, pull then leaves LATEST there until
    `zerogr pull --follow-remote`. The version's manifest and files (sizes, array headers) are checked
    first; `zerogr verify` hashes them; with --trusted-keys its proof (manifest.json.sig, the fleet's
    signed metadata its pull kept) too. Prints the LATEST it set. Exit 2 when VERSION_DIR is not a version
    dir of an OUT.

    s3://bucket/prefix/vNNNNNN moves the remote LATEST to that version, backwards included: the fleet's
    rollback (push only moves it forwards). The version must be complete on the store (its manifest, and
    every file it lists with its size). On a signed fleet give --signing-key KEY: the version must have
    been pushed signed, and new signed metadata names it as LATEST (its timestamp renewed, [fleet] of
    --config); an unsigned fleet says --allow-unsigned, and LATEST moves by compare-and-swap. The line
    printed names the version it replaced. Serving hosts follow on their next pull. Exit codes as push:
    2 configuration (a signed fleet without --signing-key, neither option, a key the fleet does not
    trust), 3 the store failed, 4 an incomplete version or one not signed, 5 no such version.
    """
    with job_metrics("promote", metrics_file) as metrics, cli_errors():
        thresholds = _guard_thresholds(config, guards, accept_change)
        if is_remote(version_dir):
            if thresholds is not None:
                raise InputError("--guards compares local versions: promote the local version with --guards")
            promote_remote(version_dir, metrics, trusted_keys, allow_unsigned, signing_key, config)
            return
        if signing_key is not None:
            raise InputError("--signing-key is for a remote version (s3://bucket/prefix/vN)")
        trust = host_trust(trusted_keys, allow_unsigned, required=False, what=version_dir)
        if trust is not None and trust.keys and (Path(version_dir) / MANIFEST_NAME).is_file():
            check_local_version(Path(version_dir), trust)  # a dir that is no version: promote says so
        if thresholds is not None and (Path(version_dir) / MANIFEST_NAME).is_file():
            with metrics.stage("guards"):
                enforce_guards(
                    version_dir, thresholds, accept_change=accept_change,
                    on_report=lambda r: _show_guards(r, metrics),
                )  # fmt: skip
        with metrics.stage("promote"):
            promoted = promote_bundle(version_dir)
        metrics.bundle(version=parse_version_dir(promoted.name))
        sys.stdout.write(f"{promoted.parent / 'LATEST'} -> {promoted.name}\n")
        pulled = read_record(promoted.parent)
        if pulled is not None and pulled != promoted.name:
            sys.stderr.write(
                f"note: pull installed {pulled} here; it leaves LATEST at {promoted.name} until "
                "zerogr pull --follow-remote (or a promote back to it)\n"
            )


def _device_load(settings):
    """The optional load after a build (--device cuda:N): the runtime's own, which needs torch."""
    if settings.device == "cpu":
        return None
    from ..runtime.device_tables import measure_device_load

    return measure_device_load
