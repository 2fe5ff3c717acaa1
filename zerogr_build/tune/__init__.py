"""`zerogr tune`: measure every scoring mode per step x batch size x dtype on this device and keep the
fastest (`measure`), reuse a previous version's plan when nothing it depends on changed (`reuse`), check
kernel modes against the torch reference (`check`), and time modes interleaved (`timing`).

The public names are imported on first use: a rebuild that reuses the previous plan needs `reuse` only and
never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_MEASURE_NAMES = (
    "DEFAULT_SETTINGS",
    "REFERENCE_MODE",
    "TORCH_MODES",
    "KernelMismatchWarning",
    "TuneResult",
    "compile_and_check_kernels",
    "tune_bundle",
)

__all__ = list(_MEASURE_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _MEASURE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".measure", __name__), name)
    globals()[name] = value
    return value
