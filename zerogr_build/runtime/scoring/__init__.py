"""Scoring modes: a registry from mode name to implementation (xgrammar's kernels/__init__.py pattern).

    full            full_torch.py            one GEMM over all V_t, then read the slots    every device
    selective       base/selective_torch.py  score only the slots' tokens, torch reference every device
    selective_cuda  cuda/selective.py        the same contract as a CUDA kernel (CuPy)     CUDA, where it runs
    selective_numba selective_numba.py       the same contract as a numba kernel (lazy)    CPU

Every mode implements the selective-scoring contract (`selective_scores`, `selective_log_softmax`; see
base/selective_torch.py, kept low so that cuda/ checks its kernels against it). Optional backends are probed
lazily - on the first `available_modes` / `get_mode` call for a CUDA device - never at import, so importing
this package needs neither CUDA nor CuPy. A backend counts on a device only when its `usable(device)` says so:
for selective_cuda that is a real load and a tiny launch checked against the torch reference, once per device
(a failure warns once and leaves it out). Adding a backend is one file plus one entry in `_OPTIONAL`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...base import selective_torch
from ...base.errors import InputError
from . import full_torch, selective_numba


@dataclass(frozen=True)
class ScoringMode:
    """One scoring implementation.

    uses_full_logits: the mode computes [R, V] logits with one GEMM; the decoder then computes that GEMM
    once per step and reads every slot set (main slots, overflow lanes) out of it.
    device_types: torch device types ("cpu", "cuda") the implementation runs on.
    """

    name: str
    selective_scores: Callable[..., torch.Tensor]
    selective_log_softmax: Callable[..., torch.Tensor]
    uses_full_logits: bool
    device_types: tuple[str, ...]
    usable: Callable[[torch.device], bool] | None = None  # per-device check (None: every such device)
    # Optional: (hidden, weight, bias, slot_tokens, beam_scores fp32 [R]) -> beam_scores[:, None] +
    # selective_log_softmax(...), bit for bit, in one pass (the filter-first step's beam totals).
    log_softmax_totals: Callable[..., torch.Tensor] | None = None
    # Optional: a filter-first sparse step's top-M per request from its slot tokens in one pass, without the
    # [R, K] totals (selective_numba.select_top's contract).
    select_top: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


_BUILTIN: dict[str, ScoringMode] = {
    "full": ScoringMode(
        "full", full_torch.selective_scores, full_torch.selective_log_softmax, True, ("cpu", "cuda")
    ),
    "selective": ScoringMode(
        "selective",
        selective_torch.selective_scores,
        selective_torch.selective_log_softmax,
        False,
        ("cpu", "cuda"),
    ),
    "selective_numba": ScoringMode(
        "selective_numba",
        selective_numba.selective_scores,
        selective_numba.selective_log_softmax,
        False,
        ("cpu",),
        log_softmax_totals=selective_numba.log_softmax_totals,
        select_top=selective_numba.select_top,
    ),
}


def _load_selective_cuda() -> ScoringMode | None:
    """The CUDA kernel backend, or None when CUDA, CuPy or the module is missing / reports unavailable."""
    if not torch.cuda.is_available():
        return None
    try:
        importlib.import_module("cupy")
        module = importlib.import_module("zerogr_build.cuda.selective")
    except Exception:  # noqa: BLE001 - any import failure means "backend not available here"
        return None
    usable = getattr(module, "usable", None)
    check = getattr(module, "is_available", None)
    if callable(check):
        try:
            if not check():
                return None
        except Exception:  # noqa: BLE001
            return None
    scores = getattr(module, "selective_scores", None)
    log_softmax = getattr(module, "selective_log_softmax", None)
    if not (callable(scores) and callable(log_softmax)):
        return None
    return ScoringMode(
        "selective_cuda", scores, log_softmax, False, ("cuda",), usable if callable(usable) else None
    )


_OPTIONAL: dict[str, Callable[[], ScoringMode | None]] = {"selective_cuda": _load_selective_cuda}
_PROBED: dict[str, ScoringMode | None] = {}

MODE_NAMES: tuple[str, ...] = (*_BUILTIN, *_OPTIONAL)


def _optional(name: str, device: str | torch.device) -> ScoringMode | None:
    """The optional mode `name` when it imports and (its `usable` check) runs on `device`."""
    if name not in _PROBED:
        _PROBED[name] = _OPTIONAL[name]()
    mode = _PROBED[name]
    if mode is None or (mode.usable is not None and not mode.usable(torch.device(device))):
        return None
    return mode


def available_modes(device: str | torch.device = "cpu") -> list[str]:
    """Names of the modes that run on `device`, builtins first (what `tune` iterates)."""
    device_type = torch.device(device).type
    names = [name for name, mode in _BUILTIN.items() if device_type in mode.device_types]
    if device_type == "cuda":
        for name in _OPTIONAL:
            mode = _optional(name, device)
            if mode is not None:
                names.append(name)
    return names


def get_mode(name: str, device: str | torch.device = "cpu") -> ScoringMode:
    """The implementation of mode `name` for `device`; InputError if unknown or not available there."""
    device_type = torch.device(device).type
    if name in _BUILTIN:
        mode = _BUILTIN[name]
        if device_type not in mode.device_types:
            where = ", ".join(mode.device_types)
            raise InputError(f"scoring mode {name!r} is not available on {device} (runs on {where} only)")
        return mode
    if name in _OPTIONAL:
        mode = _optional(name, device) if device_type == "cuda" else None
        if mode is None:
            raise InputError(
                f"scoring mode {name!r} is not available on {device} (needs CUDA, CuPy and its kernels)"
            )
        return mode
    raise InputError(f"unknown scoring mode {name!r} (known: {', '.join(MODE_NAMES)})")


__all__ = ["MODE_NAMES", "ScoringMode", "available_modes", "get_mode"]
