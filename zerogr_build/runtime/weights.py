"""Per-step output layers: the forms a Decoder accepts, checked against the index's codebooks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from .plan import dtype_name


def normalize_weights(
    weights: Sequence[Any],
    codebook_sizes: Sequence[int],
    device: torch.device | str | None = None,
    *,
    source: str = "weights",
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per-step (weight [V_t, d], bias [V_t] | None), on `device` when given (bias in the weight's dtype).

    Each entry is a tensor / array, a (weight, bias) pair, a {"weight", "bias"} dict or an nn.Linear-like
    object; fp32, fp16 or bf16; every step has the same d. Raises InputError prefixed by `source`, naming
    the step, the expected and the actual shape.
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
        weight, bias = _split_layer(entry, t, source)
        try:
            weight = torch.as_tensor(weight).detach()
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InputError(f"{source}: weights[{t}] is not an array ({type(entry).__name__})") from exc
        if weight.ndim != 2 or weight.shape[0] != sizes[t]:
            raise InputError(
                f"{source}: weights[{t}] has shape {list(weight.shape)}, expected [{sizes[t]}, d] "
                f"(codebook size of step {t}; codebooks {sizes})"
            )
        dtype_name(weight.dtype)  # raises for unsupported dtypes
        if bias is not None:
            bias = torch.as_tensor(bias).detach()
            if tuple(bias.shape) != (sizes[t],):
                raise InputError(
                    f"{source}: bias of weights[{t}] has shape {list(bias.shape)}, expected [{sizes[t]}]"
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
