"""The leaf-order merge of `zerogr diff` (bundle/diff.py streams the items and calls this): arrays in,
arrays out, no I/O.

Both versions store their items in leaf order: leaves in lexicographic SID order (docs/bundle-format.md,
section 2), so the packed SIDs (diff_math.KeyLayout, compared word by word) of a version's items never
decrease. Walking both versions' items at once in that order, the items under one SID in both versions
meet: an id found under the same SID on both sides is in both versions with its SID unchanged. Every
other item (its SID only on one side, or its id not under the same SID on the other side) is a
*leftover*: matched by id afterwards (id_match), where a leftover id found on both sides is a common item
whose SID changed (had it kept its SID, the merge would have met it).

The items arrive in batches that end at leaf boundaries (a SID's items are never split between two
batches), so `merge_leaves` merges two buffers up to a bound: the smaller of the last SIDs of the two
buffers (of the sides with items still to come). Every item at or below it is present on both sides
(the rest of either version's items have larger SIDs); the other side's items past it wait for the next
call, and the side whose last SID was the bound is used up and reads its next batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .id_match import SLOT_PAIRS_LIMIT, same_bytes
from .key_words import compare_keys, kernel_keys

_NO_BYTES = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))


@nb.njit(cache=True, nogil=True)
def _in_order(keys):
    for i in range(1, keys.shape[0]):  # noqa: SIM110 - numba compiles loops, not generator expressions
        if compare_keys(keys, i - 1, keys, i) > 0:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _at_most(keys, bound_keys, bound):
    # How many rows of the ascending keys are <= bound_keys[bound] (binary search).
    lo, hi = 0, keys.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if compare_keys(keys, mid, bound_keys, bound) <= 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@nb.njit(cache=True, nogil=True, inline="always")
def _same_id(a_hashes, a_offsets, a_data, x, b_hashes, b_offsets, b_data, y, byte_ids):
    if a_hashes[x] != b_hashes[y]:
        return False
    if not byte_ids:
        return True  # integer ids: the hash is a bijection
    return same_bytes(a_offsets, a_data, x, b_offsets, b_data, y)


@nb.njit(cache=True, nogil=True)
def _match_run(
    a_hashes, a_off, a_data, a0, a1, b_hashes, b_off, b_data, b0, b1, byte_ids, limit, a_left, b_left
):
    # The ids of one SID on both sides (a0..a1-1, b0..b1-1): marks the ids found on both sides as not left
    # over and returns how many. Ids are unique within a side, so an id matches at most one of the other.
    same = 0
    if (a1 - a0) * (b1 - b0) <= limit:
        for x in range(a0, a1):
            for y in range(b0, b1):
                if b_left[y] and _same_id(a_hashes, a_off, a_data, x, b_hashes, b_off, b_data, y, byte_ids):
                    a_left[x] = False
                    b_left[y] = False
                    same += 1
                    break
        return same
    a_order = np.argsort(a_hashes[a0:a1]) + a0  # a large leaf: sorted by hash and merged, n log n
    b_order = np.argsort(b_hashes[b0:b1]) + b0
    i = j = 0
    while i < a_order.shape[0] and j < b_order.shape[0]:
        h_a, h_b = a_hashes[a_order[i]], b_hashes[b_order[j]]
        if h_a < h_b:
            i += 1
        elif h_a > h_b:
            j += 1
        else:  # one hash on each side: one id each unless string ids collide, so every pair is compared
            i_end, j_end = i, j
            while i_end < a_order.shape[0] and a_hashes[a_order[i_end]] == h_a:
                i_end += 1
            while j_end < b_order.shape[0] and b_hashes[b_order[j_end]] == h_a:
                j_end += 1
            for u in range(i, i_end):
                x = a_order[u]
                for v in range(j, j_end):
                    y = b_order[v]
                    if b_left[y] and _same_id(
                        a_hashes, a_off, a_data, x, b_hashes, b_off, b_data, y, byte_ids
                    ):
                        a_left[x] = False
                        b_left[y] = False
                        same += 1
                        break
            i, j = i_end, j_end
    return same


@nb.njit(cache=True, nogil=True)
def _merge(
    a_keys, a_hashes, a_off, a_data, a_final, b_keys, b_hashes, b_off, b_data, b_final, byte_ids, limit
):
    na, nb_ = a_keys.shape[0], b_keys.shape[0]
    a_stop, b_stop = na, nb_
    if not (a_final and b_final):
        if not a_final and (b_final or compare_keys(a_keys, na - 1, b_keys, nb_ - 1) <= 0):
            a_stop, b_stop = na, _at_most(b_keys, a_keys, na - 1)
        else:
            a_stop, b_stop = _at_most(a_keys, b_keys, nb_ - 1), nb_
    a_left = np.ones(a_stop, dtype=np.bool_)
    b_left = np.ones(b_stop, dtype=np.bool_)
    same = 0
    i = j = 0
    while i < a_stop and j < b_stop:
        c = compare_keys(a_keys, i, b_keys, j)
        if c < 0:
            i += 1
        elif c > 0:
            j += 1
        else:
            i_end, j_end = i + 1, j + 1
            while i_end < a_stop and compare_keys(a_keys, i_end, a_keys, i) == 0:
                i_end += 1
            while j_end < b_stop and compare_keys(b_keys, j_end, b_keys, j) == 0:
                j_end += 1
            if i_end - i == 1 and j_end - j == 1:  # one item under this SID on each side (the usual case)
                if _same_id(a_hashes, a_off, a_data, i, b_hashes, b_off, b_data, j, byte_ids):
                    a_left[i] = False
                    b_left[j] = False
                    same += 1
                i, j = i_end, j_end
                continue
            same += _match_run(
                a_hashes,
                a_off,
                a_data,
                i,
                i_end,
                b_hashes,
                b_off,
                b_data,
                j,
                j_end,
                byte_ids,
                limit,
                a_left,
                b_left,
            )
            i, j = i_end, j_end
    return same, a_left, b_left


@dataclass(frozen=True)
class Merged:
    """One merge_leaves step: `same` ids found under the same SID on both sides; the first `a_stop` /
    `b_stop` items of each buffer were merged (the rest wait for the next call), and `a_left` bool
    [a_stop] / `b_left` bool [b_stop] mark which of those are leftovers."""

    same: int
    a_stop: int
    b_stop: int
    a_left: np.ndarray
    b_left: np.ndarray


def merge_leaves(
    a_keys: np.ndarray,
    a_hashes: np.ndarray,
    b_keys: np.ndarray,
    b_hashes: np.ndarray,
    *,
    a_final: bool,
    b_final: bool,
    a_bytes: tuple[np.ndarray, np.ndarray] | None = None,
    b_bytes: tuple[np.ndarray, np.ndarray] | None = None,
    pairs_limit: int = SLOT_PAIRS_LIMIT,
) -> Merged:
    """Merge two buffers of items in leaf order: packed SIDs a_keys uint64 [na, W] / b_keys [nb, W]
    (one KeyLayout, ascending) and id hashes a_hashes / b_hashes uint64 [na] / [nb] (id_match.hash_int_ids,
    or hash_byte_ids with a_bytes / b_bytes the ids' (offsets int64 [n+1], data uint8): equal hashes are
    then compared byte for byte). Each buffer ends at a leaf boundary: that side's items still to come
    have larger SIDs. `a_final` / `b_final`: no items of that side are still to come; a side that is not
    final must hold at least one item. Merged are the items with a SID at or below the smaller last SID of
    the sides not final (all of them when both are final): Merged.a_stop, b_stop, one of which is the
    whole buffer. Raises ValueError when a buffer's SIDs are not ascending (a version whose items are not
    in leaf order)."""
    byte_ids = a_bytes is not None
    if byte_ids != (b_bytes is not None):
        raise ValueError("both sides' ids are strings, or neither's")
    if a_keys.shape[1] != b_keys.shape[1]:
        raise ValueError(f"keys of {a_keys.shape[1]} and {b_keys.shape[1]} words")
    if (not a_final and a_keys.shape[0] == 0) or (not b_final and b_keys.shape[0] == 0):
        raise ValueError("a side that is not final holds no items")
    a_keys = kernel_keys(np.ascontiguousarray(a_keys, dtype=np.uint64))
    b_keys = kernel_keys(np.ascontiguousarray(b_keys, dtype=np.uint64))
    if not (_in_order(a_keys) and _in_order(b_keys)):
        raise ValueError("items not in leaf order (SIDs not ascending)")
    a_off, a_data = a_bytes if a_bytes is not None else _NO_BYTES
    b_off, b_data = b_bytes if b_bytes is not None else _NO_BYTES
    same, a_left, b_left = _merge(
        a_keys, np.asarray(a_hashes, dtype=np.uint64), np.asarray(a_off), np.asarray(a_data), a_final,
        b_keys, np.asarray(b_hashes, dtype=np.uint64), np.asarray(b_off), np.asarray(b_data), b_final,
        byte_ids, np.int64(pairs_limit),
    )  # fmt: skip
    return Merged(int(same), a_left.shape[0], b_left.shape[0], a_left, b_left)
