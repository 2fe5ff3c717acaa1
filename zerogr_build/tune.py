"""`zerogr tune`: measure every scoring mode per step x batch size x dtype on this device, keep the fastest.

What is timed is one whole decoding step (`Decoder.step(state, hidden, mode=m)`: slot lookup, scoring,
log-softmax over the valid slots, top-M) from a real beam state at that step, so a plan compares what a
serving process would actually pay. Modes come from the scoring registry (`runtime.scoring.available_modes`
for the device: `full`, `selective`, and `selective_cuda` where CUDA and CuPy load it). Timing: `warmup`
untimed calls of every mode, then `iters` rounds that time each mode once per round (interleaved, so drift
in clock speed or load hits all modes alike); CUDA events on a GPU, perf_counter on a CPU; medians.

A kernel mode (anything beyond the torch `full` / `selective` implementations) is checked against the torch
reference on this device first - fresh random inputs, every slot of both contract functions compared, exact
-inf pattern, no NaN, tolerance by dtype - and refused if it differs: it is then never chosen, the plan
lists it under `refused`, and a `KernelMismatchWarning` is raised as a warning.

The plan goes into the bundle as `plans/<device-key>.json`, and on a GPU the kernels compiled for its
architecture go under `kernels/<arch>/`, through `bundle.add_bundle_files` (atomic, manifest updated, so
`zerogr verify` keeps passing). `find_plan(bundle, device)` reads it back for `Decoder(..., plan="auto")`.

Plan file (format "zerogr-plan", version 1):
    device_key, device {type, name, compute_capability, arch, driver, cuda_runtime, torch, cupy, threads},
    created_at, bundle_version, settings {batch_sizes, beam_width, dtypes, hidden_dim, weights, warmup,
    iters, order, seed}, modes [...], refused [{mode, dtype, reason}], kernels {arch, files} | null,
    entries [{step, batch_size, dtype, rows, format, mode, timings_ms {mode: median ms}}]
    (dense steps are always scored with one GEMM by the Decoder, so their entries time and record "full")
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import config
from .errors import InputError, ZerogrError
from .progress import NULL_PROGRESS, Progress

PLAN_FORMAT = "zerogr-plan"
PLAN_FORMAT_VERSION = 1
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
REFERENCE_MODE = "selective"
TORCH_MODES = ("full", "selective")
# (rtol, atol) per dtype for kernel vs reference. Both accumulate in fp32 from identically rounded inputs,
# so they differ only by summation order; these bounds leave room for that and nothing more.
CHECK_TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (1e-3, 1e-3), "bf16": (1e-3, 1e-3)}


class KernelMismatchWarning(UserWarning):
    """A kernel scoring mode disagreed with the torch reference on this device and was refused."""


@dataclass(frozen=True)
class TuneSettings:
    """What tune measures. dtypes None: fp32 and bf16 on a GPU, fp32 on a CPU."""

    batch_sizes: tuple[int, ...] = (1, 8, 32, 128)
    beam_width: int = 16
    dtypes: tuple[str, ...] | None = None
    hidden_dim: int = 128
    weights: str | None = None
    warmup: int = 3
    iters: int = 10
    order: str = "filter_first"
    seed: int = 0


@dataclass
class TuneResult:
    """plan_path: the plan file inside the bundle; plan: its content; kernel_files: bundle-relative names
    of the kernels written (empty on CPU)."""

    plan_path: Path
    plan: dict
    kernel_files: list[str] = field(default_factory=list)

    @property
    def refused(self) -> list[dict]:
        return self.plan["refused"]


def load_tune_settings(config_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None):
    """(TuneSettings, device or None): defaults, then the config file's [tune] table, then `overrides`
    (None values ignored, so CLI flags not given keep the file's value). Keys: the TuneSettings fields plus
    `device` ("" = not set: the command line must name it). Lists may be TOML arrays or "1,8,32" strings;
    an empty dtypes / weights means "not set". Unknown keys and bad values raise InputError."""
    from .config import layered_values

    defaults = TuneSettings()
    known = [*defaults.__dataclass_fields__, "device"]
    values, _ = layered_values("tune", config_file, overrides, known, _coerce_tune)
    device = values.pop("device", None) or None
    return replace(defaults, **values), device


def _coerce_tune(key: str, value: Any, where: str) -> Any:
    option = f"{where}: {key}"
    if key == "batch_sizes":
        text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        return parse_int_list(text, option)
    if key == "dtypes":
        text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        return parse_dtypes(text) if text.strip() else None
    if key in ("weights", "device", "order"):
        if not isinstance(value, str):
            raise InputError(f"{option}: expected a string, got {value!r}")
        return value or (None if key != "order" else TuneSettings().order)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{option}: expected an integer, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ device


def _cupy_version() -> str | None:
    import importlib.util
    import sys

    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy

        return str(cupy.__version__)
    except Exception:  # noqa: BLE001 - an unusable cupy is the same as none for the record
        return None


def _driver_version() -> str | None:
    try:
        import cupy

        v = int(cupy.cuda.runtime.driverGetVersion())
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:  # noqa: BLE001
        pass
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_info(device: str) -> dict:
    """What identifies the device a plan was measured on (recorded in the plan, keyed by device_key)."""
    import torch

    dev = torch.device(device)
    info: dict[str, Any] = {"type": dev.type, "torch": torch.__version__, "cupy": _cupy_version()}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(
            name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            arch=f"sm_{props.major}{props.minor}",
            driver=_driver_version(),
            cuda_runtime=torch.version.cuda,
            memory_bytes=int(props.total_memory),
        )
    elif dev.type == "cpu":
        info.update(
            name=_cpu_name(),
            compute_capability=None,
            arch=platform.machine(),
            driver=None,
            cuda_runtime=None,
            threads=torch.get_num_threads(),
        )
    else:
        raise InputError(f"cannot tune for device {device!r}: use cpu or cuda:N")
    return info


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_key(info: Mapping[str, Any] | str | Any) -> str:
    """File-name-safe key of a device class: "cuda-nvidia-h200-sm90", "cpu-x86-64-amd-epyc-...-2t".

    info: a `device_info` dict, or a device (str / torch.device) whose info is read now. GPUs of one model
    and architecture share plans; CPUs also by thread count (timings depend on it)."""
    if not isinstance(info, Mapping):
        info = device_info(str(info))
    if info["type"] == "cuda":
        return f"cuda-{_slug(info['name'])}-{_slug(info['arch']).replace('-', '')}"
    return f"cpu-{_slug(info['arch'])}-{_slug(info['name'])}-{info.get('threads', 0)}t"


def current_device_key(device: str) -> str:
    return device_key(device_info(device))


def parse_device(gpu: int | None, device: str | None) -> str:
    """`--gpu N` / `--device D` -> a torch device string; exactly one must be given."""
    if (gpu is None) == (device is None):
        raise InputError("give exactly one of --gpu N or --device cpu|cuda:N")
    if gpu is not None:
        if gpu < 0:
            raise InputError(f"--gpu must be >= 0, got {gpu}")
        return f"cuda:{gpu}"
    assert device is not None
    if device == "cpu" or re.fullmatch(r"cuda(:\d+)?", device):
        return "cuda:0" if device == "cuda" else device
    raise InputError(f"--device must be cpu or cuda:N, got {device!r}")


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """'1,8,32' -> (1, 8, 32), every value >= 1; InputError naming the option otherwise."""
    values = config.parse_int_list(text, option)
    if not values or any(v < 1 for v in values):
        raise InputError(f"{option}: expected positive integers, got {text!r}")
    return values


def parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in DTYPE_NAMES]
    if not names or bad:
        raise InputError(f"--dtypes: expected a list of {', '.join(DTYPE_NAMES)}, got {text!r}")
    return names


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPE_NAMES[name])


# ------------------------------------------------------------------------------------------ weights


def random_weights(codebook_sizes: Sequence[int], hidden_dim: int, seed: int) -> list:
    """fp32 [V_t, d] per step, scaled like a trained output layer (logits of order 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(v, hidden_dim, generator=gen) / math.sqrt(hidden_dim) for v in codebook_sizes]


def load_weights_file(path: str | Path, codebook_sizes: Sequence[int]) -> list:
    """Per-step output layers from a safetensors file: one 2-D tensor per step, [V_t, d], all of one d.

    Tensors are taken in natural name order ("step2" before "step10"); InputError naming the file and
    tensor when the count or a shape does not fit the bundle."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: weights file not found")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for bad files
        raise InputError(f"{path}: not a readable safetensors file ({exc})") from exc

    def natural(name: str) -> list:
        return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]

    names = sorted(tensors, key=natural)
    if len(names) != len(codebook_sizes):
        raise InputError(f"{path}: {len(names)} tensors, the bundle has {len(codebook_sizes)} steps")
    dims = set()
    out = []
    for t, (name, vocab) in enumerate(zip(names, codebook_sizes, strict=True)):
        w = tensors[name]
        if w.ndim != 2 or w.shape[0] != vocab:
            raise InputError(
                f"{path}: tensor {name!r} (step {t}) has shape {tuple(w.shape)}, need [{vocab}, d]"
            )
        dims.add(int(w.shape[1]))
        out.append(w.float())
    if len(dims) != 1:
        raise InputError(f"{path}: tensors have different hidden sizes {sorted(dims)}")
    return out


# ------------------------------------------------------------------------------------------ checking


def check_mode_against_reference(
    mode: Any,
    reference: Any,
    device: str,
    dtype: str,
    *,
    vocab: int,
    hidden_dim: int,
    rows: int = 64,
    slots: int = 24,
    seed: int = 1234,
) -> str | None:
    """Compare a scoring mode with the reference on fresh random inputs on `device`; None if they agree,
    else one line saying where they differ.

    Inputs: hidden [rows, d], weight [vocab, d] and bias [vocab] in `dtype` (with and without bias),
    slot_tokens int32 [rows, slots] with ~30% empty slots (-1), one fully empty row, a row with every slot
    valid and out-of-range tokens. Both contract functions, every element: same -inf pattern, no NaN,
    finite values within CHECK_TOLERANCE[dtype]."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tdt = torch_dtype(dtype)
    hidden = torch.randn(rows, hidden_dim, generator=gen).to(device=device, dtype=tdt)
    weight = (torch.randn(vocab, hidden_dim, generator=gen) / math.sqrt(hidden_dim)).to(
        device=device, dtype=tdt
    )
    bias = torch.randn(vocab, generator=gen).to(device=device, dtype=tdt)
    tokens = torch.randint(0, vocab, (rows, slots), generator=gen, dtype=torch.int32)
    tokens[torch.rand(rows, slots, generator=gen) < 0.3] = -1
    tokens[0] = -1
    if rows > 2:
        tokens[1] = torch.randint(0, vocab, (slots,), generator=gen, dtype=torch.int32)
        tokens[2, 0] = vocab  # out of range: must read as empty
    tokens = tokens.to(device)
    rtol, atol = CHECK_TOLERANCE[dtype]
    for fn_name in ("selective_scores", "selective_log_softmax"):
        for b in (None, bias):
            want = getattr(reference, fn_name)(hidden, weight, b, tokens).float().cpu()
            try:
                got = getattr(mode, fn_name)(hidden, weight, b, tokens)
            except Exception as exc:  # noqa: BLE001 - a kernel that crashes is refused, not fatal
                return f"{fn_name} raised {type(exc).__name__}: {exc}"
            got = got.float().cpu()
            what = f"{fn_name} ({dtype}, bias={'yes' if b is not None else 'no'})"
            if tuple(got.shape) != tuple(want.shape):
                return f"{what}: shape {tuple(got.shape)}, reference {tuple(want.shape)}"
            if torch.isnan(got).any():
                r, k = (int(x) for x in torch.nonzero(torch.isnan(got))[0])
                return f"{what}: NaN at row {r} slot {k}"
            if not torch.equal(torch.isneginf(got), torch.isneginf(want)):
                r, k = (int(x) for x in torch.nonzero(torch.isneginf(got) != torch.isneginf(want))[0])
                return f"{what}: -inf pattern differs at row {r} slot {k} ({float(got[r, k])} vs reference)"
            finite = torch.isfinite(want)
            diff = (got[finite] - want[finite]).abs()
            bound = atol + rtol * want[finite].abs()
            if (diff > bound).any():
                worst = int(torch.argmax(diff - bound))
                flat = torch.nonzero(finite)[worst]
                r, k = int(flat[0]), int(flat[1])
                return (
                    f"{what}: row {r} slot {k} = {float(got[r, k]):.6g}, reference {float(want[r, k]):.6g} "
                    f"(tolerance rtol={rtol}, atol={atol})"
                )
    return None


# ------------------------------------------------------------------------------------------ timing


def _timer(device: str) -> Callable[[Callable[[], Any]], float]:
    """Returns time_ms(fn): one call of fn, in milliseconds (CUDA events on a GPU, perf_counter on CPU)."""
    import torch

    if torch.device(device).type == "cuda":

        def time_cuda(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))

        return time_cuda

    def time_cpu(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return time_cpu


def time_modes(
    run: Callable[[str], Any], modes: Sequence[str], time_ms: Callable, *, warmup: int, iters: int
) -> dict[str, float]:
    """Median ms of run(mode) per mode: `warmup` untimed calls each, then `iters` interleaved rounds."""
    for mode in modes:
        for _ in range(warmup):
            run(mode)
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(iters):
        for mode in modes:
            samples[mode].append(time_ms(lambda m=mode: run(m)))
    return {m: float(statistics.median(v)) for m, v in samples.items()}


def fastest(timings: dict[str, float]) -> str:
    """The mode with the smallest median (ties: the first listed, i.e. the registry's order)."""
    return min(timings, key=lambda m: timings[m])


# ------------------------------------------------------------------------------------------ tune


class _LoadedKernels:
    """The contract functions of a SelectiveKernels module loaded from a compiled file."""

    def __init__(self, kernels: Any) -> None:
        self._kernels = kernels

    def selective_scores(self, hidden, weight, bias, slot_tokens):
        return self._kernels.scores(hidden, weight, bias, slot_tokens)

    def selective_log_softmax(self, hidden, weight, bias, slot_tokens):
        return self._kernels.log_softmax(hidden, weight, bias, slot_tokens)


def compile_and_check_kernels(
    device: str, arch: str, dtypes: Sequence[str], check: Callable[[Any, str], str | None]
) -> tuple[dict[str, bytes], list[dict], str | None]:
    """Compile every kernel for `arch` (cubin, plus PTX for newer drivers), load each file on `device` the
    way a serving process will, and check it with check(mode_like, dtype) per dtype.

    Returns ({bundle-relative name: bytes} of the files that passed, refusals [{mode, dtype, reason}],
    reason the compile was skipped or None)."""
    import tempfile

    from .runtime.scoring.compile import KernelCompileError, compile_kernels
    from .runtime.scoring.selective_cuda import SelectiveKernels

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
                loaded = _LoadedKernels(SelectiveKernels.from_file(path, device))
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
    settings: TuneSettings = TuneSettings(),
    *,
    progress: Progress = NULL_PROGRESS,
) -> TuneResult:
    """Measure, choose and write the plan of `device` into the bundle (see module docstring)."""
    import torch

    from .bundle import add_bundle_files, open_bundle
    from .runtime.decoder import Decoder
    from .runtime.scoring import available_modes, get_mode

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available on this machine")
    bundle = open_bundle(bundle_path)
    index = bundle.index
    info = device_info(device)
    key = device_key(info)
    dtypes = settings.dtypes or (("fp32", "bf16") if info["type"] == "cuda" else ("fp32",))
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

    time_ms = _timer(device)
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
    }
    plan_name = f"plans/{key}.json"
    files[plan_name] = (json.dumps(plan, indent=2, sort_keys=False) + "\n").encode()
    progress.stage("write plan into the bundle")
    add_bundle_files(bundle.path, files)
    return TuneResult(bundle.path / plan_name, plan, [n for n in files if n.startswith("kernels/")])


# ------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class TunedPlan:
    """A device's plan read from a bundle. `mode_for` answers the Decoder's question per step."""

    device_key: str
    data: dict
    path: Path | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({e["batch_size"] for e in self.data["entries"]}))

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(sorted({e["dtype"] for e in self.data["entries"]}))

    def mode_for(
        self, step: int, batch_size: int, dtype: str, available: Sequence[str] | None = None
    ) -> str | None:
        """The planned mode of the entry of `step` and `dtype` at the measured batch size nearest to
        `batch_size` (log scale, ties to the larger: the Decoder's rule, runtime.plan.planned_mode); if it is
        not in `available` (e.g. the kernel backend failed to load here), the fastest measured mode that is;
        None when the plan has nothing usable for this step/dtype."""
        from .runtime.plan import planned_mode

        mode = planned_mode(self.data, step, batch_size, dtype, available)
        return None if mode is None or (available is not None and mode not in available) else mode

    def kernel_files(self) -> list[str]:
        """Bundle-relative names of the compiled kernels shipped with this plan (may be empty)."""
        kernels = self.data.get("kernels") or {}
        return list(kernels.get("files") or [])


def find_plan(bundle: Any, device: str) -> TunedPlan | None:
    """The plan measured on this device's class (same device_key) in an opened Bundle, or None."""
    key = current_device_key(device)
    plans = bundle.plans()
    if key not in plans:
        return None
    data = bundle.plan(key)
    if data.get("format") != PLAN_FORMAT or data.get("format_version") != PLAN_FORMAT_VERSION:
        raise ZerogrError(
            f"{bundle.path / plans[key]}: not a zerogr plan of format version {PLAN_FORMAT_VERSION}"
        )
    return TunedPlan(key, data, bundle.path / plans[key])


def load_bundle_kernels(bundle: Any, device: str | Any) -> Any | None:
    """Load the kernels tune compiled for this GPU's architecture from the bundle (`kernels/<arch>/`,
    cubin preferred, PTX otherwise) and make them the process's `selective_cuda` kernels for the device,
    so the first selective_cuda call does not compile with NVRTC. Returns the SelectiveKernels, or None
    (not a CUDA device, no CuPy, or no compiled file for this arch: NVRTC then compiles on first use)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        from .runtime.scoring import selective_cuda
    except Exception:  # noqa: BLE001 - no CuPy / kernel backend: nothing to load
        return None
    if not selective_cuda.is_available():
        return None
    arch = selective_cuda.device_arch(dev)
    listed = set(bundle.files(f"kernels/{arch}/"))
    for kind in ("cubin", "ptx"):
        name = f"kernels/{arch}/selective.{kind}"
        if name not in listed:
            continue
        kernels = selective_cuda.SelectiveKernels.from_file(bundle.file(name), dev)
        # selective_cuda keeps one kernel set per device; installing ours there is what makes every
        # selective_cuda call (the registry's functions) use the shipped binary.
        selective_cuda.set_default_kernels(kernels)
        return kernels
    return None


# ------------------------------------------------------------------------------------------ report


def plan_table(plan: dict):
    """A rich Table of a plan: one row per dtype x step x batch size with the chosen mode, every mode's
    median ms and the chosen mode's speedup over `full`. (Built here, printed by the CLI.)"""
    from rich.table import Table

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


__all__ = [
    "KernelMismatchWarning",
    "TuneResult",
    "TuneSettings",
    "TunedPlan",
    "check_mode_against_reference",
    "current_device_key",
    "device_info",
    "device_key",
    "find_plan",
    "load_bundle_kernels",
    "load_tune_settings",
    "load_weights_file",
    "parse_device",
    "plan_table",
    "tune_bundle",
]
