"""The arithmetic of `verify` that is worth compiling (bundle/verify.py reads the files and calls these):
arrays in, arrays out, no I/O."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

#: Bits of the key sorted on in one pass of the radix sort (2^11 counters: they stay in L1).
DIGIT_BITS = 11


@nb.njit(cache=True)
def _radix_pass(src_keys, src_order, dst_keys, dst_order, shift, digit_bits, first):
    n = src_keys.shape[0]
    buckets = 1 << digit_bits
    mask = np.uint64(buckets - 1)
    counts = np.zeros(buckets, dtype=np.int64)
    for i in range(n):
        counts[np.int64((src_keys[i] >> shift) & mask)] += 1
    for b in range(buckets):
        if counts[b] == n:  # every key has this digit: the order does not change
            return False
    total = 0
    for b in range(buckets):
        c = counts[b]
        counts[b] = total
        total += c
    for i in range(n):
        b = np.int64((src_keys[i] >> shift) & mask)
        p = counts[b]
        counts[b] = p + 1
        dst_keys[p] = src_keys[i]
        dst_order[p] = i if first else src_order[i]
    return True


def stable_argsort_keys(
    keys: np.ndarray, key_bits: int, *, overwrite: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(order, sorted keys) of uint64 keys [n] whose values fit `key_bits` bits: exactly
    np.argsort(keys, kind="stable") and keys[order] (equal keys keep their input order), by an LSD radix
    sort of DIGIT_BITS-bit digits (linear time). order is int32 when n < 2^31, else int64.
    overwrite: `keys` (uint64, contiguous) may be used as scratch (8 bytes per key less at the peak)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    n = keys.shape[0]
    index_type = np.int32 if n < 2**31 else np.int64
    passes = max(1, math.ceil(key_bits / DIGIT_BITS))
    digit = max(1, math.ceil(key_bits / passes))
    src_keys, src_order = keys, np.zeros(0, dtype=index_type)
    dst_keys, dst_order = np.empty_like(keys), np.empty(n, dtype=index_type)
    first = True
    for p in range(passes):
        moved = _radix_pass(src_keys, src_order, dst_keys, dst_order, np.uint64(p * digit), digit, first)
        if not moved:
            continue
        if first:  # from here on two key buffers take turns: the input's too, when it may be overwritten
            spare = keys if overwrite and keys.dtype == np.uint64 else np.empty_like(keys)
            src_keys, dst_keys = dst_keys, spare
            src_order, dst_order = dst_order, np.empty(n, dtype=index_type)
            first = False
        else:
            src_keys, dst_keys = dst_keys, src_keys
            src_order, dst_order = dst_order, src_order
    if first:  # no pass moved anything: all keys equal, or n <= 1
        return np.arange(n, dtype=index_type), keys.copy()
    return src_order, src_keys
