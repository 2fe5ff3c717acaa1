"""Slot filling (runtime/slots.fill_slots): the CPU numba kernel against a brute-force reference and the torch
expression it replaces on other devices."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.runtime.slots import fill_slots, fill_slots_torch


def brute_force(tokens: np.ndarray, start: np.ndarray, count: np.ndarray, width: int) -> np.ndarray:
    """Slot by slot: tokens[start + k] (position clamped into the table) while k < count, else -1."""
    out = np.full((len(start), width), -1, dtype=np.int32)
    for r in range(len(start)):
        for k in range(width):
            if k < count[r]:
                out[r, k] = tokens[min(max(start[r] + k, 0), len(tokens) - 1)]
    return out


@st.composite
def slot_rows(draw):
    nnz = draw(st.integers(1, 40))
    tokens = np.array(draw(st.lists(st.integers(-1, 2**31 - 1), min_size=nnz, max_size=nnz)), np.int32)
    rows = draw(st.integers(0, 12))
    width = draw(st.integers(0, 9))
    start = np.array(draw(st.lists(st.integers(0, nnz + 5), min_size=rows, max_size=rows)), np.int64)
    count = np.array(draw(st.lists(st.integers(-2, 14), min_size=rows, max_size=rows)), np.int64)
    return tokens, start, count, width


@settings(max_examples=300, deadline=None)
@given(slot_rows())
def test_cpu_kernel_matches_brute_force_and_the_torch_reference(case):
    tokens, start, count, width = case
    step = SimpleNamespace(nnz=len(tokens), tokens=torch.from_numpy(tokens))
    got = fill_slots(step, torch.from_numpy(start), torch.from_numpy(count), width)
    assert got.dtype == torch.int32 and tuple(got.shape) == (len(start), width)
    np.testing.assert_array_equal(got.numpy(), brute_force(tokens, start, count, width))
    if (start + np.maximum(count, 0) <= len(tokens)).all():  # the torch reference needs in-range positions
        reference = fill_slots_torch(step, torch.from_numpy(start), torch.from_numpy(count), width)
        np.testing.assert_array_equal(got.numpy(), reference.numpy())


def test_the_kernel_reads_a_masked_copy_and_strided_starts():
    """Slots of a masked token copy (availability: -1 children) and of a non-contiguous start vector."""
    tokens = torch.tensor([5, -1, 7, 8, -1, 3], dtype=torch.int32)
    step = SimpleNamespace(nnz=6, tokens=tokens)
    start = torch.tensor([[0, 9], [2, 9], [4, 9]], dtype=torch.int64)[:, 0]  # stride 2
    count = torch.tensor([3, 0, 2], dtype=torch.int64)
    got = fill_slots(step, start, count, 4)
    assert got.tolist() == [[5, -1, 7, -1], [-1, -1, -1, -1], [-1, 3, -1, -1]]
