"""Which scoring mode a step uses: the tuned plan's choice, else a documented heuristic.

A plan (written by `zerogr tune` into the bundle as plans/<device-key>.json) is a dict with `entries`, each
{"step": t, "batch_size": B, "dtype": "fp32"|"fp16"|"bf16", "mode": name, ...}. Lookup for (step, batch,
dtype) takes the entries of that step and dtype and picks the one whose batch size is nearest in log scale
(ties go to the larger batch); no entry -> no plan answer. If the planned mode is not available on this
device (e.g. the kernel backend failed to load), the fastest *available* mode in the entry's `timings_ms`.

Heuristic (no plan, or no entry, or the planned mode is not available here):
  - dense steps, the score-first order and the unconstrained order -> "full": all V_t logits are needed
    anyway (slot k is token k at a dense step; score-first normalises over all V_t), so one GEMM is the
    cheapest way to get them.
  - sparse steps under filter-first -> a selective mode when the slot cap K is small against V_t:
    K * 32 <= V_t on CPU (a gathered dot product costs several GEMM flops there), K * 8 <= V_t on CUDA;
    "selective_cuda" when that backend is available, else "selective"; otherwise "full".
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError

DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
}
_DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}  # fmt: skip


def dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical plan dtype name ("fp32", "fp16", "bf16") of a torch dtype or an alias string."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES:
            raise InputError(f"unsupported weight dtype {dtype} (fp32, fp16 or bf16)")
        return DTYPE_NAMES[dtype]
    key = str(dtype).lower()
    if key not in _DTYPE_ALIASES:
        raise InputError(f"unknown dtype name {dtype!r} in plan (fp32, fp16 or bf16)")
    return _DTYPE_ALIASES[key]


def load_plan(plan: Mapping[str, Any] | Sequence[Mapping[str, Any]] | str | Path) -> dict[str, Any]:
    """A plan as a dict with "entries": from a dict, a bare list of entries, or a JSON file path."""
    if isinstance(plan, (str, Path)):
        path = Path(plan)
        try:
            plan = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: cannot read plan ({exc})") from exc
    if isinstance(plan, Mapping):
        entries = plan.get("entries")
        if not isinstance(entries, list):
            raise InputError("plan has no 'entries' list")
        return dict(plan)
    if isinstance(plan, Sequence):
        return {"entries": list(plan)}
    raise InputError(f"plan must be a dict, a list of entries or a JSON path, got {type(plan).__name__}")


def planned_mode(
    plan: Mapping[str, Any] | None,
    step: int,
    batch_size: int,
    dtype: torch.dtype | str,
    available: Sequence[str] | None = None,
) -> str | None:
    """The plan's mode for (step, batch_size, dtype): the entry of that step and dtype whose batch size is
    nearest in log scale (ties -> larger); None without a plan or a matching entry. With `available`, a
    planned mode not in it is replaced by the fastest available mode of the entry's timings_ms (if any)."""
    if not plan:
        return None
    want = dtype_name(dtype)
    best: tuple[float, int] | None = None
    chosen: Mapping[str, Any] | None = None
    for entry in plan.get("entries", ()):
        try:
            if int(entry["step"]) != step or dtype_name(entry["dtype"]) != want:
                continue
            size = int(entry["batch_size"])
            str(entry["mode"])
        except (KeyError, TypeError, ValueError, InputError):
            continue
        key = (abs(math.log(max(size, 1)) - math.log(max(batch_size, 1))), -size)
        if best is None or key < best:
            best, chosen = key, entry
    if chosen is None:
        return None
    mode = str(chosen["mode"])
    if available is not None and mode not in available:
        timings = chosen.get("timings_ms") or {}
        usable = {m: float(v) for m, v in timings.items() if m in available}
        if usable:
            return min(usable, key=usable.__getitem__)
    return mode


def heuristic_mode(
    *, step_format: str, cap: int, codebook_size: int, order: str, device_type: str, available: Sequence[str]
) -> str:
    """Mode for a step without a plan (rules in the module docstring)."""
    if step_format == "dense" or order != "filter_first":
        return "full"
    ratio = 8 if device_type == "cuda" else 32
    if cap * ratio > codebook_size:
        return "full"
    return "selective_cuda" if "selective_cuda" in available else "selective"


def find_bundle_plan(bundle: Any, device: torch.device) -> dict[str, Any] | None:
    """plan="auto": the bundle's plan measured on this device class (tune.find_plan), or None (warns)."""
    if bundle is None:
        warnings.warn("plan='auto' needs a Bundle; using the heuristic", stacklevel=3)
        return None
    from ..tune import find_plan  # tune imports the runtime: resolve at call time

    found = find_plan(bundle, str(device))
    if found is None:
        warnings.warn(f"plan='auto': no plan for {device} in the bundle; using the heuristic", stacklevel=3)
        return None
    return dict(found.data)
