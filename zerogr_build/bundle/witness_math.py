"""The arithmetic of checking a version against the catalog its build read, using the build's leaf order
as a witness (bundle/witness.py reads the files and calls these): arrays in, arrays out, no I/O.

The witness is `order` int [N]: the catalog row at each position of the version's leaf order. The check
walks the positions once and proves, without trusting whatever sort produced `order`:
- `order` is a permutation of 0..N-1 (a bitmap of the rows seen);
- the catalog SID of row order[j] is the SID of the leaf holding position j (leaf_offsets, leaf SIDs
  rebuilt from the step tables);
- the catalog id of row order[j] is the version's item j (bundle/witness.py, per batch).
Together: the version's (SID, item) pairs are the catalog's, as multisets, exactly.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..index.formats import bits_for

#: Failure codes of check_positions.
BAD_ROW = 1  # order[j] outside 0..N-1, or a row that an earlier position already took
BAD_SID = 2  # the catalog SID of row order[j] is not the SID of position j's leaf


def steps_as_csr(steps) -> list[tuple[np.ndarray, np.ndarray]]:
    """(indptr int [rows+1], tokens int [nnz]) of every step table, children in flat child order (the
    row order of the next step). Sparse tables as stored (no copy); dense ones from their valid cells in
    row-major order, which is flat child order by the row numbering rule (checked before this is used)."""
    out = []
    for table in steps:
        if table.format == "sparse":
            out.append((np.asarray(table.indptr), np.asarray(table.tokens)))
            continue
        valid = np.asarray(table.next) >= 0
        indptr = np.zeros(valid.shape[0] + 1, dtype=np.int64)
        np.cumsum(valid.sum(axis=1), out=indptr[1:])
        out.append((indptr, np.nonzero(valid)[1]))
    return out


@nb.njit(cache=True)
def parents_of(indptr, children, out):
    """out[i] = the row r with indptr[r] <= children[i] < indptr[r+1]. children: nondecreasing ints in
    0..indptr[-1]-1; indptr int [rows+1] nondecreasing. One binary search, then a forward walk."""
    n = children.shape[0]
    if n == 0:
        return
    lo, hi = 0, indptr.shape[0] - 1  # invariant: indptr[lo] <= c < indptr[hi]
    c = children[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if indptr[mid] <= c:
            lo = mid
        else:
            hi = mid
    r = lo
    for i in range(n):
        c = children[i]
        while indptr[r + 1] <= c:
            r += 1
        out[i] = r


def leaf_tokens(csr: list[tuple[np.ndarray, np.ndarray]], first_leaf: int, end_leaf: int) -> np.ndarray:
    """uint64 [L, end_leaf - first_leaf]: column c = the SID of leaf first_leaf + c, walked up from the
    last step's flat children (leaf k = child k of the last step) through each step's parents."""
    num_steps = len(csr)
    out = np.empty((num_steps, end_leaf - first_leaf), dtype=np.uint64)
    children = np.arange(first_leaf, end_leaf, dtype=np.int64)
    parents = np.empty_like(children)
    for t in range(num_steps - 1, -1, -1):
        indptr, tokens = csr[t]
        out[t] = tokens[children]
        parents_of(indptr, children, parents)
        children, parents = parents, children
    return out


def key_bits(codebook_sizes) -> list[int]:
    """Bits of each step's field in a SID key (bundle/verify.py: sid_sort_keys' layout)."""
    return [bits_for(int(v)) for v in codebook_sizes]


def leaf_keys(csr: list[tuple[np.ndarray, np.ndarray]], bits: list[int], first_leaf: int, end_leaf: int):
    """uint64 [end_leaf - first_leaf]: the SID keys (token t in its field of `bits`, most significant
    first; sum(bits) <= 64) of leaves first_leaf.., walked up as leaf_tokens walks."""
    out = np.zeros(end_leaf - first_leaf, dtype=np.uint64)
    children = np.arange(first_leaf, end_leaf, dtype=np.int64)
    parents = np.empty_like(children)
    shift = 0
    for t in range(len(csr) - 1, -1, -1):
        indptr, tokens = csr[t]
        out |= tokens[children].astype(np.uint64) << np.uint64(shift)
        shift += bits[t]
        parents_of(indptr, children, parents)
        children, parents = parents, children
    return out


def packed_keys(first: np.ndarray, words: np.ndarray, row_bits: int, tail_bits: int) -> np.ndarray:
    """uint64 [n]: the SID keys of PackedSids rows (first [n], words [n]; tokens 1.. take tail_bits bits
    above row_bits in the words, already in key order), when token 0 and the tail fit 64 bits."""
    return (first.astype(np.uint64) << np.uint64(tail_bits)) | (words >> np.uint64(row_bits))


def unpack_keys(keys: np.ndarray, bits: list[int]) -> np.ndarray:
    """int64 [n, L]: the tokens of SID keys uint64 [n] (the inverse of the key layout)."""
    out = np.empty((keys.shape[0], len(bits)), dtype=np.int64)
    shift = 0
    for t in range(len(bits) - 1, -1, -1):
        out[:, t] = (keys >> np.uint64(shift)) & np.uint64((1 << bits[t]) - 1)
        shift += bits[t]
    return out


@nb.njit(cache=True)
def check_keys(order, lo, hi, leaf_offsets, first_leaf, leaf_key, keys, seen):
    """check_positions for SIDs that fit a 64-bit key: keys uint64 [N] of the catalog rows, leaf_key
    uint64 [m] of leaves first_leaf.. (leaf_keys). Returns (-1, 0) or (first bad position, code)."""
    n = order.shape[0]
    k = first_leaf
    for j in range(lo, hi):
        while leaf_offsets[k + 1] <= j:
            k += 1
        r = order[j]
        if r < 0 or r >= n:
            return j, BAD_ROW
        byte, bit = r >> 3, np.uint8(1 << (r & 7))
        if seen[byte] & bit:
            return j, BAD_ROW
        seen[byte] |= bit
        if keys[r] != leaf_key[k - first_leaf]:
            return j, BAD_SID
    return -1, 0


@nb.njit(cache=True)
def check_positions(order, lo, hi, leaf_offsets, first_leaf, tokens, first, words, shifts, masks, sids, seen):
    """Check positions lo..hi-1 of the witness. Returns (-1, 0) or (first bad position, BAD_ROW|BAD_SID).

    order         int [N]: catalog row at each position (the witness).
    leaf_offsets  int [n_leaves+1]: 0 first, N last, strictly increasing (already verified).
    first_leaf    the leaf holding position lo; tokens uint64 [L, m]: the SIDs of leaves first_leaf..
                  (leaf_tokens).
    first, words  PackedSids arrays [N] of the catalog (index/pack.py), shifts/masks uint64 [L] their
                  fields; or empty, and then sids int [N, L] holds the catalog's tokens.
    seen          uint8 [N // 8 + 1]: bitmap of the rows taken so far, updated.
    """
    n = order.shape[0]
    num_steps = tokens.shape[0]
    packed = words.shape[0] > 0
    k = first_leaf
    for j in range(lo, hi):
        while leaf_offsets[k + 1] <= j:
            k += 1
        r = order[j]
        if r < 0 or r >= n:
            return j, BAD_ROW
        byte, bit = r >> 3, np.uint8(1 << (r & 7))
        if seen[byte] & bit:
            return j, BAD_ROW
        seen[byte] |= bit
        c = k - first_leaf
        if packed:
            if np.uint64(first[r]) != tokens[0, c]:
                return j, BAD_SID
            w = words[r]
            for t in range(1, num_steps):
                if (w >> shifts[t]) & masks[t] != tokens[t, c]:
                    return j, BAD_SID
        else:
            for t in range(num_steps):
                if sids[r, t] < 0 or np.uint64(sids[r, t]) != tokens[t, c]:
                    return j, BAD_SID
    return -1, 0
