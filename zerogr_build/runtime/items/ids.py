"""Item ids as the item constraints take them: which bundle (or index) a mask belongs to, the checked
conversion of any container of ids, and the id -> leaf-order position lookup (docs/constraints.md).

Accepted containers of ids: a list, tuple, set, frozenset, dict view, range, generator or any other
iterable; a numpy array of any shape (flattened) of integers, strings, integral floats or Python objects; a
pyarrow Array or ChunkedArray; anything with `to_numpy()` (pandas). Refused with InputError: a single id
(a str, bytes or number where a collection is expected), a mapping (pass its `.keys()`), null ids (None,
NaN, pandas NA), non-integral or inexact floats, booleans, ids that mix integers and strings, and ids of
the other kind than the catalog's (strings for an integer catalog or the reverse).

Integer ids are compared by value in the catalog's own domain: a signed catalog (int8..int64) holds
-2^63..2^63-1, a uint64 catalog 0..2^64-1; an id outside that domain is simply not in the catalog (so -1
never aliases 2^64-1).
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...base.errors import InputError
from ...index import SidIndex

INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
#: Floats hold every integer exactly only up to here; a float id beyond it may already be another id.
FLOAT_EXACT = 2**53


def index_of(source: Any) -> SidIndex:
    """The SidIndex of a SidIndex or a Bundle (anything with `.index`)."""
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


# ---------------------------------------------------------------------------------------------- binding


@dataclass(frozen=True)
class SourceBinding:
    """Which item order a mask or sets object was built for.

    key: a bundle's items.parquet sha256 (two versions with byte-identical items tables share one item
    order, so a mask fits both), or a per-object token for an in-memory index or any other source.
    label: how messages name it."""

    key: tuple
    label: str


_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NEXT_TOKEN = itertools.count(1)


def _object_token(obj: Any) -> int:
    try:
        token = _TOKENS.get(obj)
        if token is None:
            token = _TOKENS[obj] = next(_NEXT_TOKEN)
        return token
    except TypeError:  # not weak-referenceable or unhashable: its id (valid while it lives)
        return -id(obj)


def _items_sha256(source: Any) -> str | None:
    manifest = getattr(source, "manifest", None)
    try:
        name = manifest["leaves"]["files"]["items"]
        digest = manifest["files"][name]["sha256"]
    except (TypeError, KeyError):
        return None
    return digest if isinstance(digest, str) else None


def binding_of(source: Any) -> SourceBinding:
    """The SourceBinding of a Bundle (its items table sha256), a SidIndex or another source (the object)."""
    if isinstance(source, SidIndex):
        return SourceBinding(("index", _object_token(source)), "an in-memory index")
    digest = _items_sha256(source)
    label = f"{getattr(source, 'path', 'a bundle')} (version {getattr(source, 'version', '?')})"
    if digest is not None:
        return SourceBinding(("items", digest), label)
    return SourceBinding(("object", _object_token(source)), label)


def accepted_bindings(source: Any) -> frozenset[tuple]:
    """Binding keys a decoder over `source` accepts: its own and, for a Bundle, its index's (positions of
    a bundle's index are the bundle's item order)."""
    keys = {binding_of(source).key}
    if not isinstance(source, SidIndex):
        keys.add(binding_of(index_of(source)).key)
    return frozenset(keys)


# ------------------------------------------------------------------------------------------- conversion


@dataclass(frozen=True)
class IdValues:
    """Checked query ids. kind "int": values int64 or uint64 numpy [k], or an object array of Python ints
    (some outside both 64-bit ranges); "str" / "bytes": an object array of str / bytes."""

    kind: str
    values: np.ndarray


def _null_error(what: str, unit: str, at: int) -> InputError:
    return InputError(f"{what}: {unit} {at} is null (an item id cannot be null)")


def _is_null(v: Any) -> bool:
    return v is None or type(v).__name__ in ("NAType", "NaTType") or (isinstance(v, float) and v != v)


def _float_id(v: float, what: str, unit: str, at: int) -> int:
    if not (abs(v) <= FLOAT_EXACT and v == int(v)):
        _floats(np.asarray([v]), what, unit, at)  # raises the matching error
    return int(v)


def _floats(values: np.ndarray, what: str, unit: str, first: int = 0) -> IdValues:
    """Integral floats -> int64 ids; NaN (a null), inf, fractions and floats beyond 2^53 are refused (the
    first bad one named as `unit` first + i)."""
    values = values.astype(np.float64, copy=False)
    checks = (
        (np.isnan(values), "is null (an item id cannot be null)"),
        (~np.isfinite(values), "is {v}, not an item id"),
        (values != np.floor(values), "is {v!r}, not an integral item id"),
        (np.abs(values) > FLOAT_EXACT, "is the float {v!r}, beyond 2^53 where floats cannot hold an exact "
         "id; pass integers"),
    )  # fmt: skip
    for bad, message in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{what}: {unit} {first + i} " + message.format(v=float(values[i])))
    return IdValues("int", values.astype(np.int64))


def _objects(values: list | np.ndarray, what: str, unit: str) -> IdValues:
    """Element by element (object arrays, mixed lists): ints, integral floats, str or bytes, one kind."""
    out: list[Any] = []
    kinds = set()
    for at, v in enumerate(values.tolist() if isinstance(values, np.ndarray) else values):
        if _is_null(v):
            raise _null_error(what, unit, at)
        if isinstance(v, (bool, np.bool_)):
            raise InputError(f"{what}: {unit} {at} is the boolean {v}, not an item id")
        if isinstance(v, (int, np.integer)):
            kinds.add("int")
            out.append(int(v))
        elif isinstance(v, (float, np.floating)):
            kinds.add("int")
            out.append(_float_id(float(v), what, unit, at))
        elif isinstance(v, str):
            kinds.add("str")
            out.append(v)
        elif isinstance(v, bytes):
            kinds.add("bytes")
            out.append(v)
        else:
            raise InputError(f"{what}: {unit} {at} is a {type(v).__name__}, not an item id")
        if len(kinds) > 1:
            raise InputError(f"{what}: ids mix {' and '.join(sorted(kinds))} ({unit} {at})")
    kind = kinds.pop() if kinds else "int"
    if kind == "int":
        low, high = (min(out), max(out)) if out else (0, 0)
        if low >= INT64_MIN and high <= INT64_MAX:
            return IdValues("int", np.asarray(out, dtype=np.int64))
        if low >= 0 and high <= UINT64_MAX:
            return IdValues("int", np.asarray(out, dtype=np.uint64))
    arr = np.empty(len(out), dtype=object)
    arr[:] = out
    return IdValues(kind, arr)


def _from_array(arr: np.ndarray, what: str, unit: str) -> IdValues:
    if arr.ndim == 0:
        raise InputError(f"{what}: expected a collection of item ids, got the single value {arr.item()!r}")
    arr = arr.reshape(-1)
    kind = arr.dtype.kind
    if kind == "i":
        return IdValues("int", arr.astype(np.int64, copy=False))
    if kind == "u":
        return IdValues("int", arr if arr.dtype == np.uint64 else arr.astype(np.int64))
    if kind == "f":
        return _floats(arr, what, unit)
    if kind == "U":
        return IdValues("str", arr.astype(object))
    if kind == "S":
        return IdValues("bytes", arr.astype(object))
    if kind == "O":  # the fast paths of a list first (all str, all int), else element by element
        return _from_list(arr.tolist(), what, unit)
    if kind == "b":
        raise InputError(f"{what}: booleans are not item ids (a mask in item order: ItemMask.from_bool)")
    raise InputError(f"{what}: ids of dtype {arr.dtype} are not item ids (integers or strings)")


def _from_list(values: list, what: str, unit: str) -> IdValues:
    types = set(map(type, values))
    if types and types <= {int}:
        for dtype in (np.int64, np.uint64):
            try:
                return IdValues("int", np.asarray(values, dtype=dtype))
            except OverflowError:
                continue
    if types == {str}:
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return IdValues("str", arr)
    return _objects(values, what, unit)


def as_ids(ids: Any, what: str = "item ids", unit: str = "entry") -> IdValues:
    """The checked ids of any accepted container (module docstring); InputError names `what` and the
    `unit` ("entry", "row") of the first bad value."""
    if isinstance(ids, (str, bytes)) or np.isscalar(ids):
        raise InputError(f"{what}: expected a collection of item ids, got the single value {ids!r}")
    if isinstance(ids, Mapping):
        raise InputError(f"{what}: got a mapping; pass the ids themselves (for its keys: .keys())")
    if type(ids).__module__.startswith("pyarrow"):
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(ids, (pa.Array, pa.ChunkedArray)):
            if ids.null_count:
                raise _null_error(what, unit, int(pc.index(pc.is_null(ids), True).as_py()))
            if pa.types.is_boolean(ids.type):
                raise InputError(f"{what}: booleans are not item ids")
            ids = ids.to_numpy(zero_copy_only=False) if isinstance(ids, pa.Array) else ids.to_numpy()
    if isinstance(ids, np.ndarray):
        return _from_array(ids, what, unit)
    if hasattr(ids, "to_numpy"):  # pandas Series / Index: nullable types become objects with NA
        return _from_array(np.asarray(ids.to_numpy()), what, unit)
    if hasattr(ids, "__array__") or hasattr(ids, "__array_interface__"):
        return _from_array(np.asarray(ids), what, unit)
    if isinstance(ids, Iterable):
        return _from_list(list(ids), what, unit)
    raise InputError(f"{what}: expected a collection of item ids, got {type(ids).__name__}")


# -------------------------------------------------------------------------------------------- lookup


class ItemIds:
    """Item id -> leaf-order position lookup of one bundle or index (built once, then shared).

    Bundle: its items table (`bundle.items()`). In-memory SidIndex with item_order: catalog row numbers.
    Otherwise: positions are the ids. Integer catalogs keep their domain (int64, or uint64 for a uint64
    items table); string and binary catalogs use a dict.
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
        ids = np.asarray(ids).reshape(-1)
        self._direct: np.ndarray | None = None
        if ids.dtype.kind in "iu":
            self.kind = "int"
            self.unsigned = ids.dtype == np.uint64
            ids = ids.astype(np.uint64 if self.unsigned else np.int64, copy=False)
            self._order = np.argsort(ids, kind="stable")
            self._sorted = ids[self._order]
            if ids.size:
                low, high = int(self._sorted[0]), int(self._sorted[-1])
                span = high - low + 1
                if span <= 4 * ids.size + 1024:  # dense ids (catalog rows, 0..n-1): one gather per lookup
                    self._low, self._high = self._sorted[0], self._sorted[-1]
                    self._direct = np.full(span, -1, dtype=np.int64)
                    self._direct[(self._sorted[::-1] - self._low).astype(np.int64)] = self._order[::-1]
        else:
            values = ids.tolist()
            self.kind = "bytes" if values and isinstance(values[0], bytes) else "str"
            self._lookup = {v: i for i, v in enumerate(values)}

    def _domain(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys in the catalog's dtype, inside bool): query ints mapped into the catalog's domain."""
        target = np.uint64 if self.unsigned else np.int64
        if values.dtype == target:
            return values, np.ones(values.shape[0], dtype=bool)
        if values.dtype == np.int64:  # into uint64: negatives are outside
            inside = values >= 0
        elif values.dtype == np.uint64:  # into int64: above 2^63 - 1 is outside
            inside = values <= np.uint64(INT64_MAX)
        else:  # Python ints, some outside both ranges
            low, high = (0, UINT64_MAX) if self.unsigned else (INT64_MIN, INT64_MAX)
            inside = np.fromiter((low <= v <= high for v in values.tolist()), bool, values.shape[0])
            pairs = zip(values.tolist(), inside.tolist(), strict=True)
            keys = np.asarray([v if ok else 0 for v, ok in pairs], dtype=target)
            return keys, inside
        return np.where(inside, values, 0).astype(target), inside

    def lookup(self, ids: Any, what: str = "item ids", unit: str = "entry") -> np.ndarray:
        """int64 [k]: the leaf-order position of each of `ids` (any accepted container, as_ids), -1 where
        not in the catalog. InputError for bad ids or ids of the other kind than the catalog's."""
        query = ids if isinstance(ids, IdValues) else as_ids(ids, what, unit)
        if query.values.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        if query.kind != self.kind:
            names = {"int": "integers", "str": "strings", "bytes": "bytes"}
            raise InputError(f"{what}: ids are {names[query.kind]}, the catalog's item ids are "
                             f"{names[self.kind]}")  # fmt: skip
        if self.kind != "int":
            return np.asarray([self._lookup.get(v, -1) for v in query.values.tolist()], dtype=np.int64)
        keys, inside = self._domain(query.values)
        if self._sorted.size == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        if self._direct is not None:
            inside &= (keys >= self._low) & (keys <= self._high)
            at = (np.where(inside, keys, self._low) - self._low).astype(np.int64)
            return np.where(inside, self._direct[at], -1)
        at = np.searchsorted(self._sorted, keys).clip(max=self._sorted.shape[0] - 1)
        return np.where(inside & (self._sorted[at] == keys), self._order[at], -1)

    def positions(self, ids: Any, what: str = "item ids", unit: str = "entry") -> np.ndarray:
        """int64 [k]: leaf-order positions of the known ids among `ids` (any order, duplicates kept).
        Unknown ids are dropped and reported in one warning per call."""
        found = self.lookup(ids, what, unit)
        unknown = int((found < 0).sum())
        if unknown:
            message = (
                f"{what}: {unknown} of {found.shape[0]} rows name item ids that are not in the catalog"
                if unit == "row"
                else f"{unknown} of {found.shape[0]} {what} are not in the catalog"
            )
            warnings.warn(message + " (ignored)", stacklevel=3)
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


__all__ = [
    "POSITIONS",
    "IdValues",
    "ItemIds",
    "SourceBinding",
    "accepted_bindings",
    "as_ids",
    "binding_of",
    "index_of",
    "item_ids",
]
