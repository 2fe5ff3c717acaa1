"""How the Decoder applies item constraints (constraints.py) in its steps, on its device (see
docs/constraints.md).

A candidate slot of step table t is valid for request b iff its child row (a row of step t+1) holds an item
b may return. Three parts, each exact (the proofs are in space.py and kills.py):
  1. availability: the step fills its slots from the resident copy of its table in which children without
     an available item are -1 (`slot_source` / `dense_next`) - free at search time;
  2. include sets (when some request of the search names sets): (row_bits[child] & set_mask[b]) != 0, the
     word of a request naming none being ANY - one gather (a window copy) and an AND per slot, O(1);
  3. exclusions: the search's few killed (request, row) pairs of step t+1 are located among the step's
     slot rows (sparse) or beams (dense) by one sort of those and one binary search per kill, and set to -1
     - O(kills + n log n), independent of the number of slots.
No part reads a value back to the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...index import SidIndex
from ..slots import empty_dense_slots
from .constraints import ItemMask, ItemSets, item_ids
from .requests import Kills, RequestConstraints, request_constraints
from .space import ItemSpace, Resident, SetBits, check_binding, make_resident

INT32_MAX = 2**31 - 1
# The kill lookups in numpy on the CPU outside static shapes (a dozen tiny ops: numpy dispatches them ~5x
# faster); static shapes keep every step op in torch, as CUDA-graph capture needs. Tests turn it off to run
# the device path on the CPU.
NUMPY_ON_CPU = True
_LOCK_CREATION = threading.Lock()  # creates each decoder's setter lock once


class _MaskedChildren:
    """What fill_slots reads of a sparse step (nnz, tokens), with the resident availability applied."""

    def __init__(self, nnz: int, tokens: torch.Tensor) -> None:
        self.nnz = nnz
        self.tokens = tokens


def slot_source(constraints: RequestConstraints | None, table: Any) -> Any:
    """The sparse table to fill slots from: `table`, or its tokens with unavailable children -1."""
    masked = None if constraints is None else constraints.resident.tables[table.step]
    return table if masked is None else _MaskedChildren(table.nnz, masked)


def dense_next(constraints: RequestConstraints | None, table: Any) -> torch.Tensor:
    """int32 [rows, V] of a dense step: table.next, or with unavailable children -1."""
    masked = None if constraints is None else constraints.resident.tables[table.step]
    return table.next if masked is None else masked


def include_ok(constraints: RequestConstraints, step: int, rows: torch.Tensor,
               request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """bool, the broadcast shape of rows and request: row rows[...] (>= 0) of step `step` (1..L) has an
    available item in the union of request[...]'s sets, or any available item when it names none
    ((row word & request word) != 0, space.SetBits)."""
    assert constraints.set_mask is not None
    ok = (constraints.resident.row_bits[step - 1][rows] & constraints.set_mask[request]) != 0
    return ok.any(dim=-1) if ok.ndim > max(rows.ndim, request.ndim) else ok  # past 63 sets: any word


def include_slots(constraints: RequestConstraints, step: int, start: torch.Tensor, width: int,
                  request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """bool [n, width]: include_ok for the child rows start[i] + k of slot row i (k < width) of step `step`.
    A slot row's children are consecutive rows, so with one word per row their words are one window of
    the padded row words: unfold + index_select copies n contiguous runs instead of gathering n * width
    scattered entries (about 3x faster on the CPU). Windows past a row's children read other rows or the
    zero padding; those slots are empty (-1) already, so what they say is ignored."""
    assert constraints.set_mask is not None
    bits = constraints.resident.row_bits[step - 1]
    if bits.ndim == 1:
        window = bits.unfold(0, width, 1).index_select(0, start)
        return window.bitwise_and_(constraints.set_mask[request][:, None]).bool()  # (faster than != 0)
    child = start[:, None] + torch.arange(width, device=start.device)
    return include_ok(constraints, step, child, request[:, None])


def _kill_slots(kills: Kills, tokens: torch.Tensor, start: torch.Tensor, used: torch.Tensor,
                request: torch.Tensor, stride: int, batch_size: int, static: bool) -> None:  # fmt: skip
    """Empty (in place) the slots of tokens int32 [n, w] that hold a killed row.

    Slot row i (request[i], first child start[i], used[i] slots) holds child rows start[i] ..
    start[i] + used[i] - 1 in slots 0 .. used[i] - 1. With key_i = request[i] * stride + start[i] (stride =
    rows of the child step + 1 > start + used) the slot row of a kill q = b * stride + row is the one with
    the largest key_i <= q, and it holds the row iff q - key_i < used[i]: a slot row of an earlier request
    has q - key_i >= stride - start[i] > used[i]. A request's live beams are distinct prefixes, so no two
    slot rows with used > 0 share a key; rows with used 0 get a key above every query. The writes go
    through scatter_reduce(amin) with -1 at hits and INT32_MAX elsewhere, so misses leave their (dummy)
    target unchanged whatever the order of duplicate writes."""
    width = tokens.shape[1]
    if tokens.device.type == "cpu" and NUMPY_ON_CPU and not static:  # numpy, in place (see NUMPY_ON_CPU)
        used_np = used.numpy()
        key = np.where(used_np > 0, request.numpy() * stride + start.numpy(), (batch_size + 1) * stride)
        order = np.argsort(key, kind="stable")
        query = kills.slot_query.numpy()
        at = np.searchsorted(key[order], query, side="right") - 1
        row = order[np.maximum(at, 0)]
        rank = query - key[row]
        hit = (at >= 0) & (rank < used_np[row])
        tokens.numpy().reshape(-1)[row[hit] * width + rank[hit]] = -1  # hits are distinct slots
        return
    key = torch.where(used > 0, request * stride + start, (batch_size + 1) * stride)
    sorted_key, order = torch.sort(key)
    query = kills.slot_query
    at = torch.searchsorted(sorted_key, query, right=True) - 1
    safe = at.clamp(min=0)
    row = order[safe]
    rank = query - sorted_key[safe]
    hit = (at >= 0) & (rank < used[row])
    target = torch.where(hit, row * width + rank, 0)
    value = torch.where(hit, -1, INT32_MAX).to(tokens.dtype)
    tokens.view(-1).scatter_reduce_(0, target, value, "amin")


def _cpu_kernel_applies(constraints: RequestConstraints, tokens: torch.Tensor, step: int) -> bool:
    """Whether a sparse step's slots take the numba kernel: CPU, no static shapes, one word per row."""
    if tokens.device.type != "cpu" or not NUMPY_ON_CPU or constraints.static:
        return False
    return constraints.set_mask is None or constraints.resident.row_bits[step - 1].ndim == 1


def _mask_slots_cpu(constraints: RequestConstraints, table: Any, tokens: torch.Tensor, start: torch.Tensor,
                    used: torch.Tensor, request: torch.Tensor) -> None:  # fmt: skip
    """mask_slots on the CPU in one serial numba pass, in place (see _slot_kernels.mask_slot_rows)."""
    from ._slot_kernels import mask_slot_rows

    step = table.step + 1
    kills = constraints.kills[step - 1]
    if constraints.set_mask is None and kills is None:
        return
    if constraints.set_mask is not None:
        bits, words = constraints.resident.row_bits[step - 1].numpy(), constraints.set_mask.numpy()
    else:
        bits = words = _NO_WORDS
    query = _NO_KILLS if kills is None else kills.slot_query.numpy()
    mask_slot_rows(tokens.numpy(), start.numpy(), used.numpy(), request.numpy(), bits, words, query,
                   table.nnz + 1)  # fmt: skip


def select_filter(constraints: RequestConstraints | None, table: Any,
                  tokens: torch.Tensor) -> dict[str, Any] | None:  # fmt: skip
    """The item-constraint arguments of scoring.select_top for a sparse step whose children it reads
    where they lie (`tokens`, slot_source's, on the CPU):
      slot_words / request_words: include sets, the child rows' words (indexed by flat child position)
        and each request's word;
      kills / kill_stride: this step's killed (request, child) pairs (Kills.slot_query).
    {} when the search restricts nothing at this step; None where the CPU kernel does not apply (several
    set words per row): the slot-row path (mask_slots) then."""
    if constraints is None:
        return {}
    step = table.step + 1
    if constraints.set_mask is None and constraints.kills[step - 1] is None:
        return {}
    if not _cpu_kernel_applies(constraints, tokens, step):
        return None
    limits: dict[str, Any] = {}
    if constraints.set_mask is not None:
        limits.update(slot_words=constraints.resident.row_bits[step - 1], request_words=constraints.set_mask)
    kills = constraints.kills[step - 1]
    if kills is not None:
        limits.update(kills=kills.slot_query, kill_stride=table.nnz + 1)
    return limits


_NO_WORDS = np.zeros(0, dtype=np.int64)
_NO_KILLS = np.zeros(0, dtype=np.int64)


def mask_slots(constraints: RequestConstraints | None, table: Any, tokens: torch.Tensor, start: torch.Tensor,
               used: torch.Tensor, request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Sparse-step slots (already filled from slot_source) emptied (-1) where the request's include sets or
    exclusions leave the child row without an allowed item.

    Args:
        constraints: the search's RequestConstraints (None: tokens returned unchanged).
        table: the step's DeviceStep (its step number).
        tokens: int32 [n, w], slot k of slot row i holds the child at flat position start[i] + k (-1: empty);
            a fresh contiguous tensor (fill_slots'), emptied in place.
        start: int64 [n], each slot row's first child (a row of the next step).
        used: int64 [n], slots in use per slot row (the first used[i] slots; the rest are empty).
        request: int64 [n], the request of each slot row.
    Shape: returns int32 [n, w].
    """
    if constraints is None:
        return tokens
    width = tokens.shape[1]
    step = table.step + 1
    used = used.clamp(max=width)
    if _cpu_kernel_applies(constraints, tokens, step):
        _mask_slots_cpu(constraints, table, tokens, start, used, request)
        return tokens
    if constraints.set_mask is not None:  # every slot (a window copy, no host read)
        tokens = torch.where(include_slots(constraints, step, start, width, request), tokens, -1)
    kills = constraints.kills[step - 1]
    if kills is not None:
        stride, batch = table.nnz + 1, constraints.batch_size
        _kill_slots(kills, tokens, start, used, request, stride, batch, constraints.static)
    return tokens


def mask_children(constraints: RequestConstraints | None, step: int, valid: torch.Tensor, child: torch.Tensor,
                  rows: torch.Tensor, request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Dense-step validity (from dense_next) narrowed by the requests' include sets and exclusions.

    Args:
        constraints: the search's RequestConstraints (None: valid returned unchanged).
        step: the dense step t (its child rows are rows of step t + 1).
        valid: bool [R, V], slot k of beam r has an available child (dense_next[row, k] >= 0, beam alive).
        child: int [R, V], dense_next[row, k] (-1 = none).
        rows: int64 [R], each beam's row of step t (-1: padding).
        request: int64 [R], each beam's request.
    Shape: returns bool [R, V].
    """
    if constraints is None:
        return valid
    if constraints.set_mask is not None:
        dense = constraints.resident.dense_bits[step]
        if dense is not None:  # the beams' rows of child words (padding: row 0, already invalid)
            words = dense.index_select(0, rows.clamp(min=0)).bitwise_and_(
                constraints.set_mask[request][:, None]
            )
            valid = valid & words.bool()
        else:
            valid = valid & include_ok(constraints, step + 1, child.clamp(min=0).long(), request[:, None])
    kills = constraints.kills[step]
    if kills is None:
        return valid
    # A kill names (request, parent row, token). A request's live beams sit on distinct rows, so at most
    # one beam matches request * (rows_t + 1) + row; padding beams take row rows_t, which no kill names.
    num_beams, vocab = valid.shape
    parent_rows = constraints.resident.space.rows[step - 1] if step >= 1 else 1
    if valid.device.type == "cpu" and NUMPY_ON_CPU and not constraints.static:
        valid = valid.contiguous()  # numpy, in place (see _kill_slots)
        key = request.numpy() * (parent_rows + 1) + np.where(rows.numpy() >= 0, rows.numpy(), parent_rows)
        order = np.argsort(key, kind="stable")
        query = kills.beam_query.numpy()
        at = np.searchsorted(key[order], query).clip(max=num_beams - 1)
        hit = key[order[at]] == query
        valid.numpy().reshape(-1)[order[at[hit]] * vocab + kills.column.numpy()[hit]] = False
        return valid
    key = request * (parent_rows + 1) + torch.where(rows >= 0, rows, parent_rows)
    sorted_key, order = torch.sort(key)
    at = torch.searchsorted(sorted_key, kills.beam_query).clamp(max=num_beams - 1)
    hit = sorted_key[at] == kills.beam_query
    target = torch.where(hit, order[at] * vocab + kills.column, 0)
    killed = torch.zeros(num_beams * vocab, dtype=torch.int32, device=valid.device)
    killed.scatter_add_(0, target, hit.to(torch.int32))  # a miss adds 0 to its dummy target
    return valid & (killed.view(num_beams, vocab) == 0)


def dense_emptier(constraints: RequestConstraints | None, table: Any, rows: torch.Tensor,
                  request: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:  # fmt: skip
    """The in-place mask of a dense step's fp32 [R, V] values (logits or log-probabilities): -inf where beam
    r (rows int64 [R], -1 padding; request int64 [R]) may not take token k - no available child
    (dense_next), or none the request may return (mask_children). On the CPU one pass over the values
    (slots.empty_dense_slots without constraints, _slot_kernels.empty_dense_disallowed with them);
    elsewhere the validity is built first."""
    source = dense_next(constraints, table)
    if constraints is None or (constraints.set_mask is None and constraints.kills[table.step] is None):
        return lambda values: empty_dense_slots(values, source, rows)  # availability alone: its table
    if _dense_kernel_applies(constraints, table, rows):
        return lambda values: _empty_dense_cpu(constraints, table, source, values, rows, request)
    child = source[rows.clamp(min=0)]
    valid = mask_children(constraints, table.step, (child >= 0) & (rows >= 0)[:, None], child, rows, request)
    return lambda values: values.masked_fill_(~valid, float("-inf"))


def _dense_kernel_applies(constraints: RequestConstraints, table: Any, rows: torch.Tensor) -> bool:
    """Whether a constrained dense step takes the numba kernel: CPU, no static shapes, one set word per row
    (or no sets)."""
    if rows.device.type != "cpu" or not NUMPY_ON_CPU or constraints.static:
        return False
    return constraints.set_mask is None or constraints.resident.dense_bits[table.step] is not None


def _empty_dense_cpu(constraints: RequestConstraints, table: Any, source: torch.Tensor, values: torch.Tensor,
                     rows: torch.Tensor, request: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """dense_emptier's mask in one serial numba pass (values fp32 [R, V], in place); returns values."""
    from ._slot_kernels import empty_dense_disallowed

    if values.dtype != torch.float32 or not values.is_contiguous():
        raise ValueError("a dense step's values must be contiguous float32")
    if constraints.set_mask is not None:
        words, wanted = constraints.resident.dense_bits[table.step].numpy(), constraints.set_mask.numpy()
    else:
        words, wanted = _NO_DENSE_WORDS, _NO_WORDS
    kills = constraints.kills[table.step]
    query, column = _NO_KILLS, _NO_KILLS
    if kills is not None:
        query, column = kills.beam_query.numpy(), kills.column.numpy()
    if query.shape[0] > 1 and (query[1:] < query[:-1]).any():  # kills come by (request, child row)
        order = np.argsort(query, kind="stable")
        query, column = query[order], column[order]
    parent_rows = constraints.resident.space.rows[table.step - 1] if table.step >= 1 else 1
    empty_dense_disallowed(values.numpy(), source.contiguous().numpy(), rows.contiguous().numpy(),
                           request.contiguous().numpy(), words, wanted, query, column,
                           parent_rows + 1)  # fmt: skip
    return values


_NO_DENSE_WORDS = np.zeros((0, 0), dtype=np.int64)


class ConstrainedDecoding:
    """The Decoder's item-constraint methods (mixed into runtime.decoder.Decoder, which provides bundle,
    index, device, steps, static_shapes and _resident)."""

    bundle: Any
    index: SidIndex
    device: torch.device
    steps: Any
    static_shapes: bool
    _resident: Resident | None = None  # availability + item sets; replaced whole, never mutated

    def _space(self) -> ItemSpace:
        current = self._resident
        if current is not None:
            return current.space
        return ItemSpace(self.bundle or self.index, self.steps, self.device)

    def _setter_lock(self) -> threading.Lock:
        """This decoder's lock around read-build-replace of _resident (searches never take it)."""
        lock = self.__dict__.get("_resident_lock")
        if lock is None:
            with _LOCK_CREATION:
                lock = self.__dict__.setdefault("_resident_lock", threading.Lock())
        return lock

    def set_availability(self, mask: ItemMask | None) -> None:
        """Swap the global availability mask (None: every item available). Safe while other threads search:
        the new resident state is built first (O(items + rows), plus the sets' row words when sets are
        attached), then one reference is replaced; a search keeps the mask it started with. Concurrent
        set_availability / set_item_sets calls are serialised, so none loses another's update. The mask
        must be built for this decoder's bundle or index (InputError otherwise)."""
        with self._setter_lock():
            current = self._resident
            sets = None if current is None else current.set_bits
            self._resident = make_resident(self._space(), mask, sets, reuse=current)

    def set_item_sets(self, sets: ItemSets | None) -> None:
        """Attach the named item sets that `include=` refers to (compiled once, see space.SetBits);
        serialised with set_availability like it."""
        with self._setter_lock():
            current, space = self._resident, self._space()
            check_binding(space, sets, "item sets")  # before compiling them
            bits = None if sets is None else SetBits.build(sets)
            mask = None if current is None else current.mask
            self._resident = make_resident(space, mask, bits, reuse=current)

    def _request_constraints(self, batch_size: int, order: str, include: Any, exclude: Any):
        """The RequestConstraints of a search starting now, or None when nothing restricts items."""
        resident = self._resident
        if order == "unconstrained" or (resident is None and include is None and exclude is None):
            return None
        if resident is None:
            with self._setter_lock():  # a setter may have won the race: take its state, never replace it
                resident = self._resident
                if resident is None:
                    resident = self._resident = make_resident(self._space(), None, None)
        ids = item_ids(self.bundle or self.index)
        return request_constraints(resident, ids, include, exclude, batch_size, static=self.static_shapes)


__all__ = [
    "ConstrainedDecoding",
    "dense_next",
    "include_ok",
    "mask_children",
    "mask_slots",
    "select_filter",
    "slot_source",
]
