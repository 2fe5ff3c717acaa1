"""The rows one search's exclusions empty ("kills"), per step: pure index math on the host (numpy in,
arrays out), run once per search by requests.request_constraints.

Allowed items of request b: A_b = (available and in the union of its sets S_b, when it names any) minus its
excluded items E_b. Row R is valid for b iff A_b meets R. Without E_b that is the resident availability
(space.masked_tables) and, with sets, (row_bits[R] & word(S_b)) != 0. An exclusion can only turn a
valid row invalid, and only a row that holds one of b's excluded available items. For such a row:

  - no sets: A_b misses R iff avail(R) == |E_b ∩ avail ∩ R| (avail(R) from the mask's prefix sum);
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


def unique_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique int64 [u] ascending, inverse int64 [k] with unique[inverse] == keys, counts int64 [u]) of
    keys int64 [k], by one sort (np.unique's hash path is slower for a few thousand int64 keys)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first = np.ones(ordered.shape[0], dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    group = np.cumsum(first) - 1
    inverse = np.empty(keys.shape[0], dtype=np.int64)
    inverse[order] = group
    starts = np.flatnonzero(first)
    return ordered[first], inverse, np.diff(np.append(starts, ordered.shape[0]))


def expand_sets(req: np.ndarray, set_flat: np.ndarray, set_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One entry per (entry i, set of request req[i]): (i int64, set index int64) [m], the sets of request
    b being set_flat[set_off[b] : set_off[b + 1]] (set_off int64 [B + 1]); entries of one i are adjacent."""
    sizes = set_off[req + 1] - set_off[req]
    entry = np.repeat(np.arange(req.shape[0]), sizes)
    first = np.zeros(req.shape[0], dtype=np.int64)
    np.cumsum(sizes[:-1], out=first[1:])
    rank = np.arange(entry.shape[0]) - first[entry]
    return entry, set_flat[set_off[req[entry]] + rank]


def _search(sorted_array: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """np.searchsorted (left) with the queries sorted first: numpy narrows each search from the previous
    result, so scattered queries into a large array take about 3x less time."""
    order = np.argsort(queries, kind="stable")
    out = np.empty(queries.shape[0], dtype=np.int64)
    out[order] = np.searchsorted(sorted_array, queries[order])
    return out


def _all_in_runs(ok: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """bool [groups]: every entry of each consecutive run (sizes int64 [groups], all >= 1) of ok is True."""
    starts = np.zeros(sizes.shape[0], dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return np.logical_and.reduceat(ok, starts) if ok.size else np.zeros(0, dtype=bool)


def _set_kills(resident: Resident, step: int, req: np.ndarray, sid: np.ndarray, row: np.ndarray,
               set_flat: np.ndarray, set_off: np.ndarray) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Requests with sets at step `step`: (killed pair keys b * rows + row, sorted; dead bool per distinct
    pair; inverse: the pair of each entry) for entries (req, set sid, row) int64 [m] (module docstring).

    A row holding a single item is killed outright: that item is the excluded available member e, so
    cnt_i(R) = |{e} ∩ set_i| = |E_b ∩ avail ∩ set_i ∩ R| for every i (most leaves, and most rows just
    above them, hold one item). Only rows with more items pay for the per-set binary searches."""
    space, nsets = resident.space, len(resident.set_bits.sets.names)
    bounds, rows = space.bounds[step - 1], space.rows[step - 1]
    pairs, inverse, _ = unique_counts(req * rows + row)
    b, r = pairs // rows, pairs % rows
    dead = np.ones(pairs.shape[0], dtype=bool)
    wide = np.flatnonzero(bounds[r + 1] - bounds[r] > 1)
    if wide.size:
        per_set, _, per_set_excluded = unique_counts((req * nsets + sid) * rows + row)
        wb, wr = b[wide], r[wide]
        pair, each = expand_sets(wb, set_flat, set_off)  # one entry per (pair, set of its request)
        stride = space.num_items + 1
        keys = resident.set_keys
        low, high = each * stride + bounds[wr[pair]], each * stride + bounds[wr[pair] + 1]
        available = _search(keys, high) - _search(keys, low)  # cnt_i(R): set i's available items in R
        q = (wb[pair] * nsets + each) * rows + wr[pair]
        at = np.searchsorted(per_set, q).clip(max=per_set.shape[0] - 1)
        excluded = np.where(per_set[at] == q, per_set_excluded[at], 0)
        dead[wide] = _all_in_runs(available == excluded, set_off[wb + 1] - set_off[wb])
    return pairs[dead], dead, inverse


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
    space = resident.space
    steps = len(space.bounds)
    row, set_row = space.leaf_of(pos), space.leaf_of(set_pos)
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.int64),) * 2] * steps
    for step in range(steps, 0, -1):
        rows = space.rows[step - 1]
        keys = []
        if req.size:  # without sets: killed iff every available item of the row is excluded
            unique, inverse, excluded = unique_counts(req * rows + row)
            dead = resident.available_in(step, unique % rows) == excluded
            keys.append(unique[dead])
            keep = dead[inverse]  # carried up: the items of killed rows only (exact, see above)
            req, row = req[keep], row[keep]
        if set_req.size:
            killed, dead, inverse = _set_kills(resident, step, set_req, set_id, set_row, set_flat, set_off)
            keys.append(killed)
            keep = dead[inverse]
            set_req, set_id, set_row = set_req[keep], set_id[keep], set_row[keep]
        if keys:
            both = np.sort(np.concatenate(keys))  # disjoint requests: no duplicates
            out[step - 1] = (both // rows, both % rows)
        if step > 1:
            parent = space.parent[step - 1]
            row, set_row = parent[row].astype(np.int64), parent[set_row].astype(np.int64)
    return out


__all__ = ["expand_sets", "killed_rows", "unique_counts"]
