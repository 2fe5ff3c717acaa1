"""Sort SIDs and find where every prefix length starts a new distinct prefix (the expensive half of a build).

Two implementations produce the same `SortedLayout`:

* `layout_from_packed` (numba, all cores), used whenever a SID's tokens after the first plus the catalog
  row number fit in one 64-bit word (`index.pack.PackedSids`, packed as the catalog is read or from an
  [N, L] array). The first token splits the catalog into buckets (a stable counting sort);
  each bucket is sorted on its own packed (remaining tokens, row) words; contiguous bucket ranges form the
  chunks that every later pass processes independently, writing into slices whose offsets were computed
  by a counting pass first (exclusive prefix sums), so no pass needs a lock or a merge.
* `_lexsort_layout` (numpy), the multi-word fallback for SIDs too wide to pack.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np
from numba import njit, prange

from .formats import bits_for, indptr_dtype, token_dtype
from .in_place import item_order_from, scatter_releasing
from .pack import PackedSids, pack_sids, packable

#: Above this many first-token buckets per item, the first tokens are renumbered by rank first, so the
#: counting sort's per-thread histograms follow the catalog, not the first codebook (V0 may be 2^31).
SPARSE_FIRST_TOKENS_PER_ITEM = 4


@dataclass(frozen=True)
class SortedLayout:
    """The distinct prefixes of every length, in lexicographic order.

    prefix_tokens[t]    int [P_{t+1}]       token t of each distinct length-(t+1) prefix (step t's children)
    prefix_starts[t]    int32|int64 [P_t+1] first child (length-(t+1) prefix) of each length-t prefix; P_0 = 1
    prefix_counts       int64 [L]           P_1 .. P_L (P_L = distinct SIDs = leaves)
    leaf_offsets        int32|int64 [P_L+1] first sorted position of each leaf, then N (int32 while N < 2^31)
    item_order          int32|int64 [N]     catalog row at each sorted position (catalog order within a leaf)
    """

    prefix_tokens: list[np.ndarray]
    prefix_starts: list[np.ndarray]
    prefix_counts: np.ndarray
    leaf_offsets: np.ndarray
    item_order: np.ndarray


def sort_and_mark(
    sids: np.ndarray, codebook_sizes: Sequence[int], workers: int | None = None
) -> SortedLayout:
    """sids int [N, L] (validated: tokens in range) -> SortedLayout. workers: threads (None = all cores)."""
    if not packable(sids.shape[0], codebook_sizes):
        return _lexsort_layout(sids)
    return layout_from_packed(pack_sids(sids, codebook_sizes), workers)


def layout_from_packed(
    packed: PackedSids, workers: int | None = None, *, consume: bool = False
) -> SortedLayout:
    """PackedSids -> SortedLayout. workers: threads (None = all cores). consume: take the packed arrays
    over (PackedSids.release) and free them once sorted, so the build never holds two sets of words
    (`packed` is empty afterwards)."""
    threads = max(1, min(int(workers or os.cpu_count() or 1), numba.config.NUMBA_NUM_THREADS))
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return _parallel_layout(packed, threads, consume)
    finally:
        numba.set_num_threads(previous)


# ---------------------------------------------------------------------------------------------------------
# numpy reference / multi-word fallback
# ---------------------------------------------------------------------------------------------------------


def _lexsort_layout(sids: np.ndarray) -> SortedLayout:
    n, num_steps = sids.shape
    order = np.lexsort(sids.T[::-1])
    s = sids[order]
    # first_diff[i]: first column where sorted row i+1 differs from row i (L when equal). Rows are sorted,
    # so row i+1 starts a new length-(t+1) prefix exactly when first_diff[i] <= t.
    first_diff = np.zeros(n, dtype=np.uint8)
    if n > 1:
        diff = s[1:] != s[:-1]
        first_diff[1:] = np.where(diff.any(axis=1), diff.argmax(axis=1), num_steps)
    tokens, starts, counts = [], [], []
    prev_new = None
    for t in range(num_steps):
        new = first_diff <= t
        tokens.append(s[new, t])
        child_rank = np.cumsum(new) - 1
        count = int(child_rank[-1]) + 1
        # A new length-t prefix is also a new length-(t+1) prefix, so its first child is the child that
        # starts at the same sorted position.
        first = np.zeros(1, np.int64) if prev_new is None else child_rank[prev_new]
        starts.append(np.append(first, count).astype(np.int64))
        counts.append(count)
        prev_new = new
    position_dtype = np.int32 if n < 2**31 else np.int64
    leaf_offsets = np.append(np.flatnonzero(prev_new), n).astype(position_dtype)
    counts_array = np.asarray(counts, np.int64)
    return SortedLayout(tokens, starts, counts_array, leaf_offsets, order.astype(position_dtype))


# ---------------------------------------------------------------------------------------------------------
# parallel build
# ---------------------------------------------------------------------------------------------------------


def _parallel_layout(packed: PackedSids, threads: int, consume: bool = False) -> SortedLayout:
    n, num_steps, codebook_sizes = packed.num_items, packed.num_steps, packed.codebook_sizes
    token_bits = [bits_for(int(v)) for v in codebook_sizes]
    row_bits, shifts = packed.row_bits, packed.shifts
    masks = np.array([(1 << b) - 1 for b in token_bits], dtype=np.uint64)
    first, packed_words = packed.release() if consume else (packed.first, packed.words)
    first_values = None
    if codebook_sizes[0] > SPARSE_FIRST_TOKENS_PER_ITEM * n:
        # Bucket by the rank of the first token among those present: memory O(N), not O(V0).
        first_values = np.unique(first)
        first = np.searchsorted(first_values, first).astype(np.uint32)
    num_buckets = codebook_sizes[0] if first_values is None else int(first_values.shape[0])

    # 1. Stable counting sort by first token, moving each packed word (tokens 1.., row) to its bucket. The
    # source rows are handed back as they are consumed, so the words never exist twice.
    if not consume:  # the caller keeps its PackedSids as they are
        first, packed_words = first.copy(), packed_words.copy()
    segments = np.linspace(0, n, threads + 1).astype(np.int64)
    seg_hist = _segment_histograms(first, segments, num_buckets)
    bucket_sizes = seg_hist.sum(axis=0)
    bucket_starts = np.zeros(num_buckets + 1, dtype=np.int64)
    np.cumsum(bucket_sizes, out=bucket_starts[1:])
    # Segment s writes bucket b from bucket_starts[b] + (rows of b in earlier segments): stable order.
    seg_offsets = bucket_starts[:-1][None, :] + np.cumsum(seg_hist, axis=0) - seg_hist
    words = scatter_releasing(first, packed_words, segments, seg_offsets)
    del first, packed_words, seg_hist, seg_offsets

    # 2. Chunks: contiguous bucket ranges holding about n / (8 * threads) rows each.
    chunk_buckets = _chunk_buckets(bucket_starts, 8 * threads)

    # 3. Sort each bucket's packed words. Equal tokens tie-break on the row bits: catalog order.
    _sort_buckets(words, bucket_starts, chunk_buckets, row_bits, sum(token_bits[1:]))

    # 4. Counting pass: first differing step per sorted position, and new prefixes per chunk and step.
    first_diff = np.empty(n, dtype=np.uint8)
    chunk_counts = _mark_first_diff(words, bucket_starts, chunk_buckets, shifts, num_steps, first_diff)
    # Exclusive prefix sums: chunk c's first new prefix of length t+1 has global rank chunk_offsets[c, t].
    chunk_offsets = np.cumsum(chunk_counts, axis=0) - chunk_counts
    counts = chunk_counts.sum(axis=0)

    # 5. Fill every step's slices chunk by chunk.
    tokens, starts = [], []
    chunk_rows = np.zeros(chunk_counts.shape[0], dtype=np.int64)
    for t in range(num_steps):
        step_tokens = np.empty(int(counts[t]), dtype=token_dtype(codebook_sizes[t]))
        if t == 0:
            step_starts = np.array([0, counts[0]], dtype=indptr_dtype(int(counts[0])))
            _fill_first_tokens(bucket_starts, step_tokens)
            if first_values is not None:  # ranks back to tokens
                step_tokens = first_values[step_tokens.astype(np.int64)].astype(step_tokens.dtype)
        else:
            # the indptr dtype the table keeps (int32 below 2^31 children): no int64 copy to narrow later
            step_starts = np.empty(int(counts[t - 1]) + 1, dtype=indptr_dtype(int(counts[t])))
            step_starts[-1] = counts[t]
            chunk_rows = np.ascontiguousarray(chunk_offsets[:, t - 1])
            _fill_step(
                words,
                first_diff,
                bucket_starts,
                chunk_buckets,
                np.ascontiguousarray(chunk_offsets[:, t]),
                chunk_rows,
                t,
                shifts[t],
                masks[t],
                step_tokens,
                step_starts,
            )
        tokens.append(step_tokens)
        starts.append(step_starts)

    # int32 while row numbers fit: 4 bytes per item and leaf less at the build's peak
    position_dtype = np.int32 if n < 2**31 else np.int64
    # item_order first, then the words (8 B/item) go, and only then the leaf offsets (4 B/leaf) exist:
    # the two never overlap the words at the build's peak.
    item_order = item_order_from(words, row_bits, position_dtype, _fill_item_order)
    del words
    leaf_offsets = np.empty(int(counts[-1]) + 1, dtype=position_dtype)
    leaf_offsets[-1] = n
    _fill_leaf_offsets(
        first_diff,
        bucket_starts,
        chunk_buckets,
        np.ascontiguousarray(chunk_offsets[:, -1]),
        num_steps - 1,
        leaf_offsets,
    )
    del first_diff
    return SortedLayout(tokens, starts, counts.astype(np.int64), leaf_offsets, item_order)


def _chunk_buckets(bucket_starts: np.ndarray, target_chunks: int) -> np.ndarray:
    """int64 [C+1]: bucket boundaries of C chunks, cutting where cumulative rows cross multiples of n/target.

    Cuts fall only on bucket boundaries, so no length >= 1 prefix spans two chunks: every chunk can count and
    fill its prefixes without looking at its neighbours.
    """
    n = int(bucket_starts[-1])
    targets = np.linspace(0, n, target_chunks + 1)[1:-1]
    cuts = np.searchsorted(bucket_starts, targets, side="left")
    bounds = np.unique(np.concatenate([[0], cuts, [len(bucket_starts) - 1]]))
    return bounds.astype(np.int64)


@njit(cache=True, parallel=True)
def _segment_histograms(first, segments, num_buckets):
    """int64 [S, buckets]: first-token counts of each contiguous input segment."""
    num_segments = segments.shape[0] - 1
    hist = np.zeros((num_segments, num_buckets), dtype=np.int64)
    for s in prange(num_segments):
        for i in range(segments[s], segments[s + 1]):
            hist[s, first[i]] += 1
    return hist


@njit(cache=True, parallel=True)
def _sort_buckets(words, bucket_starts, chunk_buckets, key_lo, key_bits):
    """Sort each bucket's words by their token bits [key_lo, key_lo + key_bits), keeping row order on ties.

    The scatter was stable, so every bucket already lists its rows in catalog order; a stable LSD radix
    sort on the token bits alone keeps that order among equal SIDs without ever comparing row bits.
    """
    for c in prange(chunk_buckets.shape[0] - 1):
        largest = 0
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            largest = max(largest, bucket_starts[b + 1] - bucket_starts[b])
        scratch = np.empty(largest, dtype=words.dtype)
        histogram = np.empty(1 << RADIX_BITS, dtype=np.int64)
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            lo, hi = bucket_starts[b], bucket_starts[b + 1]
            if hi - lo <= INSERTION_SORT_MAX:
                _insertion_sort(words, lo, hi, key_lo)
            else:
                _radix_sort(words[lo:hi], scratch[: hi - lo], histogram, key_lo, key_bits)


RADIX_BITS = 11
INSERTION_SORT_MAX = 48


@njit(cache=True, inline="always")
def _insertion_sort(words, lo, hi, key_lo):
    shift = np.uint64(key_lo)
    for i in range(lo + 1, hi):
        word = words[i]
        key = word >> shift
        j = i - 1
        while j >= lo and (words[j] >> shift) > key:
            words[j + 1] = words[j]
            j -= 1
        words[j + 1] = word


@njit(cache=True)
def _radix_sort(values, scratch, histogram, key_lo, key_bits):
    """Stable LSD radix sort of `values` in place on bits [key_lo, key_lo + key_bits); digits that are the
    same for every value are skipped (common in skewed catalogs)."""
    n = values.shape[0]
    src, dst = values, scratch
    digit_mask = np.uint64((1 << RADIX_BITS) - 1)
    for lo_bit in range(key_lo, key_lo + key_bits, RADIX_BITS):
        shift = np.uint64(lo_bit)
        histogram[:] = 0
        for i in range(n):
            histogram[(src[i] >> shift) & digit_mask] += 1
        if histogram[(src[0] >> shift) & digit_mask] == n:
            continue
        total = 0
        for d in range(histogram.shape[0]):
            count = histogram[d]
            histogram[d] = total
            total += count
        for i in range(n):
            d = (src[i] >> shift) & digit_mask
            dst[histogram[d]] = src[i]
            histogram[d] += 1
        src, dst = dst, src
    if src is not values:
        values[:] = src


@njit(cache=True, parallel=True)
def _mark_first_diff(words, bucket_starts, chunk_buckets, shifts, num_steps, first_diff):
    """first_diff[p]: first step whose token differs from sorted position p-1 (num_steps if none).

    Returns int64 [C, L]: per chunk, how many positions start a new length-(t+1) prefix, i.e. first_diff <= t.
    The first row of a bucket differs at step 0. Inside a bucket, tokens 1.. are the high bits of the word,
    most significant first, so the first differing step is the first t whose bits above shifts[t] differ.
    """
    num_chunks = chunk_buckets.shape[0] - 1
    counts = np.zeros((num_chunks, num_steps), dtype=np.int64)
    for c in prange(num_chunks):
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            lo, hi = bucket_starts[b], bucket_starts[b + 1]
            for p in range(lo, hi):
                if p == lo:
                    f = 0
                else:
                    f = num_steps
                    for t in range(1, num_steps):
                        if (words[p] >> np.uint64(shifts[t])) != (words[p - 1] >> np.uint64(shifts[t])):
                            f = t
                            break
                first_diff[p] = f
                for t in range(f, num_steps):
                    counts[c, t] += 1
    return counts


@njit(cache=True)
def _fill_first_tokens(bucket_starts, step_tokens):
    """Step 0's children: the first tokens whose bucket is non-empty, ascending."""
    j = 0
    for b in range(bucket_starts.shape[0] - 1):
        if bucket_starts[b + 1] > bucket_starts[b]:
            step_tokens[j] = b
            j += 1


@njit(cache=True, parallel=True)
def _fill_step(
    words,
    first_diff,
    bucket_starts,
    chunk_buckets,
    child_offsets,
    row_offsets,
    t,
    shift,
    mask,
    step_tokens,
    step_starts,
):
    """Write step t (t >= 1): children tokens and each row's first child.

    A position with first_diff <= t starts a new child (length-(t+1) prefix); with first_diff <= t-1 it also
    starts a new row (length-t prefix), whose first child is the child starting at that same position.
    """
    for c in prange(chunk_buckets.shape[0] - 1):
        child = child_offsets[c]
        row = row_offsets[c]
        for p in range(bucket_starts[chunk_buckets[c]], bucket_starts[chunk_buckets[c + 1]]):
            f = first_diff[p]
            if f <= t:
                if f <= t - 1:
                    step_starts[row] = child
                    row += 1
                step_tokens[child] = (words[p] >> np.uint64(shift)) & mask
                child += 1


@njit(cache=True, parallel=True)
def _fill_leaf_offsets(first_diff, bucket_starts, chunk_buckets, leaf_chunk_offsets, last, leaf_offsets):
    """leaf_offsets[j]: sorted position where leaf j starts."""
    for c in prange(chunk_buckets.shape[0] - 1):
        leaf = leaf_chunk_offsets[c]
        for p in range(bucket_starts[chunk_buckets[c]], bucket_starts[chunk_buckets[c + 1]]):
            if first_diff[p] <= last:
                leaf_offsets[leaf] = p
                leaf += 1


@njit(cache=True, parallel=True)
def _fill_item_order(words, row_bits, item_order):
    """item_order[p]: catalog row at sorted position p (the low bits of its word)."""
    row_mask = (np.uint64(1) << np.uint64(row_bits)) - np.uint64(1)
    for p in prange(words.shape[0]):
        item_order[p] = words[p] & row_mask
