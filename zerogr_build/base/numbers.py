"""Numbers read from untrusted records (manifests, metrics files, run histories, a store's metadata)."""

from __future__ import annotations

import math


def finite(value: object) -> float | None:
    """`value` as a float when it is a real number a float holds; None otherwise: a bool, None, a string,
    NaN or an infinity, and an int past ~1.8e308 (which overflows a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


__all__ = ["finite"]
