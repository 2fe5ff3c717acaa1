"""`zerogr tune`: measure every scoring mode per step x batch size x dtype on this device, keep the fastest.

What is timed is one whole decoding step (`Decoder.step(state, hidden, mode=m)`: slot lookup, scoring,
log-softmax over the valid slots, top-M) from a real beam state at that step, so a plan compares what a
serving process would actually pay. Modes come from the scoring registry (`runtime.scoring.available_modes`
for the device: `full`, `selective`, and `selective_cuda` where CUDA and CuPy load it). Timing (timing.py):
`warmup` untimed calls of every mode, then `iters` rounds that time each mode once per round (interleaved,
so drift in clock speed or load hits all modes alike); CUDA events on a GPU, perf_counter on a CPU; medians.

A kernel mode (anything beyond the torch `full` / `selective` implementations) is checked against the torch
reference on this device first (check.py) and refused if it differs: it is then never chosen, the plan
lists it under `refused`, and a `KernelMismatchWarning` is raised as a warning.

The plan goes into the bundle as `plans/<device-key>.json` (format: docs/bundle-format.md, section 11; read
back by `runtime.plan.find_plan` for `Decoder(..., plan="auto")`), and on a GPU the kernels compiled for
its architecture go under `kernels/<arch>/`, through `bundle.add_bundle_files` (atomic, manifest updated,
so `zerogr verify` keeps passing).
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..base.device import device_info, device_key
from ..base.dtypes import DTYPE_NAMES, torch_dtype
from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..base.version import __version__
from ..bundle import add_bundle_files, open_bundle
from ..config import TuneSettings
from ..cuda.compile import KernelCompileError, compile_kernels
from ..cuda.selective import SelectiveKernels
from ..runtime.decoder import Decoder
from ..runtime.plan import PLAN_FORMAT, PLAN_FORMAT_VERSION
from ..runtime.scoring import available_modes, get_mode
from ..runtime.weights import load_weights_file, random_weights
from .check import check_mode_against_reference
from .reuse import tune_dtypes
from .timing import fastest, time_modes, timer

REFERENCE_MODE = "selective"
TORCH_MODES = ("full", "selective")
DEFAULT_SETTINGS = TuneSettings()


class KernelMismatchWarning(UserWarning):
    """A kernel scoring mode disagreed with the torch reference on this device and was refused."""


@dataclass
class TuneResult:
    """plan_path: the plan file inside the bundle; plan: its content; kernel_files: bundle-relative names
    of the kernels written (empty on CPU)."""

    plan_path: Path
    plan: dict
    kernel_files: list[str] = field(default_factory=list)


def compile_and_check_kernels(
    device: str, arch: str, dtypes: Sequence[str], check: Callable[[Any, str], str | None]
) -> tuple[dict[str, bytes], list[dict], str | None]:
    """Compile every kernel for `arch` (cubin, plus PTX for newer drivers), load each file on `device` the
    way a serving process will, and check it with check(mode_like, dtype) per dtype.

    Returns ({bundle-relative name: bytes} of the files that passed, refusals [{mode, dtype, reason}],
    reason the compile was skipped or None)."""
    files: dict[str, bytes] = {}
    refused: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            paths = [p for kind in ("cubin", "ptx") for p in compile_kernels(arch, kind, tmp)]
        except KernelCompileError as exc:
            return {}, [], str(exc).splitlines()[0]
        for path in paths:
            name = f"kernels/{arch}/{path.name}"
            try:
                loaded = SelectiveKernels.from_file(path, device)
                problems = [(dt, check(loaded, dt)) for dt in dtypes]
            except Exception as exc:  # noqa: BLE001 - a file that does not load is refused like a wrong one
                problems = [(dt, f"cannot load: {exc}") for dt in dtypes]
            bad = [(dt, p) for dt, p in problems if p is not None]
            for dt, problem in bad:
                refused.append({"mode": name, "dtype": dt, "reason": problem})
            if not bad:
                files[name] = path.read_bytes()
    return files, refused, None


def tune_bundle(
    bundle_path: str | Path | None,
    device: str,
    settings: TuneSettings = DEFAULT_SETTINGS,
    *,
    progress: Progress = NULL_PROGRESS,
) -> TuneResult:
    """Measure, choose and write the plan of `device` into the bundle (see module docstring)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available on this machine")
    started = time.perf_counter()
    bundle = open_bundle(bundle_path)
    index = bundle.index
    info = device_info(device)
    key = device_key(info)
    dtypes = tune_dtypes(settings, info["type"])
    for dt in dtypes:
        if dt not in DTYPE_NAMES:
            raise InputError(f"unknown dtype {dt!r} (use {', '.join(DTYPE_NAMES)})")
    if settings.beam_width < 1 or settings.warmup < 0 or settings.iters < 1:
        raise InputError("--beam-width and --iters must be >= 1, --warmup >= 0")

    if settings.weights:
        base_weights = load_weights_file(settings.weights, index.codebook_sizes)
        hidden_dim = int(base_weights[0].shape[1])
    else:
        hidden_dim = settings.hidden_dim
        if hidden_dim < 1:
            raise InputError(f"--hidden-dim must be >= 1, got {hidden_dim}")
        base_weights = random_weights(index.codebook_sizes, hidden_dim, settings.seed)

    modes = available_modes(device)
    reference = get_mode(REFERENCE_MODE, device)
    vocab = max(index.codebook_sizes)

    def check(mode: Any, dt: str) -> str | None:
        return check_mode_against_reference(
            mode, reference, device, dt, vocab=vocab, hidden_dim=hidden_dim, seed=settings.seed + 1
        )

    refused: list[dict] = []
    allowed: dict[str, list[str]] = {}
    progress.stage("check kernels against the torch reference", total=len(modes) * len(dtypes))
    for dt in dtypes:
        allowed[dt] = []
        for name in modes:
            problem = None if name in TORCH_MODES else check(get_mode(name, device), dt)
            if problem is None:
                allowed[dt].append(name)
            else:
                refused.append({"mode": name, "dtype": dt, "reason": problem})
            progress.advance(1)

    files: dict[str, bytes] = {}
    kernels: dict | None = None
    if info["type"] == "cuda" and any(m not in TORCH_MODES for m in modes):
        progress.stage(f"compile kernels for {info['arch']} and check the compiled files")
        compiled, file_refusals, skipped = compile_and_check_kernels(device, info["arch"], dtypes, check)
        files.update(compiled)
        refused.extend(file_refusals)
        kernels = {"arch": info["arch"], "files": sorted(compiled), "skipped": skipped}
    for r in refused:
        warnings.warn(
            f"{r['mode']} refused on {info['name']} ({r['dtype']}): differs from the torch reference: "
            f"{r['reason']}",
            KernelMismatchWarning,
            stacklevel=2,
        )

    time_ms = timer(device)
    gen = torch.Generator(device="cpu").manual_seed(settings.seed)
    entries: list[dict] = []
    for dt in dtypes:
        weights = [w.to(device=device, dtype=torch_dtype(dt)) for w in base_weights]
        decoder = Decoder(bundle, weights, device=device, order=settings.order)
        for batch in settings.batch_sizes:
            progress.stage(f"time {dt} batch {batch}", total=index.num_steps)
            state = decoder.start(batch, settings.beam_width)
            for t in range(index.num_steps):
                rows = int(state.prefixes.shape[0])
                hidden = torch.randn(rows, hidden_dim, generator=gen).to(device=device, dtype=torch_dtype(dt))

                def run(mode: str, decoder=decoder, state=state, hidden=hidden) -> Any:
                    return decoder.step(state, hidden, mode=mode)

                # The Decoder scores dense steps (and every step of the unconstrained order) with one GEMM
                # whatever the mode, so there is nothing to choose: time that once and record "full".
                mode_matters = index.steps[t].format == "sparse" and settings.order != "unconstrained"
                candidates = allowed[dt] if mode_matters else ["full"]
                measured = time_modes(run, candidates, time_ms, warmup=settings.warmup, iters=settings.iters)
                timings = {m: round(v, 6) for m, v in measured.items()}  # choose from what is recorded
                entries.append(
                    {
                        "step": t,
                        "batch_size": batch,
                        "dtype": dt,
                        "rows": rows,
                        "format": index.steps[t].format,
                        "mode": fastest(timings),
                        "timings_ms": timings,
                    }
                )
                state = decoder.step(state, hidden, mode=REFERENCE_MODE)
                progress.advance(1)

    plan = {
        "format": PLAN_FORMAT,
        "format_version": PLAN_FORMAT_VERSION,
        "device_key": key,
        "zerogr_version": __version__,
        "device": info,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "bundle_version": bundle.version,
        "settings": {
            **asdict(settings),
            "dtypes": list(dtypes),
            "hidden_dim": hidden_dim,
            "batch_sizes": list(settings.batch_sizes),
        },
        "modes": modes,
        "refused": refused,
        "kernels": kernels,
        "entries": entries,
        "tune_seconds": round(time.perf_counter() - started, 3),  # checks, compiles and timings
    }
    plan_name = f"plans/{key}.json"
    files[plan_name] = (json.dumps(plan, indent=2, sort_keys=False) + "\n").encode()
    progress.stage("write plan into the bundle")
    add_bundle_files(bundle.path, files)
    return TuneResult(bundle.path / plan_name, plan, [n for n in files if n.startswith("kernels/")])


__all__ = ["KernelMismatchWarning", "TuneResult", "compile_and_check_kernels", "tune_bundle"]
