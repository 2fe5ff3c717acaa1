"""Steps of the packed build sort (index.sort) that never hold two arrays of N words: the first-token
counting sort, which hands the source rows back as it consumes them, and the item order written over the
sorted words.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit, prange

from ..base.memory import fresh_zeros, is_mapped, populate_rows, release_rows

#: The scatter runs in this many rounds; after each, the source rows it consumed are handed back, so at
#: most about 1 / SCATTER_ROUNDS of the words exists twice.
SCATTER_ROUNDS = 32

#: After this many rounds (a quarter of the source handed back) the rest of the destination's pages are
#: mapped in one call (populate_rows) instead of faulting 4 KiB at a time as the later rounds' writes land:
#: the destination whole (8 B/item) beside three quarters of the source (7.5 B/item) stays below the
#: build's later peak (the step tables beside the words), and three quarters of the faults are saved.
POPULATE_AFTER_ROUNDS = SCATTER_ROUNDS // 4


def scatter_releasing(first: np.ndarray, packed_words: np.ndarray, segments: np.ndarray,
                      seg_offsets: np.ndarray) -> np.ndarray:  # fmt: skip
    """uint64 [N]: packed_words in a stable counting-sort order by first token.

    Args:
        first: uint16|uint32 [N], each row's bucket (first token or its rank).
        packed_words: uint64 [N], the words to move (catalog order).
        segments: int64 [S + 1], the contiguous row segments scattered in parallel.
        seg_offsets: int64 [S, B], where segment s writes its first word of bucket b.
    The words go into a fresh mapping (a page is mapped when its first word lands) in SCATTER_ROUNDS
    rounds, each segment taking its next slice per round; after every round the pages of the consumed
    source rows of both inputs are handed back (release_rows: a no-op unless they are fresh_zeros
    mappings), and after POPULATE_AFTER_ROUNDS rounds the destination's remaining pages are mapped in bulk.
    So source and destination together hold at most about 1.75 N words, never 2N, and `first` and
    `packed_words` read as zeros afterwards."""
    words = fresh_zeros(packed_words.shape[0], np.uint64)
    cursor = np.ascontiguousarray(seg_offsets, dtype=np.int64).copy()
    begin, length = segments[:-1], segments[1:] - segments[:-1]
    for k in range(SCATTER_ROUNDS):
        if k == POPULATE_AFTER_ROUNDS:
            populate_rows(words, 0, words.shape[0])
        lo, hi = begin + length * k // SCATTER_ROUNDS, begin + length * (k + 1) // SCATTER_ROUNDS
        _scatter_rows(first, packed_words, lo, hi, cursor, words)
        for start, stop in zip(begin.tolist(), hi.tolist(), strict=True):
            release_rows(packed_words, start, stop)
            release_rows(first, start, stop)
    return words


@njit(cache=True, parallel=True)
def _scatter_rows(first, packed_words, lo, hi, cursor, words):
    """words[cursor[s, b]++] = packed_words[i] for rows lo[s] <= i < hi[s] of each segment s, b = first[i]
    (segments in parallel: their cursors point into disjoint slices)."""
    for s in prange(lo.shape[0]):
        for i in range(lo[s], hi[s]):
            b = first[i]
            words[cursor[s, b]] = packed_words[i]
            cursor[s, b] += 1


def item_order_from(words: np.ndarray, row_bits: int, position_dtype: type, fill_wide) -> np.ndarray:
    """item_order [N] (position_dtype) from the sorted words. int32 over words in a fresh_zeros mapping:
    written over the first half of the words' own buffer, whose second half then goes back to the kernel,
    so the item order never exists beside all the words (-4 B/item at the peak). Words that are no such
    mapping (below base.memory.MAPPED_MIN_BYTES) get a separate item order.
    fill_wide(words, row_bits, out): writes the item order in parallel (either position dtype)."""
    n = words.shape[0]
    if position_dtype != np.int32 or not is_mapped(words):
        # rows past 2^31, or words whose second half could not be handed back (a small build's plain
        # array): a separate item order, written in parallel
        item_order = np.empty(n, dtype=position_dtype)
        fill_wide(words, row_bits, item_order)
        return item_order
    _pack_rows_in_place(words, row_bits, sys.byteorder == "little")
    item_order = words.view(np.int32)[:n]
    release_rows(words, (n + 1) // 2, n)
    return item_order


@njit(cache=True, nogil=True)
def _pack_rows_in_place(words, row_bits, little):
    """Rows (the low row_bits < 32 bits of each word) as int32, written over the words: int32 p is the
    low half of word p // 2 on a little-endian machine (`little`), else its high half. Word p // 2 <= p
    is read before it is written over, so one serial pass from the front is safe."""
    n = words.shape[0]
    row_mask = (np.uint64(1) << np.uint64(row_bits)) - np.uint64(1)
    for p in range(0, n, 2):
        low = words[p] & row_mask
        high = words[p + 1] & row_mask if p + 1 < n else np.uint64(0)
        words[p // 2] = (high << np.uint64(32)) | low if little else (low << np.uint64(32)) | high
