"""The CPU numba scoring mode (selective_numba): the selective-scoring contract against a brute-force
fp64 reference for every dtype and layout, exact 16-bit widening, zero-copy weight reads, threads, the
registry and the default heuristic's choice."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import selective_reference
from zerogr_build.base import selective_torch
from zerogr_build.base.errors import InputError
from zerogr_build.runtime.plan import heuristic_mode
from zerogr_build.runtime.scoring import available_modes, get_mode, selective_numba

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def laid_out(t: torch.Tensor, layout: str, g: torch.Generator) -> torch.Tensor:
    """The same values as t [n, d] in another memory layout (what a caller may hand the kernel)."""
    n, d = t.shape
    if layout == "columns":  # the first d columns of a wider matrix: row stride > d
        wide = torch.randn(n, d + 5, generator=g).to(t.dtype)
        wide[:, :d] = t
        return wide[:, :d]
    if layout == "rows":  # every other row of a taller matrix: row stride 2d
        tall = torch.randn(2 * n, d, generator=g).to(t.dtype)
        tall[::2] = t
        return tall[::2]
    if layout == "transposed":  # stride 1 along rows, not along d: the one layout that is copied
        return t.T.contiguous().T
    return t


def check(got: torch.Tensor, want: np.ndarray, atol: float) -> None:
    assert got.dtype == torch.float32 and tuple(got.shape) == want.shape
    assert not torch.isnan(got).any()
    assert np.array_equal(np.isfinite(got.numpy()), np.isfinite(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got.numpy()[finite], want[finite], atol=atol)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 9),  # rows
    st.sampled_from([0, 1, 3, 7, 64]),  # slots (64: rows far wider than their valid slots)
    st.integers(1, 40),  # dim
    st.integers(1, 30),  # vocab
    st.booleans(),  # bias
    st.sampled_from(sorted(DTYPES)),
    st.sampled_from(["contiguous", "columns", "rows", "transposed"]),  # weight layout
    st.sampled_from(["contiguous", "columns", "expand"]),  # hidden layout
    st.sampled_from([torch.int32, torch.int64]),
    st.integers(0, 2**31 - 1),
)
def test_contract_matches_fp64_brute_force(
    rows, slots, dim, vocab, with_bias, dtype, weight_layout, hidden_layout, token_dtype, seed
):
    g = torch.Generator().manual_seed(seed)
    tdt = DTYPES[dtype]
    hidden = torch.randn(rows, dim, generator=g).to(tdt)
    if hidden_layout == "expand" and rows:
        hidden = hidden[:1].expand(rows, dim)  # row stride 0
    elif hidden_layout == "columns":
        hidden = laid_out(hidden, "columns", g)
    weight = laid_out(torch.randn(vocab, dim, generator=g).to(tdt), weight_layout, g)
    bias = torch.randn(vocab, generator=g).to(tdt) if with_bias else None
    # tokens in [-3, V+3): -1 marks empty, anything outside [0, V) counts as empty too
    slot_tokens = torch.randint(-3, vocab + 3, (rows, slots), generator=g).to(token_dtype)
    if rows:
        slot_tokens[0] = -1  # a row without any valid slot
    if rows > 1 and slots:
        slot_tokens[1] = torch.randint(0, vocab, (slots,), generator=g)  # a row with every slot valid
    want_scores, want_logp = selective_reference(hidden, weight, bias, slot_tokens)
    atol = (1e-4 if dtype == "fp32" else 1e-3) * dim
    check(selective_numba.selective_scores(hidden, weight, bias, slot_tokens), want_scores, atol)
    check(selective_numba.selective_log_softmax(hidden, weight, bias, slot_tokens), want_logp, atol)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 9),  # rows
    st.sampled_from([0, 1, 5, 64]),  # slots
    st.integers(1, 40),  # dim
    st.integers(1, 30),  # vocab
    st.booleans(),  # bias
    st.sampled_from(sorted(DTYPES)),
    st.integers(0, 2**31 - 1),
)
def test_totals_are_bit_for_bit_the_beam_scores_plus_the_log_softmax(
    rows, slots, dim, vocab, with_bias, dtype, seed
):
    """log_softmax_totals (the add inside the kernel) == torch's beam_scores[:, None] + log-softmax, bit for
    bit: the decoder's filter-first beams stay what they were. Beam scores include -inf (padded beams)."""
    g = torch.Generator().manual_seed(seed)
    tdt = DTYPES[dtype]
    hidden = torch.randn(rows, dim, generator=g).to(tdt)
    weight = torch.randn(vocab, dim, generator=g).to(tdt)
    bias = torch.randn(vocab, generator=g).to(tdt) if with_bias else None
    slot_tokens = torch.randint(-2, vocab + 2, (rows, slots), generator=g, dtype=torch.int32)
    beam_scores = torch.randn(rows, generator=g) * 30
    beam_scores[torch.rand(rows, generator=g) < 0.2] = float("-inf")
    want = beam_scores[:, None] + selective_numba.selective_log_softmax(hidden, weight, bias, slot_tokens)
    got = selective_numba.log_softmax_totals(hidden, weight, bias, slot_tokens, beam_scores)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # same bits (-inf included)
    with pytest.raises(ValueError, match="beam_scores"):
        selective_numba.log_softmax_totals(hidden, weight, bias, slot_tokens, beam_scores[:-1].double())


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heavy_and_empty_rows_agree_with_the_torch_reference(dtype):
    """Realistic sizes (V=4096, d=128, K=1500): heavy rows, empty rows, slots filled from the front or
    scattered; every slot of both entry points within rounding of selective_torch."""
    g = torch.Generator().manual_seed(3)
    tdt = DTYPES[dtype]
    rows, slots, vocab, dim = 48, 1500, 4096, 128
    hidden = torch.randn(rows, dim, generator=g).to(tdt)
    weight = (torch.randn(vocab, dim, generator=g) / dim**0.5).to(tdt)
    bias = torch.randn(vocab, generator=g).to(tdt)
    counts = torch.randint(0, 40, (rows,), generator=g)
    counts[:4] = slots  # heavy rows: every slot valid
    counts[4:8] = 0  # empty rows
    tokens = torch.randint(0, vocab, (rows, slots), generator=g, dtype=torch.int32)
    slot_tokens = torch.where(torch.arange(slots)[None, :] < counts[:, None], tokens, -1)
    slot_tokens[-4:] = torch.where(torch.rand(4, slots, generator=g) < 0.3, tokens[-4:], -1)  # scattered
    for ours, ref in (
        (selective_numba.selective_scores, selective_torch.selective_scores),
        (selective_numba.selective_log_softmax, selective_torch.selective_log_softmax),
    ):
        got, want = ours(hidden, weight, bias, slot_tokens), ref(hidden, weight, bias, slot_tokens)
        assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and not torch.isnan(got).any()
        torch.testing.assert_close(
            got[torch.isfinite(want)], want[torch.isfinite(want)], rtol=1e-5, atol=1e-4
        )
    assert torch.isneginf(selective_numba.selective_log_softmax(hidden, weight, bias, slot_tokens)[4:8]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_16_bit_pattern_widens_exactly(dtype):
    """All 65536 weight bit patterns (normals, denormals, +-0, +-inf, NaN) read as fp32 exactly as torch
    widens them: weight [65536, 1] scored against hidden = 1."""
    patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    weight = patterns.view(dtype)[:, None]
    tokens = torch.arange(2**16, dtype=torch.int32)[None, :]
    got = selective_numba.selective_scores(torch.ones(1, 1, dtype=dtype), weight, None, tokens)[0]
    want = weight[:, 0].float()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got[~torch.isnan(want)], want[~torch.isnan(want)])  # == keeps -0.0 == 0.0: a dot
    # product starts from +0.0, so the sign of a zero weight cannot survive it; everything else is exact


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_weight_rows_are_read_in_place(dtype):
    """A sliced weight (w[:, :70], w[3:]) is handed to the kernel as a view of its own memory."""
    wide = torch.randn(50, 128).to(DTYPES[dtype])
    for view in (wide[:, :70], wide[3:, 10:80], wide):
        flat, stride = selective_numba.weight_rows(view)
        assert flat.__array_interface__["data"][0] == view.data_ptr()
        assert stride == view.stride(0) and flat.size == (view.shape[0] - 1) * stride + view.shape[1]
        rows = np.lib.stride_tricks.as_strided(flat, view.shape, (stride * flat.itemsize, flat.itemsize))
        assert np.array_equal(rows, selective_numba.raw_elements(view.contiguous()))


def test_int64_tokens_beyond_int32_are_empty_not_wrapped():
    """2**32 + 1 would become token 1 if int64 tokens were narrowed without clamping."""
    hidden, weight = torch.randn(1, 4), torch.randn(5, 4)
    tokens = torch.tensor([[2**32 + 1, 1, -(2**32) + 2]], dtype=torch.int64)
    out = selective_numba.selective_scores(hidden, weight, None, tokens)
    assert torch.isneginf(out[0, [0, 2]]).all() and torch.isfinite(out[0, 1])


def test_numba_threads_follow_torch_and_small_calls_run_alone():
    """One setting for both pools: a call of PARALLEL_MIN_WORK multiply-adds runs with
    torch.get_num_threads() threads, a smaller one on the calling thread alone."""
    before = torch.get_num_threads()
    rows, slots, dim = 64, 256, 256
    assert rows * slots * dim >= selective_numba.PARALLEL_MIN_WORK
    big = (torch.randn(rows, dim), torch.randn(300, dim), None, torch.zeros(rows, slots, dtype=torch.int32))
    small = (torch.randn(4, 8), torch.randn(6, 8), None, torch.zeros(4, 2, dtype=torch.int32))
    most = min(2, numba.config.NUMBA_NUM_THREADS)
    try:
        for threads in (most, 1, most):
            torch.set_num_threads(threads)
            selective_numba.selective_log_softmax(*big)
            assert numba.get_num_threads() == threads
            selective_numba.selective_log_softmax(*small)
            assert numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_registry_offers_it_on_cpu_only():
    assert "selective_numba" in available_modes("cpu")
    assert "selective_numba" not in available_modes("cuda")
    mode = get_mode("selective_numba", "cpu")
    assert mode.selective_log_softmax is selective_numba.selective_log_softmax and not mode.uses_full_logits
    with pytest.raises(InputError, match="not available"):
        get_mode("selective_numba", "cuda")


def test_heuristic_picks_the_kernel_where_it_beats_the_gemm():
    cpu = dict(codebook_size=8192, device_type="cpu", order="filter_first", step_format="sparse")
    with_numba = ["full", "selective", "selective_numba"]
    # the 1M-item benchmark's middle step (~107 children per row, K = 812) and last step (K = 4)
    assert heuristic_mode(cap=812, mean_children=107.0, available=with_numba, **cpu) == "selective_numba"
    assert heuristic_mode(cap=4, mean_children=1.1, available=with_numba, **cpu) == "selective_numba"
    # the densest rows of the sweep (0.88 V) still go to the kernel; rows as full as a dense step's do not
    assert heuristic_mode(cap=8192, mean_children=7230.0, available=with_numba, **cpu) == "selective_numba"
    assert heuristic_mode(cap=8192, mean_children=7500.0, available=with_numba, **cpu) == "full"
    # without the table's mean, the cap bounds a beam's main slots
    assert heuristic_mode(cap=812, available=with_numba, **cpu) == "selective_numba"
    assert heuristic_mode(cap=8192, available=with_numba, **cpu) == "full"
    # dense steps and other orders always use the GEMM; without numba the old rule stands
    assert heuristic_mode(**{**cpu, "step_format": "dense"}, cap=8192, available=with_numba) == "full"
    assert heuristic_mode(**{**cpu, "order": "score_first"}, cap=4, available=with_numba) == "full"
    assert heuristic_mode(cap=8, available=["full", "selective"], **cpu) == "selective"
    assert heuristic_mode(cap=812, available=["full", "selective"], **cpu) == "full"
