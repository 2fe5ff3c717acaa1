"""The selective-scoring contract (torch reference and full-GEMM mode), the mode registry, dtype names,
slot caps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import selective_reference
from zerogr_build.base import selective_torch
from zerogr_build.base.dtypes import DTYPE_NAMES, DTYPES, dtype_name, torch_dtype
from zerogr_build.base.errors import InputError
from zerogr_build.index import build_index
from zerogr_build.runtime.scoring import MODE_NAMES, available_modes, full_torch, get_mode
from zerogr_build.runtime.slots import MIN_CAP, default_slot_cap, lane_count, lane_width

IMPLS = {"selective": selective_torch, "full": full_torch}


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 9),  # rows
    st.integers(0, 7),  # slots
    st.integers(1, 40),  # dim
    st.integers(1, 30),  # vocab
    st.booleans(),
    st.sampled_from(["fp32", "fp16", "bf16"]),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1, 64, 1 << 20]),  # block bytes: one beam per block .. everything in one block
)
def test_contract_matches_fp64_reference(rows, slots, dim, vocab, with_bias, dtype, seed, block):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, dim, generator=g).to(DTYPES[dtype])
    weight = torch.randn(vocab, dim, generator=g).to(DTYPES[dtype])
    bias = torch.randn(vocab, generator=g).to(DTYPES[dtype]) if with_bias else None
    # tokens in [-3, V+3): -1 marks empty; anything outside [0, V) must count as empty too
    slot_tokens = torch.randint(-3, vocab + 3, (rows, slots), generator=g, dtype=torch.int32)
    if rows:
        slot_tokens[0] = -1  # a row without any valid slot
    want_scores, want_logp = selective_reference(hidden, weight, bias, slot_tokens)
    tol = 1e-4 if dtype == "fp32" else 1e-3
    got = selective_torch.selective_scores(hidden, weight, bias, slot_tokens, block_bytes=block)
    got_lsm = selective_torch.selective_log_softmax(hidden, weight, bias, slot_tokens, block_bytes=block)
    for value, want in ((got, want_scores), (got_lsm, want_logp)):
        assert value.dtype == torch.float32 and value.shape == (rows, slots)
        assert not torch.isnan(value).any()
        assert np.array_equal(np.isfinite(value.numpy()), np.isfinite(want))
        np.testing.assert_allclose(value.numpy()[np.isfinite(want)], want[np.isfinite(want)], atol=tol * dim)
    if dtype == "fp32":  # the GEMM path rounds its output to the dtype, so compare it at fp32 only
        full = full_torch.selective_scores(hidden, weight, bias, slot_tokens)
        full_lsm = full_torch.selective_log_softmax(hidden, weight, bias, slot_tokens)
        np.testing.assert_allclose(full.numpy(), want_scores, atol=1e-4)
        np.testing.assert_allclose(full_lsm.numpy(), want_logp, atol=1e-4)


def test_all_empty_rows_are_minus_inf_never_nan():
    hidden, weight = torch.randn(3, 4), torch.randn(5, 4)
    slots = torch.full((3, 6), -1, dtype=torch.int32)
    for impl in IMPLS.values():
        out = impl.selective_log_softmax(hidden, weight, None, slots)
        assert torch.isneginf(out).all()


@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_in_place_masked_log_softmax_is_bit_identical(rows, cols, seed):
    """masked_log_softmax_ writes into its argument and returns the same bits as masked_log_softmax, with
    -inf slots, all -inf rows and +inf / NaN entries among them."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, cols, generator=g) * 10
    pick = torch.rand(rows, cols, generator=g)
    scores[pick < 0.3] = float("-inf")
    scores[0] = float("-inf")
    if rows > 1:
        scores[1, 0] = float("nan") if seed % 2 else float("inf")
    want = selective_torch.masked_log_softmax(scores)
    got = selective_torch.masked_log_softmax_(scores)
    assert got.data_ptr() == scores.data_ptr()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_registry():
    assert available_modes("cpu") == ["full", "selective", "selective_numba"]
    assert set(MODE_NAMES) >= {"full", "selective", "selective_cuda"}
    assert get_mode("full").uses_full_logits and not get_mode("selective").uses_full_logits
    with pytest.raises(InputError):
        get_mode("selective_cuda", "cpu")
    with pytest.raises(InputError):
        get_mode("fast")


def test_dtype_names_are_one_table():
    assert DTYPE_NAMES == ("fp32", "fp16", "bf16")
    torch_dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    assert torch_dtypes == DTYPES
    for name, dtype in DTYPES.items():
        assert dtype_name(dtype) == name and torch_dtype(name) is dtype
    assert dtype_name("bfloat16") == dtype_name("torch.bfloat16") == "bf16" and dtype_name("half") == "fp16"
    with pytest.raises(InputError, match="unsupported weight dtype"):
        dtype_name(torch.float64)
    with pytest.raises(InputError, match="unknown dtype name"):
        dtype_name("fp8")


def test_slot_caps_follow_the_p99_row():
    sids = np.array([(0, v) for v in range(40)] + [(a, a % 7) for a in range(1, 300)], dtype=np.int64)
    index = build_index(sids, (300, 64), step_formats="1=sparse")
    assert index.steps[1].max_slots == 40
    assert default_slot_cap(index.steps[1]) == MIN_CAP
    assert [lane_count(n) for n in (0, 1, 4, 5, 9)] == [0, 4, 4, 8, 16]
    assert [lane_width(n, 40) for n in (1, 5, 11, 16, 17, 33, 40)] == [1, 8, 16, 16, 32, 40, 40]
