"""One search's include / exclude arguments compiled against the Decoder's Resident (space.py): the
per-request set words (set_mask), and per step the few rows that the requests' exclusions empty (Kills,
computed by kills.killed_rows, where the exactness argument is), laid out for the lookups the steps
make (filter.py). Host work per search: one id lookup and a few sorts over the batch's excluded items,
vectorised across requests; nothing per catalog item, and no step reads a value back to the host.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...base.errors import InputError
from ...index import SidIndex
from .constraints import POSITIONS, ItemIds
from .ids import IdValues, as_ids
from .kills import expand_sets, killed_rows, sorted_unique
from .space import Resident, SetBits, signed_words


@dataclass(frozen=True, eq=False)
class Kills:
    """Rows of one step s that exclusions empty, one entry per (request, row), on the device.

    slot_query int64 [k]: request * (rows_s + 1) + row (row = a flat child of step table s-1), ascending
    (killed_rows lists the pairs sorted by (request, row));
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


def _nothing(entry: Any) -> bool:
    """An include or exclude entry that restricts nothing: None or an empty list / tuple."""
    return entry is None or (type(entry) in (list, tuple) and not entry)


def _python_int_lists(exclude: list[Any]) -> np.ndarray | None:
    """int64 [total]: the ids of every request when each entry is None or a list of Python ints that all
    fit int64, else None (each entry then goes through as_ids, whose errors name its request)."""
    if not all(e is None or type(e) is list for e in exclude):
        return None
    flat = list(itertools.chain.from_iterable(e for e in exclude if e is not None))
    if not set(map(type, flat)) <= {int}:  # bool, float, str, None, numpy scalars: the checked path
        return None
    try:
        return np.asarray(flat, dtype=np.int64)
    except OverflowError:
        return None


def _include_sets(include: list[Any], set_bits: SetBits | None) -> tuple[np.ndarray, np.ndarray]:
    """(set_flat, set_off) int64: the sets request b names are set_flat[set_off[b] : set_off[b + 1]],
    sorted and distinct (none for None or []). InputError for an entry that is not set names, or names
    without item sets attached."""
    if all(_nothing(names) for names in include):
        return np.zeros(0, np.int64), np.zeros(len(include) + 1, np.int64)
    chosen: list[np.ndarray] = []
    for names in include:
        if names is not None and not isinstance(names, (str, Iterable)):
            raise InputError(f"include: expected set names (a list of str) or None, got {names!r}")
        if names is None or not len(names):
            chosen.append(np.zeros(0, np.int64))
            continue
        if set_bits is None:
            raise InputError("include needs item sets: call Decoder.set_item_sets first")
        names = [names] if isinstance(names, str) else list(names)
        chosen.append(np.asarray(sorted(set(set_bits.sets.lookup(names))), dtype=np.int64))
    set_off = np.zeros(len(chosen) + 1, np.int64)
    np.cumsum([c.shape[0] for c in chosen], out=set_off[1:])
    return np.concatenate(chosen), set_off


def _kills_on_device(resident: Resident, step: int, b: np.ndarray, r: np.ndarray, batch_size: int,
                     static: bool) -> Kills | None:  # fmt: skip
    """Kills of step `step` (request b, row r int64 [k]) as the lookups filter.py makes (see Kills)."""
    if b.size == 0:
        return None
    space = resident.space
    rows = space.rows[step - 1]
    parent_rows = space.rows[step - 2] if step >= 2 else 1
    parent = space.parent[step - 1]
    parent = parent[r].astype(np.int64) if parent is not None else np.zeros_like(r)
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
    arrays = (np.ascontiguousarray(x, dtype=np.int64) for x in (slot_q, beam_q, column))
    if dev.type == "cpu":
        return Kills(*map(torch.from_numpy, arrays))
    return Kills(*(torch.from_numpy(x).to(dev) for x in arrays))


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
    if all(_nothing(names) for names in include) and all(_nothing(ids) for ids in exclude):
        # Availability alone: no set words, no kills (what the general path below makes of it, without
        # its passes; the steps read the resident's masked tables).
        empty = tuple(np.zeros(0, np.int64) for _ in range(batch_size))
        steps = len(resident.space.bounds)
        return RequestConstraints(resident, None, (None,) * steps, empty, (None,) * batch_size, batch_size,
                                  static)  # fmt: skip
    n = resident.space.num_items
    set_bits = resident.set_bits
    set_flat, set_off = _include_sets(include, set_bits)
    uses_sets = set_off[1:] > set_off[:-1]

    # Every request's excluded ids looked up (each list checked on its own, so an error names its request);
    # key = request * (n + 1) + position sorts and dedups them by (request, position) at once.
    flat = _python_int_lists(exclude)
    if flat is not None:  # the usual call: lists of Python ints, converted at once (as_ids would agree)
        owner = np.repeat(np.arange(batch_size), [0 if e is None else len(e) for e in exclude])
        found = ids.lookup(IdValues("int", flat), "exclude")
    else:
        empty = IdValues("int", np.zeros(0, np.int64))
        lists = [as_ids(e, f"exclude[{b}]") if e is not None else empty for b, e in enumerate(exclude)]
        owner = np.repeat(np.arange(batch_size), [x.values.shape[0] for x in lists])
        if all(x.kind == "int" and x.values.dtype == np.int64 for x in lists):  # one lookup
            found = ids.lookup(IdValues("int", np.concatenate([x.values for x in lists])), "exclude")
        else:
            found = np.concatenate([ids.lookup(x, f"exclude[{b}]") for b, x in enumerate(lists)])
    if (found < 0).any():
        warnings.warn(f"{int((found < 0).sum())} of {found.shape[0]} excluded item ids are not in the "
                      "catalog (ignored)", stacklevel=4)  # fmt: skip
    real = found >= 0
    keys = sorted_unique(owner[real] * (n + 1) + found[real])
    req, pos = keys // (n + 1), keys % (n + 1)
    cut = np.searchsorted(req, np.arange(batch_size + 1))
    host_exclude = tuple(pos[cut[b] : cut[b + 1]] for b in range(batch_size))
    live = np.ones(pos.shape[0], bool) if resident.available is None else resident.available[pos]

    plain = live & ~uses_sets[req]
    with_sets = np.flatnonzero(live & uses_sets[req])
    entry, sid = expand_sets(req[with_sets], set_flat, set_off)
    spos = pos[with_sets][entry]
    member = set_bits.contains(spos, sid) if set_bits is not None else np.zeros(0, bool)
    arrays = (req[plain], pos[plain], req[with_sets][entry][member], sid[member], spos[member])
    kills = [
        _kills_on_device(resident, s, b, r, batch_size, static)
        for s, (b, r) in enumerate(killed_rows(resident, *arrays, set_flat, set_off), start=1)
    ]
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


__all__ = ["Kills", "RequestConstraints", "request_constraints"]
