"""numba kernels of slots.py on the CPU: filling sparse slots, emptying dense ones (compiled on first use,
cached on disk; slots.py imports this module on the first CPU call, so numba is not loaded before).

Each is one serial pass over [R, width] on the calling thread. The torch expressions they replace make
several passes each with temporaries (fill: rank compare, int64 positions, clamp, gather, where - at the
1M-item benchmark's middle step, 1024 beams x 812 slots, about half of the step's time; dense: a row gather
of the next table, two compares, a not and a masked fill), and on a shared CPU every one of those passes is
a parallel region that waits for its second thread.
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


@njit(cache=True, nogil=True)
def empty_dense_slots(values: np.ndarray, next_rows: np.ndarray, rows: np.ndarray) -> None:
    """values[r, k] = -inf where beam r is padding (rows[r] < 0) or its row has no child k
    (next_rows[rows[r], k] < 0), in place; other entries untouched.

    Args:
        values: float32 [R, V], C-contiguous.
        next_rows: int32 [rows_t, V], the dense step's next table (or its availability-masked copy).
        rows: int64 [R], each beam's row (-1: padding).
    A row outside the table raises IndexError (as torch's row gather does).
    """
    beams, vocab = values.shape
    neg_inf = np.float32(-np.inf)
    for r in range(beams):
        row = rows[r]
        if row >= next_rows.shape[0]:
            raise IndexError("a beam's row is outside the dense step table")
        for k in range(vocab):
            if row < 0 or next_rows[row, k] < 0:
                values[r, k] = neg_inf


__all__ = ["empty_dense_slots", "fill_slot_rows"]
