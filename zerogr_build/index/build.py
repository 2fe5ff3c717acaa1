"""build_index: raw (unsorted, possibly duplicated) SIDs -> SidIndex. Pure: arrays in, arrays out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..base.errors import InputError
from ..base.memory import trim_heap
from .formats import (
    FormatPolicy,
    choose_format,
    forced_dense_error,
    indptr_dtype,
    parse_step_formats,
    token_dtype,
)
from .tables import SidIndex, StepTable

if TYPE_CHECKING:
    from .pack import PackedSids
    from .sort import SortedLayout


def validate_sids(sids: np.ndarray, codebook_sizes: Sequence[int]) -> np.ndarray:
    """Check shape, dtype and token range; returns sids as a 2-D integer array (no copy if possible)."""
    sids = np.asarray(sids)
    if sids.ndim != 2:
        raise InputError(f"sids must be a 2-D array [items, steps], got shape {sids.shape}")
    if not np.issubdtype(sids.dtype, np.integer):
        raise InputError(f"sids must be integers, got dtype {sids.dtype}")
    n, num_steps = sids.shape
    if n == 0:
        raise InputError("empty catalog: no SIDs to index")
    if len(codebook_sizes) != num_steps:
        raise InputError(f"{len(codebook_sizes)} codebook sizes given for SIDs of length {num_steps}")
    for t, size in enumerate(codebook_sizes):
        if int(size) < 1:
            raise InputError(f"codebook size of step {t} must be >= 1, got {size}")
        column = sids[:, t]
        lo, hi = int(column.min()), int(column.max())
        if lo < 0 or hi >= int(size):
            bad = int(np.flatnonzero((column < 0) | (column >= int(size)))[0])
            raise InputError(
                f"row {bad}: token {int(column[bad])} at step {t} is outside codebook 0..{int(size) - 1}"
            )
    return sids


def build_index(
    sids: np.ndarray,
    codebook_sizes: Sequence[int],
    *,
    step_formats: str | Mapping[int, str] | None = None,
    policy: FormatPolicy | None = None,
    workers: int | None = None,
) -> SidIndex:
    """Build every step table of a catalog in memory.

    sids: integer [N, L], one row per item, any order, duplicates allowed (several items per leaf).
    codebook_sizes: V_t for t = 0..L-1. step_formats: "auto", "0=dense,2=sparse" or {step: format}.
    workers: CPU threads for the parallel build (None: all cores).
    Returns a SidIndex whose item_order int32|int64 [N] lists catalog rows in leaf order.
    """
    sids = validate_sids(sids, codebook_sizes)
    sizes = tuple(int(v) for v in codebook_sizes)
    formats = parse_step_formats(step_formats, len(sizes))
    from .sort import sort_and_mark  # numba kernels compile lazily

    return _index_from_layout(sort_and_mark(sids, sizes, workers=workers), sizes, formats, policy)


def build_index_packed(
    packed: PackedSids,
    *,
    step_formats: str | Mapping[int, str] | None = None,
    policy: FormatPolicy | None = None,
    workers: int | None = None,
    consume: bool = False,
) -> SidIndex:
    """build_index from SIDs packed as the catalog was read (index.pack.PackedSids, tokens already
    validated): the same SidIndex as build_index(packed.unpack(), packed.codebook_sizes).
    consume: the sort takes `packed`'s arrays over and frees them (packed is empty afterwards)."""
    if packed.num_items == 0:
        raise InputError("empty catalog: no SIDs to index")
    sizes = packed.codebook_sizes
    formats = parse_step_formats(step_formats, len(sizes))
    from .sort import layout_from_packed  # numba kernels compile lazily

    layout = layout_from_packed(packed, workers, consume=consume)
    trim_heap()  # the sort's scratch, before the tables and the publish that follows (0.25 B/item at 100M)
    return _index_from_layout(layout, sizes, formats, policy)


def _index_from_layout(
    layout: SortedLayout, sizes: tuple[int, ...], formats: Mapping[int, str], policy: FormatPolicy | None
) -> SidIndex:
    policy = policy or FormatPolicy()
    steps = []
    for t, size in enumerate(sizes):
        rows = 1 if t == 0 else int(layout.prefix_counts[t - 1])
        nnz = int(layout.prefix_counts[t])
        fmt = choose_format(rows, nnz, size, formats[t], policy, step=t)
        try:
            steps.append(_make_step(layout, t, size, rows, nnz, fmt))
        except MemoryError:
            if formats[t] != "dense":
                raise
            raise forced_dense_error(t, rows, size, "more memory than this process may allocate") from None
    return SidIndex(
        codebook_sizes=sizes,
        steps=tuple(steps),
        leaf_offsets=layout.leaf_offsets,
        item_order=layout.item_order,
    )


def _largest_gap(indptr: np.ndarray, chunk: int = 1 << 20) -> int:
    """max(indptr[j+1] - indptr[j]) over rows j, `chunk` rows at a time: np.diff of the whole indptr
    would be a temporary as large as it (4 B per row, 0.35 GB at 100M items) at the build's peak."""
    best = 0
    for lo in range(0, indptr.shape[0] - 1, chunk):
        part = indptr[lo : lo + chunk + 1]
        best = max(best, int((part[1:] - part[:-1]).max()))
    return best


def _make_step(layout: SortedLayout, t: int, size: int, rows: int, nnz: int, fmt: str) -> StepTable:
    """Materialise step t from the sorted layout in the chosen format."""
    indptr = layout.prefix_starts[t].astype(indptr_dtype(nnz), copy=False)
    if fmt == "sparse":
        tokens = layout.prefix_tokens[t].astype(token_dtype(size), copy=False)
        max_slots = _largest_gap(indptr) if rows else 0
        return StepTable(t, size, rows, nnz, max_slots, indptr=indptr, tokens=tokens)
    from .dense import dense_next  # numba kernels compile lazily

    nxt = dense_next(indptr, layout.prefix_tokens[t], rows, size)
    return StepTable(t, size, rows, nnz, size, next=nxt)
