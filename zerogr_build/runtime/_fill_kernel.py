"""numba kernel of slots.fill_slots on the CPU (compiled on first use, cached on disk; slots.py imports this
module on the first CPU fill, so numba is not loaded before).

One serial pass writes each slot row's tokens and its -1 tail. The torch expression it replaces (rank
compare, int64 positions, clamp, gather, where) makes five passes over [R, width] with int64 temporaries:
at the 1M-item benchmark's middle step (1024 beams x 812 slots) that was about half of the step's time.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def fill_slot_rows(tokens: np.ndarray, start: np.ndarray, count: np.ndarray, out: np.ndarray) -> None:
    """out[r, k] = tokens[start[r] + k] for k < count[r], else -1 (in place).

    Args:
        tokens: int32 [nnz], the step's child tokens (or its availability-masked copy).
        start: int64 [R], each slot row's first child position.
        count: int64 [R], children to copy (capped at the width; <= 0: none).
        out: int32 [R, width], C-contiguous.
    Positions are clamped into [0, nnz - 1], as fill_slots' torch reference clamps them, so a bad start
    never reads outside `tokens`.
    """
    rows, width = out.shape
    last = tokens.shape[0] - 1
    for r in range(rows):
        used = min(max(count[r], 0), width) if last >= 0 else 0
        first = start[r]
        for k in range(used):
            out[r, k] = tokens[min(max(first + k, 0), last)]
        for k in range(used, width):
            out[r, k] = -1


__all__ = ["fill_slot_rows"]
