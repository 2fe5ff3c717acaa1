"""The serving side: Decoder (filter-first constrained beam search), scoring modes, plans, streaming.

Names are imported lazily so that `import zerogr_build.runtime.stream` (or anything else here) does not pay
for torch until a Decoder is actually used.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Decoder": ".decoder",
    "BeamState": ".decoder",
    "SearchResult": ".decoder",
    "ORDERS": ".decoder",
    "available_modes": ".scoring",
    "get_mode": ".scoring",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
