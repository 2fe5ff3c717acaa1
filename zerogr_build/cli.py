"""The `zerogr` command line (Typer). Thin: parse options, call the library, print.

Output discipline: results go to stdout (a table, or one JSON object with --json); progress, warnings and
errors go to stderr. Exit codes: 0 ok; 2 bad input or usage (one line naming file/column/row/item, nothing
published); 1 anything else (one line; set ZEROGR_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .errors import InputError, ZerogrError, one_line
from .progress import NullProgress

app = typer.Typer(
    name="zerogr",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

DEBUG_ENV = "ZEROGR_DEBUG"


def _show_version(value: bool) -> None:
    if value:
        from . import __version__

        sys.stdout.write(f"zerogr {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Build, inspect and verify per-step constrained-decoding indexes for generative recommenders.

    Exit codes: 0 ok; 2 bad input or usage (one line naming file, column, row and item; nothing
    published); 1 anything else (set ZEROGR_DEBUG=1 for a traceback).
    """


# ----------------------------------------------------------------------------------------- plumbing


def _stderr() -> Console:
    # soft_wrap: never insert line breaks into a message (an error stays one line for log scrapers).
    return Console(stderr=True, soft_wrap=True, highlight=False)


def _stdout() -> Console:
    console = Console(soft_wrap=True, highlight=False)
    if not console.is_terminal:  # piped or logged: rich would assume 80 columns and truncate table cells
        console = Console(soft_wrap=True, highlight=False, width=200)
    return console


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Map exceptions to exit codes: InputError -> 2, ZerogrError -> its exit_code, anything else -> 1,
    each as one line on stderr (traceback only with ZEROGR_DEBUG=1)."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        sys.stderr.write("zerogr: interrupted\n")
        raise typer.Exit(130) from None
    except ZerogrError as exc:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        sys.stderr.write(f"error: {one_line(exc)}\n")
        raise typer.Exit(exc.exit_code) from None
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
            hint = ""
        else:
            hint = f" (set {DEBUG_ENV}=1 for a traceback)"
        sys.stderr.write(f"error: {type(exc).__name__}: {one_line(exc)}{hint}\n")
        raise typer.Exit(1) from None


class RichProgress:
    """zerogr_build.progress.Progress rendered as rich progress bars on stderr (one line per stage)."""

    def __init__(self, console: Console) -> None:
        self._bars = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._finish_task()
        else:  # keep stderr to the one error line: drop the unfinished bars instead of printing them
            for task in self._bars.tasks:
                self._bars.update(task.id, visible=False)
            self._bars.live.transient = True
        self._bars.stop()

    def _finish_task(self) -> None:
        if self._task is not None:
            task = self._bars.tasks[self._task]
            done = task.total if task.total is not None else max(task.completed, 1)
            self._bars.update(self._task, total=done, completed=done)
            self._task = None

    def stage(self, name: str, total: float | None = None) -> None:
        self._finish_task()
        self._task = self._bars.add_task(name, total=total)

    def advance(self, n: float = 1) -> None:
        if self._task is not None:
            self._bars.advance(self._task, n)


class LineProgress:
    """Progress for a non-terminal stderr (cron logs, CI): one plain line per finished stage."""

    def __init__(self) -> None:
        self._stage: str | None = None
        self._started = 0.0
        self._done = 0.0

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._finish()

    def _finish(self) -> None:
        if self._stage is not None:
            done = f" ({self._done:,.0f})" if self._done else ""
            sys.stderr.write(
                f"zerogr: {self._stage} done in {time.perf_counter() - self._started:.2f} s{done}\n"
            )
            self._stage = None

    def stage(self, name: str, total: float | None = None) -> None:
        self._finish()
        self._stage, self._started, self._done = name, time.perf_counter(), 0.0

    def advance(self, n: float = 1) -> None:
        self._done += n


class _QuietProgress(NullProgress):
    """NullProgress usable as a context manager, like the other two."""

    def __enter__(self) -> _QuietProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(quiet: bool) -> RichProgress | LineProgress | _QuietProgress:
    if quiet:
        return _QuietProgress()
    console = _stderr()
    return RichProgress(console) if console.is_terminal else LineProgress()


@contextlib.contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """Show the library's warnings (e.g. inferred codebook sizes) as they happen, one line on stderr."""

    def show(message: Warning | str, *_: object, **__: object) -> None:
        _stderr().print(f"WARNING: {message}", style="bold yellow", markup=False)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _steps_table(title: str, steps: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("step", "format", "V", "rows", "nnz", "max_slots", "valid", "bytes"):
        table.add_column(name, justify="left" if name == "format" else "right", no_wrap=True)
    for s in steps:
        table.add_row(
            str(s["step"]),
            s["format"],
            f"{s['codebook_size']:,}",
            f"{s['rows']:,}",
            f"{s['nnz']:,}",
            f"{s['max_slots']:,}",
            f"{s['valid_share']:.2e}" if s["valid_share"] < 0.001 else f"{s['valid_share']:.3f}",
            _human_bytes(s["bytes"]),
        )
    return table


def _catalog_column_overrides(
    sid_column: str | None, sid_columns: str | None, item_column: str | None
) -> dict[str, Any]:
    """Settings overrides of the catalog column options shared by `build` and `verify --catalog`."""
    from .config import parse_name_list

    if sid_column is not None and sid_columns is not None:
        raise InputError("--sid-column and --sid-columns are mutually exclusive")
    overrides: dict[str, Any] = {"sid_column": sid_column, "item_column": item_column}
    if sid_columns is not None:
        overrides["sid_columns"] = parse_name_list(sid_columns)
    elif sid_column is not None:
        overrides["sid_columns"] = ()  # --sid-column on the command line beats sid_columns in a config
    return overrides


# -------------------------------------------------------------------------------------------- build

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML file with a [build] table (see configs/default.toml).",
        show_default=False,
    ),
]


@app.command()
def build(
    catalog: Annotated[
        str,
        typer.Argument(
            help="Parquet catalog: a file, a directory of Parquet files, or a glob such as 'part-*.parquet'.",
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
            help="V per step, e.g. 2048,2048,2048. Omitted: inferred as max token + 1 (warns: a wrong V "
            "misaligns dense steps with the model's output layer).",
            show_default=False,
        ),
    ] = None,
    sid_column: Annotated[
        str | None, typer.Option("--sid-column", help="List column holding each SID [config: sid]")
    ] = None,
    sid_columns: Annotated[
        str | None,
        typer.Option(
            "--sid-columns", help="SID tokens as separate integer columns, e.g. c0,c1,c2", show_default=False
        ),
    ] = None,
    item_column: Annotated[
        str | None, typer.Option("--item-column", help="Item id column, integer or string [config: item_id]")
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", "-j", help="CPU threads for the build [config: 0 = all cores]")
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
    json_out: JsonOpt = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress or table; print only the bundle path.")
    ] = False,
) -> None:
    """Build the per-step index of a Parquet SID catalog and publish it as the next bundle version.

    Reads CATALOG (streamed by row group), validates it, builds every step table (--workers threads) and
    publishes OUT/vNNNNNN atomically, then points OUT/LATEST at it (not with --no-promote). Bad input exits
    with code 2 and one line naming file, column, row and item id; nothing is published then.
    """
    with cli_errors():
        from .config import load_settings, parse_int_list
        from .pipeline import build_bundle

        overrides: dict[str, Any] = {
            **_catalog_column_overrides(sid_column, sid_columns, item_column),
            "out": out,
            "workers": workers,
            "step_formats": step_formats,
            "device": device,
            "model_version": model_version,
            "keep": keep,
            "promote": promote,
        }
        if codebook_sizes is not None:
            overrides["codebook_sizes"] = parse_int_list(codebook_sizes, "--codebook-sizes")
        settings = load_settings(config, overrides)
        with _progress(quiet) as progress, _warnings_on_stderr():
            summary = build_bundle(catalog, settings, progress=progress)
        _print_build_summary(summary, json_out=json_out, quiet=quiet)


def _print_build_summary(summary: dict[str, Any], *, json_out: bool, quiet: bool) -> None:
    if json_out:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    if quiet:
        sys.stdout.write(summary["bundle"] + "\n")
        return
    console = _stdout()
    console.print(
        _steps_table(f"bundle {summary['bundle']} (version {summary['version']})", summary["steps"])
    )
    console.print(
        f"{summary['items']:,} items, {summary['distinct_sids']:,} distinct SIDs, index "
        f"{_human_bytes(summary['index_bytes'])}, {summary['seconds']:.2f} s "
        f"({summary['items_per_second'] or 0:,} items/s)",
        markup=False,
    )
    if summary["collisions"]:
        console.print(
            f"{summary['items_in_shared_sids']:,} items share {summary['shared_sids']:,} SIDs with other "
            f"items ({summary['collisions']:,} beyond one per SID); decoding a shared SID yields all.",
            markup=False,
        )
    console.print(summary["bundle"], markup=False)


# ------------------------------------------------------------------------------------------ inspect

BundleArg = Annotated[
    str | None,
    typer.Argument(
        help="A version dir, or an OUT dir (its LATEST is read). Default: the configured OUT (bundles).",
        metavar="BUNDLE",
        show_default=False,
    ),
]


def _bundle_path(bundle: str | None, config: Path | None) -> str:
    if bundle is not None:
        return bundle
    from .config import load_settings

    return load_settings(config).out


@app.command()
def inspect(
    bundle: BundleArg = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a bundle's step tables (format, rows, nnz, max_slots, valid share, bytes) and how its index size
    compares with STATIC's layout for the same catalog."""
    with cli_errors():
        from .pipeline import inspect_bundle

        report = inspect_bundle(_bundle_path(bundle, config))
        if json_out:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
            return
        console = _stdout()
        title = f"bundle {report['bundle']} (version {report['version']}"
        title += f", model {report['model_version']})" if report["model_version"] else ")"
        console.print(_steps_table(title, report["steps"]))
        console.print(
            f"{report['items']:,} items on {report['distinct_sids']:,} distinct SIDs "
            f"({report['collisions']:,} beyond one per SID); "
            f"leaf offsets {_human_bytes(report['leaf_offsets_bytes'])}",
            markup=False,
        )
        line = f"index bytes: {report['index_bytes']:,} ({_human_bytes(report['index_bytes'])})"
        if report["static_bytes"]:
            static_total = report["static_bytes"]["total"]
            line += (
                f"; STATIC layout for the same catalog: {static_total:,} "
                f"({_human_bytes(static_total)}), ours = {report['ratio_to_static']:.2f}x"
            )
        console.print(line, markup=False)


# ------------------------------------------------------------------------------------------- verify


@app.command()
def verify(
    bundle: BundleArg = None,
    catalog: Annotated[
        str | None,
        typer.Option(
            "--catalog",
            help="Also check the bundle equals this catalog exactly (SID set and item -> SID mapping).",
            show_default=False,
        ),
    ] = None,
    config: ConfigOpt = None,
    sid_column: Annotated[
        str | None, typer.Option("--sid-column", help="SID list column of --catalog")
    ] = None,
    sid_columns: Annotated[
        str | None, typer.Option("--sid-columns", help="SID token columns of --catalog", show_default=False)
    ] = None,
    item_column: Annotated[
        str | None, typer.Option("--item-column", help="Item id column of --catalog")
    ] = None,
    json_out: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")] = False,
) -> None:
    """Check a bundle: every file's sha256, the structural invariants of every step table and the leaf map,
    and with --catalog exact equality with the catalog. Exits non-zero naming the first bad file."""
    with cli_errors():
        from .config import load_settings
        from .pipeline import verify_with_catalog

        settings = load_settings(config, _catalog_column_overrides(sid_column, sid_columns, item_column))
        with _progress(quiet or json_out or catalog is None) as progress:  # only reading has stages
            report = verify_with_catalog(
                bundle if bundle is not None else settings.out, catalog, settings, progress=progress
            )
        if json_out:
            sys.stdout.write(json.dumps(report, default=str) + "\n")
        elif not quiet:
            what = "checksums and invariants"
            if catalog is not None:
                what += f", equal to catalog {catalog}"
            _stdout().print(
                f"OK {report['bundle']} (version {report['version']}): {report['files']} files, "
                f"{_human_bytes(report['bytes'])}, {what}",
                markup=False,
            )
            if report.get("unlisted_files"):
                _stderr().print(
                    f"note: files not listed in the manifest: {', '.join(report['unlisted_files'])}",
                    markup=False,
                )


# ------------------------------------------------------------------------------------------ promote


@app.command()
def promote(
    version_dir: Annotated[
        str,
        typer.Argument(
            help="A published version dir OUT/vNNNNNN (not an OUT dir).",
            metavar="VERSION_DIR",
            show_default=False,
        ),
    ],
) -> None:
    """Point OUT/LATEST at VERSION_DIR, atomically under the OUT lock.

    For publishing a version after your own checks: `zerogr build --no-promote` publishes OUT/vNNNNNN
    without moving LATEST, you verify or test it, then promote it. Also pins an older version (rollback).
    The version's manifest and files (sizes, array headers) are checked first; `zerogr verify` hashes
    them. Prints the LATEST it set. Exit 2 when VERSION_DIR is not a version dir of an OUT.
    """
    with cli_errors():
        from .bundle import promote_bundle

        promoted = promote_bundle(version_dir)
        sys.stdout.write(f"{promoted.parent / 'LATEST'} -> {promoted.name}\n")


# ------------------------------------------------------------------------------------------ commands
# Commands owned by other modules (tune, compare, ...) go below this line: each a small function that
# parses its options and calls its module's library function inside `with cli_errors():`.


@app.command()
def tune(
    bundle: BundleArg = None,
    gpu: Annotated[int | None, typer.Option("--gpu", help="Tune for GPU N (same as --device cuda:N)")] = None,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda:N [config: tune.device]", show_default=False)
    ] = None,
    batch_sizes: Annotated[
        str | None, typer.Option("--batch-sizes", help="Batch sizes to measure [config: 1,8,32,128]")
    ] = None,
    beam_width: Annotated[
        int | None, typer.Option("--beam-width", help="Beams per request M [config: 16]")
    ] = None,
    dtypes: Annotated[
        str | None,
        typer.Option(
            "--dtypes", help="fp32,bf16,fp16 [config: fp32,bf16 on GPU; fp32 on CPU]", show_default=False
        ),
    ] = None,
    hidden_dim: Annotated[
        int | None, typer.Option("--hidden-dim", help="d of the random output layers [config: 128]")
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option("--weights", help="safetensors file, one [V_t, d] tensor per step", show_default=False),
    ] = None,
    warmup: Annotated[
        int | None, typer.Option("--warmup", help="Untimed calls per mode first [config: 3]")
    ] = None,
    iters: Annotated[
        int | None, typer.Option("--iters", help="Timed calls per mode, median kept [config: 10]")
    ] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the plan path")] = False,
) -> None:
    """Time every scoring mode per step x batch size x dtype on this device and write the fastest into the
    bundle as plans/<device-key>.json (plus compiled kernels under kernels/<arch>/ on a GPU)."""
    with cli_errors():
        from .config import check_device, load_tune_settings
        from .runtime.device import device_for
        from .tune import tune_bundle

        overrides = {
            "batch_sizes": batch_sizes,
            "beam_width": beam_width,
            "dtypes": dtypes,
            "hidden_dim": hidden_dim,
            "weights": weights,
            "warmup": warmup,
            "iters": iters,
        }
        settings, config_device = load_tune_settings(config, overrides)
        dev = device_for(gpu, device if device is not None or gpu is not None else config_device)
        check_device(dev)
        with _progress(quiet) as progress, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tune_bundle(_bundle_path(bundle, config), dev, settings, progress=progress)
        for w in caught:
            _stderr().print(f"WARNING: {w.message}", style="bold red", markup=False)
        plan = result.plan
        plan_path = result.plan_path.resolve()
        if json_out:
            summary = {
                "plan": str(plan_path),
                "bundle": str(plan_path.parent.parent),
                "device_key": plan["device_key"],
                "device": plan["device"],
                "modes": plan["modes"],
                "refused": plan["refused"],
                "kernels": result.kernel_files,
                "entries": plan["entries"],
            }
            sys.stdout.write(json.dumps(summary, default=str) + "\n")
        elif quiet:
            sys.stdout.write(f"{plan_path}\n")
        else:
            console = _stdout()
            console.print(_plan_table(plan))
            console.print(f"plan written: {plan_path}", markup=False)


def _plan_table(plan: dict) -> Table:
    """A rich Table of a plan: one row per dtype x step x batch size with the chosen mode, every mode's
    median ms and the chosen mode's speedup over `full`."""
    modes = list(dict.fromkeys(m for e in plan["entries"] for m in e["timings_ms"]))
    table = Table(title=f"zerogr tune: {plan['device']['name']} ({plan['device_key']})")
    for col in ("dtype", "step", "batch", "rows", "chosen", *[f"{m} ms" for m in modes], "vs full"):
        table.add_column(col, justify="right" if col not in ("dtype", "chosen") else "left")
    for e in plan["entries"]:
        t = e["timings_ms"]
        speedup = f"{t['full'] / t[e['mode']]:.2f}x" if "full" in t and t[e["mode"]] > 0 else "-"
        cells = [f"{t[m]:.3f}" if m in t else "-" for m in modes]
        table.add_row(
            e["dtype"], str(e["step"]), str(e["batch_size"]), str(e["rows"]), e["mode"], *cells, speedup
        )
    return table


@app.command()
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
) -> None:
    """Decode the requests filter-first, score-first and unconstrained with your model and compare top-K
    lists (overlap@K, Recall@K, NDCG@K, invalid probability mass per step)."""
    with cli_errors():
        from .compare import parse_ks, report_tables, run_compare
        from .config import check_device

        check_device(device)
        with _progress(json_out) as progress:
            report = run_compare(
                _bundle_path(bundle, config), model, requests, beam_width=beam_width, ks=parse_ks(k),
                batch_size=batch_size, device=device, request_column=request_column,
                target_column=target_column, progress=progress,
            )  # fmt: skip
        if json_out:
            sys.stdout.write(json.dumps(report.to_dict(), default=str) + "\n")
            return
        console = _stdout()
        title = f"{report.requests} requests, beam {report.beam_width}: filter-first vs score-first"
        for renderable in report_tables(report, title):
            console.print(renderable)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`zerogr`), also used by the repo-root `cli.py` shim."""
    app(args=argv, prog_name="zerogr")
