"""`zerogr tune`: time every scoring mode on this device and write the fastest into the bundle as a plan."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Annotated

import typer

from ..base.printable import safe_text
from ._errors import cli_errors
from ._metrics import job_metrics
from ._options import BundleArg, ConfigOpt, JsonOpt, MetricsFileOpt, bundle_path, with_help
from ._progress import progress_for
from ._render import plan_table, stderr_console, stdout_console

TuneConfigOpt = with_help(
    ConfigOpt,
    "TOML file with a [tune] table (zerogr config --show-defaults prints one); its [build] out is the "
    "default BUNDLE.",
)


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
    reuse_from: Annotated[
        str | None,
        typer.Option(
            "--reuse-from",
            help="A previous version (or an OUT dir: the version its LATEST names) whose plan for this "
            "device is copied instead of measuring, when the same device, zerogr, settings, codebook sizes "
            "and step formats were used and every step's rows, nnz and max_slots are within 10% "
            "(docs/operations.md). Otherwise prints why and measures.",
            show_default=False,
        ),
    ] = None,
    retune: Annotated[
        bool, typer.Option("--retune", help="Measure even when --reuse-from's plan could be reused.")
    ] = False,
    config: TuneConfigOpt = None,
    json_out: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the plan path")] = False,
    metrics_file: MetricsFileOpt = None,
) -> None:
    """Time every scoring mode per step x batch size x dtype on this device and write the fastest into the
    bundle as plans/<device-key>.json (plus compiled kernels under kernels/<arch>/ on a GPU).

    With --reuse-from PREV the plan PREV measured is copied instead when nothing that decides the
    measurement changed (--retune measures anyway). Progress goes to stderr: bars on a terminal, one
    line per stage otherwise."""
    with job_metrics("tune", metrics_file) as metrics, cli_errors():
        # Imported when the command runs: tune needs torch, and `zerogr --help` should not pay for it.
        from ..base.device import check_device, device_for
        from ..config import load_tune_settings
        from ..tune import tune_bundle

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
        target = bundle_path(bundle, config)
        reused = None
        if reuse_from is not None and not retune:
            from ..tune.reuse import reuse_plan

            with metrics.stage("reuse"):
                reused = reuse_plan(target, reuse_from, dev, settings)
            if not reused.reused:
                stderr_console().print(
                    safe_text(f"tune: not reusing the plan of {reuse_from}: {reused.refusal}; measuring"),
                    markup=False,
                )
        if reused is not None and reused.reused:
            stderr_console().print(
                f"tune: reused the plan of {reused.source} (same device, settings and step shapes)",
                markup=False,
            )
            result = reused
        else:
            with (
                progress_for(quiet) as progress,
                warnings.catch_warnings(record=True) as caught,
                metrics.stage("tune"),
            ):
                warnings.simplefilter("always")
                result = tune_bundle(target, dev, settings, progress=progress)
            for w in caught:
                stderr_console().print(f"WARNING: {safe_text(w.message)}", style="bold red", markup=False)
        plan = result.plan
        plan_path = result.plan_path.resolve()
        metrics.bundle(version=plan["bundle_version"])
        if json_out:
            summary = {
                "plan": str(plan_path),
                "bundle": str(plan_path.parent.parent),
                "device_key": plan["device_key"],
                "device": plan["device"],
                "modes": plan["modes"],
                "refused": plan["refused"],
                "kernels": list(result.kernel_files),
                "reused_from": plan["reused_from"]["bundle_version"] if reused and reused.reused else None,
                "reuse_refused": reused.refusal if reused else None,
                "entries": plan["entries"],
            }
            sys.stdout.write(json.dumps(summary, default=str) + "\n")
        elif quiet:
            sys.stdout.write(f"{plan_path}\n")
        else:
            console = stdout_console()
            console.print(plan_table(plan))
            console.print(f"plan written: {plan_path}", markup=False)
