"""Selective scoring on CPU with a numba kernel: the "selective_numba" scoring mode.

Contract: the one of selective_torch.py (`selective_scores`, `selective_log_softmax`; fp32 [R, K] out,
fp32 accumulation, -inf at empty slots, tokens outside [0, V) empty, all -inf rows never NaN), for CPU
tensors only.

Why a kernel. Scoring a beam's slots is one d-long dot product per valid slot, with the weight row its
token names. torch has no gathered dot product, so selective_torch.py copies every slot's weight row into a
tile first (`F.embedding`) and computes every slot, empty or not. The kernel (_numba_kernels.score_slots)
runs in parallel over beams, reads each valid slot's weight row where it lies, skips empty slots, and
log-softmaxes each row over its valid slots in the same pass (`log_softmax_totals`, what the decoder's
filter-first steps call, also adds each beam's score there, bit for bit torch's add; `select_top` goes
on to keep each request's best M in the same pass, so no [R, K] totals are written). At a mid-density
step (1M items, V=8192: ~100 children per row against V=8192) that is ~70x fewer multiply-adds than the
full GEMM.

Zero copy. torch CPU tensors are handed to numba through `.numpy()` views of their memory:
  - weight [V, d]: any row stride with unit stride along d (e.g. `weight[:, :70]` of a wider matrix) is
    read in place, through a flat view of its elements plus the row stride. Only a weight whose d axis is
    itself strided (e.g. a transposed matrix) is copied to a contiguous one first - once per call, V * d
    elements - so keep weights row-major.
  - bf16 / fp16 weights and bias are read as their 16-bit patterns (`.view(torch.int16)`) and widened to
    fp32 inside the kernel, exactly (no fp32 copy of the weight).
  - hidden [R, d] is widened to fp32 contiguous (a no-op for fp32 contiguous input; R * d otherwise).
  - slot_tokens: int32 contiguous is used as it is; other integer dtypes or layouts are converted (R * K),
    int64 clamped to [-1, V] first so a huge token can never wrap into range.

Threads. The kernel runs with `torch.get_num_threads()` threads (capped by numba's own maximum), so
`torch.set_num_threads(n)` (or OMP_NUM_THREADS at start-up) is the one setting for both runtimes; see
docs/cpu-threads.md. A small call (under PARALLEL_MIN_WORK multiply-adds, e.g. a last step with K = 4)
runs on the calling thread alone, as torch does with small tensors.

Compile cost. numba compiles the kernel for a weight dtype on its first call (a few seconds) and caches
the machine code on disk next to the module (`cache=True`), so later processes load it in milliseconds.
`warm_up()` compiles (or loads) every dtype up front; the decoder never has to pay for it inside a timed
region if the caller warms up first. numba is imported on the first call, not when this module is.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

_RAW_VIEW = {torch.float32: None, torch.bfloat16: np.uint16, torch.float16: np.int16}
"""numpy element type the kernel reads each weight dtype as (None: the fp32 values themselves)."""

_WARM_LOCK = threading.Lock()
_NO_SCORES = np.zeros(0, dtype=np.float32)
_NO_WORDS = np.zeros(0, dtype=np.int64)
_NO_KILLS = np.zeros(0, dtype=np.int64)

PARALLEL_MIN_WORK = 1 << 22
"""Calls with fewer multiply-adds than this (R * K * d, counting empty slots too) run on one thread: waking
the pool costs more than it saves, and on a busy machine a parallel region waits until every one of its
threads is scheduled (measured: the 1M-item benchmark's last step, 1024 x 4 slots, 2.8x faster alone)."""


def _kernels() -> Any:
    """The compiled-kernel module (imports numba on the first call)."""
    from . import _numba_kernels

    return _numba_kernels


def set_kernel_threads(work: int) -> int:
    """Set numba's thread count for this thread from torch's (one setting for both pools), or 1 for a call
    of fewer than PARALLEL_MIN_WORK multiply-adds; returns it."""
    import numba

    threads = 1
    if work >= PARALLEL_MIN_WORK:
        threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)
    return threads


def raw_elements(tensor: torch.Tensor) -> np.ndarray:
    """The elements of a CPU fp32 / bf16 / fp16 tensor as numpy, without copying (16-bit types as their
    bit patterns, see _numba_kernels); same shape and strides."""
    if tensor.dtype not in _RAW_VIEW:
        raise TypeError(f"selective_numba supports float32, float16 and bfloat16, got {tensor.dtype}")
    view = _RAW_VIEW[tensor.dtype]
    if view is None:
        return tensor.numpy()
    return tensor.view(torch.int16).numpy().view(view)


def weight_rows(weight: torch.Tensor) -> tuple[np.ndarray, int]:
    """(flat raw elements from row 0's first element, row stride) of weight [V, d], read in place.

    The flat view spans (V - 1) * row_stride + d elements of the weight's storage, so rows of a sliced
    matrix (`w[:, :70]`, `w[10:20]`) are read where they are. A weight with a non-unit stride along d is
    copied to a contiguous one first.
    """
    vocab, dim = weight.shape
    if dim > 1 and weight.stride(1) != 1:
        weight = weight.contiguous()
    stride = int(weight.stride(0)) if vocab > 1 else dim
    span = (vocab - 1) * stride + dim if vocab else 0
    flat = weight.as_strided((span,), (1,))
    return raw_elements(flat), stride


def _check(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, slot_tokens) -> None:
    for name, t in (("hidden", hidden), ("weight", weight), ("slot_tokens", slot_tokens)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
        if t.device.type != "cpu":
            raise ValueError(f"selective_numba runs on CPU tensors, got {name} on {t.device}")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight is {tuple(weight.shape)} but hidden is {tuple(hidden.shape)}: d differs")
    if slot_tokens.shape[0] != hidden.shape[0]:
        raise ValueError(f"slot_tokens has {slot_tokens.shape[0]} rows but hidden has {hidden.shape[0]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"bias dtype {bias.dtype} differs from weight dtype {weight.dtype}")


def _run(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    log_softmax: bool,
    beam_scores: torch.Tensor | None = None,
) -> torch.Tensor:
    _check(hidden, weight, bias, slot_tokens)
    if beam_scores is not None and (
        beam_scores.dtype != torch.float32 or beam_scores.shape != (len(hidden),)
    ):
        raise ValueError(
            f"beam_scores must be float32 [{len(hidden)}], got {beam_scores.dtype} {tuple(beam_scores.shape)}"
        )
    rows, slots = slot_tokens.shape
    vocab = int(weight.shape[0])
    out = torch.empty((rows, slots), dtype=torch.float32)
    if rows == 0 or slots == 0:
        return out
    weight, hidden = weight.detach(), hidden.detach()
    flat, row_stride = weight_rows(weight)
    raw_bias = np.empty(0, flat.dtype) if bias is None else raw_elements(bias.detach().contiguous())
    if slot_tokens.dtype != torch.int32:
        slot_tokens = slot_tokens.clamp(-1, vocab).to(torch.int32)
    tokens = slot_tokens.contiguous().numpy()
    hidden32 = hidden.float().contiguous().numpy()
    set_kernel_threads(rows * slots * int(hidden.shape[1]))
    scores = _NO_SCORES if beam_scores is None else beam_scores.detach().contiguous().numpy()
    _kernels().score_slots(
        hidden32, flat, row_stride, raw_bias, tokens, vocab, log_softmax, scores, out.numpy()
    )
    return out


def selective_scores(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, slot_tokens: torch.Tensor
) -> torch.Tensor:
    """fp32 [R, K]: hidden [R, d] . weight[slot_tokens[r, k]] (+ bias), -inf at empty slots (CPU)."""
    return _run(hidden, weight, bias, slot_tokens, False)


def selective_log_softmax(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, slot_tokens: torch.Tensor
) -> torch.Tensor:
    """fp32 [R, K]: the slots' scores log-softmaxed over each row's valid slots, in the same pass (CPU)."""
    return _run(hidden, weight, bias, slot_tokens, True)


def log_softmax_totals(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    beam_scores: torch.Tensor,
) -> torch.Tensor:
    """fp32 [R, K]: beam_scores fp32 [R] plus selective_log_softmax, in the same pass - bit for bit
    `beam_scores[:, None] + selective_log_softmax(...)`, without the [R, K] add after the kernel (CPU)."""
    return _run(hidden, weight, bias, slot_tokens, True, beam_scores)


def select_top(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens: torch.Tensor,
    first: torch.Tensor,
    used: torch.Tensor,
    beam_scores: torch.Tensor,
    requests: int,
    beam_width: int,
    *,
    slot_words: torch.Tensor | None = None,
    request_words: torch.Tensor | None = None,
    kills: torch.Tensor | None = None,
    kill_stride: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A filter-first sparse step's best `beam_width` candidates per request in one pass (CPU), without
    an [R, K] array of totals: (values fp32 [B, M], beam int64 [B, M], slot int64 [B, M]), the candidates
    topk would pick from every beam's `log_softmax_totals` over its slots, totals bit for bit; equal totals
    ordered by beam, then slot; past a request's last candidate: -inf, its first beam, slot 0.

    tokens int32 [n]: slot tokens end to end (a step table's own tokens, or slot rows flattened); beam r's
    slots are tokens[first[r] : first[r] + used[r]] (first, used int64 [R]; outside [0, V): empty);
    hidden [R, d]; beam_scores fp32 [R]; R = requests * the beams per request, in request order.

    Item constraints, applied where the slots lie (items.filter.select_filter gives a search's):
      slot_words [>= n], request_words [requests]: one signed integer word each, the same dtype; slot p of
        a beam of request b is empty when (slot_words[p] & request_words[b]) == 0;
      kills int64 [k] ascending: slot p of a beam of request b is empty when b * kill_stride + p is one.
    """
    for name, t in (("hidden", hidden), ("weight", weight), ("tokens", tokens), ("first", first)):
        if t.device.type != "cpu":
            raise ValueError(f"selective_numba runs on CPU tensors, got {name} on {t.device}")
    rows = int(hidden.shape[0])
    if requests < 1 or rows % requests or beam_width < 1:
        raise ValueError(f"{rows} beams do not split into {requests} requests, or beam_width < 1")
    if tokens.dtype != torch.int32 or tokens.dim() != 1:
        raise ValueError(f"tokens must be int32 [n], got {tokens.dtype} {tuple(tokens.shape)}")
    if first.shape != (rows,) or used.shape != (rows,) or beam_scores.shape != (rows,):
        raise ValueError(f"first, used and beam_scores must be [{rows}]")
    if beam_scores.dtype != torch.float32 or weight.shape[1] != hidden.shape[1]:
        raise ValueError("beam_scores must be float32, and hidden [R, d] with weight [V, d]")
    lo, hi = (first.min(), (first + used).max()) if rows else (0, 0)
    if rows and (int(lo) < 0 or int(hi) > tokens.shape[0] or int(used.min()) < 0):
        raise ValueError("a beam's slots reach outside tokens")
    vocab = int(weight.shape[0])
    weight, hidden = weight.detach(), hidden.detach()
    flat, row_stride = weight_rows(weight)
    raw_bias = np.empty(0, flat.dtype) if bias is None else raw_elements(bias.detach().contiguous())
    values = torch.empty((requests, beam_width), dtype=torch.float32)
    beam = torch.empty((requests, beam_width), dtype=torch.int64)
    slot = torch.empty((requests, beam_width), dtype=torch.int64)
    first_np, used_np = first.to(torch.int64).contiguous().numpy(), used.to(torch.int64).contiguous().numpy()
    words, wanted = _slot_words(slot_words, request_words, requests, int(hi) if rows else 0)
    kill_keys, kill_from = _kill_starts(kills, kill_stride, first_np, requests)
    set_kernel_threads(int(used.sum()) * int(hidden.shape[1]))
    _kernels().select_slots(
        hidden.float().contiguous().numpy(), flat, row_stride, raw_bias, tokens.contiguous().numpy(),
        first_np, used_np, vocab, beam_scores.detach().contiguous().numpy(), words, wanted, kill_keys,
        kill_from, kill_stride, values.numpy(), beam.numpy(), slot.numpy(),
    )  # fmt: skip
    return values, beam, slot


def _slot_words(slot_words: torch.Tensor | None, request_words: torch.Tensor | None, requests: int,
                reach: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """select_top's include-set words as numpy (empty: no test), checked against the slots they cover."""
    if slot_words is None:
        return _NO_WORDS, _NO_WORDS
    if request_words is None or request_words.shape != (requests,) or slot_words.dim() != 1:
        raise ValueError(f"slot_words must be [n] and request_words [{requests}]")
    if slot_words.dtype != request_words.dtype or slot_words.dtype.is_floating_point:
        raise ValueError("slot_words and request_words must be integer words of one dtype")
    if slot_words.shape[0] < reach:
        raise ValueError("slot_words do not cover every beam's slots")
    return slot_words.contiguous().numpy(), request_words.contiguous().numpy()


def _kill_starts(kills: torch.Tensor | None, stride: int, first: np.ndarray,
                 requests: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """select_top's kills as int64 numpy and each beam's first kill at or past its first slot."""
    if kills is None or kills.shape[0] == 0:
        return _NO_KILLS, _NO_KILLS
    if kills.dtype != torch.int64 or kills.dim() != 1 or stride < 1:
        raise ValueError("kills must be int64 [k] and kill_stride >= 1")
    keys = kills.contiguous().numpy()
    per = first.shape[0] // requests
    request = np.arange(first.shape[0], dtype=np.int64) // per
    return keys, np.searchsorted(keys, request * stride + first)


def warm_up(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)) -> None:
    """Compile (or load from numba's disk cache) the kernel for `dtypes`, outside any timed region."""
    with _WARM_LOCK:
        for dtype in dtypes:
            weight = torch.zeros((2, 4), dtype=dtype)
            selective_log_softmax(
                torch.zeros((1, 4), dtype=dtype), weight, None, torch.zeros((1, 1), dtype=torch.int32)
            )
