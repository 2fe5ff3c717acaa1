"""Selective scoring in torch: the reference of the selective-scoring contract, and the CPU path.

Contract (shared with the CUDA kernel in cuda/selective.py / cuda/selective.cu; this module lives in base/
so that cuda/, which runtime/ imports, can check its kernels against it without importing runtime/):

    selective_scores(hidden [R, d], weight [V, d], bias [V] | None, slot_tokens int32|int64 [R, K])
        -> fp32 [R, K]; out[r, k] = hidden[r] . weight[tok] + bias[tok] with tok = slot_tokens[r, k],
           accumulated in fp32 whatever the input dtype (fp32 / fp16 / bf16); -inf where the slot is empty
           (tok == -1; any tok outside [0, V) counts as empty, so a bad slot never reads out of bounds).
    selective_log_softmax(same arguments) -> fp32 [R, K]: each row's valid slots log-softmaxed, -inf at
           empty slots, a row with no valid slot all -inf (never NaN).

What the CPU path does (and why). Every (beam, slot) needs one d-long dot product with a weight row chosen
by the slot's token. torch has no "gathered dot product" op, so rows are gathered with `F.embedding`
(a plain row copy, in the weight's dtype) and multiplied with the beam's hidden vector in fp32. To keep
that gather off the hot path's memory traffic it is done in *blocks of beams* sized so the temporary
[beams_per_block, K, d] tile stays within `block_bytes` (CPU default 1 MiB, about an L2 cache): the tile
is written and immediately re-read from cache, so main memory sees only the weight rows themselves (read
in place, once per slot) and the [R, K] output - never an [R, K, d] tensor. Measured on 2 cores (R=1024,
K=8, d=128): blocked embedding + multiply-sum ~0.2-0.4 ms, one [R, K, d] gather + bmm ~0.8-1.4 ms, a numba
per-slot dot loop ~0.4 ms (fp32 only), full GEMM over V=8192 ~25-90 ms. The same code runs on CUDA as the
reference the kernel is checked against, there with 256 MiB tiles (launches, not caches, cost on a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_BLOCK_BYTES = 1 << 20
"""CPU tile budget (about an L2 cache)."""
CUDA_BLOCK_BYTES = 256 << 20
"""On CUDA the reference gathers in few large tiles: launches, not cache, are what costs there."""


def masked_log_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Log-softmax of each row of fp32 [R, K] over its finite entries; -inf stays -inf (all -inf rows too).

    logsumexp of an all -inf row is -inf and -inf - (-inf) would be NaN, so such rows subtract 0 instead.
    """
    return scores - _finite_lse(scores)


def masked_log_softmax_(scores: torch.Tensor) -> torch.Tensor:
    """masked_log_softmax computed in place in scores fp32 [R, K] (no [R, K] result allocated); returns
    scores."""
    return scores.sub_(_finite_lse(scores))


def _finite_lse(scores: torch.Tensor) -> torch.Tensor:
    """fp32 [R, 1]: logsumexp of each row of scores [R, K], 0 where it is not finite."""
    lse = torch.logsumexp(scores, dim=1, keepdim=True)
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def slot_validity(slot_tokens: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid bool [R, K], safe_tokens int64 [R, K]): valid = 0 <= tok < vocab; empty slots read token 0."""
    valid = (slot_tokens >= 0) & (slot_tokens < vocab)
    safe = torch.where(valid, slot_tokens, torch.zeros_like(slot_tokens)).long()
    return valid, safe


def selective_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    *,
    block_bytes: int | None = None,
) -> torch.Tensor:
    """fp32 [R, K]: dot products of hidden [R, d] with the weight rows [V, d] named by slot_tokens [R, K].

    fp32 accumulation for every input dtype; -inf at empty slots (see module docstring for the CPU path).
    """
    num_rows, num_slots = slot_tokens.shape
    vocab, dim = weight.shape
    out = torch.empty((num_rows, num_slots), dtype=torch.float32, device=hidden.device)
    if num_rows == 0 or num_slots == 0:
        return out
    if block_bytes is None:
        block_bytes = CUDA_BLOCK_BYTES if hidden.device.type == "cuda" else DEFAULT_BLOCK_BYTES
    valid, safe = slot_validity(slot_tokens, vocab)
    hidden32 = hidden.float()
    rows_per_block = max(1, block_bytes // max(1, num_slots * dim * 4))
    for lo in range(0, num_rows, rows_per_block):
        hi = min(num_rows, lo + rows_per_block)
        tile = F.embedding(safe[lo:hi], weight)  # [b, K, d] block-sized, cache-resident
        if tile.dtype != torch.float32:
            tile = tile.float()
        torch.sum(tile * hidden32[lo:hi, None, :], dim=-1, out=out[lo:hi])
    if bias is not None:
        out += bias[safe].float()  # gather [R, K] first: no fp32 copy of the whole [V] bias per call
    return out.masked_fill_(~valid, float("-inf"))


def selective_log_softmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    *,
    block_bytes: int | None = None,
) -> torch.Tensor:
    """fp32 [R, K]: selective_scores, then log-softmax over each row's valid slots (-inf elsewhere)."""
    return masked_log_softmax(selective_scores(hidden, weight, bias, slot_tokens, block_bytes=block_bytes))
