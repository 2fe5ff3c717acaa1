"""numba kernels of the CPU item-constraint filter on sparse-step slots and dense-step values (compiled on
first use, cached on disk; filter.py imports this module on the first constrained CPU step, so numba is not
loaded before).

One serial pass over the used slots (or the [R, V] values) replaces the torch window copy or row gather,
AND, bool, where and the numpy kill lookup (about ten array passes and a dozen small numpy calls per step):
a constrained step then costs O(slots + beams x log kills) on the calling thread, with no temporary and no
thread pool to wake.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._kill_kernels import first_at_least


@njit(cache=True, nogil=True)
def mask_slot_rows(
    tokens: np.ndarray,
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
        tokens: int32 [n, width], slot k of slot row i holds child row start[i] + k for k < used[i].
        start, used, request: int64 [n]: first child, slots in use (<= width), request of each slot row.
        row_bits: [rows + pad] signed words (filter.include_slots' padded row words); empty: no include
            sets in this search.
        set_mask: [B] the same word type, each request's set word (unused when row_bits is empty).
        kill_query: int64 [k] ascending: request * stride + child row of every killed (request, row).
        stride: rows of the child step + 1 (> start + used of every slot row).
    Slot k of row i is emptied when (row_bits[start + k] & set_mask[request]) == 0, or when its (request,
    row) is a kill: the kills of slot row i are the queries in [key, key + used) with key = request *
    stride + start, one binary search per row (a slot row of another request never falls in that range).
    """
    rows = tokens.shape[0]
    with_sets = row_bits.shape[0] > 0
    num_kills = kill_query.shape[0]
    for i in range(rows):
        count = used[i]
        if count <= 0:
            continue
        first = start[i]
        if with_sets:
            word = set_mask[request[i]]
            for k in range(count):
                if (row_bits[first + k] & word) == 0:
                    tokens[i, k] = -1
        if num_kills:
            key = request[i] * stride + first
            j = first_at_least(kill_query, key)
            while j < num_kills and kill_query[j] < key + count:
                tokens[i, kill_query[j] - key] = -1
                j += 1


@njit(cache=True, nogil=True)
def empty_dense_disallowed(
    values: np.ndarray,
    next_rows: np.ndarray,
    rows: np.ndarray,
    request: np.ndarray,
    dense_words: np.ndarray,
    request_words: np.ndarray,
    beam_query: np.ndarray,
    column: np.ndarray,
    parent_stride: int,
) -> None:
    """values[r, k] = -inf (in place) where beam r may not take token k of a dense step: it is padding
    (rows[r] < 0), its row has no (available) child k, the child holds no item of its request's sets, or
    the (request, child) pair is a kill.

    Args:
        values: float32 [R, V], C-contiguous.
        next_rows: int32 [rows_t, V], the dense step's next table (or its availability-masked copy).
        rows, request: int64 [R], each beam's row (-1: padding) and request.
        dense_words: [rows_t, V] signed words of the children's sets (Resident.dense_bits); empty: no
            include sets in this search.
        request_words: [B] the same word type, each request's set word (unused when dense_words is empty).
        beam_query, column: int64 [k], one kill each: request * parent_stride + row of the beam's row, and
            the token it empties; beam_query ascending.
        parent_stride: rows_t + 1.
    A row outside the table raises IndexError (as torch's row gather does).
    """
    beams, vocab = values.shape
    neg_inf = np.float32(-np.inf)
    with_words = dense_words.shape[0] > 0
    num_kills = beam_query.shape[0]
    for r in range(beams):
        row = rows[r]
        if row >= next_rows.shape[0]:
            raise IndexError("a beam's row is outside the dense step table")
        if row < 0:
            values[r, :] = neg_inf
            continue
        if with_words:
            word = request_words[request[r]]
            for k in range(vocab):
                if next_rows[row, k] < 0 or (dense_words[row, k] & word) == 0:
                    values[r, k] = neg_inf
        else:
            for k in range(vocab):
                if next_rows[row, k] < 0:
                    values[r, k] = neg_inf
        if num_kills:
            key = request[r] * parent_stride + row
            j = first_at_least(beam_query, key)
            while j < num_kills and beam_query[j] == key:
                values[r, column[j]] = neg_inf
                j += 1
