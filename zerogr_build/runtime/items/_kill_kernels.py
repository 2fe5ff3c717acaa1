"""numba kernels of one step of kills.killed_rows (compiled on first use, cached on disk): the counting of
the excluded items of each (request, row) pair and the test whether they are all the row's allowed items
(the argument is in kills.py's docstring). One serial pass over the few hundred entries of a search
replaces a dozen numpy calls per step, each of which cost more in dispatch than in work.

Entries arrive sorted by (request, row) (they start sorted by (request, position) and every map to a row
of the step above is monotone); a kernel sorts them (stably) first only when they are not.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._mask_kernels import rank


@njit(cache=True, nogil=True)
def first_at_least(sorted_keys: np.ndarray, value: int) -> int:
    """The first index i with sorted_keys[i] >= value (len when none)."""
    lo, hi = 0, sorted_keys.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if sorted_keys[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _pair_order(req: np.ndarray, row: np.ndarray, rows: int) -> np.ndarray:
    """int64 [k]: a stable order of the entries by key request * rows + row (the identity when sorted)."""
    keys = req * rows + row
    for i in range(1, keys.shape[0]):
        if keys[i] < keys[i - 1]:
            return np.argsort(keys, kind="mergesort")
    return np.arange(keys.shape[0])


@njit(cache=True, nogil=True)
def plain_step_kills(req, row, rows, bounds, words, before, with_mask):
    """Requests without sets at one step: (killed keys request * rows + row int64 ascending, keep bool [k]).

    Args:
        req, row: int64 [k], one entry per excluded available item carried to this step (its row).
        rows: rows of the step; bounds: int64 [rows + 1], each row's leaf-ordered item run.
        words, before: the availability's rank structure (space.AvailabilityRank; with_mask False: every
            item available).
    A pair is killed iff its entries (distinct excluded items) are all the row's available items; keep
    marks the entries of killed pairs (carried up).
    """
    order = _pair_order(req, row, rows)
    k = order.shape[0]
    # Each entry's row count first, in a loop of independent reads (the rows are scattered through
    # tables the search keeps pushing out of the caches, so the reads' misses overlap), then the groups.
    available = np.empty(k, dtype=np.int64)
    for e in range(k):
        r = row[order[e]]
        lo, hi = bounds[r], bounds[r + 1]
        available[e] = rank(words, before, hi) - rank(words, before, lo) if with_mask else hi - lo
    keep = np.zeros(k, dtype=np.bool_)
    killed = np.empty(k, dtype=np.int64)
    found = 0
    i = 0
    while i < k:
        b, r = req[order[i]], row[order[i]]
        j = i + 1
        while j < k and req[order[j]] == b and row[order[j]] == r:
            j += 1
        if available[i] == j - i:
            killed[found] = b * rows + r
            found += 1
            for e in range(i, j):
                keep[order[e]] = True
        i = j
    return killed[:found], keep


@njit(cache=True, nogil=True)
def set_step_kills(req, sid, row, rows, bounds, set_flat, set_off, set_keys, stride):
    """Requests with sets at one step: (killed keys request * rows + row int64 ascending, keep bool [m]).

    Args:
        req, sid, row: int64 [m], one entry per (excluded available item, set of S_b it belongs to).
        rows, bounds: as plain_step_kills.
        set_flat, set_off: the sets S_b of request b are set_flat[set_off[b] : set_off[b + 1]].
        set_keys: int64 ascending, i * stride + p for every available member p of set i.
        stride: items + 1.
    A pair (b, R) is killed iff for every set i of S_b the entries with sid i are all of cnt_i(R) = set
    i's available items in R (two binary searches in set_keys); a row of one item is killed outright.
    """
    order = _pair_order(req, row, rows)
    m = order.shape[0]
    keep = np.zeros(m, dtype=np.bool_)
    killed = np.empty(m, dtype=np.int64)
    found = 0
    i = 0
    while i < m:
        b, r = req[order[i]], row[order[i]]
        j = i + 1
        while j < m and req[order[j]] == b and row[order[j]] == r:
            j += 1
        lo, hi = bounds[r], bounds[r + 1]
        dead = True
        if hi - lo > 1:
            for s in range(set_off[b], set_off[b + 1]):
                each = set_flat[s]
                excluded = 0
                for e in range(i, j):
                    if sid[order[e]] == each:
                        excluded += 1
                low = first_at_least(set_keys, each * stride + lo)
                if first_at_least(set_keys, each * stride + hi) - low != excluded:
                    dead = False
                    break
        if dead:
            killed[found] = b * rows + r
            found += 1
            for e in range(i, j):
                keep[order[e]] = True
        i = j
    return killed[:found], keep
