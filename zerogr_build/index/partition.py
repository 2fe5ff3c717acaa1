"""The partitioned build's index math (docs/scaling.md, "When one machine is not enough"): cut a catalog's
first-token ranges into P partitions, route each SID to its partition, pack it with partition-local row
numbers, build each partition's sorted layout alone, and place every partition's slice in the global
tables. Pure functions: numpy/numba arrays in, arrays out; no engine, no I/O.

Keys. A SID's routing key is token0 * V1 + token1 (V1 = 1 for one-token SIDs). Partitions own contiguous
key ranges `bounds[p] <= key < bounds[p + 1]`. A cut between two first tokens leaves no prefix in two
partitions; a cut inside a first token that holds more than a partition's share (two-token cut) leaves
exactly one prefix of length 1 in two or more consecutive partitions, which the assembly merges: that
first token is one child of step 0 and one row of step 1, whose children come from each partition in turn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from .pack import PackedSids, word_shifts
from .sort import SortedLayout, layout_from_packed, sort_and_mark


def second_size(codebook_sizes: Sequence[int]) -> int:
    """V1, the multiplier of the routing key (1 for one-token SIDs)."""
    return int(codebook_sizes[1]) if len(codebook_sizes) > 1 else 1


def heavy_first_tokens(tokens: np.ndarray, counts: np.ndarray, parts: int, num_steps: int) -> np.ndarray:
    """The first tokens (int64 [k], ascending) holding more items than one partition's share N/P, which a
    cut may split on their second token; none for one-token SIDs or one partition.
    tokens/counts: int64 [U], the catalog's first tokens (ascending) and their item counts."""
    total = int(counts.sum())
    if num_steps < 2 or parts < 2:
        return np.zeros(0, dtype=np.int64)
    return tokens[counts * parts > total].astype(np.int64)


def cut_bounds(
    tokens: np.ndarray,
    counts: np.ndarray,
    parts: int,
    codebook_sizes: Sequence[int],
    heavy_counts: np.ndarray | None = None,
) -> np.ndarray:
    """int64 [P + 1]: key bounds of P partitions of about N/P items each (some may be empty).

    tokens/counts: int64 [U], the first tokens present (ascending) and their item counts.
    heavy_counts: int64 [k, V1], item counts per second token of each heavy first token
    (heavy_first_tokens, same order); those tokens are cut on their second token, the others whole.
    Cuts fall where the cumulative count first reaches p * N / P (as index.sort._chunk_buckets cuts
    threads' chunks).
    """
    v1 = second_size(codebook_sizes)
    total_keys = int(codebook_sizes[0]) * v1
    tokens = np.asarray(tokens, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    unit_keys, unit_counts = tokens * v1, counts
    heavy = heavy_first_tokens(tokens, counts, parts, len(codebook_sizes))
    if heavy.size and heavy_counts is not None:
        keep = ~np.isin(tokens, heavy)
        second_tokens = np.nonzero(heavy_counts)
        split_keys = heavy[second_tokens[0]] * v1 + second_tokens[1]
        split_counts = heavy_counts[second_tokens]
        unit_keys = np.concatenate([unit_keys[keep], split_keys])
        unit_counts = np.concatenate([unit_counts[keep], split_counts])
        order = np.argsort(unit_keys, kind="stable")
        unit_keys, unit_counts = unit_keys[order], unit_counts[order]
    starts = np.zeros(unit_counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(unit_counts, out=starts[1:])
    targets = np.arange(1, parts) * (int(starts[-1]) / parts)
    cut_units = np.searchsorted(starts, targets, side="left")
    inner = np.append(unit_keys, total_keys)[cut_units]
    return np.concatenate([[0], inner, [total_keys]]).astype(np.int64)


def routing_keys(tokens: np.ndarray, codebook_sizes: Sequence[int]) -> np.ndarray:
    """int64 [n]: token0 * V1 + token1 of each SID (tokens int [n, L], validated)."""
    key = tokens[:, 0].astype(np.int64) * second_size(codebook_sizes)
    if tokens.shape[1] > 1:
        key += tokens[:, 1]
    return key


def partition_of(tokens: np.ndarray, bounds: np.ndarray, codebook_sizes: Sequence[int]) -> np.ndarray:
    """int64 [n]: the partition owning each SID (tokens int [n, L]; bounds from cut_bounds)."""
    parts = bounds.shape[0] - 1
    found = np.searchsorted(bounds, routing_keys(tokens, codebook_sizes), side="right") - 1
    return np.minimum(found, parts - 1)


def partition_sizes(
    tokens: np.ndarray,
    counts: np.ndarray,
    bounds: np.ndarray,
    codebook_sizes: Sequence[int],
    heavy_counts=None,
) -> np.ndarray:
    """int64 [P]: items per partition, from the first-token counts (and the heavy tokens' second-token
    counts where a bound falls inside a first token)."""
    v1 = second_size(codebook_sizes)
    tokens = np.asarray(tokens, dtype=np.int64)
    keys, weights = tokens * v1, np.asarray(counts, dtype=np.int64)
    heavy = heavy_first_tokens(tokens, weights, bounds.shape[0] - 1, len(codebook_sizes))
    if heavy.size and heavy_counts is not None:
        keep = ~np.isin(tokens, heavy)
        second = np.nonzero(heavy_counts)
        keys = np.concatenate([keys[keep], heavy[second[0]] * v1 + second[1]])
        weights = np.concatenate([weights[keep], heavy_counts[second]])
    owner = np.minimum(np.searchsorted(bounds, keys, side="right") - 1, bounds.shape[0] - 2)
    return np.bincount(owner, weights=weights, minlength=bounds.shape[0] - 1).astype(np.int64)


def partition_shifts(sizes_per_partition: np.ndarray, codebook_sizes: Sequence[int]) -> np.ndarray:
    """int64 [P, L]: the packed-word shifts of each partition (its row bits follow its own row count)."""
    return np.stack([word_shifts(codebook_sizes, int(n)) for n in sizes_per_partition])


def pack_piece(tokens: np.ndarray, shifts: np.ndarray, first_dtype: np.dtype) -> PackedSids:
    """Pack validated tokens int [k, L] with rows 0..k-1 (a piece of one partition; the partition adds the
    piece's offset to the words, which never carries into the token bits: the row bits hold its size)."""
    first = np.empty(tokens.shape[0], dtype=first_dtype)
    words = np.empty(tokens.shape[0], dtype=np.uint64)
    _pack_rows(np.ascontiguousarray(tokens), shifts, first, words)
    return PackedSids(first, words, ())


@njit(cache=True, nogil=True)
def _pack_rows(tokens, shifts, first, words):
    for i in range(tokens.shape[0]):
        word = np.uint64(i)
        for t in range(1, tokens.shape[1]):
            word |= np.uint64(tokens[i, t]) << np.uint64(shifts[t])
        first[i] = tokens[i, 0]
        words[i] = word


def partition_layout_packed(
    firsts: Sequence[np.ndarray], words: Sequence[np.ndarray], codebook_sizes: Sequence[int], workers=None
) -> SortedLayout:
    """The sorted layout of one partition from its pieces in catalog order (pack_piece: rows numbered
    from 0 within each piece): the local builder's layout_from_packed on partition-local rows."""
    lengths = [int(w.shape[0]) for w in words]
    first = np.concatenate(firsts) if firsts else np.zeros(0, np.uint16)
    packed_words = np.empty(sum(lengths), dtype=np.uint64)
    row = 0
    for piece, length in zip(words, lengths, strict=True):
        np.add(piece, np.uint64(row), out=packed_words[row : row + length])
        row += length
    packed = PackedSids(first, packed_words, tuple(int(v) for v in codebook_sizes))
    return layout_from_packed(packed, workers, consume=True)


def partition_layout_tokens(tokens: Sequence[np.ndarray], codebook_sizes: Sequence[int]) -> SortedLayout:
    """The sorted layout of one partition whose keys do not fit one word: the local builder's multi-word
    path on its tokens int [n_p, L] (pieces in catalog order)."""
    return sort_and_mark(np.concatenate(tokens), codebook_sizes)


def global_offsets(counts: np.ndarray, continues: np.ndarray) -> np.ndarray:
    """int64 [P, L]: partition p's first new length-(t+1) prefix in the global order.

    counts: int64 [P, L], each partition's prefix_counts. continues: bool [P], partition p starts inside
    the first token the previous non-empty partition ended with (that length-1 prefix is counted once)."""
    own = np.asarray(counts, dtype=np.int64).copy()
    own[:, 0] -= np.asarray(continues, dtype=np.int64)
    return np.cumsum(own, axis=0) - own


def global_totals(counts: np.ndarray, continues: np.ndarray) -> np.ndarray:
    """int64 [L]: distinct prefixes of each length in the whole catalog (P_1 .. P_L)."""
    totals = np.asarray(counts, dtype=np.int64).sum(axis=0)
    totals[0] -= int(np.asarray(continues).sum())
    return totals


def dense_rows(starts: np.ndarray, tokens: np.ndarray, child_offset: int, codebook_size: int) -> np.ndarray:
    """int32 [rows, V]: a dense step's rows from sparse ones (starts int [rows + 1] local child offsets,
    tokens int [nnz]), children numbered from `child_offset`; -1 where a token has no child."""
    rows = starts.shape[0] - 1
    out = np.full((rows, codebook_size), -1, dtype=np.int32)
    counts = np.diff(np.asarray(starts, dtype=np.int64))
    parents = np.repeat(np.arange(rows, dtype=np.int64), counts)
    first = int(starts[0])
    nnz = int(starts[-1]) - first
    out[parents, np.asarray(tokens[first : first + nnz], dtype=np.int64)] = np.arange(
        child_offset, child_offset + nnz, dtype=np.int64
    )
    return out
