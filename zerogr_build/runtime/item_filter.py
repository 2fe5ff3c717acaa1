"""How the Decoder applies item constraints (constraints.py) on its device: per-row allowed-item counts and
per-request lists, and the slot masks built from them. The math (docs/constraints.md):

Row j of step s (1..L; the rows of step L are the leaves) is the j-th distinct length-s prefix in
lexicographic order, so it covers a contiguous run [bounds[j], bounds[j+1]) of the leaf-ordered items.
  - availability: counts[j] = cum[bounds[j+1]] - cum[bounds[j]], cum the prefix sum of the mask (O(items)
    per mask swap, O(rows) memory);
  - exclude (requests without include sets): subtract the request's available excluded positions inside
    [lo, hi) - two binary searches in a sorted list, O(|exclude|) memory, O(|exclude| x L) to build;
  - include: count the request's allowed positions (union of its sets, available, not excluded) inside
    [lo, hi) the same way.
A candidate slot of step s-1 is valid iff its child row's count is > 0. Every request's list lives in one
ascending key tensor (key = request * (items + 1) + position), so one 1-D searchsorted answers any mix of
requests and no step reads a value back to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..index import SidIndex
from .constraints import POSITIONS, ItemIds, ItemMask, ItemSets, index_of, item_ids, row_item_bounds


class ItemSpace:
    """The leaf-order item geometry of one index on a device: bounds[s-1] int64 [rows_s + 1] (see
    row_item_bounds) and the all-items counts (what an all-available mask gives)."""

    def __init__(self, source: Any, device: torch.device) -> None:
        index = index_of(source)
        self.num_items = index.num_items
        self.device = device
        self.bounds = tuple(torch.as_tensor(b).to(device) for b in row_item_bounds(index))
        self.full_counts = tuple((b[1:] - b[:-1]).to(torch.int32) for b in self.bounds)
        self.one_item_per_leaf = index.num_leaves == index.num_items


@dataclass(frozen=True, eq=False)
class Resident:
    """The Decoder's current availability and item sets (replaced as a whole, never mutated).

    available: bool [items] host or None (all available); counts[s-1]: int32 [rows_s] available items per row
    of step s on the device; sets / set_available: ItemSets and each set's available positions."""

    space: ItemSpace
    available: np.ndarray | None
    counts: tuple[torch.Tensor, ...]
    sets: ItemSets | None
    set_available: tuple[np.ndarray, ...]


def availability_counts(space: ItemSpace, available: np.ndarray | None) -> tuple[torch.Tensor, ...]:
    """Per step s: int32 [rows_s] available items of each row: one prefix sum over items, then one gather
    and a difference per step (O(items + rows), on the space's device). Leaves holding one item each (the
    common case: unique SIDs) take the mask itself."""
    if available is None:
        return space.full_counts
    if space.device.type == "cpu":  # numpy: about 3x faster than torch's int32 cumsum + gathers here
        cum = np.zeros(available.shape[0] + 1, dtype=np.int32)
        np.cumsum(available, dtype=np.int32, out=cum[1:])
        host = []
        for s, b in enumerate(space.bounds):
            if s == len(space.bounds) - 1 and space.one_item_per_leaf:
                host.append(available.astype(np.int32))
            else:
                edges = cum[b.numpy()]
                host.append(edges[1:] - edges[:-1])
        return tuple(torch.from_numpy(c) for c in host)
    mask = torch.as_tensor(available).to(space.device)
    cum = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=space.device)
    torch.cumsum(mask, 0, dtype=torch.int32, out=cum[1:])
    counts = []
    for s, b in enumerate(space.bounds):
        if s == len(space.bounds) - 1 and space.one_item_per_leaf:
            counts.append(mask.to(torch.int32))
        else:
            edges = cum[b]
            counts.append(edges[1:] - edges[:-1])
    return tuple(counts)


def make_resident(space: ItemSpace, mask: ItemMask | None, sets: ItemSets | None) -> Resident:
    available = None if mask is None else mask.available
    for what, n in (("availability mask", None if mask is None else mask.num_items),
                    ("item sets", None if sets is None else sets.num_items)):  # fmt: skip
        if n is not None and n != space.num_items:
            raise InputError(f"{what} is for {n} items, the decoder's index has {space.num_items}")
    set_available: tuple[np.ndarray, ...] = ()
    if sets is not None:
        set_available = (
            sets.positions if available is None else tuple(p[available[p]] for p in sets.positions)
        )
    return Resident(space, available, availability_counts(space, available), sets, set_available)


@dataclass(frozen=True, eq=False)
class RequestConstraints:
    """What one search may decode: a snapshot of the Decoder's Resident plus per-request lists, keyed so
    one 1-D binary search serves every request: key = request * (items + 1) + position.

    exclude_keys int64 [nE]: available excluded positions of requests without include sets, ascending;
    include_keys int64 [nA]: allowed positions of requests with include sets, ascending;
    uses_include bool [B]. Padded with the sentinel B * (items + 1) under static shapes.
    host_exclude / host_include: the same per request on the host (dec.items filters leaves with them).
    """

    resident: Resident
    exclude_keys: torch.Tensor | None
    include_keys: torch.Tensor | None
    uses_include: torch.Tensor | None
    host_exclude: tuple[np.ndarray, ...]
    host_include: tuple[np.ndarray | None, ...]
    static: bool = False

    def allowed_rows(self, step: int, rows: torch.Tensor, request: torch.Tensor) -> torch.Tensor:
        """bool, rows' shape: row rows[...] of step `step` (1..L; -1 = none) has an allowed item for request
        request[...] (broadcast against rows). Static shapes: every entry is computed and nothing is read
        back to the host; otherwise only the real rows (one nonzero: most slots are empty)."""
        request = request.expand_as(rows)
        if self.static:
            return self.allowed_real(step, rows.clamp(min=0), request) & (rows >= 0)
        flat = rows.reshape(-1)
        real = torch.nonzero(flat >= 0).squeeze(1)
        out = torch.zeros(flat.shape[0], dtype=torch.bool, device=rows.device)
        out[real] = self.allowed_real(step, flat[real], request.reshape(-1)[real])
        return out.view(rows.shape)

    def allowed_real(self, step: int, rows: torch.Tensor, request: torch.Tensor) -> torch.Tensor:
        """bool, rows' shape: rows (all >= 0) of step `step` have an allowed item for request (same shape)."""
        space = self.resident.space
        bounds = space.bounds[step - 1]
        count = self.resident.counts[step - 1][rows].long()
        if self.exclude_keys is None and self.include_keys is None:
            return count > 0
        offset = request * (space.num_items + 1)
        lo, hi = bounds[rows] + offset, bounds[rows + 1] + offset
        if self.exclude_keys is not None:
            count = count - _count_between(self.exclude_keys, lo, hi)
        if self.include_keys is not None:
            count = torch.where(self.uses_include[request], _count_between(self.include_keys, lo, hi), count)
        return count > 0

    def allowed_positions(self, request: int, positions: np.ndarray) -> np.ndarray:
        """bool [k]: which leaf-order item positions request `request` may return (host)."""
        include = self.host_include[request]
        if include is not None:
            return _isin_sorted(positions, include)
        keep = np.ones(positions.shape[0], dtype=bool)
        if self.resident.available is not None:
            keep &= self.resident.available[positions]
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
        kept_offsets = kept[offsets]
        return [v for v, k in zip(values, keep.tolist(), strict=True) if k], kept_offsets


def _count_between(keys: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """int64, lo's shape: how many of the ascending keys lie in [lo, hi). On the CPU through numpy, whose
    binary search is about 2x faster than torch's (zero-copy views, no device involved)."""
    if keys.device.type == "cpu":
        k = keys.numpy()
        counts = np.searchsorted(k, hi.numpy()) - np.searchsorted(k, lo.numpy())
        return torch.from_numpy(counts)
    return torch.searchsorted(keys, hi) - torch.searchsorted(keys, lo)


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


def _keyed(lists: Sequence[np.ndarray], num_items: int, device: torch.device, static: bool) -> torch.Tensor:
    """One ascending int64 tensor of request * (items + 1) + position over every request's sorted list;
    static: padded to a power of two with the sentinel len(lists) * (items + 1) (above every query)."""
    stride = num_items + 1
    keys = np.concatenate([np.zeros(0, np.int64)] + [p + b * stride for b, p in enumerate(lists)])
    if static:
        width = 1 << max(keys.shape[0] - 1, 63).bit_length()
        keys = np.concatenate([keys, np.full(width - keys.shape[0], len(lists) * stride, dtype=np.int64)])
    return torch.as_tensor(keys).to(device)


def request_constraints(resident: Resident, ids: ItemIds, include: Any, exclude: Any, batch_size: int, *,
                        static: bool = False) -> RequestConstraints:  # fmt: skip
    """Compile one search's include/exclude arguments (one entry per request; None or [] = no restriction).

    Args:
        resident: the Decoder's availability and sets at the start of the search (a snapshot).
        ids: item id -> position lookup of the Decoder's bundle or index.
        include: per request, names of item sets (union) or None.
        exclude: per request, item ids or None.
        batch_size: B.
        static: pad the key tensors (static_shapes).
    Host work O(sum |include sets| + |exclude| log |exclude|) per request; steps then read no host value.
    """
    include, exclude = (
        _per_request(include, batch_size, "include"),
        _per_request(exclude, batch_size, "exclude"),
    )
    host_exclude: list[np.ndarray] = []
    host_include: list[np.ndarray | None] = []
    for names, excluded in zip(include, exclude, strict=True):
        excl = np.zeros(0, np.int64)
        if excluded is not None and len(excluded):
            excl = np.unique(ids.positions(excluded, "excluded item ids"))
        if names is not None and len(names):
            if isinstance(names, str):
                names = [names]
            if resident.sets is None:
                raise InputError("include needs item sets: call Decoder.set_item_sets first")
            chosen = [resident.set_available[i] for i in sorted(set(resident.sets.lookup(list(names))))]
            allowed = chosen[0]
            if len(chosen) > 1:  # sorted runs: a stable sort merges them in linear time
                allowed = np.sort(np.concatenate(chosen), kind="stable")
                allowed = allowed[np.concatenate([allowed[:1] == allowed[:1], allowed[1:] != allowed[:-1]])]
            if excl.size:  # |exclude| binary searches into the (large) allowed list, not the reverse
                at = np.searchsorted(allowed, excl).clip(max=max(allowed.shape[0] - 1, 0))
                hit = at[allowed[at] == excl] if allowed.size else at[:0]
                allowed = np.delete(allowed, hit)
            host_include.append(allowed)
            host_exclude.append(np.zeros(0, np.int64))
        else:
            if resident.available is not None and excl.size:
                excl = excl[resident.available[excl]]  # only allowed items are counted, once
            host_include.append(None)
            host_exclude.append(excl)
    dev, n = resident.space.device, resident.space.num_items
    any_exclude = any(e.size for e in host_exclude)
    any_include = any(a is not None for a in host_include)
    empty = np.zeros(0, np.int64)
    return RequestConstraints(
        resident=resident,
        exclude_keys=_keyed(host_exclude, n, dev, static) if any_exclude else None,
        include_keys=_keyed([empty if a is None else a for a in host_include], n, dev, static)
        if any_include
        else None,
        uses_include=torch.tensor([a is not None for a in host_include], device=dev) if any_include else None,
        host_exclude=tuple(host_exclude),
        host_include=tuple(host_include),
        static=static,
    )


class ConstrainedDecoding:
    """The Decoder's item-constraint methods (mixed into runtime.decoder.Decoder, which provides bundle,
    index, device, static_shapes and _resident)."""

    bundle: Any
    index: SidIndex
    device: torch.device
    static_shapes: bool
    _resident: Resident | None = None  # availability + item sets; replaced whole, never mutated

    def _space(self) -> ItemSpace:
        current = self._resident
        return current.space if current is not None else ItemSpace(self.bundle or self.index, self.device)

    def set_availability(self, mask: ItemMask | None) -> None:
        """Swap the global availability mask (None: every item available). Safe while other threads search:
        the new per-row counts are built first (O(items)), then one reference is replaced; a search keeps
        the mask it started with."""
        current = self._resident
        self._resident = make_resident(self._space(), mask, None if current is None else current.sets)

    def set_item_sets(self, sets: ItemSets | None) -> None:
        """Attach the named item sets that `include=` refers to (compiled once, see ItemSets)."""
        current = self._resident
        mask = None if current is None or current.available is None else ItemMask(current.available)
        self._resident = make_resident(self._space(), mask, sets)

    def _request_constraints(self, batch_size: int, order: str, include: Any, exclude: Any):
        """The RequestConstraints of a search starting now, or None when nothing restricts items."""
        resident = self._resident
        if order == "unconstrained" or (resident is None and include is None and exclude is None):
            return None
        if resident is None:
            resident = self._resident = make_resident(self._space(), None, None)
        ids = item_ids(self.bundle or self.index)
        return request_constraints(resident, ids, include, exclude, batch_size, static=self.static_shapes)


def mask_slots(constraints: RequestConstraints | None, table: Any, tokens: torch.Tensor, start: torch.Tensor,
               used: torch.Tensor, request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Sparse-step slots emptied (-1) where the child row has no item the request may return.

    Args:
        constraints: the search's RequestConstraints (None: tokens returned unchanged).
        table: the step's DeviceStep (its step number).
        tokens: int32 [n, w], slot k of slot row i holds the child at flat position start[i] + k (-1: empty);
            a fresh tensor (fill_slots'), emptied in place outside static shapes.
        start: int64 [n], each slot row's first child (a row of the next step).
        used: int64 [n], slots in use per slot row (the first used[i] slots; the rest are empty).
        request: int64 [n], the request of each slot row.
    Shape: returns int32 [n, w].

    Static shapes: all n * w slots are answered, no host read. Otherwise only the used slots (one host
    read for their number): most of a [R, K] block is empty, and its size should not set the cost.
    """
    if constraints is None:
        return tokens
    width = tokens.shape[1]
    if constraints.static:
        child = start[:, None] + torch.arange(width, device=start.device)
        child = torch.where(tokens >= 0, child, -1)
        return torch.where(constraints.allowed_rows(table.step + 1, child, request[:, None]), tokens, -1)
    used = used.clamp(max=width)
    total = int(used.sum())
    slot_row = torch.repeat_interleave(
        torch.arange(used.shape[0], device=used.device), used, output_size=total
    )
    rank = torch.arange(total, device=used.device) - (torch.cumsum(used, 0) - used)[slot_row]
    ok = constraints.allowed_real(table.step + 1, start[slot_row] + rank, request[slot_row])
    tokens[slot_row[~ok], rank[~ok]] = -1
    return tokens


def mask_children(constraints: RequestConstraints | None, step: int, valid: torch.Tensor, child: torch.Tensor,
                  request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Dense-step validity narrowed to child rows that have an item the request may return.

    Args:
        constraints: the search's RequestConstraints (None: valid returned unchanged).
        step: the dense step t (its child rows are rows of step t + 1).
        valid: bool [R, V], slot k of beam r is in the catalog (next[row, k] >= 0, beam alive).
        child: int [R, V], next[row, k] (-1 = none).
        request: int64 [R], each beam's request.
    Shape: returns bool [R, V].
    """
    if constraints is None:
        return valid
    child = torch.where(valid, child.long(), -1)
    return constraints.allowed_rows(step + 1, child, request[:, None])


__all__ = [
    "ConstrainedDecoding",
    "mask_children",
    "ItemSpace",
    "RequestConstraints",
    "Resident",
    "availability_counts",
    "make_resident",
    "mask_slots",
    "request_constraints",
]
