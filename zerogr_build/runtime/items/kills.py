"""The rows one search's exclusions empty ("kills"), per step: pure index math on the host (numpy in,
arrays out), run once per search by requests.request_constraints.

Allowed items of request b: A_b = (available and in the union of its sets S_b, when it names any) minus its
excluded items E_b. Row R is valid for b iff A_b meets R. Without E_b that is the resident availability
(space.masked_tables) and, with sets, (row_bits[R] & word(S_b)) != 0. An exclusion can only turn a
valid row invalid, and only a row that holds one of b's excluded available items. For such a row:

  - no sets: A_b misses R iff avail(R) == |E_b ∩ avail ∩ R| (avail(R) from the mask's rank);
  - sets S_b: A_b ∩ R = U_{i in S_b} (avail ∩ set_i ∩ R) minus E_b, which is empty iff *every* set's part
    lies inside E_b, i.e. for every i in S_b: cnt_i(R) == |E_b ∩ avail ∩ set_i ∩ R|, with cnt_i(R) =
    |avail ∩ set_i ∩ R| from two binary searches in Resident.set_keys. Each set is compared with its own
    count, so an item in two sets is never counted twice (a sum of per-set counts would be wrong).

Bottom-up pruning (exact): a row whose child holding e still meets A_b is not killed, so from the leaves up
only the excluded items whose row of the step below was killed are carried to its parent. If R is killed
every child of R is too, so all of R's excluded items are carried and the counts above are complete; if R
is not killed the carried counts are at most the full ones, which are below cnt, so R is not reported.
Work O(|E| x (|S_b| + 1) x L) gathers and small sorts, nothing per catalog item.
"""

from __future__ import annotations

import numpy as np

from .space import Resident


def sorted_unique(keys: np.ndarray) -> np.ndarray:
    """int64 [u]: the distinct keys of int64 [k], ascending, by one sort (np.unique's hash path is slower
    for a few thousand int64 keys)."""
    ordered = np.sort(keys)
    if ordered.shape[0] < 2:
        return ordered
    first = np.empty(ordered.shape[0], dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def expand_sets(req: np.ndarray, set_flat: np.ndarray, set_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One entry per (entry i, set of request req[i]): (i int64, set index int64) [m], the sets of request
    b being set_flat[set_off[b] : set_off[b + 1]] (set_off int64 [B + 1]); entries of one i are adjacent."""
    sizes = set_off[req + 1] - set_off[req]
    entry = np.repeat(np.arange(req.shape[0]), sizes)
    first = np.zeros(req.shape[0], dtype=np.int64)
    np.cumsum(sizes[:-1], out=first[1:])
    rank = np.arange(entry.shape[0]) - first[entry]
    return entry, set_flat[set_off[req[entry]] + rank]


def killed_rows(resident: Resident, req: np.ndarray, pos: np.ndarray, set_req: np.ndarray, set_id: np.ndarray,
                set_pos: np.ndarray, set_flat: np.ndarray,
                set_off: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Per step s = 1..L: (request, row) int64 [k_s] each, sorted by (request, row): the rows of step s
    that request's exclusions empty (module docstring).

    Args:
        resident: availability, sets and geometry (space.Resident).
        req, pos: int64 [n], excluded *available* positions of requests without sets (unique per request).
        set_req, set_id, set_pos: int64 [m], (request, set i, position) for each excluded position of a
            request with sets that is an available member of set i in S_b (unique triples).
        set_flat, set_off: the sets S_b of request b are set_flat[set_off[b] : set_off[b + 1]] (sorted).
    """
    from ._kill_kernels import plain_step_kills, set_step_kills

    space = resident.space
    steps = len(space.bounds)
    rank = resident.rank
    words, before = (_NO_WORDS, _NO_BEFORE) if rank is None else (rank.words, rank.before)
    if set_req.size:
        assert resident.set_bits is not None and resident.set_keys is not None
    row, set_row = space.leaf_of(pos), space.leaf_of(set_pos)
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.int64),) * 2] * steps
    for step in range(steps, 0, -1):
        rows, bounds = space.rows[step - 1], space.bounds[step - 1]
        keys = []
        if req.size:  # without sets: killed iff every available item of the row is excluded
            killed, keep = plain_step_kills(req, row, rows, bounds, words, before, resident.rank is not None)
            keys.append(killed)
            req, row = req[keep], row[keep]  # carried up: the items of killed rows only (exact, see above)
        if set_req.size:
            killed, keep = set_step_kills(set_req, set_id, set_row, rows, bounds, set_flat, set_off,
                                          resident.set_keys, space.num_items + 1)  # fmt: skip
            keys.append(killed)
            set_req, set_id, set_row = set_req[keep], set_id[keep], set_row[keep]
        if keys:
            both = np.sort(np.concatenate(keys)) if len(keys) > 1 else keys[0]  # disjoint requests
            out[step - 1] = (both // rows, both % rows)
        if step > 1:
            parent = space.parent[step - 1]
            row, set_row = parent[row].astype(np.int64), parent[set_row].astype(np.int64)
    return out


_NO_WORDS = np.zeros(1, dtype=np.uint64)
_NO_BEFORE = np.zeros(2, dtype=np.int64)

__all__ = ["expand_sets", "killed_rows", "sorted_unique"]
