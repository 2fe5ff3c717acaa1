"""Dtype names: the one table between the names plans, settings and the CLI use and torch dtypes.

    DTYPE_NAMES          ("fp32", "fp16", "bf16")
    dtype_name(x)        torch.bfloat16 / "bfloat16" / "bf16" -> "bf16"
    torch_dtype("bf16")  -> torch.bfloat16
    DTYPES               {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

Importing this module does not import torch (settings parse dtype names before torch is needed); DTYPES
and torch_dtype import it on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import InputError

DTYPE_NAMES = ("fp32", "fp16", "bf16")
_TORCH_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}  # fmt: skip


def dtype_name(dtype: Any) -> str:
    """Canonical name ("fp32", "fp16", "bf16") of a torch dtype or of an alias string ("float32", "half")."""
    if not isinstance(dtype, str):  # a torch.dtype prints as "torch.float32"
        name = _ALIASES.get(str(dtype)) if str(dtype).startswith("torch.") else None
        if name is None:
            raise InputError(f"unsupported weight dtype {dtype} (fp32, fp16 or bf16)")
        return name
    key = dtype.lower()
    if key not in _ALIASES:
        raise InputError(f"unknown dtype name {dtype!r} (fp32, fp16 or bf16)")
    return _ALIASES[key]


def torch_dtype(name: str) -> Any:
    """The torch dtype of a dtype name or alias ("bf16" -> torch.bfloat16)."""
    import torch

    return getattr(torch, _TORCH_NAMES[dtype_name(name)])


def __getattr__(name: str) -> Any:
    if name == "DTYPES":
        return {n: torch_dtype(n) for n in DTYPE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DTYPE_NAMES", "dtype_name", "torch_dtype"]  # and DTYPES, built on first access
