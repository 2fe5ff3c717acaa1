"""`zerogr rebuild`: the build box's job for cron, over zerogr_build.rebuild (build -> verify -> tune ->
gate -> promote -> push). This module parses the options (CATALOG and build's options by build's own
parser, --tune-args by tune's, --gate-args by compare's) and reports: the version on stdout, one line per
step on stderr, the metrics file on every exit (usage errors included)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from ..base.errors import InputError, one_line
from ..base.printable import safe_text
from ._early_metrics import metrics_path as _metrics_path
from ._errors import cli_errors, warnings_on_stderr
from ._metrics import JobMetrics, job_metrics
from ._options import AcceptChangeOpt, MetricsFileOpt
from ._progress import progress_for
from ._render import stderr_console
from ._run_metrics import check_metrics_file, report_run, writes_start
from ._runlog import run_id_on_stderr
from ._usage import UsageCommand

# click's exception base, as the click that typer runs on defines it (recent typers carry their own copy).
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

TUNE_KEYS = ("batch_sizes", "beam_width", "dtypes", "hidden_dim", "weights", "warmup", "iters")
GATE_KEYS = ("k", "beam_width", "batch_size", "max_recall_gap", "model_tag")
# build options rebuild sets itself
RESERVED_BUILD_OPTIONS = {"promote": "--promote/--no-promote", "json_out": "--json", "quiet": "--quiet"}

EXIT_CODES = """\b
Exit codes (what a scheduler should do; stdout holds the version dir on 0, 5, 10 and 12):
   0  built, verified, guarded, tuned, gated, promoted (and pushed): LATEST names the printed version;
      or the inputs had not changed: no new version, the live version printed
   1  an unexpected error (a bug; ZEROGR_DEBUG=1 for the traceback); the new version, if any, removed
   2  bad input, usage or set-up (catalog, option, config, gate files, push URL or credentials, signing
      key, metrics dir), checked before anything is built: nothing was published; fix it, do not retry
   3  build failed otherwise (out of memory, the catalog's store), promote failed, the push target did
      not answer, or the run was interrupted: LATEST not moved, the new version removed; retry later
   4  the new version failed verification: do NOT serve it; alert a human. LATEST not moved; the
      version is kept in OUT for inspection (status shows it unpromoted)
   5  tune failed: the version is valid, verified, promoted (and pushed) without a plan for this
      device; decoders use the heuristic mode choice. Rerun zerogr tune VERSION --device D
   6  the guards refused the new version against LATEST (one line per guard that fired, with its value
      and threshold): not promoted, not pushed, the new version removed. Look at the catalog export and
      the model; --accept-change REASON lets an intended change through
   7  another zerogr rebuild holds OUT's run lock (the line names its pid, host and start): this run did
      nothing and left the metrics file to the holder
   8  disk full: no room for the version even after pruning beyond --keep; the line names the path.
      Nothing promoted; free space or lower --keep (retrying alone will not help)
  10  the quality gate failed: promoted (and pushed) with score_first recorded for the model
      (Decoder(order="auto") decodes exactly, slower). Precedence over 5
  11  the quality gate could not run: not promoted, the new version removed; fix the gate inputs
  12  --push failed: promoted here, the fleet keeps its version; retry zerogr push VERSION URL
 143  ended by SIGTERM (129 SIGHUP, 130 Ctrl-C): the new version, if unpromoted, removed"""


class MonitoredCommand(UsageCommand):
    """A command whose usage errors (unknown option, bad value) still write its --metrics-file, and whose
    usage line names the build arguments it passes on."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "CATALOG", "[BUILD OPTIONS]"]

    def make_context(self, info_name: Any, args: list[str], parent: Any = None, **extra: Any) -> Any:
        raw = list(args)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except ClickException as exc:
            path = _metrics_path(raw)
            if path:
                metrics = JobMetrics(self.name or "rebuild", path)
                metrics.fail("usage", exc.format_message())
                try:
                    metrics.write(exc.exit_code)
                except OSError as err:
                    sys.stderr.write(f"WARNING: could not write the metrics file {path}: {err}\n")
            raise


COMMAND_SETTINGS = {
    "cls": MonitoredCommand,
    "context_settings": {"ignore_unknown_options": True, "allow_extra_args": True},
}


def given_options(command: Callable, args: Sequence[str], what: str) -> dict[str, Any]:
    """Parse `args` with `command`'s own options (a Typer command function); return the values given on
    that line (the names of its parameters). InputError on a usage error, naming `what`."""
    app = typer.Typer()
    app.command()(command)
    click_command = typer.main.get_command(app)
    try:
        ctx = click_command.make_context(what, list(args))
    except ClickException as exc:
        raise InputError(f"{what}: {exc.format_message()}") from None
    if ctx.args:
        raise InputError(f"{what}: unexpected argument {ctx.args[0]!r}")
    return {k: v for k, v in ctx.params.items() if ctx.get_parameter_source(k).name == "COMMANDLINE"}


def _only(values: dict[str, Any], allowed: Sequence[str], what: str, options: str) -> dict[str, Any]:
    extra = sorted(set(values) - set(allowed))
    if extra:
        raise InputError(f"{what} takes only {options}; not {extra[0].replace('_', '-')}")
    return values


def rebuild(
    ctx: typer.Context,
    gpu: Annotated[
        int | None, typer.Option("--gpu", help="Tune (and gate) on GPU N.", show_default=False)
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="Tune (and gate) on cpu or cuda:N [default: cuda:0 if torch sees a GPU, else cpu]",
            show_default=False,
        ),
    ] = None,
    tune_args: Annotated[
        str,
        typer.Option(
            "--tune-args",
            help="zerogr tune options, e.g. '--batch-sizes 1,32 --iters 5' (also the config's [tune] table).",
            show_default=False,
        ),
    ] = "",
    retune: Annotated[
        bool, typer.Option("--retune", help="Measure even when the previous plan could be reused.")
    ] = False,
    gate_model: Annotated[
        str | None,
        typer.Option(
            "--gate-model",
            help="Quality gate with a saved Hugging Face model dir (with "
            "--gate-sid-map; requests hold input_ids).",
            show_default=False,
        ),
    ] = None,
    gate_sid_map: Annotated[
        str | None, typer.Option("--gate-sid-map", help="The SID map of --gate-model.", show_default=False)
    ] = None,
    gate_model_fn: Annotated[
        str | None,
        typer.Option(
            "--gate-model-fn",
            help="Quality gate with a module:function model (the contract of "
            "zerogr compare --model; imported from the current dir; requests hold request_id).",
            show_default=False,
        ),
    ] = None,
    gate_requests: Annotated[
        str | None, typer.Option("--gate-requests", help="The gate's requests (Parquet).", show_default=False)
    ] = None,
    min_overlap: Annotated[
        float, typer.Option("--min-overlap", help="The gate passes when overlap@K >= this at every K.")
    ] = 0.995,
    gate_args: Annotated[
        str,
        typer.Option(
            "--gate-args",
            help="More zerogr compare options: --k, --beam-width, --batch-size, "
            "--max-recall-gap, --model-tag.",
            show_default=False,
        ),
    ] = "",
    push: Annotated[
        str | None,
        typer.Option(
            "--push",
            help="After promote, publish the version to this remote OUT (s3://bucket/"
            "prefix; needs zerogr[s3]) and move its LATEST; also on exit 5 and 10.",
            show_default=False,
        ),
    ] = None,
    push_keep: Annotated[
        int | None,
        typer.Option("--push-keep", help="Then keep only the newest N remote versions.", show_default=False),
    ] = None,
    push_signing_key: Annotated[
        str | None,
        typer.Option(
            "--push-signing-key",
            help="Sign the pushed version with this Ed25519 private key (zerogr keys new); without it the "
            "version is pushed unsigned and hosts with --trusted-keys refuse it.",
            show_default=False,
        ),
    ] = None,
    guards: Annotated[
        bool,
        typer.Option(
            "--guards/--no-guards",
            help="Compare the new version with the one LATEST names before tune and promote, and refuse it "
            "(exit 6) when a guard fires; thresholds in the config's [guards] table.",
        ),
    ] = True,
    accept_change: AcceptChangeOpt = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Build a new version even when the inputs did not change since LATEST's."
        ),
    ] = False,
    metrics_file: MetricsFileOpt = None,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="After the run, whatever its exit code, write the HTML page of OUT's last versions here "
            "(zerogr report OUT -o FILE).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Build CATALOG into the next version, verify it, guard it against LATEST, tune it (reusing the
    previous plan), run the quality gate, promote it, and push it: the build box's whole job, for cron.
    Prints the version dir.

    CATALOG and every other option go to `zerogr build` (--out, --config, --codebook-sizes, --model-version,
    --keep, ... see zerogr build --help); rebuild decides --promote. First, in seconds: the set-up checks,
    OUT's run lock (OUT/.rebuild.lock, held for the whole run: a second rebuild exits 7 at once), removal
    of the unpromoted version a killed run left, the push target (answers with these credentials) and
    room on disk (pruning versions beyond --keep when short). Then the catalog's fingerprint: when it, the
    model tag, the codebook sizes and the build settings equal LATEST's, no version is built (exit 0,
    the live version printed; --force builds anyway). Steps: build publishes OUT/vNNNNNN without moving
    LATEST; verify checks it exactly against CATALOG as the build read it; the guards compare it with
    LATEST (exit 6 and the version removed when one fires; --accept-change REASON lets it through); tune
    writes the device's plan (copied from LATEST's when nothing that decides it changed; --retune
    measures); verify again; the gate (optional) records filter_first or score_first; promote moves
    LATEST; --push publishes it.
    Progress and one line per step go to stderr (every line starts with the run id in a log), the
    version dir to stdout. A version that fails after its build is removed, except one that fails
    verification (kept for inspection). --metrics-file is written as the run starts (running) and on every
    exit, naming the failed stage (zerogr_job_failure_info) and what the guards measured. Every run that
    holds the lock records its start and outcome in OUT/.rebuild-history.jsonl (the newest 200 runs;
    zerogr report shows them).

    EXIT_CODES_PLACEHOLDER
    """
    with job_metrics("rebuild", metrics_file) as metrics:
        from ..rebuild.outcome import new_run_id

        run_id = new_run_id()
        with run_id_on_stderr(run_id), cli_errors():
            try:
                request = _request(
                    ctx.args,
                    guards=guards,
                    accept_change=accept_change,
                    force=force,
                    gpu=gpu,
                    device=device,
                    tune_args=tune_args,
                    retune=retune,
                    gate_model=gate_model,
                    gate_sid_map=gate_sid_map,
                    gate_model_fn=gate_model_fn,
                    gate_requests=gate_requests,
                    min_overlap=min_overlap,
                    gate_args=gate_args,
                    push=push,
                    push_keep=push_keep,
                    push_signing_key=push_signing_key,
                )
                check_metrics_file(metrics.path)
            except InputError as exc:
                metrics.fail("usage", one_line(exc))
                raise
            try:
                _run(request, metrics, run_id)
            finally:
                if report is not None:
                    _write_report(request.settings.out, report)


rebuild.__doc__ = (rebuild.__doc__ or "").replace(
    "EXIT_CODES_PLACEHOLDER", EXIT_CODES.replace("\n", "\n    ")
)


def _log(line: str) -> None:
    stderr_console().print(f"rebuild: {safe_text(line)}", markup=False, soft_wrap=True)


def _run(request: Any, metrics: JobMetrics, run_id: str) -> None:
    from ..rebuild import EXIT_LOCKED, PROMOTED_CODES, RebuildResult
    from ..rebuild import rebuild as run_rebuild

    result = RebuildResult(run_id=run_id)
    try:
        with progress_for(False) as progress, warnings_on_stderr():
            run_rebuild(request, progress=progress, log=_log, result=result, on_start=writes_start(metrics))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (cli._signals): name the signal
        result.failure = None
        metrics.fail("signal", str(exc) or "interrupted")
        raise
    except Exception as exc:
        metrics.fail("crash", f"{type(exc).__name__}: {one_line(exc)}")
        raise
    finally:
        report_run(metrics, result, Path(request.settings.out))
        metrics.fleet(**result.fleet)
        if "gate" in result.stages and result.version_dir is not None:
            _gate_metrics(metrics, result.version_dir)
    if result.exit_code == EXIT_LOCKED:
        metrics.path = None  # the holder's file: this run did nothing and writes nothing
    for note in result.notes:
        _log(note)
    if result.version_dir is not None and (result.unchanged or result.exit_code in PROMOTED_CODES):
        sys.stdout.write(f"{result.version_dir}\n")
    if result.failure is not None:
        _log(f"exit {result.exit_code}: {result.failure.stage}: {result.failure.message}")
    elif result.unchanged:
        _log(f"ready: {result.version_dir.name if result.version_dir else '-'} (unchanged, nothing built)")
    else:
        _log(f"ready: {result.version_dir.name if result.version_dir else '-'}")
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _gate_metrics(metrics: JobMetrics, version_dir: Path) -> None:
    """The gate's worst overlap@K and its threshold, from the record it wrote into the version."""
    from ..report import gate_overlap

    gate = gate_overlap(version_dir)
    if gate is not None:
        worst, threshold = gate.worst_overlap, gate.min_overlap
        metrics.job_value("gate_worst_overlap", "Lowest overlap@K of the quality gate's two orders.", worst)
        metrics.job_value("gate_min_overlap", "The quality gate's threshold (--min-overlap).", threshold)


def _write_report(out: str, path: Path) -> None:
    """`zerogr report OUT -o PATH` after the run; a report that cannot be written is one warning line and
    never changes the run's exit code."""
    from .report import write_out_report

    try:
        write_out_report(Path(out), path, 10, None)
    except Exception as exc:  # noqa: BLE001 - the run's outcome stands
        why = safe_text(one_line(exc))
        sys.stderr.write(f"WARNING: could not write the report {safe_text(path)}: {why}\n")
    else:
        _log(f"report: {path}")


def _request(build_args: Sequence[str], **opts: Any) -> Any:
    """The RebuildRequest of the command line."""
    from ..base.device import device_for, parse_device
    from ..config import load_guard_thresholds, load_tune_settings
    from ..rebuild import GateSpec, PushSpec, RebuildRequest, default_tune_device
    from .build import build, build_settings
    from .compare import compare
    from .tune import tune

    given = given_options(build, build_args, "rebuild (build options)")
    if "catalog" not in given:
        raise InputError("rebuild: missing CATALOG (the first argument, as for zerogr build)")
    reserved = sorted(set(given) & set(RESERVED_BUILD_OPTIONS))
    if reserved:
        raise InputError(f"rebuild decides {RESERVED_BUILD_OPTIONS[reserved[0]]} itself; leave it out")
    catalog, config = given.pop("catalog"), given.pop("config", None)
    settings = build_settings(config, **given)
    tune_given = given_options(tune, shlex.split(opts["tune_args"]), "--tune-args")
    tune_given = _only(tune_given, TUNE_KEYS, "--tune-args", "tune's measurement options")
    tune_settings, config_device = load_tune_settings(config, tune_given)
    gpu, device = opts["gpu"], opts["device"]
    tune_device = device_for(gpu, device) if gpu is not None or device is not None else config_device
    tune_device = parse_device(tune_device) if tune_device else default_tune_device()
    gate = None
    gate_opts = (opts["gate_model"], opts["gate_sid_map"], opts["gate_model_fn"], opts["gate_requests"])
    if any(v is not None for v in gate_opts) or opts["gate_args"]:
        if opts["gate_requests"] is None:
            raise InputError("the quality gate needs --gate-requests FILE")
        extra = given_options(compare, [*shlex.split(opts["gate_args"]), "--requests", "-"], "--gate-args")
        extra.pop("requests", None)
        extra = _only(
            extra, GATE_KEYS, "--gate-args", "--k, --beam-width, --batch-size, --max-recall-gap, --model-tag"
        )
        from ..compare.inputs import parse_ks

        if "k" in extra:
            extra["ks"] = tuple(parse_ks(extra.pop("k")))
        gate = GateSpec(
            requests=opts["gate_requests"],
            min_overlap=opts["min_overlap"],
            model_dir=opts["gate_model"],
            sid_map=opts["gate_sid_map"],
            model_fn=opts["gate_model_fn"],
            **extra,
        )
    push = None
    if opts["push"] is not None:
        from ._options import timestamp_expiry_s

        expiry = timestamp_expiry_s(config)
        push = PushSpec(opts["push"], opts["push_keep"], opts["push_signing_key"], expiry)
    for option in ("push_keep", "push_signing_key"):
        if push is None and opts[option] is not None:
            raise InputError(f"--{option.replace('_', '-')} needs --push")
    return RebuildRequest(
        catalog=catalog,
        settings=settings,
        tune_device=tune_device,
        tune_settings=tune_settings,
        retune=opts["retune"],
        gate=gate,
        push=push,
        guards=load_guard_thresholds(config) if opts["guards"] else None,
        accept_change=opts["accept_change"],
        force=opts["force"],
    )
