"""Per-step output layers: the forms a Decoder accepts, checked against the index's codebooks; a safetensors
file of them; random ones for measuring."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from ..base.dtypes import dtype_name
from ..base.errors import InputError


def normalize_weights(
    weights: Sequence[Any],
    codebook_sizes: Sequence[int],
    device: torch.device | str | None = None,
    *,
    source: str = "weights",
    names: Sequence[str] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per-step (weight [V_t, d], bias [V_t] | None), on `device` when given (bias in the weight's dtype).

    Each entry is a tensor / array, a (weight, bias) pair, a {"weight", "bias"} dict or an nn.Linear-like
    object; fp32, fp16 or bf16; every step has the same d. Raises InputError prefixed by `source`, naming
    the step (as names[t] when given, else weights[t]), the expected and the actual shape.
    """
    sizes = [int(v) for v in codebook_sizes]
    try:
        entries = list(weights)
    except TypeError:
        raise InputError(f"{source}: weights must be a sequence of {len(sizes)} per-step layers") from None
    if len(entries) != len(sizes):
        raise InputError(
            f"{source}: {len(entries)} per-step output layers, but the SIDs have {len(sizes)} steps "
            f"(codebooks {sizes})"
        )
    out, dims = [], set()
    for t, entry in enumerate(entries):
        label = f"weights[{t}]" if names is None else names[t]
        weight, bias = _split_layer(entry, t, source)
        try:
            weight = torch.as_tensor(weight).detach()
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InputError(f"{source}: {label} is not an array ({type(entry).__name__})") from exc
        if weight.ndim != 2 or weight.shape[0] != sizes[t] or weight.shape[1] < 1:
            raise InputError(
                f"{source}: {label} has shape {list(weight.shape)}, expected [{sizes[t]}, d] with d >= 1 "
                f"(codebook size of step {t}; codebooks {sizes})"
            )
        dtype_name(weight.dtype)  # raises for unsupported dtypes
        if bias is not None:
            bias = torch.as_tensor(bias).detach()
            if tuple(bias.shape) != (sizes[t],):
                raise InputError(
                    f"{source}: bias of {label} has shape {list(bias.shape)}, expected [{sizes[t]}]"
                )
        if device is not None:
            weight = weight.to(device)
            bias = None if bias is None else bias.to(device=device, dtype=weight.dtype)
        dims.add(int(weight.shape[1]))
        out.append((weight, bias))
    if len(dims) > 1:
        raise InputError(f"{source}: per-step weights disagree on d: {sorted(dims)}")
    return out


def _split_layer(entry: Any, step: int, source: str) -> tuple[Any, Any]:
    """(weight, bias or None) of one per-step entry, whatever form it has."""
    if isinstance(entry, Mapping):
        if "weight" not in entry:
            raise InputError(f"{source}: weights[{step}] is a mapping without a 'weight' entry")
        return entry["weight"], entry.get("bias")
    if isinstance(entry, (tuple, list)):
        if len(entry) != 2:
            raise InputError(f"{source}: weights[{step}]: expected (weight, bias), got {len(entry)} items")
        return entry[0], entry[1]
    if hasattr(entry, "weight") and not isinstance(entry, (torch.Tensor, np.ndarray)):
        return entry.weight, getattr(entry, "bias", None)
    return entry, None


def load_weights_file(path: str | Path, codebook_sizes: Sequence[int]) -> list[torch.Tensor]:
    """Per-step output layers fp32 [V_t, d] from a safetensors file: one 2-D tensor per step, all of one d.

    Tensors are taken in natural name order ("step2" before "step10") and converted to fp32, then checked
    like any weights (normalize_weights); InputError naming the file (and the tensor) otherwise."""
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
    layers = normalize_weights(
        [tensors[n].float() for n in names],
        codebook_sizes,
        source=str(path),
        names=[f"tensor {n!r} (step {t})" for t, n in enumerate(names)],
    )
    return [weight for weight, _ in layers]


def random_weights(codebook_sizes: Sequence[int], hidden_dim: int, seed: int) -> list[torch.Tensor]:
    """fp32 [V_t, d] per step, scaled like a trained output layer (logits of order 1)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(v, hidden_dim, generator=gen) / math.sqrt(hidden_dim) for v in codebook_sizes]
