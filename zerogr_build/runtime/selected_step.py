"""A filter-first sparse step in one kernel pass on the CPU: each beam's children scored where they lie
and each request's best M kept (scoring mode `select_top`, selective_numba's), instead of the decoder's
slot rows, overflow lanes, [R, K] totals and top-M over them.

    selected_sparse_step(state, hidden, table, weight, bias, scoring, start, count) -> BeamState | None

The same candidates and totals as the slot-row path (bit for bit; equal totals ordered by beam, then
slot). The children are read from the step table, or its availability-masked copy, where they lie; the
kernel also empties the ones a request's include sets or exclusions rule out (items.filter.select_filter).
None where that does not apply: the decoder takes the slot rows then.
"""

from __future__ import annotations

from typing import Any

import torch

from .beams import BeamState
from .device_tables import DeviceStep
from .items.filter import select_filter, slot_source


def selected_sparse_step(
    state: BeamState,
    hidden: torch.Tensor,
    table: DeviceStep,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scoring: Any,
    start: torch.Tensor,
    count: torch.Tensor,
) -> BeamState | None:
    """The state after one filter-first sparse step through scoring.select_top (see the module docstring).

    hidden [R, d]; weight [V, d] and bias [V] or None of the step; start, count int64 [R]: each beam's
    first child position and child count (slots.row_extent). None when the step's tokens cannot be read
    in place or the request constraints need the slot-row path."""
    source = slot_source(state.constraints, table)
    if not _reads_in_place(source):
        return None
    limits = select_filter(state.constraints, table, source.tokens)
    if limits is None:
        return None
    values, beam, slot = scoring.select_top(
        hidden, weight, bias, source.tokens, start, count, state.scores, state.batch_size, state.beam_width,
        **limits,
    )  # fmt: skip
    flat = (start[beam] + slot).clamp(max=table.nnz - 1)
    assert table.tokens is not None
    token = table.tokens[flat].long()
    return state.advance(values, beam, token, flat)


def _reads_in_place(source: Any) -> bool:
    """Whether a sparse step's tokens (slot_source's) can be read where they lie by select_top."""
    tokens = source.tokens
    return (
        tokens is not None
        and tokens.dtype == torch.int32
        and tokens.is_contiguous()
        and tokens.device.type == "cpu"
    )


__all__ = ["selected_sparse_step"]
