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
exclusions become the few rows they empty, found at start() (space.py, filter.py,
requests.py, kills.py).

Item positions: everything here is in *leaf order* - position p is row p of a bundle's items table
(`bundle.items()`), or of an in-memory index's `item_order` (catalog row item_order[p]).
Masks are not part of the bundle: they change by the minute and live only in the Decoder. A mask or sets
object is bound to the item order it was built for (ids.binding_of) and copied read-only; ids are
checked and compared by value in the catalog's type (ids.py); files are read by files.py.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...base.errors import InputError
from ...index import SidIndex
from .ids import (
    POSITIONS,
    ItemIds,
    SourceBinding,
    as_ids,
    binding_of,
    index_of,
    item_ids,
)


def _frozen(array: np.ndarray) -> np.ndarray:
    """`array` read-only and owning its memory: copied unless it already is (a caller's buffer or a view of
    one is never kept, so editing it later cannot change a live mask)."""
    if array.flags.writeable or array.base is not None or not array.flags.c_contiguous:
        array = np.array(array, order="C", copy=True)
    array.setflags(write=False)
    return array


def _bool_mask(mask: Any, num_items: int) -> np.ndarray:
    """bool [num_items] from a bool array, or from integers / floats that are all 0 or 1 (a copy)."""
    if isinstance(mask, (str, bytes)) or np.isscalar(mask):
        raise InputError(f"availability mask: expected a bool array of {num_items} entries, got {mask!r}")
    arr = np.asarray(mask)
    if arr.ndim != 1:
        raise InputError(f"availability mask: expected a 1-D bool array, got shape {arr.shape}")
    if arr.shape[0] != num_items:
        raise InputError(f"availability mask has {arr.shape[0]} entries for {num_items} items")
    if arr.dtype.kind == "b":
        return np.array(arr, dtype=bool, copy=True)
    if arr.dtype.kind in "iuf":
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            raise InputError(f"availability mask: entry {at} is {arr[at]!r}, not a bool (or 0 / 1)")
        return arr == 1
    raise InputError(f"availability mask: dtype {arr.dtype} is not bool (strings such as 'False' are not)")


@dataclass(frozen=True, eq=False)
class ItemMask:
    """The global availability mask: available bool [items] in leaf order (numpy, read-only, its own copy),
    bound to the bundle or index it was built for (`binding`; a Decoder over another item order refuses
    it). Build it with from_bool / from_ids / from_parquet."""

    available: np.ndarray
    binding: SourceBinding | None = None

    def __post_init__(self) -> None:
        arr = self.available
        if not isinstance(arr, np.ndarray) or arr.dtype != np.bool_ or arr.ndim != 1:
            raise InputError("ItemMask needs a 1-D numpy bool array (build one with ItemMask.from_bool, "
                             "from_ids or from_parquet)")  # fmt: skip
        object.__setattr__(self, "available", _frozen(arr))

    @property
    def num_items(self) -> int:
        return int(self.available.shape[0])

    @property
    def num_available(self) -> int:
        return int(self.available.sum())

    @classmethod
    def from_bool(cls, source: Any, mask: Any) -> ItemMask:
        """mask bool [items] (or 0 / 1 integers): for a Bundle in its items order (`bundle.items()`), for an
        in-memory index in catalog row order (the rows build_index was given). The mask is copied."""
        index = index_of(source)
        available = _bool_mask(mask, index.num_items)
        if isinstance(source, SidIndex) and index.item_order is not None:
            available = available[np.asarray(index.item_order)]
        available.setflags(write=False)
        return cls(available, binding_of(source))

    @classmethod
    def from_ids(cls, source: Any, ids: Any) -> ItemMask:
        """Available = the items named in ids (any container of ids; ids not in the catalog: one warning,
        ignored; bad ids such as nulls: InputError)."""
        lookup = item_ids(source)
        available = np.zeros(lookup.num_items, dtype=bool)
        available[lookup.positions(ids, "available item ids")] = True
        available.setflags(write=False)
        return cls(available, binding_of(source))

    @classmethod
    def from_parquet(cls, source: Any, path: Any, item_column: str | None = None,
                     flag_column: str | None = None) -> ItemMask:  # fmt: skip
        """A Parquet file of item ids (first column unless `item_column`), optionally with a flag column
        (`flag_column`, or the first boolean column) saying which of them are available. A bad file
        (missing, not Parquet, no rows, a null or mistyped id or flag) raises InputError naming it."""
        from .files import read_available_ids

        ids, what = read_available_ids(path, item_column, flag_column)
        lookup = item_ids(source)
        available = np.zeros(lookup.num_items, dtype=bool)
        available[lookup.positions(ids, what, "row")] = True
        available.setflags(write=False)
        return cls(available, binding_of(source))


def _set_name(name: Any) -> str:
    if isinstance(name, str):
        return name
    if isinstance(name, (int, np.integer)) and not isinstance(name, (bool, np.bool_)):
        return str(int(name))
    raise InputError(f"item set names must be strings (or integers), got {name!r}")


@dataclass(frozen=True, eq=False)
class ItemSets:
    """Named item sets (e.g. category -> items), compiled once: positions[i] = sorted unique leaf-order
    positions int64 of set names[i]. Sets may overlap; an item in two named sets counts once. Bound to the
    bundle or index it was built for, like ItemMask."""

    names: tuple[str, ...]
    positions: tuple[np.ndarray, ...]
    num_items: int
    binding: SourceBinding | None = None

    @classmethod
    def from_positions(cls, source: Any, names: Sequence[str], positions: Sequence[np.ndarray]) -> ItemSets:
        """Sets of leaf-order positions (int64, any order, duplicates allowed) of `source`."""
        index = index_of(source)
        if len(set(names)) != len(names):
            seen: set[str] = set()
            dup = next(n for n in names if n in seen or seen.add(n))
            raise InputError(f"item sets: two sets are named {dup!r}")
        frozen = []
        for p in positions:
            p = np.unique(np.asarray(p, dtype=np.int64))
            p.setflags(write=False)
            frozen.append(p)
        return cls(tuple(names), tuple(frozen), index.num_items, binding_of(source))

    @classmethod
    def from_mapping(cls, source: Any, sets: Mapping[Any, Any]) -> ItemSets:
        """{set name: item ids (any container of ids)}; ids not in the catalog are reported in one warning
        and ignored; bad ids (nulls, other types) raise InputError naming the set."""
        if not isinstance(sets, Mapping):
            raise InputError(f"item sets: expected a mapping of set name -> ids, got {type(sets).__name__}")
        ids = item_ids(source)
        names, positions = [], []
        unknown = unknown_sets = 0
        for name, members in sets.items():
            name = _set_name(name)
            found = ids.lookup(members, f"item set {name!r}")
            missing = int((found < 0).sum())
            unknown += missing
            unknown_sets += missing > 0
            names.append(name)
            positions.append(found[found >= 0])
        if unknown:
            warnings.warn(f"item sets name {unknown} ids that are not in the catalog ({unknown_sets} sets; "
                          "ignored)", stacklevel=2)  # fmt: skip
        return cls.from_positions(source, names, positions)

    @classmethod
    def from_parquet(
        cls, source: Any, path: Any, set_column: str = "set", item_column: str = "item_id"
    ) -> ItemSets:
        """A Parquet file with one (set name, item id) row per membership. A bad file (missing, not
        Parquet, no rows, a null or mistyped name or id) raises InputError naming it."""
        from .files import read_set_memberships

        names, ids, what = read_set_memberships(path, set_column, item_column)
        return cls.from_memberships(source, names, ids, what)

    @classmethod
    def from_memberships(cls, source: Any, names: np.ndarray, ids: Any, what: str) -> ItemSets:
        """The sets of membership rows already read (read_set_memberships: set name per row, item id per
        row, how messages name the file): one file read, then mapped onto any number of versions. Rows naming
        ids not in `source` are reported in one warning and ignored."""
        lookup = item_ids(source)
        found = lookup.lookup(ids, what, "row")
        unknown = int((found < 0).sum())
        uniq, inverse = np.unique(names, return_inverse=True)
        if unknown:
            warnings.warn(f"{what}: {unknown} of {found.shape[0]} rows name item ids that are not in the "
                          f"catalog ({len(set(inverse[found < 0].tolist()))} sets; ignored)",
                          stacklevel=3)  # fmt: skip
        keep = found >= 0
        order = np.argsort(inverse[keep], kind="stable")
        grouped = found[keep][order]
        cut = np.searchsorted(inverse[keep][order], np.arange(uniq.shape[0] + 1))
        positions = [grouped[cut[i] : cut[i + 1]] for i in range(uniq.shape[0])]
        return cls.from_positions(source, [str(n) for n in uniq.tolist()], positions)

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
    "SourceBinding",
    "as_ids",
    "binding_of",
    "ItemMask",
    "ItemSets",
    "index_of",
    "item_ids",
    "row_item_bounds",
    "valid_rows_per_step",
]


def available_prefixes(bundle: str | Path, available: str | Path) -> dict:
    """What `zerogr inspect --available` adds for the bundle at `bundle` (no checksums read) under the
    Parquet availability file `available` (ItemMask.from_parquet): {file, items, valid_prefixes: per step
    s = 1..L the prefixes (at s = L the leaves) that keep an available item}."""
    from ...bundle import open_bundle

    opened = open_bundle(bundle, verify_checksums=False)
    mask = ItemMask.from_parquet(opened, available)
    return {
        "file": str(available),
        "items": mask.num_available,
        "valid_prefixes": valid_rows_per_step(opened.index, mask.available),
    }
