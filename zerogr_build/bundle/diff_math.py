"""The arithmetic of `zerogr diff` (bundle/diff.py reads the files and calls these): arrays in, arrays out,
no I/O.

Words used below (docs/bundle-format.md, section 2): step t has `rows_t` rows and `nnz_t` children in flat
order; the children of row r are flat positions starts_t[r] .. starts_t[r+1]-1 (`indptr` for a sparse step,
`dense_as_sparse` for a dense one), and flat position p of step t *is* row p of step t+1, or leaf p at the
last step. The items of leaf j are rows offsets[j] .. offsets[j+1]-1 of items.parquet (leaf order).

Two jobs (the third, matching items by id across versions, is id_match.py):

1. Per version: fan-out per step (children per row: mean, p99, max), items in shared SIDs, the first
   token's items. One pass over the step arrays and the leaf offsets (memory-mapped is fine).
2. The SID of each item of a contiguous slice of items.parquet, packed into `KeyLayout.words` uint64
   words so that two versions' SIDs compare with `==` (`leaf_keys`, `item_keys`). Only the ancestors of
   the slice's leaves are read: a slice of items is a slice of leaves, whose ancestors are a slice of rows
   at every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numba as nb
import numpy as np

from .key_words import child_key, copy_key, kernel_keys, key_rows

# ----------------------------------------------------------------------------------------- per version


@nb.njit(cache=True)
def _dense_counts(next_rows: np.ndarray) -> np.ndarray:
    rows, width = next_rows.shape
    starts = np.zeros(rows + 1, dtype=np.int64)
    for r in range(rows):
        count = 0
        for v in range(width):
            if next_rows[r, v] >= 0:
                count += 1
        starts[r + 1] = starts[r] + count
    return starts


@nb.njit(cache=True)
def _dense_tokens(next_rows: np.ndarray, nnz: int) -> np.ndarray:
    tokens = np.empty(nnz, dtype=np.int32)
    rows, width = next_rows.shape
    for r in range(rows):
        for v in range(width):
            child = next_rows[r, v]
            if child >= 0:
                tokens[child] = v  # the next row of a child is its flat position (row numbering rule)
    return tokens


def dense_as_sparse(next_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dense step's `next` int32 [rows, V] as (starts int64 [rows+1], tokens int32 [nnz]): the sparse
    layout of the same children (a dense step is at most dense_max_bytes, so this copy is bounded)."""
    starts = _dense_counts(next_rows)
    return starts, _dense_tokens(next_rows, int(starts[-1]))


@nb.njit(cache=True)
def _count_histogram(starts: np.ndarray, width: int) -> np.ndarray:
    hist = np.zeros(width + 1, dtype=np.int64)
    for r in range(starts.shape[0] - 1):
        hist[starts[r + 1] - starts[r]] += 1
    return hist


@dataclass(frozen=True)
class Fanout:
    """Children per row of one step: mean (nnz / rows), p99 (nearest rank: the smallest count at least 99%
    of the rows do not exceed) and max."""

    mean: float
    p99: int
    max: int


def fanout(starts: np.ndarray, codebook_size: int) -> Fanout:
    """Fan-out of a step from its row starts int [rows+1] (children per row <= codebook_size)."""
    starts = np.asarray(starts)
    # no row has more children than the step has, so a wide codebook never sizes the histogram
    width = min(int(codebook_size), int(starts[-1] - starts[0])) if starts.shape[0] else 0
    hist = _count_histogram(starts, width)
    rows = int(hist.sum())
    counts = np.cumsum(hist)
    rank = max(math.ceil(0.99 * rows), 1)
    nonzero = np.flatnonzero(hist)
    return Fanout(
        mean=float(np.dot(np.arange(hist.shape[0], dtype=np.float64), hist) / rows),
        p99=int(np.searchsorted(counts, rank)),
        max=int(nonzero[-1]) if nonzero.size else 0,
    )


@nb.njit(cache=True)
def _shared_items(offsets: np.ndarray) -> int:
    total = 0
    for j in range(offsets.shape[0] - 1):
        size = offsets[j + 1] - offsets[j]
        if size > 1:
            total += size
    return total


def items_in_shared_sids(offsets: np.ndarray | None) -> int:
    """Items whose leaf (SID) holds more than one item; offsets int [n_leaves+1], None = one item per
    leaf."""
    return 0 if offsets is None else int(_shared_items(np.asarray(offsets)))


def first_token_items(starts: Sequence[np.ndarray], offsets: np.ndarray | None) -> np.ndarray:
    """int64 [nnz_0]: the items under each child of step 0 (each first token), in token order.

    The descendants of a run of rows are a run of rows at every later step, so the boundaries of the
    first tokens' subtrees at step t+1 are starts_t at their boundaries at step t."""
    bounds = np.arange(int(starts[0][-1]) + 1, dtype=np.int64)  # step 1's rows = step 0's children
    for step_starts in starts[1:]:
        bounds = np.asarray(step_starts)[bounds].astype(np.int64)
    if offsets is not None:
        bounds = np.asarray(offsets)[bounds].astype(np.int64)
    return np.diff(bounds)


# ------------------------------------------------------------------------------------------- SID keys


@dataclass(frozen=True)
class KeyLayout:
    """How SIDs of L steps are packed into uint64 words, the same for both versions: step t is a digit of
    radix `radices[t]` in word `word_of_step[t]`. Radices are the larger codebook size of the two
    versions at each step, and a word takes steps while the product of their radices stays <= 2^64, so
    equal SIDs give equal words and different SIDs different ones."""

    radices: tuple[int, ...]
    word_of_step: tuple[int, ...]

    @property
    def words(self) -> int:
        return self.word_of_step[-1] + 1

    @classmethod
    def common(cls, sizes_a: Sequence[int], sizes_b: Sequence[int]) -> KeyLayout | None:
        """The layout for two versions' codebook sizes; None when their SIDs have different lengths (then
        no SID of one equals a SID of the other)."""
        if len(sizes_a) != len(sizes_b):
            return None
        radices = tuple(max(int(a), int(b)) for a, b in zip(sizes_a, sizes_b, strict=True))
        word, product, words = 0, 1, []
        for radix in radices:
            if product * radix > 2**64:
                word, product = word + 1, 1
            product *= radix
            words.append(word)
        return cls(radices, tuple(words))


@nb.njit(cache=True, nogil=True)
def _expand_step(starts, tokens, row_lo, pos_lo, pos_hi, prev, radix, word, out):
    row = row_lo
    for pos in range(pos_lo, pos_hi):
        while starts[row + 1] <= pos:
            row += 1
        child_key(out, pos - pos_lo, prev, row - row_lo, radix, word, tokens[pos])


def leaf_keys(
    starts: Sequence[np.ndarray], tokens: Sequence[np.ndarray], layout: KeyLayout, lo: int, hi: int
) -> np.ndarray:
    """uint64 [hi - lo, layout.words]: the packed SIDs of leaves lo .. hi-1.

    starts[t]: int [rows_t + 1] and tokens[t]: int [nnz_t] of every step (memory-mapped is fine; only the
    ancestors of the leaves are read). Bottom-up, the parents of a run of positions are a run of rows
    (two binary searches); top-down, each position's key is its parent's key times the radix plus its
    token (a word a step starts is still 0 in the parent's key)."""
    steps = len(starts)
    if hi <= lo:
        return np.zeros((0, layout.words), dtype=np.uint64)
    spans = [(0, 0)] * steps
    spans[steps - 1] = (lo, hi)
    for t in range(steps - 1, 0, -1):
        pos_lo, pos_hi = spans[t]
        row_lo = rank_right(starts[t], pos_lo) - 1
        row_hi = rank_right(starts[t], pos_hi - 1)
        spans[t - 1] = (row_lo, row_hi)
    keys = kernel_keys(np.zeros((1, layout.words), dtype=np.uint64))  # step 0's one row: the empty prefix
    row_lo = 0
    for t in range(steps):
        pos_lo, pos_hi = spans[t]
        out = kernel_keys(np.empty((pos_hi - pos_lo, layout.words), dtype=np.uint64))
        _expand_step(
            np.asarray(starts[t]), np.asarray(tokens[t]), row_lo, pos_lo, pos_hi, keys,
            np.uint64(layout.radices[t]), layout.word_of_step[t], out,
        )  # fmt: skip
        keys, row_lo = out, pos_lo
    return key_rows(keys, layout.words)


@nb.njit(cache=True, nogil=True)
def _spread(offsets, leaf_lo, keys, first, out):
    leaf = leaf_lo
    for i in range(out.shape[0]):
        while offsets[leaf + 1] <= first + i:
            leaf += 1
        copy_key(out, i, keys, leaf - leaf_lo)


def rank_right(sorted_values: np.ndarray, value: int) -> int:
    """How many of `sorted_values` (an ascending integer array [n], memory-mapped is fine) are <= `value`,
    by binary search. The value is cast to the array's dtype first: given a Python int, NumPy converts an
    int32 array to int64 whole before searching (O(n) per call)."""
    info = np.iinfo(sorted_values.dtype)
    if value > info.max:
        return int(sorted_values.shape[0])
    if value < info.min:
        return 0
    return int(np.searchsorted(sorted_values, sorted_values.dtype.type(value), side="right"))


def item_leaf_span(offsets: np.ndarray | None, first: int, stop: int) -> tuple[int, int]:
    """The leaves (lo, hi) holding items first .. stop-1 (offsets None: leaf j is item j)."""
    if offsets is None:
        return first, stop
    lo = rank_right(offsets, first) - 1
    hi = rank_right(offsets, stop - 1)
    return lo, hi


def item_keys(
    starts: Sequence[np.ndarray],
    tokens: Sequence[np.ndarray],
    offsets: np.ndarray | None,
    layout: KeyLayout,
    first: int,
    stop: int,
) -> np.ndarray:
    """uint64 [stop - first, layout.words]: the packed SID of items first .. stop-1 (leaf order)."""
    lo, hi = item_leaf_span(offsets, first, stop)
    keys = leaf_keys(starts, tokens, layout, lo, hi)
    if offsets is None:
        return keys
    out = np.empty((stop - first, layout.words), dtype=np.uint64)
    _spread(np.asarray(offsets), lo, kernel_keys(keys), first, kernel_keys(out))
    return out
