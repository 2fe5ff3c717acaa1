"""Sort SIDs and mark where each prefix length starts a new distinct prefix.

This is the expensive half of the build; the step tables are cheap reads of its result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SortedLayout:
    """Catalog rows in lexicographic SID order, with the distinct prefixes of every length.

    prefix_tokens[t]   uint/int [P_{t+1}]  token t of each distinct length-(t+1) prefix, in order
    prefix_parent[t]   int64 [P_{t+1}]      row (distinct length-t prefix) each one extends; t=0 -> 0
    prefix_counts      int64 [L]            P_1 .. P_L (P_L = distinct SIDs = leaves)
    leaf_offsets       int64 [P_L + 1]      first sorted position of each leaf, then N
    item_order         int64 [N]            catalog row at each sorted position (stable within a leaf)
    """

    prefix_tokens: list[np.ndarray]
    prefix_parent_starts: list[np.ndarray]
    prefix_counts: np.ndarray
    leaf_offsets: np.ndarray
    item_order: np.ndarray

    def step_tokens(self, t: int, dtype: np.dtype) -> np.ndarray:
        return self.prefix_tokens[t].astype(dtype, copy=False)

    def step_indptr(self, t: int, dtype: np.dtype) -> np.ndarray:
        return self.prefix_parent_starts[t].astype(dtype, copy=False)


def sort_and_mark(sids: np.ndarray, codebook_sizes: Sequence[int], workers: int | None = None) -> SortedLayout:
    """Reference implementation (numpy lexsort); replaced by the parallel build for packable keys."""
    n, num_steps = sids.shape
    order = np.lexsort(sids.T[::-1])
    s = sids[order]
    # first_diff[i]: first column where sorted row i+1 differs from row i (L when equal). Rows are sorted,
    # so row i+1 starts a new length-k prefix exactly when first_diff[i] < k.
    if n > 1:
        diff = s[1:] != s[:-1]
        first_diff = np.where(diff.any(axis=1), diff.argmax(axis=1), num_steps)
    else:
        first_diff = np.zeros(0, dtype=np.int64)
    prefix_tokens, starts, counts = [], [], []
    prev_new = None
    for t in range(num_steps):
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = first_diff <= t
        prefix_tokens.append(s[new, t])
        child_rank = np.cumsum(new) - 1
        count = int(child_rank[-1]) + 1
        if prev_new is None:
            indptr = np.array([0, count], dtype=np.int64)
        else:
            indptr = np.append(child_rank[prev_new], count).astype(np.int64)
        starts.append(indptr)
        counts.append(count)
        prev_new = new
    leaf_offsets = np.append(np.flatnonzero(prev_new), n).astype(np.int64)
    return SortedLayout(prefix_tokens, starts, np.asarray(counts, dtype=np.int64), leaf_offsets,
                        order.astype(np.int64))
