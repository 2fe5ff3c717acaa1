"""The CPU numba kernels of runtime/slots.py (fill_slots, empty_dense_slots) against brute-force
references and the torch expressions they replace on other devices."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.runtime.slots import empty_dense_slots, fill_slots, fill_slots_torch


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


@st.composite
def dense_rows(draw):
    table_rows, vocab = draw(st.integers(1, 6)), draw(st.integers(1, 12))
    cells = table_rows * vocab
    next_rows = np.array(draw(st.lists(st.integers(-1, 50), min_size=cells, max_size=cells)), np.int32)
    next_rows = next_rows.reshape(table_rows, vocab)
    beams = draw(st.integers(0, 8))
    rows = np.array(draw(st.lists(st.integers(-1, table_rows - 1), min_size=beams, max_size=beams)), np.int64)
    values = np.array(draw(st.lists(st.floats(-1e6, 1e6, width=32) | st.just(float("-inf")),
                                    min_size=beams * vocab, max_size=beams * vocab)), np.float32)  # fmt: skip
    return values.reshape(beams, vocab), next_rows, rows


@settings(max_examples=300, deadline=None)
@given(dense_rows())
def test_dense_slots_empty_where_brute_force_says(case):
    values, next_rows, rows = case
    want = values.copy()
    for r in range(len(rows)):
        for k in range(values.shape[1]):
            if rows[r] < 0 or next_rows[rows[r], k] < 0:
                want[r, k] = -np.inf
    got = torch.from_numpy(values.copy())
    out = empty_dense_slots(got, torch.from_numpy(next_rows), torch.from_numpy(rows))
    assert out.data_ptr() == got.data_ptr()  # in place
    assert torch.equal(got.view(torch.int32), torch.from_numpy(want).view(torch.int32))
    if len(rows):  # the torch path (a non-contiguous view takes it) says the same
        wide = torch.zeros(len(rows), values.shape[1] * 2)
        wide[:, ::2] = torch.from_numpy(values)
        empty_dense_slots(wide[:, ::2], torch.from_numpy(next_rows), torch.from_numpy(rows))
        assert torch.equal(
            wide[:, ::2].contiguous().view(torch.int32), torch.from_numpy(want).view(torch.int32)
        )


def test_a_row_outside_the_dense_table_is_refused():
    values = torch.zeros(1, 3)
    with pytest.raises(IndexError):
        empty_dense_slots(values, torch.zeros(2, 3, dtype=torch.int32), torch.tensor([2]))
