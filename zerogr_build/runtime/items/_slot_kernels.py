"""numba kernel of the CPU item-constraint filter on sparse-step slots (compiled on first use, cached on
disk; filter.py imports this module on the first constrained CPU step, so numba is not loaded before).

One serial pass over the used slots replaces the torch window copy, AND, bool, where and the numpy kill
lookup (about ten array passes over [n, width] and a dozen small numpy calls per step): a constrained step
then costs O(used slots + slot rows x log kills) on the calling thread, with no temporary and no thread
pool to wake.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._kill_kernels import first_at_least


@njit(cache=True, nogil=True)
def mask_slot_rows(
    tokens: np.ndarray,
    offset: np.ndarray,
    start: np.ndarray,
    used: np.ndarray,
    request: np.ndarray,
    row_bits: np.ndarray,
    set_mask: np.ndarray,
    kill_query: np.ndarray,
    stride: int,
) -> None:
    """Empty (-1, in place) the used slots whose child row the request may not return.

    Args:
        tokens: int32 [n], slot rows end to end: slot k of slot row i is tokens[offset[i] + k] and holds
            child row start[i] + k for k < used[i] ([R, width] slot rows: offset[i] = i * width).
        offset, start, used, request: int64 [n]: where the row's slots are, its first child, slots in use,
            request of each slot row.
        row_bits: [rows + pad] signed words (filter.include_slots' padded row words); empty: no include
            sets in this search.
        set_mask: [B] the same word type, each request's set word (unused when row_bits is empty).
        kill_query: int64 [k] ascending: request * stride + child row of every killed (request, row).
        stride: rows of the child step + 1 (> start + used of every slot row).
    Slot k of row i is emptied when (row_bits[start + k] & set_mask[request]) == 0, or when its (request,
    row) is a kill: the kills of slot row i are the queries in [key, key + used) with key = request *
    stride + start, one binary search per row (a slot row of another request never falls in that range).
    """
    rows = start.shape[0]
    with_sets = row_bits.shape[0] > 0
    num_kills = kill_query.shape[0]
    for i in range(rows):
        count = used[i]
        if count <= 0:
            continue
        first, at = start[i], offset[i]
        if with_sets:
            word = set_mask[request[i]]
            for k in range(count):
                if (row_bits[first + k] & word) == 0:
                    tokens[at + k] = -1
        if num_kills:
            key = request[i] * stride + first
            j = first_at_least(kill_query, key)
            while j < num_kills and kill_query[j] < key + count:
                tokens[at + kill_query[j] - key] = -1
                j += 1
