"""numba kernels of the catalog reader (compiled on first use and cached): per-step token ranges and
duplicate detection for integer item ids.

Per-step min/max of a [n, L] block: numpy's axis-0 reduction over a C-contiguous array with a tiny inner
dimension runs ~15x slower than this loop.

Duplicates:
Sorting 20M int64 ids costs ~2 s and Arrow's hash-based unique more. Two O(N) paths instead:
- ids spanning a small range (the usual dense ids): one pass over a bitmap of the range;
- scattered ids (hashes, 63-bit ids): radix-partition the keys by the top bits of a hash into buckets small
  enough that each bucket's hash table stays in cache, then probe bucket by bucket. A repeat can only meet
  its twin inside one bucket, so checking buckets independently is exact.
Only when a repeat exists is the (slower, row-exact) full hash table run to name the first repeated row.
String ids are hashed to 64 bits (FNV-1a + splitmix64) and checked the same way: distinct hashes prove
distinct strings; a repeated hash (a duplicate, or a ~N^2/2^65 collision) sends the caller to an exact check.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Use the bitmap when the id range needs at most this many bits per item (2 bytes per item at 16).
_BITMAP_BITS_PER_ITEM = 16
#: Target keys per bucket of the partitioned check (its table: 4x this many int64 slots, ~1 MiB).
_BUCKET_KEYS = 1 << 15


@njit(cache=True)
def step_min_max(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """block int [n, L] (any integer dtype) -> (min int64 [L], max int64 [L]) per column. Needs n >= 1.

    Column by column with scalar accumulators: branch-free min/max over one strided column compiles to a
    tight loop (~1 ns/token), where updating lo[t]/hi[t] inside a row loop does not.
    """
    n, num_steps = block.shape
    lo = np.empty(num_steps, dtype=np.int64)
    hi = np.empty(num_steps, dtype=np.int64)
    for t in range(num_steps):
        a = block[0, t]
        b = block[0, t]
        for i in range(n):
            v = block[i, t]
            a = min(a, v)
            b = max(b, v)
        lo[t] = a
        hi[t] = b
    return lo, hi


@njit(cache=True, inline="always")
def _mix(key: np.int64) -> np.uint64:
    """splitmix64 finaliser: spreads sequential and structured ids over all 64 bits."""
    z = np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _first_repeat_bitmap(keys: np.ndarray, lo: np.int64, span: np.uint64) -> int:
    words = np.zeros(np.int64(span >> np.uint64(6)) + 1, dtype=np.uint64)
    for i in range(keys.shape[0]):
        k = np.uint64(keys[i]) - np.uint64(lo)
        w = np.int64(k >> np.uint64(6))
        bit = np.uint64(1) << (k & np.uint64(63))
        if words[w] & bit:
            return i
        words[w] |= bit
    return -1


@njit(cache=True)
def _has_repeat_partitioned(keys: np.ndarray) -> bool:
    n = keys.shape[0]
    bits = 0
    while (n >> bits) > _BUCKET_KEYS and bits < 24:
        bits += 1
    shift = np.uint64(64 - bits) if bits else np.uint64(63)
    n_buckets = 1 << bits
    # 1. count keys per bucket (top bits of the hash), exclusive prefix sum -> bucket starts
    starts = np.zeros(n_buckets + 1, dtype=np.int64)
    for i in range(n):
        b = np.int64(_mix(keys[i]) >> shift) if bits else 0
        starts[b + 1] += 1
    largest = 0
    for b in range(n_buckets):
        largest = max(largest, starts[b + 1])
        starts[b + 1] += starts[b]
    # 2. scatter keys into their buckets
    part = np.empty(n, dtype=np.int64)
    fill = starts[:-1].copy()
    for i in range(n):
        b = np.int64(_mix(keys[i]) >> shift) if bits else 0
        part[fill[b]] = keys[i]
        fill[b] += 1
    # 3. per bucket, open addressing on the low hash bits; `stamp` marks slots used by this bucket,
    #    so the table is never cleared between buckets
    capacity = 1
    while capacity < 2 * largest:
        capacity *= 2
    mask = np.uint64(capacity - 1)
    table = np.empty(capacity, dtype=np.int64)
    stamp = np.zeros(capacity, dtype=np.int32)
    for b in range(n_buckets):
        mark = b + 1
        for i in range(starts[b], starts[b + 1]):
            key = part[i]
            slot = np.int64(_mix(key) & mask)
            while stamp[slot] == mark:
                if table[slot] == key:
                    return True
                slot = (slot + 1) & np.int64(mask)
            stamp[slot] = mark
            table[slot] = key
    return False


@njit(cache=True)
def _first_repeat_hash(keys: np.ndarray) -> int:
    """Row-exact but cache-unfriendly: one table of row numbers (+1, 0 = empty) over all keys."""
    n = keys.shape[0]
    capacity = 1
    while capacity < 2 * n:
        capacity *= 2
    mask = np.uint64(capacity - 1)
    table = np.zeros(capacity, dtype=np.int64)
    for i in range(n):
        key = keys[i]
        slot = np.int64(_mix(key) & mask)
        while True:
            j = table[slot]
            if j == 0:
                table[slot] = i + 1
                break
            if keys[j - 1] == key:
                return i
            slot = (slot + 1) & np.int64(mask)
    return -1


@njit(cache=True)
def first_repeat_int64(keys: np.ndarray) -> int:
    """keys int64 [N] -> index of the first element equal to an earlier one, or -1 when all are distinct."""
    n = keys.shape[0]
    if n < 2:
        return -1
    lo = keys[0]
    hi = keys[0]
    for i in range(n):
        if keys[i] < lo:
            lo = keys[i]
        if keys[i] > hi:
            hi = keys[i]
    # Unsigned difference is exact for any int64 lo <= hi (wraps modulo 2**64 into the true span).
    span = np.uint64(hi) - np.uint64(lo)
    if span < np.uint64(_BITMAP_BITS_PER_ITEM) * np.uint64(n):
        return _first_repeat_bitmap(keys, lo, span)
    if not _has_repeat_partitioned(keys):
        return -1
    return _first_repeat_hash(keys)


@njit(cache=True)
def hash_strings(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Arrow string buffers -> int64 [n] hashes. offsets int32|int64 [n+1] (already sliced to the array),
    data uint8 [bytes]. Equal strings get equal hashes."""
    n = offsets.shape[0] - 1
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        h = np.uint64(0xCBF29CE484222325)
        lo = np.int64(offsets[i])
        hi = np.int64(offsets[i + 1])
        for k in range(lo, hi):
            h = (h ^ np.uint64(data[k])) * np.uint64(0x100000001B3)
        out[i] = np.int64(_mix(np.int64(h ^ np.uint64(hi - lo))))
    return out
