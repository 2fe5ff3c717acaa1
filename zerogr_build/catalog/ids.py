"""Duplicate item ids, vectorised: numba for integers, Arrow hashing for strings (kernels in _kernels.py).

Generic over any pyarrow Array of ids: the catalog reader and `bundle.verify` both use it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Below this many rows (per batch, or ids in all) plain numpy is used: it is fast enough there, and a
#: small catalog (tests, `verify --catalog` on samples) then never pays numba's ~1 s import. (The reader's
#: per-batch range check uses the same threshold.)
NUMBA_MIN_ROWS = 1 << 16


def _earliest_repeat(order: np.ndarray, same: np.ndarray) -> int:
    """First repeated row from a stable sort: order int [n] (stable argsort of the ids), same bool [n-1]
    (sorted ids k and k+1 are equal). A stable sort keeps rows in order within a run of equal ids, so every
    non-first member of a run repeats an earlier row; the first repeated row is the smallest of those."""
    return int(order[1:][same].min()) if same.any() else -1


def _string_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [n+1], data uint8) of a string/binary array (large or not) without nulls, as numpy views."""
    _, offsets_buf, data_buf = ids.buffers()
    large = pa.types.is_large_string(ids.type) or pa.types.is_large_binary(ids.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[ids.offset : ids.offset + len(ids) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def _has_string_buffers(tp: pa.DataType) -> bool:
    """string, large_string, binary, large_binary: an offsets buffer and a data buffer."""
    return (
        pa.types.is_string(tp)
        or pa.types.is_large_string(tp)
        or pa.types.is_binary(tp)
        or pa.types.is_large_binary(tp)
    )


def first_duplicate_row(ids: pa.Array, workers: int | None = None) -> int:
    """Index of the first row whose item id already occurred in an earlier row, or -1 if all are distinct.
    ids: pyarrow Array without nulls (integers and strings take the fast paths; any other type works).
    workers: parallel slices of the hash check (None: numba's thread count)."""
    if len(ids) < 2:
        return -1
    if pa.types.is_integer(ids.type):
        values = ids.to_numpy(zero_copy_only=False)
        # Sorted ids (common in exports) are distinct exactly when strictly increasing: one pass, no memory.
        if bool(np.all(values[1:] > values[:-1])):
            return -1
        if len(values) < NUMBA_MIN_ROWS:
            order = np.argsort(values, kind="stable")
            ordered = values[order]
            return _earliest_repeat(order, ordered[1:] == ordered[:-1])
        keys = values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False)
        from ._kernels import first_repeat_int64  # numba compiles lazily (cached)

        return int(first_repeat_int64(keys, workers))
    if len(ids) >= NUMBA_MIN_ROWS and _has_string_buffers(ids.type):
        from ._kernels import first_repeat_int64, hash_strings

        if first_repeat_int64(hash_strings(*_string_buffers(ids)), workers) == -1:
            return -1  # distinct hashes: certainly distinct strings
    elif len(pc.unique(ids)) == len(ids):
        return -1
    # Error path only (or a hash collision): the exact first repeated row.
    order = pc.array_sort_indices(ids).to_numpy()  # Arrow's sort_indices is stable
    sorted_ids = ids.take(pa.array(order))
    return _earliest_repeat(order, pc.equal(sorted_ids[1:], sorted_ids[:-1]).to_numpy(zero_copy_only=False))


def first_row_with_id(ids: pa.Array, row: int) -> int:
    """The first row holding the same id as `row` (== row when no earlier row holds it)."""
    return int(np.flatnonzero(pc.equal(ids[: row + 1], ids[row]).to_numpy(zero_copy_only=False))[0])
