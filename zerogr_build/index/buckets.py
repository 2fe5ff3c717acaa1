"""Per-chunk kernels of the packed build sort (index.sort): after the first-token counting sort, every
bucket holds the packed words (tokens 1.., catalog row) of the SIDs sharing a first token. Chunks are
contiguous bucket ranges, so every kernel here runs its chunks in parallel without locks.

* `sort_and_mark_buckets`: sort each bucket and, while it is still in cache, count the new prefixes of
  every length and mark where each leaf starts (one bit per item: no per-item array beside the words).
* `fill_steps`: write the tokens and row starts of several steps in one pass over the sorted words,
  finding each position's first differing step again from the words (cheaper than storing it), bucket
  by bucket while the bucket is in cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

RADIX_BITS = 11
MIN_RADIX_BITS = 6
INSERTION_SORT_MAX = 48


@njit(cache=True, parallel=True)
def sort_and_mark_buckets(words, bucket_starts, chunk_buckets, key_lo, key_bits, shifts, leaf_bits, edges):
    """Sort each bucket's words by their token bits [key_lo, key_lo + key_bits), keeping row order on ties,
    count the new prefixes and mark where each leaf starts.

    words uint64 [N] (each bucket in catalog order: the scatter is stable), bucket_starts int64 [B+1],
    chunk_buckets int64 [C+1], shifts int64 [L] (where token t starts in a word). A stable LSD radix sort
    on the token bits alone keeps catalog order among equal SIDs without comparing row bits.
    leaf_bits uint8 [ceil(N / 8)] (zeros in, output): bit p % 8 of byte p // 8 set where sorted position p
    starts a leaf (a distinct SID), except in the first and last byte of each chunk's positions, which a
    neighbouring chunk may share: those bits go to edges uint8 [C, 2] (zeros in) for the caller to OR in
    (merge_edge_bits).
    Returns int64 [C, L]: per chunk, how many positions start a new length-(t+1) prefix
    (first_differing_step <= t).
    """
    num_chunks, num_steps = chunk_buckets.shape[0] - 1, shifts.shape[0]
    counts = np.zeros((num_chunks, num_steps), dtype=np.int64)
    for c in prange(num_chunks):
        largest = 0
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            largest = max(largest, bucket_starts[b + 1] - bucket_starts[b])
        scratch = np.empty(largest, dtype=words.dtype)
        histogram = np.empty(1 << RADIX_BITS, dtype=np.int64)
        diffs = np.zeros(num_steps + 1, dtype=np.int64)  # positions per first differing step
        head = bucket_starts[chunk_buckets[c]] >> 3
        tail = (bucket_starts[chunk_buckets[c + 1]] - 1) >> 3
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            lo, hi = bucket_starts[b], bucket_starts[b + 1]
            if hi - lo <= INSERTION_SORT_MAX:
                _insertion_sort(words, lo, hi, key_lo)
            else:
                _radix_sort(words[lo:hi], scratch[: hi - lo], histogram, key_lo, key_bits)
            for p in range(lo, hi):
                f = first_differing_step(words, lo, p, shifts)
                diffs[f] += 1
                if f < num_steps:
                    bit = np.uint8(1 << (p & 7))
                    byte = p >> 3
                    if byte == head:
                        edges[c, 0] |= bit
                    elif byte == tail:
                        edges[c, 1] |= bit
                    else:
                        leaf_bits[byte] |= bit
        total = 0
        for t in range(num_steps):
            total += diffs[t]
            counts[c, t] = total
    return counts


def merge_edge_bits(
    leaf_bits: np.ndarray, edges: np.ndarray, bucket_starts: np.ndarray, chunk_buckets: np.ndarray
) -> None:
    """OR the edge bytes sort_and_mark_buckets set aside into leaf_bits (two chunks may share a byte)."""
    lo, hi = bucket_starts[chunk_buckets[:-1]], bucket_starts[chunk_buckets[1:]]
    used = hi > lo
    np.bitwise_or.at(leaf_bits, lo[used] >> 3, edges[used, 0])
    np.bitwise_or.at(leaf_bits, (hi[used] - 1) >> 3, edges[used, 1])


@njit(cache=True, inline="always")
def first_differing_step(words, lo, p, shifts):
    """The first step whose token differs between sorted positions p-1 and p of a bucket starting at lo:
    0 at the bucket's first position (its first token is new), L for a repeated SID. Tokens 1.. are the high
    bits of the word, most significant first, so x = word ^ previous word differs first at step t exactly
    when x >= 2^shifts[t] and x < 2^shifts[t'] for every t' < t. The bounds fall with t, so the step is
    1 + the number of steps t >= 1 with x < 2^shifts[t]: counted without a branch."""
    if p == lo:
        return 0
    changed = words[p] ^ words[p - 1]
    f = 1
    for t in range(1, shifts.shape[0]):
        f += changed < (np.uint64(1) << np.uint64(shifts[t]))
    return f


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
    same for every value are skipped (common in skewed catalogs). Digits are RADIX_BITS wide, narrower for
    a short array (about log2 of its length, at least MIN_RADIX_BITS): a pass costs its length plus twice
    the histogram, so a few hundred values sort faster in more passes over a smaller histogram."""
    n = values.shape[0]
    src, dst = values, scratch
    digit_bits = MIN_RADIX_BITS
    while digit_bits < RADIX_BITS and (n >> (digit_bits + 1)) > 0:
        digit_bits += 1
    digit_mask = np.uint64((1 << digit_bits) - 1)
    for lo_bit in range(key_lo, key_lo + key_bits, digit_bits):
        shift = np.uint64(lo_bit)
        histogram[: 1 << digit_bits] = 0
        for i in range(n):
            histogram[(src[i] >> shift) & digit_mask] += 1
        if histogram[(src[0] >> shift) & digit_mask] == n:
            continue
        total = 0
        for d in range(1 << digit_bits):
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
def fill_steps(words, bucket_starts, chunk_buckets, chunk_offsets, t_lo, shifts, masks, tokens, starts):
    """Write steps t_lo .. t_lo + k - 1 (t_lo >= 1) in one pass over the sorted words: tokens[i] (children
    tokens of step t_lo + i) and starts[i] (each row's first child), k = len(tokens), tuples of same-typed
    arrays.

    chunk_offsets int64 [C, L]: chunk c's first new length-(t+1) prefix has global rank chunk_offsets[c, t].
    With f the first differing step of a position (first_differing_step): f <= t starts a new child
    (length-(t+1) prefix) of step t; f <= t-1 also starts a new row (length-t prefix), whose first child is
    the child at that position. Each bucket's steps are found once, then every step is written from them
    while the bucket is in cache.
    """
    k = len(tokens)
    for c in prange(chunk_buckets.shape[0] - 1):
        child = chunk_offsets[c, t_lo : t_lo + k].copy()
        row = chunk_offsets[c, t_lo - 1 : t_lo - 1 + k].copy()
        largest = 0
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            largest = max(largest, bucket_starts[b + 1] - bucket_starts[b])
        steps = np.empty(largest, dtype=np.uint8)
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            lo, hi = bucket_starts[b], bucket_starts[b + 1]
            for p in range(lo, hi):
                steps[p - lo] = first_differing_step(words, lo, p, shifts)
            for i in range(k):
                t = t_lo + i
                step_tokens, step_starts = tokens[i], starts[i]
                shift, mask = np.uint64(shifts[t]), masks[t]
                next_child, next_row = child[i], row[i]
                for p in range(lo, hi):
                    f = steps[p - lo]
                    if f <= t:
                        if f < t:
                            step_starts[next_row] = next_child
                            next_row += 1
                        step_tokens[next_child] = (words[p] >> shift) & mask
                        next_child += 1
                child[i], row[i] = next_child, next_row


@njit(cache=True)
def fill_first_tokens(bucket_starts, step_tokens):
    """Step 0's children: the first tokens whose bucket is non-empty, ascending."""
    j = 0
    for b in range(bucket_starts.shape[0] - 1):
        if bucket_starts[b + 1] > bucket_starts[b]:
            step_tokens[j] = b
            j += 1


@njit(cache=True, parallel=True)
def fill_leaf_offsets(leaf_bits, bucket_starts, chunk_buckets, leaf_chunk_offsets, leaf_offsets):
    """leaf_offsets[j]: sorted position where leaf j starts (the set bits of leaf_bits, in order)."""
    for c in prange(chunk_buckets.shape[0] - 1):
        leaf = leaf_chunk_offsets[c]
        for p in range(bucket_starts[chunk_buckets[c]], bucket_starts[chunk_buckets[c + 1]]):
            if (leaf_bits[p >> 3] >> (p & 7)) & 1:
                leaf_offsets[leaf] = p
                leaf += 1


@njit(cache=True, parallel=True)
def fill_item_order(words, row_bits, item_order):
    """item_order[p]: catalog row at sorted position p (the low bits of its word)."""
    row_mask = (np.uint64(1) << np.uint64(row_bits)) - np.uint64(1)
    for p in prange(words.shape[0]):
        item_order[p] = words[p] & row_mask
