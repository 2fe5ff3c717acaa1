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

from .buckets import (
    fill_first_tokens,
    fill_item_order,
    fill_leaf_offsets,
    fill_steps,
    merge_edge_bits,
    sort_and_mark_buckets,
)
from .formats import bits_for, indptr_dtype, token_dtype
from .in_place import item_order_from, scatter_releasing
from .pack import PackedSids, pack_by_first_token, pack_sids, packable, word_shifts

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
    n, sizes = sids.shape[0], tuple(int(v) for v in codebook_sizes)
    if not packable(n, sizes):
        return _lexsort_layout(sids)
    if sizes[0] > SPARSE_FIRST_TOKENS_PER_ITEM * n:  # first tokens renumbered by rank: the packed path
        return layout_from_packed(pack_sids(sids, sizes), workers, consume=True)
    sids = np.ascontiguousarray(sids)
    return _with_threads(workers, lambda threads: _layout_from_sids(sids, sizes, threads))


def layout_from_packed(
    packed: PackedSids, workers: int | None = None, *, consume: bool = False
) -> SortedLayout:
    """PackedSids -> SortedLayout. workers: threads (None = all cores). consume: take the packed arrays
    over (PackedSids.release) and free them once sorted, so the build never holds two sets of words
    (`packed` is empty afterwards)."""
    return _with_threads(workers, lambda threads: _parallel_layout(packed, threads, consume))


def _with_threads(workers: int | None, run):
    """run(threads) with numba's thread count set to `workers` (None = all cores) for its duration."""
    threads = max(1, min(int(workers or os.cpu_count() or 1), numba.config.NUMBA_NUM_THREADS))
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return run(threads)
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
    n, codebook_sizes = packed.num_items, packed.codebook_sizes
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
    bucket_starts, seg_offsets = _bucket_offsets(_segment_histograms(first, segments, num_buckets))
    words = scatter_releasing(first, packed_words, segments, seg_offsets)
    del first, packed_words, seg_offsets
    return _layout_from_buckets(words, bucket_starts, first_values, codebook_sizes, threads)


def _layout_from_sids(sids: np.ndarray, sizes: tuple[int, ...], threads: int) -> SortedLayout:
    """The in-memory build: sids int [N, L] (C order, validated) packed and scattered into first-token
    buckets in one pass (pack.pack_by_first_token), then sorted like the packed path."""
    n = sids.shape[0]
    segments = np.linspace(0, n, threads + 1).astype(np.int64)
    bucket_starts, seg_offsets = _bucket_offsets(_segment_histograms(sids[:, 0], segments, sizes[0]))
    words = pack_by_first_token(sids, word_shifts(sizes, n), segments, seg_offsets)
    return _layout_from_buckets(words, bucket_starts, None, sizes, threads)


def _bucket_offsets(seg_hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From per-segment bucket counts int64 [S, B]: (bucket_starts int64 [B+1], seg_offsets int64 [S, B]),
    where segment s writes its first word of bucket b: bucket_starts[b] + (rows of b in earlier segments),
    so the scatter is stable."""
    bucket_starts = np.zeros(seg_hist.shape[1] + 1, dtype=np.int64)
    np.cumsum(seg_hist.sum(axis=0), out=bucket_starts[1:])
    return bucket_starts, bucket_starts[:-1][None, :] + np.cumsum(seg_hist, axis=0) - seg_hist


def _layout_from_buckets(
    words: np.ndarray,
    bucket_starts: np.ndarray,
    first_values: np.ndarray | None,
    codebook_sizes: tuple[int, ...],
    threads: int,
) -> SortedLayout:
    """The rest of the packed build, from the words in first-token buckets (uint64 [N], each bucket in
    catalog order) and bucket_starts int64 [B+1]; first_values: the first token of each bucket when buckets
    are ranks (None: bucket b is token b). Takes `words` over."""
    n, num_steps = words.shape[0], len(codebook_sizes)
    token_bits = [bits_for(int(v)) for v in codebook_sizes]
    row_bits, shifts = bits_for(n), word_shifts(codebook_sizes, n)
    masks = np.array([(1 << b) - 1 for b in token_bits], dtype=np.uint64)

    # 2. Chunks: contiguous bucket ranges holding about n / (8 * threads) rows each.
    chunk_buckets = _chunk_buckets(bucket_starts, 8 * threads)

    # 3. Sort each bucket's packed words (equal tokens keep catalog order) and, in the same pass, count the
    # new prefixes per chunk and step and mark where each leaf starts (1 bit per item).
    leaf_bits = np.zeros((n + 7) // 8, dtype=np.uint8)
    edges = np.zeros((chunk_buckets.shape[0] - 1, 2), dtype=np.uint8)
    chunk_counts = sort_and_mark_buckets(
        words, bucket_starts, chunk_buckets, row_bits, sum(token_bits[1:]), shifts, leaf_bits, edges
    )
    merge_edge_bits(leaf_bits, edges, bucket_starts, chunk_buckets)
    # Exclusive prefix sums: chunk c's first new prefix of length t+1 has global rank chunk_offsets[c, t].
    chunk_offsets = np.ascontiguousarray(np.cumsum(chunk_counts, axis=0) - chunk_counts)
    counts = chunk_counts.sum(axis=0)

    # 4. Every step's tokens and row starts: step 0 from the buckets, the others in passes over the words.
    tokens, starts = [], []
    for t in range(num_steps):
        tokens.append(np.empty(int(counts[t]), dtype=token_dtype(codebook_sizes[t])))
        # the indptr dtype the table keeps (int32 below 2^31 children): no int64 copy to narrow later
        rows = 1 if t == 0 else int(counts[t - 1])
        starts.append(np.empty(rows + 1, dtype=indptr_dtype(int(counts[t]))))
        starts[t][-1] = counts[t]
    starts[0][0] = 0
    fill_first_tokens(bucket_starts, tokens[0])
    if first_values is not None:  # ranks back to tokens
        tokens[0] = first_values[tokens[0].astype(np.int64)].astype(tokens[0].dtype)
    for lo, hi in _same_dtype_runs(tokens, starts):
        fill_steps(
            words, bucket_starts, chunk_buckets, chunk_offsets, lo, shifts, masks,
            tuple(tokens[lo:hi]), tuple(starts[lo:hi]),
        )  # fmt: skip

    # int32 while row numbers fit: 4 bytes per item and leaf less at the build's peak
    position_dtype = np.int32 if n < 2**31 else np.int64
    # item_order first, then the words (8 B/item) go, and only then the leaf offsets (4 B/leaf) exist:
    # the two never overlap the words at the build's peak.
    item_order = item_order_from(words, row_bits, position_dtype, fill_item_order)
    del words
    leaf_offsets = np.empty(int(counts[-1]) + 1, dtype=position_dtype)
    leaf_offsets[-1] = n
    leaf_chunk_offsets = np.ascontiguousarray(chunk_offsets[:, -1])
    fill_leaf_offsets(leaf_bits, bucket_starts, chunk_buckets, leaf_chunk_offsets, leaf_offsets)
    del leaf_bits
    return SortedLayout(tokens, starts, counts.astype(np.int64), leaf_offsets, item_order)


def _same_dtype_runs(tokens: list[np.ndarray], starts: list[np.ndarray]) -> list[tuple[int, int]]:
    """[lo, hi) runs of steps 1.. whose tokens and starts share dtypes: each run is filled in one pass
    (fill_steps takes tuples of same-typed arrays). Usually one run: steps 1..L-1."""
    runs: list[tuple[int, int]] = []
    for t in range(1, len(tokens)):
        kind = (tokens[t].dtype, starts[t].dtype)
        if runs and kind == (tokens[t - 1].dtype, starts[t - 1].dtype):
            runs[-1] = (runs[-1][0], t + 1)
        else:
            runs.append((t, t + 1))
    return runs


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
