"""Matching items by id across two versions, for `zerogr diff` and the guards (bundle/diff.py reads the
files and calls these): arrays in, arrays out, no I/O.

The ids (`hash_int_ids` / `hash_byte_ids`) are split into parts by the top bits of a seeded hash
(`part_of`; a part's ids of both versions fit in memory); within a part, each side is grouped into slots by
the hash's low bits with one counting sort (`slot_table`), and the two sides' slots are compared in step
(`join_slots`, `match_part`): counts of common items and of common items whose SID differs, in linear
time, with no comparison sort of the ids. Integer ids, whose seeded hash is one to one, take a faster
join per cache-sized group: one side's ids in an open-addressing table, probed by the other's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
#: Above this many id pairs in one slot (its ids of one side times the other's), the slot is sorted and
#: merged instead of compared pair by pair, so ids crafted to share a slot cost n log n, not n^2.
SLOT_PAIRS_LIMIT = 4096


@nb.njit(cache=True, nogil=True)
def _mix(x):
    # splitmix64's finaliser: spreads any 64-bit value over all bits (ids are often consecutive). Each of
    # its steps is invertible, so it is a bijection of the 64-bit values.
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@nb.njit(cache=True, nogil=True)
def _hash_ints(values, seed):
    out = np.empty(values.shape[0], dtype=np.uint64)
    for i in range(values.shape[0]):
        out[i] = _mix(_mix(values[i] ^ seed) ^ seed)
    return out


@nb.njit(cache=True, nogil=True)
def _hash_bytes(offsets, data, seed):
    n = offsets.shape[0] - 1
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        h = _FNV_OFFSET
        for k in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[k])) * _FNV_PRIME
        out[i] = _mix(_mix(h ^ seed) ^ seed)
    return out


def hash_int_ids(ids: np.ndarray, seed: int = 0) -> np.ndarray:
    """uint64 [n]: a well-spread hash of integer ids int [n] under `seed`. A bijection of the 64-bit id
    (for one seed), so two ids are equal exactly when their hashes are."""
    return _hash_ints(np.asarray(ids, dtype=np.int64).view(np.uint64), np.uint64(seed))


def hash_byte_ids(offsets: np.ndarray, data: np.ndarray, seed: int = 0) -> np.ndarray:
    """uint64 [n]: a hash of n byte strings (string i = data[offsets[i]:offsets[i+1]], data uint8) under
    `seed`; equal strings hash alike, different ones may too (compare the bytes)."""
    return _hash_bytes(np.asarray(offsets), np.asarray(data), np.uint64(seed))


def part_of(hashes: np.ndarray, part_bits: int) -> np.ndarray:
    """uint16 [n]: the part (0 .. 2^part_bits - 1, part_bits <= 16) each id is matched in: the top
    `part_bits` bits of its hash, so the same id falls in the same part in both versions and a part holds
    about 1/2^part_bits of the ids."""
    if part_bits == 0:
        return np.zeros(hashes.shape[0], dtype=np.uint16)
    return (np.asarray(hashes, dtype=np.uint64) >> np.uint64(64 - part_bits)).astype(np.uint16)


@dataclass(frozen=True)
class SlotTable:
    """One version's ids of one part grouped into 2^bits slots by the low bits of their hash (a counting
    sort): the ids of slot s are positions starts[s] .. starts[s+1]-1 of `hashes` uint64 [n], `keys`
    uint64 [n, W] (W = 0: SIDs not compared) and `index` int64 [n] (each one's position in the input;
    empty unless asked for, to find a string id's bytes)."""

    starts: np.ndarray
    hashes: np.ndarray
    keys: np.ndarray
    index: np.ndarray


@nb.njit(cache=True, nogil=True)
def _slot_sort(hashes, keys, bits, with_index):
    n = hashes.shape[0]
    words = keys.shape[1]
    slots = np.int64(1) << bits
    mask = np.uint64(slots - 1)
    starts = np.zeros(slots + 1, dtype=np.int64)
    for i in range(n):
        starts[np.int64(hashes[i] & mask) + 1] += 1
    for s in range(slots):
        starts[s + 1] += starts[s]
    fill = starts[:-1].copy()
    out_hashes = np.empty(n, dtype=np.uint64)
    out_keys = np.empty((n, words), dtype=np.uint64)
    index = np.empty(n if with_index else 0, dtype=np.int64)
    for i in range(n):
        s = np.int64(hashes[i] & mask)
        p = fill[s]
        fill[s] = p + 1
        out_hashes[p] = hashes[i]
        for w in range(words):
            out_keys[p, w] = keys[i, w]
        if with_index:
            index[p] = i
    return starts, out_hashes, out_keys, index


def slot_bits(items: int) -> int:
    """Slots for a part of `items` ids per side: about 2 to 4 ids a slot (a power of two)."""
    return max(int(items).bit_length() - 2, 0)


def slot_table(hashes: np.ndarray, keys: np.ndarray, bits: int, *, with_index: bool = False) -> SlotTable:
    """hashes uint64 [n] and keys uint64 [n, W] grouped by slot (SlotTable); both tables of a join must
    use the same `bits`."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    if keys.ndim != 2 or keys.shape[0] != hashes.shape[0]:
        raise ValueError(f"keys of shape {keys.shape} for {hashes.shape[0]} hashes (wanted [n, W])")
    return SlotTable(*_slot_sort(np.asarray(hashes, dtype=np.uint64), keys, np.int64(bits), with_index))


@nb.njit(cache=True, nogil=True)
def same_bytes(a_offsets, a_data, i, b_offsets, b_data, j):
    """Byte id i of (a_offsets, a_data) equals byte id j of (b_offsets, b_data)."""
    length = a_offsets[i + 1] - a_offsets[i]
    if b_offsets[j + 1] - b_offsets[j] != length:
        return False
    for k in range(length):  # noqa: SIM110 - numba compiles loops, not generator expressions
        if a_data[a_offsets[i] + k] != b_data[b_offsets[j] + k]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _same_id(x, y, a_hashes, a_index, a_offsets, a_data, b_hashes, b_index, b_offsets, b_data, byte_ids):
    if a_hashes[x] != b_hashes[y]:
        return False
    if not byte_ids:
        return True  # integer ids: the hash is a bijection
    return same_bytes(a_offsets, a_data, a_index[x], b_offsets, b_data, b_index[y])


@nb.njit(cache=True, nogil=True)
def _keys_differ(a_keys, x, b_keys, y):
    for w in range(a_keys.shape[1]):  # noqa: SIM110 - numba compiles loops, not generator expressions
        if a_keys[x, w] != b_keys[y, w]:
            return True
    return False


@nb.njit(cache=True, nogil=True)
def _join(
    a_starts, a_hashes, a_keys, a_index, a_offsets, a_data,
    b_starts, b_hashes, b_keys, b_index, b_offsets, b_data, byte_ids, pairs_limit,
):  # fmt: skip
    # Ids are unique within a side, so an id of a matches at most one of b (the loops stop at it).
    common = changed = 0
    for s in range(a_starts.shape[0] - 1):
        a0, a1, b0, b1 = a_starts[s], a_starts[s + 1], b_starts[s], b_starts[s + 1]
        if a0 == a1 or b0 == b1:
            continue
        if (a1 - a0) * (b1 - b0) <= pairs_limit:
            for x in range(a0, a1):
                for y in range(b0, b1):
                    if _same_id(x, y, a_hashes, a_index, a_offsets, a_data,
                                b_hashes, b_index, b_offsets, b_data, byte_ids):  # fmt: skip
                        common += 1
                        if _keys_differ(a_keys, x, b_keys, y):
                            changed += 1
                        break
            continue
        a_order = np.argsort(a_hashes[a0:a1]) + a0
        b_order = np.argsort(b_hashes[b0:b1]) + b0
        i = j = 0
        while i < a_order.shape[0] and j < b_order.shape[0]:
            h_a, h_b = a_hashes[a_order[i]], b_hashes[b_order[j]]
            if h_a < h_b:
                i += 1
            elif h_a > h_b:
                j += 1
            else:  # a run of one hash on each side (one id each unless byte ids collide): every pair
                i_end, j_end = i, j
                while i_end < a_order.shape[0] and a_hashes[a_order[i_end]] == h_a:
                    i_end += 1
                while j_end < b_order.shape[0] and b_hashes[b_order[j_end]] == h_a:
                    j_end += 1
                for u in range(i, i_end):
                    x = a_order[u]
                    for v in range(j, j_end):
                        y = b_order[v]
                        if _same_id(x, y, a_hashes, a_index, a_offsets, a_data,
                                    b_hashes, b_index, b_offsets, b_data, byte_ids):  # fmt: skip
                            common += 1
                            if _keys_differ(a_keys, x, b_keys, y):
                                changed += 1
                            break
                i, j = i_end, j_end
    return common, changed


#: Groups a part is first split into by the hash's low bits (counting sort into this many streams), so
#: that each group's slot tables fit in the CPU caches.
GROUP_BITS = 8


@nb.njit(cache=True, nogil=True)
def _probe_groups(a_starts, a_hashes, a_keys, b_starts, b_hashes, b_keys, first, stop, shift):
    # Integer ids, groups first .. stop-1: a group's ids of side a go into an open-addressing table (linear
    # probing, at most half full) on the hash bits above `shift`, which side b's ids probe. A side's
    # hashes are distinct (hash_int_ids is a bijection), so a probe walks a run of random length, O(1)
    # expected, and one equal hash is the match.
    largest = 1
    for g in range(first, stop):
        largest = max(largest, a_starts[g + 1] - a_starts[g])
    size = 2
    while size < 2 * largest:
        size *= 2
    table = np.empty(size, dtype=np.int64)
    common = changed = 0
    for g in range(first, stop):
        a0, a1, b0, b1 = a_starts[g], a_starts[g + 1], b_starts[g], b_starts[g + 1]
        if a0 == a1 or b0 == b1:
            continue
        width = 2
        while width < 2 * (a1 - a0):
            width *= 2
        mask = np.uint64(width - 1)
        table[:width] = -1
        for x in range(a0, a1):
            at = np.int64((a_hashes[x] >> shift) & mask)
            while table[at] >= 0:
                at = (at + 1) & (width - 1)
            table[at] = x
        for y in range(b0, b1):
            h = b_hashes[y]
            at = np.int64((h >> shift) & mask)
            while table[at] >= 0:
                x = table[at]
                if a_hashes[x] == h:
                    common += 1
                    if _keys_differ(a_keys, x, b_keys, y):
                        changed += 1
                    break
                at = (at + 1) & (width - 1)
    return common, changed


@nb.njit(cache=True, nogil=True)
def _group(hashes, keys, bits, with_index):
    # The same counting sort as _slot_sort, by the low `bits` bits (few groups: sequential writes).
    return _slot_sort(hashes, keys, bits, with_index)


@dataclass(frozen=True)
class MatchCounts:
    """Items of two versions matched by id: `common` ids present in both, `changed` of those whose SID
    differs."""

    common: int
    changed: int


_NO_BYTES = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))


def join_slots(
    a: SlotTable,
    b: SlotTable,
    *,
    a_bytes: tuple[np.ndarray, np.ndarray] | None = None,
    b_bytes: tuple[np.ndarray, np.ndarray] | None = None,
    pairs_limit: int = SLOT_PAIRS_LIMIT,
) -> MatchCounts:
    """Match the ids of two SlotTables of one part (same slot bits, ids unique within each side).

    Integer ids (a_bytes/b_bytes None): hashes from hash_int_ids with one seed, equal exactly when the
    ids are. String ids: a_bytes/b_bytes are (offsets int [n+1], data uint8) of each side's ids in input
    order, the tables built with_index, hashes from hash_byte_ids with one seed; equal hashes are compared
    byte for byte, so a collision never matches two different ids. `changed` counts the matched ids whose
    keys differ (none when W = 0)."""
    byte_ids = a_bytes is not None
    if byte_ids != (b_bytes is not None):
        raise ValueError("both sides' ids are strings, or neither's")
    if a.starts.shape != b.starts.shape or a.keys.shape[1] != b.keys.shape[1]:
        raise ValueError("the two tables have different slots or key words")
    a_off, a_data = a_bytes if a_bytes is not None else _NO_BYTES
    b_off, b_data = b_bytes if b_bytes is not None else _NO_BYTES
    common, changed = _join(
        a.starts, a.hashes, a.keys, a.index, np.asarray(a_off), np.asarray(a_data),
        b.starts, b.hashes, b.keys, b.index, np.asarray(b_off), np.asarray(b_data),
        byte_ids, np.int64(pairs_limit),
    )  # fmt: skip
    return MatchCounts(int(common), int(changed))


def match_part(
    a_hashes: np.ndarray,
    a_keys: np.ndarray,
    b_hashes: np.ndarray,
    b_keys: np.ndarray,
    *,
    a_bytes: tuple[np.ndarray, np.ndarray] | None = None,
    b_bytes: tuple[np.ndarray, np.ndarray] | None = None,
    workers: int = 1,
) -> MatchCounts:
    """Match two versions' ids of one part: hashes uint64 [n] (hash_int_ids, or hash_byte_ids with
    a_bytes/b_bytes the strings' (offsets, data)), keys uint64 [n, W]. Each side is split into
    2^GROUP_BITS groups by the hash's low bits, and each group matched on the bits above: integer ids by
    a hash table of side a's ids that side b's probe (their hashes are the ids, one to one), string ids by
    slot tables (join_slots, whose sorted runs bound the cost of crafted collisions); the same as one
    join_slots of the whole part, in cache-sized pieces, the groups shared by `workers` threads (the
    kernels release the GIL)."""
    strings = a_bytes is not None
    grouped = []
    for hashes, keys in ((a_hashes, a_keys), (b_hashes, b_keys)):
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        grouped.append(_group(np.asarray(hashes, dtype=np.uint64), keys, np.int64(GROUP_BITS), strings))
    (a_starts, a_h, a_k, a_pos), (b_starts, b_h, b_k, b_pos) = grouped

    def groups(first: int, stop: int) -> tuple[int, int]:
        if not strings:
            return _probe_groups(a_starts, a_h, a_k, b_starts, b_h, b_k, first, stop, np.uint64(GROUP_BITS))
        common = changed = 0
        for g in range(first, stop):
            a0, a1, b0, b1 = a_starts[g], a_starts[g + 1], b_starts[g], b_starts[g + 1]
            if a0 == a1 or b0 == b1:
                continue
            bits = slot_bits(max(a1 - a0, b1 - b0))
            a = slot_table(a_h[a0:a1] >> np.uint64(GROUP_BITS), a_k[a0:a1], bits, with_index=strings)
            b = slot_table(b_h[b0:b1] >> np.uint64(GROUP_BITS), b_k[b0:b1], bits, with_index=strings)
            if strings:  # positions in the group -> positions in the input (where the strings' bytes are)
                a = SlotTable(a.starts, a.hashes, a.keys, a_pos[a0 + a.index])
                b = SlotTable(b.starts, b.hashes, b.keys, b_pos[b0 + b.index])
            got = join_slots(a, b, a_bytes=a_bytes, b_bytes=b_bytes)
            common, changed = common + got.common, changed + got.changed
        return common, changed

    count = a_starts.shape[0] - 1
    if workers <= 1:
        return MatchCounts(*groups(0, count))
    from concurrent.futures import ThreadPoolExecutor

    bounds = [count * w // workers for w in range(workers + 1)]
    with ThreadPoolExecutor(workers, thread_name_prefix="zerogr-match") as pool:
        got = list(pool.map(groups, bounds[:-1], bounds[1:]))
    return MatchCounts(sum(c for c, _ in got), sum(c for _, c in got))
