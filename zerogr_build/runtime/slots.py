"""The fixed candidate slots every beam gets at a step: slot caps, slot filling, overflow lanes.
(The step tables' device copies live in device_tables.py.)

Slots. At a sparse step a beam on row r gets K slots filled from the front with the row's children
(tokens[indptr[r] : indptr[r+1]], ascending), -1 after them; slot k's next row is the flat position
indptr[r] + k. At a dense step slot k is token k (K = V_t) and next[r, k] is the next row. A slot depends
only on its beam and its rank, never on other beams, so there is no packing into ragged lists.

Heavy tails: the slot cap K. Real catalogs have a few rows with far more children than the typical one
(1M items, V=8192: last step max 343 children, p99 3). Sizing slots by the max makes every beam pay for the
largest row, so a sparse step gets K = min(max_slots, max(MIN_CAP, p99 of child counts rounded up to a
multiple of 4)) slots per beam (tunable per step: `Decoder(slot_caps=...)`). A beam on a row with more than K
children - a *heavy* beam - does not use its main slots; it gets an *overflow lane* instead: one lane
holding the whole row, scored by the same mode, log-softmaxed over the whole row (so the filter-first
normaliser is exact) and cut to its best min(M, width) candidates, since at most M candidates of one
request survive the step. Main slots and lanes then go through one top-M per request.

Shapes: main slots are [R, K] (static per step). Lanes are [lanes, width]: lanes = the number of heavy
beams rounded up to a power of two (>= MIN_LANES), width = the largest row among *this step's* beams
rounded up to a power of two (<= max_slots) - so a step whose heavy beams sit on rows of 11 children pays
for 16-wide lanes, not for the catalog's 343-child row - and only a handful of distinct shapes ever occur.
With K near p99 about 1% of beams are heavy. Both numbers come from one device->host sync per sparse
step. `Decoder(static_shapes=True)` fixes them instead - one lane per beam, max_slots wide, empty unless
its beam is heavy - so no step syncs and a step can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from ..index import StepTable

MIN_CAP = 4
MIN_LANES = 4


class SparseStepTensors(Protocol):
    """What slot filling reads of a sparse step on the device (runtime.device_tables.DeviceStep has it)."""

    nnz: int
    indptr: torch.Tensor | None  # int64 [rows+1]
    tokens: torch.Tensor | None  # int32 [nnz]


def child_counts(table: StepTable) -> np.ndarray:
    """int64 [rows]: number of children of every row of a host step table."""
    if table.next is not None:
        return (np.asarray(table.next) >= 0).sum(axis=1).astype(np.int64)
    assert table.indptr is not None
    return np.diff(np.asarray(table.indptr, dtype=np.int64))


def default_slot_cap(table: StepTable) -> int:
    """K for a sparse step: min(max_slots, max(MIN_CAP, p99 child count rounded up to a multiple of 4)).

    p99 over rows: a beam sits on some row, and 99% of rows fit their whole child list in K slots."""
    if table.format == "dense":
        return table.codebook_size
    counts = child_counts(table)
    p99 = float(np.percentile(counts, 99)) if counts.size else 0.0
    return int(min(table.max_slots, max(MIN_CAP, 4 * int(np.ceil(p99 / 4)))))


def row_extent(step: SparseStepTensors, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(start int64 [R], count int64 [R]) of each beam's row at a sparse step; row -1 (padding): count 0."""
    assert step.indptr is not None
    alive = rows >= 0
    safe = rows.clamp(min=0)
    start = step.indptr[safe]
    count = torch.where(alive, step.indptr[safe + 1] - start, torch.zeros_like(start))
    return start, count


def fill_slots(step: SparseStepTensors, start: torch.Tensor, count: torch.Tensor, width: int) -> torch.Tensor:
    """int32 [R, width]: slot k of beam r holds tokens[start[r] + k] for k < count[r], else -1.

    On the CPU one serial numba pass (_slot_kernels.fill_slot_rows); elsewhere the torch expression below,
    which is its reference."""
    assert step.tokens is not None
    if _fills_on_cpu(step.tokens, start, count):
        from ._slot_kernels import fill_slot_rows

        out = torch.empty((start.shape[0], width), dtype=torch.int32)
        fill_slot_rows(
            step.tokens.numpy(), start.contiguous().numpy(), count.contiguous().numpy(), out.numpy()
        )
        return out
    return fill_slots_torch(step, start, count, width)


def _fills_on_cpu(tokens: torch.Tensor, start: torch.Tensor, count: torch.Tensor) -> bool:
    """Whether fill_slots takes the numba kernel: CPU tensors of the kernel's dtypes."""
    return (
        start.device.type == "cpu"
        and tokens.dtype == torch.int32
        and tokens.is_contiguous()
        and start.dtype == count.dtype == torch.int64
    )


def fill_slots_torch(
    step: SparseStepTensors, start: torch.Tensor, count: torch.Tensor, width: int
) -> torch.Tensor:
    """fill_slots in torch ops (every device)."""
    assert step.tokens is not None
    rank = torch.arange(width, device=start.device)
    used = rank[None, :] < count[:, None]
    flat = (start[:, None] + rank[None, :]).clamp(max=step.nnz - 1)
    # gather, not step.tokens[flat]: advanced indexing into the large tokens array goes multi-threaded even
    # for a few thousand slots, and on a busy CPU that region waits milliseconds for its second thread.
    return torch.where(used, torch.gather(step.tokens, 0, flat.view(-1)).view(flat.shape), -1)


def empty_dense_slots(values: torch.Tensor, next_rows: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """values fp32 [R, V] of a dense step, -inf (in place) where beam r is padding (rows[r] < 0) or its row
    has no child k (next_rows int32 [rows_t, V] < 0); returns values.

    On the CPU one serial numba pass (_slot_kernels.empty_dense_slots); elsewhere torch ops."""
    if values.device.type == "cpu" and values.is_contiguous() and next_rows.dtype == torch.int32:
        from ._slot_kernels import empty_dense_slots as kernel

        kernel(values.numpy(), next_rows.contiguous().numpy(), rows.contiguous().numpy())
        return values
    valid = (next_rows[rows.clamp(min=0)] >= 0) & (rows >= 0)[:, None]
    return values.masked_fill_(~valid, float("-inf"))


def lane_count(num_heavy: int) -> int:
    """Overflow lanes for `num_heavy` heavy beams: 0, or the next power of two >= num_heavy, MIN_LANES."""
    if num_heavy == 0:
        return 0
    return 1 << (max(num_heavy, MIN_LANES) - 1).bit_length()


def lane_width(heaviest: int, max_slots: int) -> int:
    """Overflow lane width: the next power of two >= the heaviest current row, at most max_slots."""
    return min(max_slots, 1 << (max(heaviest, 1) - 1).bit_length())
