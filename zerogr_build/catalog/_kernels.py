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
from numba import get_num_threads, njit, prange

from ..base.memory import populated_zeros

#: Use the bitmap when the id range needs at most this many bits per item (2 bytes per item at 16).
_BITMAP_BITS_PER_ITEM = 16
#: Target keys per bucket of the partitioned check (its table: 4x this many int64 slots, ~1 MiB).
_BUCKET_KEYS = 1 << 15
#: The partitioned check scatters and probes its buckets in this many ranges, one after the other: its
#: buffer holds 8 / PARTITION_PASSES bytes per key (2 B/item at a build's read peak instead of 8), for
#: PARTITION_PASSES - 1 more hashing passes over the keys.
PARTITION_PASSES = 4


@njit(cache=True, nogil=True)
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


@njit(cache=True, parallel=True)
def _chunk_bucket_counts(keys: np.ndarray, bits: int, chunks: int) -> np.ndarray:
    """int64 [chunks, 2**bits]: how many keys of each chunk fall in each bucket (top `bits` bits of the
    hash). Chunk c is rows [n*c // chunks, n*(c+1) // chunks); chunks are counted in parallel."""
    n = keys.shape[0]
    shift = np.uint64(64 - bits)
    counts = np.zeros((chunks, 1 << bits), dtype=np.int64)
    for c in prange(chunks):
        for i in range(n * c // chunks, n * (c + 1) // chunks):
            counts[c, np.int64(_mix(keys[i]) >> shift)] += 1
    return counts


def _chunk_fill_starts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """counts int64 [chunks, B] -> (starts int64 [B + 1]: where bucket b begins in the partition;
    fill int64 [chunks, B]: where chunk c's keys of bucket b begin).

    Within bucket b the chunks' keys lie in chunk order, so chunk c's slice starts after the keys of chunks
    0..c-1 in that bucket (an exclusive prefix sum down the chunk axis): the slices are disjoint, which is
    what lets the chunks scatter in parallel without a race."""
    starts = np.zeros(counts.shape[1] + 1, dtype=np.int64)
    np.cumsum(counts.sum(axis=0), out=starts[1:])
    fill = starts[:-1][None, :] + np.cumsum(counts, axis=0) - counts
    return starts, fill


@njit(cache=True, parallel=True)
def _scatter_hashes(keys: np.ndarray, bits: int, fill: np.ndarray, part: np.ndarray, lo: int, hi: int,
                    base: int) -> None:  # fmt: skip
    """part[starts[b] - base : starts[b+1] - base] = hashes of bucket b, for buckets lo <= b < hi only,
    each chunk writing its own slices (fill, from _chunk_fill_starts; advanced in place). The hash is a
    bijection of the key (xor-shifts and odd multiplications), so equal hashes mean equal keys and the
    keys themselves are not needed."""
    n = keys.shape[0]
    chunks = fill.shape[0]
    shift = np.uint64(64 - bits)
    for c in prange(chunks):
        for i in range(n * c // chunks, n * (c + 1) // chunks):
            h = _mix(keys[i])
            b = np.int64(h >> shift)
            if lo <= b < hi:
                part[fill[c, b] - base] = np.int64(h)
                fill[c, b] += 1


@njit(cache=True, parallel=True)
def _probe_buckets(part: np.ndarray, starts: np.ndarray, groups: int, capacity: int) -> bool:
    """Open addressing per bucket on the hash's low bits, `groups` runs of buckets in parallel, each with
    its own cache-sized table of `capacity` (a power of two >= 2x the largest bucket). stamp[slot] ==
    bucket + 1 marks slots used by the current bucket, so a table is never cleared between buckets."""
    buckets = starts.shape[0] - 1
    mask = np.int64(capacity - 1)
    found = np.zeros(groups, dtype=np.bool_)
    for g in prange(groups):
        table = np.zeros(capacity, dtype=np.int64)
        stamp = np.zeros(capacity, dtype=np.int32)
        for b in range(buckets * g // groups, buckets * (g + 1) // groups):
            mark = b + 1
            for i in range(starts[b], starts[b + 1]):
                h = part[i]
                slot = h & mask
                while stamp[slot] == mark and table[slot] != h:
                    slot = (slot + 1) & mask
                if stamp[slot] == mark:  # stopped on an equal hash: a repeated key
                    found[g] = True
                    break
                stamp[slot] = mark
                table[slot] = h
            if found[g]:
                break
    return found.any()


def has_repeat_partitioned(keys: np.ndarray, chunks: int | None = None) -> bool:
    """True when some key occurs twice (keys int64 [N]). chunks: how many parallel slices the counting,
    scattering and probing are split into (default: numba's thread count); any value gives the same
    answer. The partition buffer comes from base.memory.populated_zeros rather than from numba: numba's
    allocations fault page by page on first write and measured several times slower."""
    n = keys.shape[0]
    chunks = max(1, int(chunks if chunks is not None else get_num_threads()))
    bits = 0
    while (n >> bits) > _BUCKET_KEYS and bits < 24:
        bits += 1
    bits = max(bits, 1)
    starts, fill = _chunk_fill_starts(_chunk_bucket_counts(keys, bits, chunks))
    largest = int((starts[1:] - starts[:-1]).max())
    capacity = 1 << max(int(2 * largest - 1).bit_length(), 1)
    # The buckets in PARTITION_PASSES ranges, one at a time: each pass scatters only its range's keys, so
    # the partition holds about N / passes hashes (a repeat and its twin share a bucket, so a range).
    buckets = 1 << bits
    passes = min(PARTITION_PASSES, buckets)
    ranges = [(buckets * p // passes, buckets * (p + 1) // passes) for p in range(passes)]
    part = populated_zeros(int(max(starts[hi] - starts[lo] for lo, hi in ranges)), np.int64)
    for lo, hi in ranges:
        _scatter_hashes(keys, bits, fill, part, lo, hi, starts[lo])
        bounds = starts[lo : hi + 1] - starts[lo]
        if _probe_buckets(part, bounds, min(chunks, hi - lo), capacity):
            return True
    return False


@njit(cache=True)
def _first_repeat_hash(keys: np.ndarray, table: np.ndarray) -> int:
    """Row-exact but cache-unfriendly: `table` (zeros, power-of-two length >= 2N) of row numbers + 1."""
    n = keys.shape[0]
    mask = np.int64(table.shape[0] - 1)
    for i in range(n):
        key = keys[i]
        slot = np.int64(_mix(key)) & mask
        while True:
            j = np.int64(table[slot])
            if j == 0:
                table[slot] = i + 1
                break
            if keys[j - 1] == key:
                return i
            slot = (slot + 1) & mask
    return -1


@njit(cache=True)
def _span(keys: np.ndarray) -> tuple[np.int64, np.uint64]:
    """(min, max - min) of int64 keys; the unsigned difference is exact for any int64 lo <= hi."""
    lo = keys[0]
    hi = keys[0]
    for i in range(keys.shape[0]):
        lo = min(lo, keys[i])
        hi = max(hi, keys[i])
    return lo, np.uint64(hi) - np.uint64(lo)


def first_repeat_int64(keys: np.ndarray, workers: int | None = None) -> int:
    """keys int64 [N] -> index of the first element equal to an earlier one, or -1 when all are distinct.
    workers: parallel slices of the partitioned check (None: numba's thread count)."""
    n = keys.shape[0]
    if n < 2:
        return -1
    lo, span = _span(keys)
    if int(span) < _BITMAP_BITS_PER_ITEM * n:
        return int(_first_repeat_bitmap(keys, lo, span))
    if not has_repeat_partitioned(keys, workers):
        return -1
    # Error path: name the first repeated row. int32 row numbers while they fit halve the table.
    capacity = 1 << int(2 * n - 1).bit_length()
    table = np.zeros(capacity, dtype=np.int32 if n < 2**31 - 1 else np.int64)
    return int(_first_repeat_hash(keys, table))


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
