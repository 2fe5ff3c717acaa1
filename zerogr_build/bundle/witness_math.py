"""The arithmetic of checking a version against the catalog its build read, using the build's leaf order
as a witness (bundle/witness.py reads the files and calls these): arrays in, arrays out, no I/O.

The witness is `order` int [N]: the catalog row at each position of the version's leaf order. The check
walks the positions once and proves, without trusting whatever sort produced `order`:
- `order` is a permutation of 0..N-1 (N positions, each names a row in range, and every row is named);
- the catalog SID of row order[j] is the SID of the leaf holding position j (leaf_offsets, leaf SIDs
  rebuilt from the step tables);
- the catalog id of row order[j] is the version's item j (bundle/witness.py, per batch).
Together: the version's (SID, item) pairs are the catalog's, as multisets, exactly.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..index.formats import bits_for


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


@nb.njit(cache=True, nogil=True)
def _leaf_of(leaf_offsets, j):
    """The leaf k with leaf_offsets[k] <= j < leaf_offsets[k+1] (binary search)."""
    lo, hi = 0, leaf_offsets.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if leaf_offsets[mid] <= j:
            lo = mid
        else:
            hi = mid
    return lo


@nb.njit(cache=True, nogil=True)
def walk_up(indptr, tokens, children, shift, keys, parents):
    """One step of the walk from leaves to the root: keys[i] |= tokens[children[i]] << shift, and
    parents[i] = the row r with indptr[r] <= children[i] < indptr[r+1]. children: nondecreasing ints in
    0..indptr[-1]-1; indptr int [rows+1] nondecreasing; keys uint64 and parents int64 like children."""
    n = children.shape[0]
    if n == 0:
        return
    r = _leaf_of(indptr, children[0])
    for i in range(n):
        c = children[i]
        while indptr[r + 1] <= c:
            r += 1
        parents[i] = r
        keys[i] |= np.uint64(tokens[c]) << shift


def leaf_keys(csr: list[tuple[np.ndarray, np.ndarray]], bits: list[int], first_leaf: int, end_leaf: int):
    """uint64 [end_leaf - first_leaf]: the SID keys (token t in its field of `bits`, most significant
    first; sum(bits) <= 64) of leaves first_leaf.., walked up from the last step's flat children (leaf k =
    child k of the last step) through each step's parents. csr: steps_as_csr."""
    keys = np.zeros(end_leaf - first_leaf, dtype=np.uint64)
    children = np.arange(first_leaf, end_leaf, dtype=np.int64)
    parents = np.empty_like(children)
    shift = 0
    for t in range(len(csr) - 1, -1, -1):
        walk_up(csr[t][0], csr[t][1], children, np.uint64(shift), keys, parents)
        shift += bits[t]
        children, parents = parents, children
    return keys


def leaf_tokens(csr: list[tuple[np.ndarray, np.ndarray]], first_leaf: int, end_leaf: int) -> np.ndarray:
    """uint64 [L, end_leaf - first_leaf]: column c = the SID of leaf first_leaf + c (leaf_keys' walk, one
    row of tokens per step, for SIDs wider than 64 bits)."""
    out = np.zeros((len(csr), end_leaf - first_leaf), dtype=np.uint64)
    children = np.arange(first_leaf, end_leaf, dtype=np.int64)
    parents = np.empty_like(children)
    for t in range(len(csr) - 1, -1, -1):
        walk_up(csr[t][0], csr[t][1], children, np.uint64(0), out[t], parents)
        children, parents = parents, children
    return out


def key_bits(codebook_sizes) -> list[int]:
    """Bits of each step's field in a SID key (bundle/verify.py: sid_sort_keys' layout)."""
    return [bits_for(int(v)) for v in codebook_sizes]


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


@nb.njit(cache=True, nogil=True, inline="always")
def _mark_row(seen, state, leaf, row):
    # Row `row` named at the next position, in leaf `leaf`: seen, and state's catalog-order flag (see
    # check_keys) set when the leaf's rows go backwards.
    seen[row] = 1
    if state[0] == leaf and state[1] > row:
        state[2] = 1
    state[0], state[1] = leaf, row


@nb.njit(cache=True, nogil=True)
def check_keys(order, lo, hi, leaf_offsets, first_leaf, leaf_key, keys, seen, state, ids, got):
    """Check positions lo..hi-1 of the witness, SIDs as 64-bit keys.

    order         int [N]: catalog row at each position (the witness).
    leaf_offsets  int [n_leaves+1]: 0 first, N last, strictly increasing (already verified).
    first_leaf    the leaf holding position lo; leaf_key uint64 [m]: keys of leaves first_leaf.. (leaf_keys).
    keys          uint64 [N]: the SID key of every catalog row.
    seen          uint8 [N]: set to 1 at every row named (the caller checks that all are, at the end).
    state         int64 [3]: (leaf, row) of the position before lo (-1, -1 at the start), then 1 once a
                  leaf's rows are not in catalog order; updated.
    ids, got      int [N] the catalog's integer item ids and int [hi - lo] the version's items at lo..hi-1
                  (the same dtype), or both empty (the caller compares the ids).
    Returns -1, or the first position whose row is out of range or whose key (id) is not its leaf's (the
    version's).
    """
    n = order.shape[0]
    with_ids = ids.shape[0] > 0
    k = first_leaf
    for j in range(lo, hi):
        while leaf_offsets[k + 1] <= j:
            k += 1
        r = order[j]
        if r < 0 or r >= n or keys[r] != leaf_key[k - first_leaf]:
            return j
        if with_ids and ids[r] != got[j - lo]:
            return j
        _mark_row(seen, state, k, r)
    return -1


@nb.njit(cache=True, nogil=True)
def check_tokens(
    order, lo, hi, leaf_offsets, first_leaf, tokens, first, words, shifts, masks, sids, seen, state
):
    """check_keys for SIDs wider than 64 bits (one position after the other).

    tokens        uint64 [L, m]: the SIDs of leaves first_leaf.. (leaf_tokens).
    first, words  PackedSids arrays [N] of the catalog (index/pack.py), shifts/masks uint64 [L] their
                  fields; or empty, and then sids int [N, L] holds the catalog's tokens.
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
            return j
        c = k - first_leaf
        if packed:
            if np.uint64(first[r]) != tokens[0, c]:
                return j
            w = words[r]
            for t in range(1, num_steps):
                if (w >> shifts[t]) & masks[t] != tokens[t, c]:
                    return j
        else:
            for t in range(num_steps):
                if sids[r, t] < 0 or np.uint64(sids[r, t]) != tokens[t, c]:
                    return j
        _mark_row(seen, state, k, r)
    return -1
