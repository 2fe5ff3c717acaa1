"""The Decoder's resident item-constraint state: what set_availability and set_item_sets compute once, so a
search pays nothing for the availability mask and O(1) per candidate slot for include sets
(docs/constraints.md). Pure functions of the index geometry and the mask / sets; requests.py and
kills.py compile one search's lists against this, filter.py applies both in the steps.

Geometry (ItemSpace, once per decoder). Row j of step s (1..L; the rows of step L are the leaves) is the j-th
distinct length-s prefix in lexicographic order, so it covers the contiguous run [bounds[s-1][j],
bounds[s-1][j+1]) of the leaf-ordered items (row_item_bounds). A child row of step s is a flat child
position of step table s-1 (sparse: tokens[f] is its last token; dense: next[p, k] = its row).

Availability (per mask). rank(x) = the available items before position x (AvailabilityRank: the mask as
bits plus a count per 64 items, items / 8 + items / 8 bytes), so row j of step s has rank(hi) - rank(lo)
available items; it is valid iff that is > 0. For every step table t the children of *unavailable* rows of
step t+1 are written as -1 into a copy of its tokens (sparse) / next (dense): `masked_tables`, one pass per
table. A search then fills its slots from that copy and a slot is in the catalog *and* has an available item
in one read - no step-time cost at all. The rank stays on the host for the per-request exclusion counts
(kills.py).

Item sets (per sets, then per mask). Set i is bit i of a word (uint8/16/32/64, or W uint64 words past 63
sets), plus one bit ANY that every item has. item_bits[p] = ANY and the sets item p belongs to (once per
ItemSets); row_bits[s-1][j] = OR of item_bits over the *available* items of row j (per mask). Bit i of
row_bits[j] is set iff row j has an available item of set i, so for a request naming sets S, "row j has an
available item in the union of S" is exactly (row_bits[j] & word(S)) != 0 - an OR of per-set existence bits
is the existence of the union (an item in two sets is one item either way; no counts are added up). A
request naming no set has word(ANY): "row j has an available item". Exclusions are handled per set in
kills.py, where counts are needed.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...base.errors import InputError
from .constraints import ItemMask, ItemSets, index_of, row_item_bounds
from .ids import accepted_bindings, binding_of


class ItemSpace:
    """The leaf-order item geometry of one index, for one decoder's step tables on its device (host
    memory O(rows + items)).

    bounds[s-1]: int64 [rows_s + 1] host (row_item_bounds); child_start[s-1]: int64 [rows_s + 1], the
    first row of step s+1 under each row of step s (s < L); child_token[t]: int64 [rows_{t+1}], the last
    token of each child row of a *dense* step table t (None for sparse tables: tokens[f] is it)."""

    def __init__(self, source: Any, steps: Any, device: torch.device) -> None:
        index = index_of(source)
        self.num_items = index.num_items
        self.bindings = accepted_bindings(source)  # masks and sets built for another item order: refused
        self.label = binding_of(source).label
        self.device = device
        self.steps = tuple(steps)  # the decoder's DeviceStep tables
        # int64 (numpy's index type): an int32 index array would be converted on every gather of a swap
        self.bounds = tuple(np.asarray(b, dtype=np.int64) for b in row_item_bounds(index))
        self.rows = tuple(int(b.shape[0]) - 1 for b in self.bounds)
        # The bounds of step s are a subset of those of step s+1 (a row is a union of whole child rows),
        # so a binary search finds each row's first child.
        self.child_start = tuple(
            np.searchsorted(self.bounds[s + 1], self.bounds[s]) for s in range(len(self.bounds) - 1)
        )
        self.one_item_per_leaf = index.num_leaves == index.num_items
        # parent[s-1][j]: the row of step s-1 above row j of step s (s >= 2; None at s = 1, whose parent
        # is the root); item_leaf[p]: the leaf of item position p (None when leaf p holds item p).
        small = np.int32 if max(self.rows) < 2**31 - 1 else np.int64
        self.parent: tuple[np.ndarray | None, ...] = (None,) + tuple(
            np.repeat(np.arange(self.rows[s], dtype=small), np.diff(self.child_start[s]))
            for s in range(len(self.bounds) - 1)
        )
        self.item_leaf = None
        if not self.one_item_per_leaf:
            leaves = self.bounds[-1]
            self.item_leaf = np.repeat(np.arange(self.rows[-1], dtype=small), np.diff(leaves))
        tokens: list[np.ndarray | None] = []
        for t, table in enumerate(index.steps):
            if table.next is None:
                tokens.append(None)
                continue
            nxt = np.asarray(table.next)
            parent, token = np.nonzero(nxt >= 0)
            last = np.empty(self.rows[t], dtype=np.int64)
            last[nxt[parent, token]] = token  # next[p, k] is the child row: its last token is k
            tokens.append(last)
        self.child_token = tuple(tokens)
        # starts[s-1]: uint64 [items // 64 + 1], bit p set where a row of step s begins (bounds[s-1][:-1]):
        # the bounds of every step as items / 8 bytes, what an availability swap reads (_mask_kernels)
        self.starts = tuple(run_starts(b, self.num_items) for b in self.bounds)
        # The buffers of masked tables (per step table), each with a weak reference to the tensor over it:
        # a swap writes into one whose tensor is gone (its Resident retired and no search holds it) rather
        # than faulting in fresh pages, which costs a VM as much as the masking itself. At most one unused
        # buffer per table is kept. The lock: residents of one space may be built in several threads at
        # once (a decoder's swaps are serialised, but the vLLM integration builds one per filter key).
        self._buffers: dict[int, list[tuple[np.ndarray, weakref.ref]]] = {}
        self._buffers_lock = threading.Lock()

    def masked_buffer(self, table: int, like: np.ndarray) -> np.ndarray:
        """An array shaped like `like` for step table `table`'s masked children: a retired one, or new."""
        with self._buffers_lock:
            for i, (array, tensor) in enumerate(self._buffers.get(table, [])):
                if tensor() is None and array.shape == like.shape and array.dtype == like.dtype:
                    return self._buffers[table].pop(i)[0]
        return np.empty_like(like)

    def keep_buffer(self, table: int, array: np.ndarray, tensor: torch.Tensor) -> None:
        """Remember `array` (the memory of `tensor`) for a later swap once `tensor` is gone; beyond the live
        ones, one unused buffer per table is kept."""
        with self._buffers_lock:
            kept = [(a, t) for a, t in self._buffers.get(table, []) if t() is not None]
            unused = [(a, t) for a, t in self._buffers.get(table, []) if t() is None]
            self._buffers[table] = [*kept, *unused[:1], (array, weakref.ref(tensor))]

    def leaf_of(self, positions: np.ndarray) -> np.ndarray:
        """int64 [k]: the leaf holding each item position int64 [k]."""
        return positions if self.item_leaf is None else self.item_leaf[positions].astype(np.int64)


@dataclass(frozen=True, eq=False)
class SetBits:
    """One ItemSets compiled against the item order, independent of availability.

    Bit i (< number of sets) = in set i; bit ANY = len(sets) is set for every item, so a row word carries
    "has an available item" too and a request without include sets has the word of ANY alone (one test,
    (row & word) != 0, for every request). Bit i lives in word i // width at bit i % width (width = the
    word type's bits). item_bits: uint8/16/32/64 [items] (uint64 [items, words] past 63 sets). Nothing is
    kept per pair of sets: memory O(items x words + set sizes)."""

    sets: ItemSets
    item_bits: np.ndarray
    words: int
    member_keys: np.ndarray  # int64 ascending: i * (items + 1) + p for every member p of set i
    member_pos: np.ndarray  # int64: the p of each member_keys entry

    @property
    def any_bit(self) -> int:
        return len(self.sets.names)

    @property
    def dtype(self) -> np.dtype:
        return self.item_bits.dtype

    @property
    def width(self) -> int:
        return 8 * self.item_bits.dtype.itemsize

    @classmethod
    def build(cls, sets: ItemSets) -> SetBits:
        n = len(sets.names) + 1
        fits = [d for d in (np.uint8, np.uint16, np.uint32) if n <= 8 * np.dtype(d).itemsize]
        dtype = np.dtype(fits[0] if fits else np.uint64)
        words = max(1, -(-n // 64)) if dtype == np.uint64 else 1
        check_set_memory(sets.num_items, words * dtype.itemsize, len(sets.names))
        width = 8 * dtype.itemsize
        bits = np.zeros((sets.num_items, words) if words > 1 else sets.num_items, dtype=dtype)
        sizes = np.asarray([p.shape[0] for p in sets.positions], dtype=np.int64)
        member_set = np.repeat(np.arange(len(sets.names), dtype=np.int64), sizes)
        member_pos = np.concatenate([np.zeros(0, np.int64), *sets.positions])
        one = np.ones((), dtype=dtype)
        any_word, any_shift = divmod(n - 1, width)
        if words > 1:
            bits[:, any_word] = one << dtype.type(any_shift)
            shifts = (member_set % width).astype(dtype)
            np.bitwise_or.at(bits, (member_pos, member_set // width), one << shifts)
        else:
            bits[:] = one << dtype.type(any_shift)
            np.bitwise_or.at(bits, member_pos, one << member_set.astype(dtype))
        stride = sets.num_items + 1
        keys = member_pos + member_set * stride  # ascending: sets in order, each set's positions sorted
        return cls(sets, bits, words, keys, member_pos)

    def word(self, i: int) -> np.ndarray:
        """The word (dtype scalar array, or [words] past 63 sets) of bit i alone."""
        out = np.zeros(self.words if self.words > 1 else (), dtype=self.dtype)
        word, shift = divmod(int(i), self.width)
        out[(word,) if self.words > 1 else ()] = np.ones((), dtype=self.dtype) << self.dtype.type(shift)
        return out

    def contains(self, positions: np.ndarray, sets: np.ndarray) -> np.ndarray:
        """bool [k]: item position positions[i] is in set sets[i] (int64 [k] each)."""
        word, shift = np.divmod(sets, self.width)
        bits = self.item_bits[positions, word] if self.words > 1 else self.item_bits[positions]
        return ((bits >> shift.astype(self.dtype)) & self.dtype.type(1)) != 0

    def request_words(self, set_flat: np.ndarray, set_off: np.ndarray) -> np.ndarray:
        """[B] (or [B, words]): OR of the words of the sets of request b, set_flat[set_off[b] :
        set_off[b + 1]] (int64); ANY alone for a request naming none."""
        batch = set_off.shape[0] - 1
        out = np.zeros((batch, self.words) if self.words > 1 else batch, dtype=self.dtype)
        owner = np.repeat(np.arange(batch), np.diff(set_off))
        word, shift = np.divmod(set_flat, self.width)
        one = np.ones((), dtype=self.dtype)
        if self.words > 1:
            np.bitwise_or.at(out, (owner, word), one << shift.astype(self.dtype))
        else:
            np.bitwise_or.at(out, owner, one << shift.astype(self.dtype))
        out[set_off[1:] == set_off[:-1]] = self.word(self.any_bit)
        return out


def item_bits(flags: np.ndarray) -> np.ndarray:
    """uint64 [items // 64 + 1]: bool [items] as bits, bit i of word w = item 64 w + i (the rest 0)."""
    n = int(flags.shape[0])
    packed = np.zeros(8 * (n // 64 + 1), dtype=np.uint8)
    packed[: -(-n // 8)] = np.packbits(flags, bitorder="little")
    return packed.view("<u8").astype(np.uint64, copy=False)  # a view on little-endian machines


def run_starts(bounds: np.ndarray, num_items: int) -> np.ndarray:
    """uint64 [items // 64 + 1]: bit p set iff some row's item run begins at p (bounds int64 [rows + 1],
    ascending, every row non-empty)."""
    flags = np.zeros(num_items, dtype=bool)
    flags[bounds[:-1]] = True
    return item_bits(flags)


@dataclass(frozen=True, eq=False)
class AvailabilityRank:
    """An availability mask as a rank structure: words uint64 [items // 64 + 1], bit i of word w = item
    64 w + i is available (bits past the last item 0); before int64 [items // 64 + 2], the available items
    in the words before word w. rank(x) = before[x >> 6] + the set bits of word x >> 6 below bit x & 63
    (_mask_kernels.rank). Built in three vectorised passes over items / 8 bytes (pack, count, prefix sum)."""

    words: np.ndarray
    before: np.ndarray

    @classmethod
    def of(cls, available: np.ndarray) -> AvailabilityRank:
        """The rank of available bool [items]."""
        words = item_bits(available)
        before = np.zeros(words.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bitwise_count(words), out=before[1:])
        return cls(words, before)

    def count(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """int64 [k]: the available items of the leaf-ordered runs lo[i] .. hi[i] - 1 (int64 [k] each)."""
        from ._mask_kernels import count_rows

        return count_rows(self.words, self.before, np.asarray(lo, np.int64), np.asarray(hi, np.int64))


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None when the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_set_memory(num_items: int, word_bytes: int, num_sets: int, limit: int | None = None) -> None:
    """Refuse item sets whose per-item words (num_items x word_bytes, one bit per item and set) would not
    fit in physical memory (`limit`, default: this machine's), before allocating them."""
    need = num_items * word_bytes
    limit = physical_memory_bytes() if limit is None else limit
    if limit is not None and need > limit:
        raise InputError(
            f"{num_sets:,} item sets over {num_items:,} items need {need / 2**30:.1f} GiB of set words (one "
            f"bit per item and set), more than this machine's {limit / 2**30:.1f} GiB of memory"
        )


def signed_words(array: np.ndarray) -> np.ndarray:
    """The same bits under a dtype torch does bitwise ops on (uint8 stays; uint16/32/64 -> int16/32/64)."""
    return array if array.dtype == np.uint8 else array.view(f"int{8 * array.dtype.itemsize}")


@dataclass(frozen=True, eq=False)
class Resident:
    """The Decoder's current availability and item sets (replaced as a whole, never mutated).

    available: bool [items] host or None (all available); rank: its AvailabilityRank on the host (None when
    all are available); tables[t]: step table t's tokens (int32 [nnz]) or next (int32 [rows, V]) with
    the children of unavailable rows set to -1, on the device (None: the table itself); set_bits: the sets
    (None: none); row_bits[s-1]: per row of step s the sets with an available item there, on the device
    (torch view of SetBits' word type, [rows_s + pad] or [rows_s + pad, words]; pad = max_slots of step
    table s-1, zero words, so every slot window start + width of that table lies inside); set_keys: int64
    host, ascending, i * (items + 1) + p for the available positions p of set i (per-set counts of
    requests.py); dense_bits[t]: for a dense step table t (one-word sets), [rows_t, V] the row words of
    its children laid out like next (0 where no child), so a dense step reads a beam's words in one
    contiguous row (None for sparse tables or no sets); mask: the ItemMask `available` came from (None:
    all available)."""

    space: ItemSpace
    available: np.ndarray | None
    rank: AvailabilityRank | None
    tables: tuple[torch.Tensor | None, ...]
    set_bits: SetBits | None
    row_bits: tuple[torch.Tensor, ...]
    set_keys: np.ndarray | None
    dense_bits: tuple[torch.Tensor | None, ...] = ()
    mask: ItemMask | None = None

    def device_bytes(self) -> int:
        """Bytes this state holds on the device: the masked tables and the sets' words (O(rows))."""
        held = [t for t in self.tables + self.dense_bits if t is not None] + list(self.row_bits)
        return sum(int(t.numel() * t.element_size()) for t in held)

    @property
    def sets(self) -> ItemSets | None:
        return None if self.set_bits is None else self.set_bits.sets

    def available_in(self, step: int, rows: np.ndarray) -> np.ndarray:
        """int64 like rows: available items of rows `rows` of step `step` (1..L)."""
        b = self.space.bounds[step - 1]
        if self.rank is None:
            return b[rows + 1] - b[rows]
        return self.rank.count(b[rows], b[rows + 1])


def row_validity(space: ItemSpace, rank: AvailabilityRank, step: int) -> np.ndarray:
    """bool [rows_s]: row j of step `step` (1..L) has an available item (rank(hi) > rank(lo)). O(rows_s)."""
    from ._mask_kernels import valid_rows

    out = np.empty(space.rows[step - 1], dtype=bool)
    valid_rows(space.starts[step - 1], rank.words, out)
    return out


def masked_tables(space: ItemSpace, rank: AvailabilityRank) -> tuple[torch.Tensor, ...]:
    """Per step table t: its children (rows of step t+1) that have no available item set to -1.

    Sparse: int32 [nnz], child f is row f of step t+1 (on the CPU one numba pass over the mask's bits and
    the run starts of step t+1 that reads each token and writes it or -1; elsewhere the validity goes to
    the device and torch.where keeps the tokens). Dense: int32 [rows, V], next[p, k] where next[p, k] >= 0
    and its row is valid, else -1. O(rows) per table."""
    from ._mask_kernels import masked_children

    out = []
    for t, table in enumerate(space.steps):
        if table.next is not None and table.next.device.type == "cpu":  # numpy: no wait on torch's pool
            nxt = table.next.numpy()
            valid = row_validity(space, rank, t + 1)
            out.append(torch.from_numpy(np.where(valid[np.maximum(nxt, 0)] & (nxt >= 0), nxt, np.int32(-1))))
        elif table.next is not None:
            nxt = table.next
            valid = torch.as_tensor(row_validity(space, rank, t + 1)).to(nxt.device)
            out.append(torch.where(valid[nxt.clamp(min=0).long()] & (nxt >= 0), nxt, -1))
        elif table.tokens.device.type == "cpu":
            tokens = table.tokens.numpy()
            masked = space.masked_buffer(t, tokens)
            masked_children(space.starts[t], rank.words, tokens, masked)
            out.append(torch.from_numpy(masked))
            space.keep_buffer(t, masked, out[-1])
        else:
            valid = torch.as_tensor(row_validity(space, rank, t + 1)).to(table.tokens.device)
            out.append(torch.where(valid, table.tokens, -1))
    return tuple(out)


def set_row_bits(
    space: ItemSpace, set_bits: SetBits, available: np.ndarray | None
) -> tuple[torch.Tensor, ...]:
    """Per step s: the sets with an available item in each row (SetBits' word type, [rows_s](, words)) on
    the device, zero-padded (see Resident). Leaves first (item bits of available items OR-ed over each
    leaf's run), then each step from the next one: a row's items are exactly its child rows' items, so
    OR-ing the child rows' words (one contiguous run each, child_start) gives the same word as OR-ing its
    items'. O(items + rows)."""
    bits = set_bits.item_bits
    if available is not None:
        zero = np.zeros((), dtype=bits.dtype)
        bits = np.where(available[:, None] if bits.ndim == 2 else available, bits, zero)
    leaves = bits if space.one_item_per_leaf else np.bitwise_or.reduceat(bits, space.bounds[-1][:-1], axis=0)
    per_step = [leaves]
    for s in range(len(space.bounds) - 2, -1, -1):
        per_step.append(np.bitwise_or.reduceat(per_step[-1], space.child_start[s][:-1], axis=0))
    out = []
    for s, b in enumerate(reversed(per_step)):  # zero padding: any slot window start + width fits
        pad = np.zeros((space.steps[s].max_slots,) + b.shape[1:], dtype=b.dtype)
        out.append(torch.from_numpy(signed_words(np.concatenate([b, pad]))).to(space.device))
    return tuple(out)


def check_binding(space: ItemSpace, value: ItemMask | ItemSets | None, what: str) -> None:
    """InputError unless `value` (None passes) was built for this decoder's item order: a mask names
    leaf-order positions of one bundle, and another version orders (and may hold) other items."""
    if value is None:
        return
    if not isinstance(value, (ItemMask, ItemSets)):
        raise InputError(f"{what}: expected an {'ItemMask' if 'mask' in what else 'ItemSets'} (or None), "
                         f"got {type(value).__name__}")  # fmt: skip
    if value.binding is None:
        raise InputError(f"{what} is bound to no bundle or index; build it with its from_* constructors")
    if value.binding.key not in space.bindings:
        raise InputError(
            f"{what} was built for {value.binding.label}, but this decoder serves {space.label}; build it "
            "again for this bundle (e.g. ItemMask.from_ids(bundle, ids))"
        )
    if value.num_items != space.num_items:  # same binding, so only a hand-made object gets here
        raise InputError(f"{what} is for {value.num_items} items, the decoder's index has {space.num_items}")


def make_resident(space: ItemSpace, mask: ItemMask | None, set_bits: SetBits | None, *,
                  reuse: Resident | None = None) -> Resident:  # fmt: skip
    """The Resident of availability `mask` (None: all) and compiled sets `set_bits` (None: no sets).
    O(items + rows + sum of set sizes); builds everything before the caller swaps one reference. reuse: a
    Resident whose availability part is taken as is when it has the same mask array (new sets only)."""
    check_binding(space, mask, "availability mask")
    check_binding(space, None if set_bits is None else set_bits.sets, "item sets")
    available = rank = None
    tables: tuple[torch.Tensor | None, ...] = (None,) * len(space.steps)
    if reuse is not None and mask is not None and reuse.mask is mask:
        available, rank, tables = reuse.available, reuse.rank, reuse.tables
    elif mask is not None:
        available = mask.available
        rank = AvailabilityRank.of(available)
        tables = masked_tables(space, rank)
    row_bits: tuple[torch.Tensor, ...] = ()
    set_keys = None
    if set_bits is not None:
        row_bits = set_row_bits(space, set_bits, available)
        keys = set_bits.member_keys  # the available members: one gather and one compress, order kept
        set_keys = keys if available is None else keys[available[set_bits.member_pos]]
    dense_bits: list[torch.Tensor | None] = []
    for t, table in enumerate(space.steps):
        if table.next is None or set_bits is None or set_bits.words > 1:
            dense_bits.append(None)
            continue
        child = table.next.long()
        words = row_bits[t][child.clamp(min=0)]
        dense_bits.append(torch.where(child >= 0, words, torch.zeros_like(words)))
    return Resident(space, available, rank, tables, set_bits, row_bits, set_keys, tuple(dense_bits), mask)


__all__ = [
    "AvailabilityRank",
    "ItemSpace",
    "Resident",
    "SetBits",
    "check_binding",
    "check_set_memory",
    "item_bits",
    "make_resident",
    "masked_tables",
    "row_validity",
    "run_starts",
    "set_row_bits",
    "signed_words",
]
