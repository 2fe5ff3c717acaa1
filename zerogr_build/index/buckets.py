"""Per-chunk kernels of the packed build sort (index.sort): after the first-token counting sort, every
bucket holds the packed words (tokens 1.., catalog row) of the SIDs sharing a first token. Chunks are
contiguous bucket ranges, so every kernel here runs its chunks in parallel without locks.

* `sort_and_mark_buckets`: sort each bucket and, while it is still in cache, mark where every sorted
  position first differs from its predecessor (one pass over the words instead of two).
* `fill_steps`: write the tokens and row starts of several steps in one pass over the sorted words.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

RADIX_BITS = 11
INSERTION_SORT_MAX = 48


@njit(cache=True, parallel=True)
def sort_and_mark_buckets(
    words, bucket_starts, chunk_buckets, key_lo, key_bits, shifts, num_steps, first_diff
):
    """Sort each bucket's words by their token bits [key_lo, key_lo + key_bits), keeping row order on ties,
    and write first_diff.

    words uint64 [N] (each bucket in catalog order: the scatter is stable), bucket_starts int64 [B+1],
    chunk_buckets int64 [C+1], shifts int64 [L] (where token t starts in a word), first_diff uint8 [N]
    (output): the first step whose token differs from sorted position p-1 (0 at a bucket's first position,
    num_steps for a repeated SID). A stable LSD radix sort on the token bits alone keeps catalog order among
    equal SIDs without comparing row bits.
    Returns int64 [C, L]: per chunk, how many positions start a new length-(t+1) prefix (first_diff <= t).
    """
    num_chunks = chunk_buckets.shape[0] - 1
    counts = np.zeros((num_chunks, num_steps), dtype=np.int64)
    for c in prange(num_chunks):
        largest = 0
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            largest = max(largest, bucket_starts[b + 1] - bucket_starts[b])
        scratch = np.empty(largest, dtype=words.dtype)
        histogram = np.empty(1 << RADIX_BITS, dtype=np.int64)
        diffs = np.zeros(num_steps + 1, dtype=np.int64)  # positions per first_diff value
        for b in range(chunk_buckets[c], chunk_buckets[c + 1]):
            lo, hi = bucket_starts[b], bucket_starts[b + 1]
            if hi - lo <= INSERTION_SORT_MAX:
                _insertion_sort(words, lo, hi, key_lo)
            else:
                _radix_sort(words[lo:hi], scratch[: hi - lo], histogram, key_lo, key_bits)
            _mark_bucket(words, lo, hi, shifts, num_steps, first_diff, diffs)
        total = 0
        for t in range(num_steps):
            total += diffs[t]
            counts[c, t] = total
    return counts


@njit(cache=True, inline="always")
def _mark_bucket(words, lo, hi, shifts, num_steps, first_diff, diffs):
    """first_diff over one sorted bucket; diffs[f] += 1 per position. Tokens 1.. are the high bits of the
    word, most significant first, so x = word ^ previous word differs first at step t exactly when
    x >= 2^shifts[t] and x < 2^shifts[t'] for every t' < t. The bounds fall with t, so the first differing
    step is 1 + the number of steps t >= 1 with x < 2^shifts[t]: counted without a branch."""
    if hi <= lo:
        return
    first_diff[lo] = 0
    diffs[0] += 1
    for p in range(lo + 1, hi):
        changed = words[p] ^ words[p - 1]
        f = 1
        for t in range(1, num_steps):
            f += changed < (np.uint64(1) << np.uint64(shifts[t]))
        first_diff[p] = f
        diffs[f] += 1


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
def fill_steps(
    words, first_diff, bucket_starts, chunk_buckets, chunk_offsets, t_lo, shifts, masks, tokens, starts
):
    """Write steps t_lo .. t_lo + k - 1 (t_lo >= 1) in one pass: tokens[i] (children tokens of step
    t_lo + i) and starts[i] (each row's first child), k = len(tokens), tuples of same-typed arrays.

    chunk_offsets int64 [C, L]: chunk c's first new length-(t+1) prefix has global rank chunk_offsets[c, t].
    A position with first_diff <= t starts a new child (length-(t+1) prefix) of step t; with first_diff
    <= t-1 it also starts a new row (length-t prefix), whose first child is the child at that position.
    """
    k = len(tokens)
    for c in prange(chunk_buckets.shape[0] - 1):
        child = chunk_offsets[c, t_lo : t_lo + k].copy()
        row = chunk_offsets[c, t_lo - 1 : t_lo - 1 + k].copy()
        for p in range(bucket_starts[chunk_buckets[c]], bucket_starts[chunk_buckets[c + 1]]):
            f = first_diff[p]
            if f >= t_lo + k:
                continue
            word = words[p]
            for i in range(max(0, f - t_lo), k):
                t = t_lo + i
                if f <= t - 1:
                    starts[i][row[i]] = child[i]
                    row[i] += 1
                tokens[i][child[i]] = (word >> np.uint64(shifts[t])) & masks[t]
                child[i] += 1


@njit(cache=True)
def fill_first_tokens(bucket_starts, step_tokens):
    """Step 0's children: the first tokens whose bucket is non-empty, ascending."""
    j = 0
    for b in range(bucket_starts.shape[0] - 1):
        if bucket_starts[b + 1] > bucket_starts[b]:
            step_tokens[j] = b
            j += 1


@njit(cache=True, parallel=True)
def fill_leaf_offsets(first_diff, bucket_starts, chunk_buckets, leaf_chunk_offsets, last, leaf_offsets):
    """leaf_offsets[j]: sorted position where leaf j starts."""
    for c in prange(chunk_buckets.shape[0] - 1):
        leaf = leaf_chunk_offsets[c]
        for p in range(bucket_starts[chunk_buckets[c]], bucket_starts[chunk_buckets[c + 1]]):
            if first_diff[p] <= last:
                leaf_offsets[leaf] = p
                leaf += 1


@njit(cache=True, parallel=True)
def fill_item_order(words, row_bits, item_order):
    """item_order[p]: catalog row at sorted position p (the low bits of its word)."""
    row_mask = (np.uint64(1) << np.uint64(row_bits)) - np.uint64(1)
    for p in prange(words.shape[0]):
        item_order[p] = words[p] & row_mask
