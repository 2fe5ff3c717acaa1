"""One search's include / exclude arguments compiled against the Decoder's Resident (item_space.py): the
per-request set words, and per step the few rows that the request's exclusions empty ("kills").

Allowed items of request b: A_b = (available and in the union of its sets S_b, when it names any) minus its
excluded items E_b. A row R of step s is valid for b iff A_b meets R. Without E_b that is the resident
availability (item_space.masked_tables) and, with sets, (row_bits[R] & mask(S_b)) != 0. An exclusion can only
turn a valid row invalid, and only a row that holds an excluded item - one of the <= |E_b| ancestors per step
of b's excluded positions. For such a row:

  - no sets: A_b meets R iff avail(R) > |E_b ∩ avail ∩ R| (avail(R) from the mask's prefix sum);
  - sets S_b: A_b ∩ R = U_{i in S_b} (avail ∩ set_i ∩ R) minus E_b, which is empty iff *every* set's part
    lies inside E_b, i.e. for every i in S_b: cnt_i(R) == |E_b ∩ avail ∩ set_i ∩ R|, where cnt_i(R) =
    |avail ∩ set_i ∩ R| (two binary searches in Resident.set_keys). Each set is compared with its own
    count, so an item in two sets is never counted twice (a sum of per-set counts would be wrong).

So the kills of step s are found in O(|E| x |S_b| x log) host work at start(), independent of the catalog
size, and a step then drops them from its slots in O(kills + beams log beams) (item_filter.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..index import SidIndex
from .constraints import POSITIONS, ItemIds
from .item_space import Resident, signed_words


@dataclass(frozen=True, eq=False)
class Kills:
    """Rows of one step s that exclusions empty, one entry per (request, row), on the device.

    slot_query int64 [k]: request * (rows_s + 1) + row (row = a flat child of step table s-1);
    beam_query int64 [k]: request * (rows_{s-1} + 1) + parent row; column int64 [k]: the row's last token
    (dense step tables). Static shapes: padded to a power of two with request = batch size (matches no
    slot and no beam)."""

    slot_query: torch.Tensor
    beam_query: torch.Tensor
    column: torch.Tensor


@dataclass(frozen=True, eq=False)
class RequestConstraints:
    """What one search may decode: a snapshot of the Decoder's Resident plus the compiled arguments.

    set_mask: [B] (or [B, words]) the word of each request's sets (SetBits: ANY alone for a request naming
    none), torch view of the sets' word type, on the device; None when no request names sets.
    kills[s-1]: Kills of step s or None. host_exclude[b]: int64 sorted excluded positions of request b;
    host_sets[b]: its set word(s) or None (host, for dec.items)."""

    resident: Resident
    set_mask: torch.Tensor | None
    kills: tuple[Kills | None, ...]
    host_exclude: tuple[np.ndarray, ...]
    host_sets: tuple[np.ndarray | None, ...]
    batch_size: int
    static: bool = False

    def allowed_positions(self, request: int, positions: np.ndarray) -> np.ndarray:
        """bool [k]: which leaf-order item positions int64 [k] request `request` may return (host)."""
        keep = np.ones(positions.shape[0], dtype=bool)
        resident = self.resident
        if resident.available is not None:
            keep &= resident.available[positions]
        words = self.host_sets[request]
        if words is not None:
            assert resident.set_bits is not None
            hit = (resident.set_bits.item_bits[positions] & words) != 0
            keep &= hit.any(axis=1) if hit.ndim == 2 else hit
        return keep & ~_isin_sorted(positions, self.host_exclude[request])

    def filter_leaf_items(
        self, index: SidIndex, leaves: np.ndarray, values: list, offsets: np.ndarray
    ) -> tuple[list, np.ndarray]:
        """SidIndex.leaf_items' result kept to each request's allowed items.

        Args:
            index: the decoder's SidIndex (its leaf map gives each value's item position).
            leaves: int [B, M], the result's leaves (-1 = padding).
            values: the items of all leaves, concatenated (list, leaf_items order).
            offsets: int64 [B * M + 1], values of beam j are values[offsets[j] : offsets[j + 1]].
        Shape: returns (kept values, int64 [B * M + 1] offsets).
        """
        positions, _ = index.leaf_items(leaves, POSITIONS)
        request = np.repeat(np.arange(leaves.shape[0]), leaves.shape[1])
        owner = np.repeat(request, np.diff(offsets))
        keep = np.zeros(positions.shape[0], dtype=bool)
        for b in range(leaves.shape[0]):
            mine = owner == b
            keep[mine] = self.allowed_positions(b, positions[mine])
        kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
        return [v for v, k in zip(values, keep.tolist(), strict=True) if k], kept[offsets]


def _isin_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if sorted_set.size == 0:
        return np.zeros(values.shape[0], dtype=bool)
    at = np.searchsorted(sorted_set, values).clip(max=sorted_set.shape[0] - 1)
    return sorted_set[at] == values


def _per_request(arg: Any, batch_size: int, what: str) -> list[Any]:
    if arg is None:
        return [None] * batch_size
    arg = list(arg)
    if len(arg) != batch_size:
        raise InputError(f"{what}: {len(arg)} entries for a batch of {batch_size} requests")
    return arg


def _group_all(ok: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """bool [groups]: all of ok's consecutive runs of sizes (int64 [groups], all >= 1) are True."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return np.logical_and.reduceat(ok, starts) if ok.size else np.zeros(0, dtype=bool)


def _search(sorted_array: np.ndarray, queries: np.ndarray, side: str = "left") -> np.ndarray:
    """np.searchsorted with the queries sorted first: numpy narrows each search from the previous result,
    so a few thousand scattered queries into a million-entry array take ~3x less time."""
    order = np.argsort(queries, kind="stable")
    out = np.empty(queries.shape[0], dtype=np.int64)
    out[order] = np.searchsorted(sorted_array, queries[order], side=side)
    return out


def ancestors(resident: Resident, step: int, positions: np.ndarray) -> np.ndarray:
    """int64 [k]: the row of step `step` (1..L) holding each leaf-order item position int64 [k] - the last
    row whose run starts at or before it (rows cover consecutive runs, row_item_bounds)."""
    space = resident.space
    if step == len(space.bounds) and space.one_item_per_leaf:
        return positions  # leaf p holds item p
    return _search(space.bounds[step - 1], positions, side="right") - 1


def _expand(req: np.ndarray, set_flat: np.ndarray, set_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One entry per (entry i, set of request req[i]): (i int64, set index int64), the sets of request b
    being set_flat[set_off[b] : set_off[b + 1]] (set_off int64 [B + 1])."""
    sizes = set_off[req + 1] - set_off[req]
    entry = np.repeat(np.arange(req.shape[0]), sizes)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    rank = np.arange(entry.shape[0]) - first[entry]
    return entry, set_flat[set_off[req[entry]] + rank]


def killed_rows(resident: Resident, step: int, req: np.ndarray, pos: np.ndarray, set_req: np.ndarray,
                set_id: np.ndarray, set_pos: np.ndarray, set_flat: np.ndarray,
                set_off: np.ndarray) -> tuple[np.ndarray, ...]:  # fmt: skip
    """The (request, row) pairs of step `step` (1..L) that the exclusions empty (see the module docstring).

    Args:
        req, pos: int64 [n], excluded *available* positions of requests without sets (unique per request).
        set_req, set_id, set_pos: int64 [m], (request, set i, position) for each excluded position of a
            request with sets that is an available member of set i in S_b (unique triples).
        set_flat, set_off: the sets S_b of request b are set_flat[set_off[b] : set_off[b + 1]] (sorted).
    Returns (request, row, a killed excluded position of the row) int64 [k] each, sorted by (request, row).
    """
    space = resident.space
    bounds, rows = space.bounds[step - 1], space.rows[step - 1]
    out_req, out_row, out_pos = [], [], []
    if req.size:  # without sets: killed iff every available item of the row is excluded
        row = ancestors(resident, step, pos)
        keys, first, excluded = np.unique(req * rows + row, return_index=True, return_counts=True)
        dead = resident.available_in(step, keys % rows) == excluded
        out_req.append(keys[dead] // rows)
        out_row.append(keys[dead] % rows)
        out_pos.append(pos[first[dead]])
    if set_req.size:  # with sets: killed iff for every set of the request its available part is excluded
        assert resident.sets is not None and resident.set_keys is not None
        nsets = len(resident.sets.names)
        row = ancestors(resident, step, set_pos)
        per_set, per_set_excluded = np.unique((set_req * nsets + set_id) * rows + row, return_counts=True)
        pairs, first = np.unique(set_req * rows + row, return_index=True)
        b, r = pairs // rows, pairs % rows
        pair, sid = _expand(b, set_flat, set_off)  # one entry per (pair, set of its request)
        stride = space.num_items + 1
        lo, hi = sid * stride + bounds[r[pair]], sid * stride + bounds[r[pair] + 1]
        keys = resident.set_keys
        available = _search(keys, hi) - _search(keys, lo)  # cnt_i(R), from the sets' available positions
        q = (b[pair] * nsets + sid) * rows + r[pair]
        at = np.searchsorted(per_set, q).clip(max=max(per_set.shape[0] - 1, 0))
        excluded = np.where(per_set[at] == q, per_set_excluded[at], 0)
        dead = _group_all(available == excluded, set_off[b + 1] - set_off[b])
        out_req.append(b[dead])
        out_row.append(r[dead])
        out_pos.append(set_pos[first[dead]])
    if not out_req:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    b, r, p = (np.concatenate(x) for x in (out_req, out_row, out_pos))
    order = np.argsort(b * rows + r, kind="stable")
    return b[order], r[order], p[order]


def _kills_on_device(resident: Resident, step: int, b: np.ndarray, r: np.ndarray, p: np.ndarray,
                     batch_size: int, static: bool) -> Kills | None:  # fmt: skip
    """Kills of step `step` as the lookups item_filter.py makes (see Kills)."""
    if b.size == 0:
        return None
    space = resident.space
    rows = space.rows[step - 1]
    parent_rows = space.rows[step - 2] if step >= 2 else 1
    parent = np.searchsorted(space.bounds[step - 2], p, side="right") - 1 if step >= 2 else np.zeros_like(p)
    token = space.child_token[step - 1]
    column = token[r] if token is not None else np.zeros_like(r)
    slot_q, beam_q = b * (rows + 1) + r, b * (parent_rows + 1) + parent
    if static:  # padding: request = batch_size, above every real key
        width = 1 << max(b.shape[0] - 1, 15).bit_length()
        pad = width - b.shape[0]
        slot_q = np.concatenate([slot_q, np.full(pad, batch_size * (rows + 1), np.int64)])
        beam_q = np.concatenate([beam_q, np.full(pad, batch_size * (parent_rows + 1), np.int64)])
        column = np.concatenate([column, np.zeros(pad, np.int64)])
    dev = space.device
    return Kills(
        *(torch.as_tensor(np.ascontiguousarray(x, dtype=np.int64)).to(dev) for x in (slot_q, beam_q, column))
    )


def _ids(entry: Any) -> np.ndarray:
    if hasattr(entry, "to_numpy"):
        entry = entry.to_numpy(zero_copy_only=False)
    return np.asarray(entry).reshape(-1)


def request_constraints(resident: Resident, ids: ItemIds, include: Any, exclude: Any, batch_size: int, *,
                        static: bool = False) -> RequestConstraints:  # fmt: skip
    """Compile one search's include/exclude arguments (one entry per request; None or [] = no restriction).

    Args:
        resident: the Decoder's availability and sets at the start of the search (a snapshot).
        ids: item id -> position lookup of the Decoder's bundle or index.
        include: per request, names of item sets (union) or None.
        exclude: per request, item ids or None.
        batch_size: B.
        static: pad the kill lists to power-of-two lengths (static_shapes).
    Host work O(|exclude| x (|sets named| + L) x log) over the batch, vectorised across requests, nothing
    per catalog item; the steps then read no host value.
    """
    include, exclude = (
        _per_request(include, batch_size, "include"),
        _per_request(exclude, batch_size, "exclude"),
    )
    n = resident.space.num_items
    set_bits = resident.set_bits
    chosen: list[np.ndarray] = []
    for names in include:
        if names is None or not len(names):
            chosen.append(np.zeros(0, np.int64))
            continue
        if set_bits is None:
            raise InputError("include needs item sets: call Decoder.set_item_sets first")
        names = [names] if isinstance(names, str) else list(names)
        chosen.append(np.unique(np.asarray(set_bits.sets.lookup(names), dtype=np.int64)))
    set_off = np.concatenate([[0], np.cumsum([c.shape[0] for c in chosen])]).astype(np.int64)
    set_flat = np.concatenate(chosen).astype(np.int64)
    uses_sets = set_off[1:] > set_off[:-1]

    # Every request's excluded ids in one lookup; key = request * (n + 1) + position sorts and dedups them
    # by (request, position) at once.
    lists = [_ids(e) if e is not None else np.zeros(0, np.int64) for e in exclude]
    lists = [x for x in lists if x.size] or [np.zeros(0, np.int64)]
    owner = np.repeat(np.arange(batch_size), [0 if e is None else _ids(e).size for e in exclude])
    found = ids.lookup(np.concatenate(lists))
    if (found < 0).any():
        warnings.warn(f"{int((found < 0).sum())} of {found.shape[0]} excluded item ids are not in the "
                      "catalog (ignored)", stacklevel=4)  # fmt: skip
    keys = np.unique(owner[found >= 0] * (n + 1) + found[found >= 0])
    req, pos = keys // (n + 1), keys % (n + 1)
    cut = np.searchsorted(req, np.arange(batch_size + 1))
    host_exclude = tuple(pos[cut[b] : cut[b + 1]] for b in range(batch_size))
    live = np.ones(pos.shape[0], bool) if resident.available is None else resident.available[pos]

    plain = live & ~uses_sets[req]
    with_sets = np.flatnonzero(live & uses_sets[req])
    entry, sid = _expand(req[with_sets], set_flat, set_off)
    spos = pos[with_sets][entry]
    member = set_bits.contains(spos, sid) if set_bits is not None else np.zeros(0, bool)
    arrays = (req[plain], pos[plain], req[with_sets][entry][member], sid[member], spos[member])
    kills = []
    for s in range(1, len(resident.space.bounds) + 1):
        killed = killed_rows(resident, s, *arrays, set_flat, set_off)
        kills.append(_kills_on_device(resident, s, *killed, batch_size, static))
    dev = resident.space.device
    set_mask = None
    host_sets: list[np.ndarray | None] = [None] * batch_size
    if uses_sets.any():
        assert set_bits is not None
        words = set_bits.request_words(set_flat, set_off)
        host_sets = [words[b] if uses_sets[b] else None for b in range(batch_size)]
        set_mask = torch.from_numpy(signed_words(words)).to(dev)
    return RequestConstraints(resident, set_mask, tuple(kills), host_exclude, tuple(host_sets),
                              batch_size, static)  # fmt: skip


__all__ = ["Kills", "RequestConstraints", "ancestors", "killed_rows", "request_constraints"]
