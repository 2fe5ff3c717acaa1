"""Item constraints at serve time: a global availability mask and per-request include sets / exclude lists,
applied exactly by the Decoder without rebuilding the index (docs/constraints.md).

    avail = ItemMask.from_ids(bundle, in_stock_ids)           # or ItemMask.from_bool(bundle, bool [items])
    sets = ItemSets.from_parquet(bundle, "categories.parquet", set_column="category", item_column="item_id")
    dec.set_availability(avail); dec.set_item_sets(sets)
    dec.search(step_fn, B, M, include=[["comedy"], None, ...], exclude=[[seen ids], [], ...])

Why it is cheap: row r of step s is the r-th distinct length-s prefix in lexicographic order, so it covers a
contiguous run of leaves, and so a contiguous run [lo, hi) of the leaf-ordered items table. A mask swap
writes the children without an available item as -1 into a copy of each step table (prefix sums, O(items +
rows); free at search time), item sets become per-row words of set bits (one AND per slot), and a search's
exclusions become the few rows they empty, found at start() (item_space.py, item_filter.py,
item_requests.py, item_kills.py).

Item positions: everything here is in *leaf order* - position p is row p of a bundle's items table
(`bundle.items()`), or of an in-memory index's `item_order` (catalog row item_order[p]).
Masks are not part of the bundle: they change by the minute and live only in the Decoder.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..index import SidIndex


def index_of(source: Any) -> SidIndex:
    if isinstance(source, SidIndex):
        return source
    if hasattr(source, "index"):
        return source.index
    raise InputError(f"constraints need a SidIndex or a Bundle, got {type(source).__name__}")


class _Positions:
    """Stand-in items table whose entry p is p: SidIndex.leaf_items(leaves, _Positions()) -> positions."""

    def take(self, positions: np.ndarray) -> np.ndarray:
        return positions


POSITIONS = _Positions()


class ItemIds:
    """Item id -> leaf-order position lookup of one bundle or index (built once, then shared).

    Bundle: its items table (`bundle.items()`). In-memory SidIndex with item_order: catalog row numbers.
    Otherwise: positions are the ids.
    """

    def __init__(self, source: Any) -> None:
        index = index_of(source)
        self.num_items = index.num_items
        items = getattr(source, "items", None)
        if callable(items) and not isinstance(source, SidIndex):
            table = items()
            ids = table.to_numpy(zero_copy_only=False) if hasattr(table, "to_numpy") else np.asarray(table)
        elif index.item_order is not None:
            ids = np.asarray(index.item_order, dtype=np.int64)
        else:
            ids = np.arange(self.num_items, dtype=np.int64)
        self._numeric = ids.dtype.kind in "iu"
        self._direct: np.ndarray | None = None
        if self._numeric:
            ids = ids.astype(np.int64, copy=False)
            self._order = np.argsort(ids, kind="stable")
            self._sorted = ids[self._order]
            low = int(self._sorted[0]) if ids.size else 0
            span = int(self._sorted[-1]) - low + 1 if ids.size else 0
            if span <= 4 * ids.size + 1024:  # dense ids (catalog rows, 0..n-1): one gather per lookup
                self._low = low
                self._direct = np.full(span, -1, dtype=np.int64)
                self._direct[self._sorted[::-1] - low] = self._order[::-1]  # a duplicate id: its first row
        else:
            self._lookup = {v: i for i, v in enumerate(ids.tolist())}

    def lookup(self, ids: Any) -> np.ndarray:
        """int64 [k]: the leaf-order position of each of `ids` (any order), -1 where not in the catalog."""
        if hasattr(ids, "to_numpy"):
            ids = ids.to_numpy(zero_copy_only=False)
        ids = np.asarray(ids).reshape(-1)
        if ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        if not self._numeric:
            return np.asarray([self._lookup.get(v, -1) for v in ids.tolist()], dtype=np.int64)
        if ids.dtype.kind not in "iu":
            return np.full(ids.shape[0], -1, dtype=np.int64)
        ids = ids.astype(np.int64)
        if self._direct is not None:
            at = ids - self._low
            inside = (at >= 0) & (at < self._direct.shape[0])
            return np.where(inside, self._direct[np.where(inside, at, 0)], -1)
        if self._sorted.size == 0:
            return np.full(ids.shape[0], -1, dtype=np.int64)
        at = np.searchsorted(self._sorted, ids).clip(max=self._sorted.shape[0] - 1)
        return np.where(self._sorted[at] == ids, self._order[at], -1)

    def positions(self, ids: Any, what: str = "item ids") -> np.ndarray:
        """int64 [k]: leaf-order positions of the known ids among `ids` (any order, duplicates kept).
        Unknown ids are dropped and reported in one warning per call."""
        found = self.lookup(ids)
        unknown = int((found < 0).sum())
        if unknown:
            warnings.warn(
                f"{unknown} of {found.shape[0]} {what} are not in the catalog (ignored)", stacklevel=3
            )
        return found[found >= 0]


_ID_LOOKUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def item_ids(source: Any) -> ItemIds:
    """The (cached per bundle / index object) id -> position lookup of `source`."""
    try:
        cached = _ID_LOOKUPS.get(source)
    except TypeError:  # not weak-referenceable / hashable: no cache
        return ItemIds(source)
    if cached is None:
        cached = _ID_LOOKUPS[source] = ItemIds(source)
    return cached


@dataclass(frozen=True, eq=False)
class ItemMask:
    """The global availability mask: available bool [items] in leaf order (numpy; see module docstring)."""

    available: np.ndarray

    @property
    def num_items(self) -> int:
        return int(self.available.shape[0])

    @property
    def num_available(self) -> int:
        return int(self.available.sum())

    @classmethod
    def from_bool(cls, source: Any, mask: Any) -> ItemMask:
        """mask bool [items]: for a Bundle in its items order (`bundle.items()`), for an in-memory index in
        catalog row order (the rows build_index was given)."""
        index = index_of(source)
        mask = np.asarray(mask, dtype=bool).reshape(-1)
        if mask.shape[0] != index.num_items:
            raise InputError(f"availability mask has {mask.shape[0]} entries for {index.num_items} items")
        if isinstance(source, SidIndex) and index.item_order is not None:
            mask = mask[np.asarray(index.item_order)]
        return cls(np.ascontiguousarray(mask))

    @classmethod
    def from_ids(cls, source: Any, ids: Any) -> ItemMask:
        """Available = the items named in ids (ids not in the catalog: one warning, ignored)."""
        lookup = item_ids(source)
        available = np.zeros(lookup.num_items, dtype=bool)
        available[lookup.positions(ids, "available item ids")] = True
        return cls(available)

    @classmethod
    def from_parquet(cls, source: Any, path: Any, item_column: str | None = None,
                     flag_column: str | None = None) -> ItemMask:  # fmt: skip
        """A Parquet file of item ids (first column unless `item_column`), optionally with a boolean column
        (`flag_column`, or the first boolean column) saying which of them are available."""
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        names = table.column_names
        if not names:
            raise InputError(f"{path}: no columns")
        item_column = item_column or names[0]
        if item_column not in names:
            raise InputError(f"{path}: no column {item_column!r} (columns: {', '.join(names)})")
        if flag_column is None:
            flags = [n for n in names if n != item_column and str(table.schema.field(n).type) == "bool"]
            flag_column = flags[0] if flags else None
        ids = table.column(item_column).to_numpy()
        if flag_column is not None:
            keep = table.column(flag_column).to_numpy(zero_copy_only=False)
            ids = ids[np.asarray(keep, dtype=bool)]
        return cls.from_ids(source, ids)


@dataclass(frozen=True, eq=False)
class ItemSets:
    """Named item sets (e.g. category -> items), compiled once: positions[i] = sorted unique leaf-order
    positions int64 of set names[i]. Sets may overlap; an item in two named sets counts once."""

    names: tuple[str, ...]
    positions: tuple[np.ndarray, ...]
    num_items: int

    @classmethod
    def from_mapping(cls, source: Any, sets: Mapping[Any, Any]) -> ItemSets:
        """{set name: item ids}; ids not in the catalog are reported once and ignored."""
        ids = item_ids(source)
        names, positions = [], []
        unknown = 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name, members in sets.items():
                names.append(str(name))
                positions.append(np.unique(ids.positions(members)))
            unknown = len(caught)
        if unknown:
            warnings.warn(f"item sets name ids that are not in the catalog ({unknown} sets; ignored)",
                          stacklevel=2)  # fmt: skip
        return cls(tuple(names), tuple(positions), ids.num_items)

    @classmethod
    def from_parquet(
        cls, source: Any, path: Any, set_column: str = "set", item_column: str = "item_id"
    ) -> ItemSets:
        """A Parquet file with one (set name, item id) row per membership."""
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for col in (set_column, item_column):
            if col not in table.column_names:
                raise InputError(f"{path}: no column {col!r} (columns: {', '.join(table.column_names)})")
        sets = np.asarray(table.column(set_column).to_numpy(zero_copy_only=False)).astype(str)
        items = table.column(item_column).to_numpy(zero_copy_only=False)
        order = np.argsort(sets, kind="stable")
        sets, items = sets[order], items[order]
        names, starts = np.unique(sets, return_index=True)
        ends = np.append(starts[1:], sets.shape[0])
        return cls.from_mapping(source, {n: items[a:b] for n, a, b in zip(names, starts, ends, strict=True)})

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def lookup(self, names: Sequence[str]) -> list[int]:
        """Indices of `names`; an unknown name raises InputError naming it."""
        table = self._index
        missing = [n for n in names if n not in table]
        if missing:
            raise InputError(f"unknown item set {missing[0]!r} (have {len(self.names)} sets)")
        return [table[n] for n in names]


def row_item_bounds(index: SidIndex) -> tuple[np.ndarray, ...]:
    """Per step s = 1..L: int64 [rows_s + 1]; row j of step s covers the leaf-ordered items
    bounds[j] .. bounds[j+1]-1 (rows of step L are the leaves). O(rows + leaves)."""
    _, leaf_offsets = index.leaf_items(np.arange(index.num_leaves, dtype=np.int64), POSITIONS)
    first_leaf = np.arange(index.num_leaves + 1, dtype=np.int64)
    bounds = [leaf_offsets]
    for table in reversed(index.steps[1:]):  # rows of step t (t = L-1..1) from those of step t+1
        if table.next is not None:
            first_child = np.zeros(table.rows + 1, dtype=np.int64)
            np.cumsum((np.asarray(table.next) >= 0).sum(axis=1), out=first_child[1:])
        else:
            first_child = np.asarray(table.indptr, dtype=np.int64)
        first_leaf = first_leaf[first_child]
        bounds.append(leaf_offsets[first_leaf])
    return tuple(reversed(bounds))


def valid_rows_per_step(index: SidIndex, available: np.ndarray) -> list[int]:
    """Under availability `available` bool [items] (leaf order): how many rows of each step s = 1..L (the
    distinct length-s prefixes; at s = L the leaves) still have an available item. O(items + rows)."""
    cum = np.zeros(available.shape[0] + 1, dtype=np.int64)
    np.cumsum(available, out=cum[1:])
    return [int((cum[b[1:]] - cum[b[:-1]] > 0).sum()) for b in row_item_bounds(index)]


__all__ = [
    "POSITIONS",
    "ItemIds",
    "ItemMask",
    "ItemSets",
    "index_of",
    "item_ids",
    "row_item_bounds",
    "valid_rows_per_step",
]
