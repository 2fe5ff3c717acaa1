"""Full scoring: one GEMM over all V_t tokens, then read the candidate slots out of the logits.

This is score-then-filter's arithmetic (STATIC's order computes exactly this product). It implements the
same selective-scoring contract as selective_torch.py so it can stand in for any slot set, and it exposes
`full_logits` / `read_slots` separately because the decoder reuses one GEMM for several reads (the
score-first normaliser, dense steps, overflow lanes).

Precision: the GEMM runs in the weight's dtype (what cuBLAS / oneDNN do fastest) and its output is cast to
fp32, so at fp16/bf16 the logits carry the dtype's output rounding; the selective path accumulates and
returns fp32. At fp32 both modes agree to summation-order rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...base.selective_torch import masked_log_softmax, slot_validity


def full_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """fp32 [R, V]: hidden [R, d] @ weight[V, d].T (+ bias [V]), computed in the weight's dtype."""
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    return F.linear(hidden, weight, bias).float()


def read_slots(logits: torch.Tensor, slot_tokens: torch.Tensor) -> torch.Tensor:
    """fp32 [R, K]: logits [R, V] read at slot_tokens [R, K]; -inf at empty slots (tok outside [0, V))."""
    valid, safe = slot_validity(slot_tokens, logits.shape[1])
    return torch.gather(logits, 1, safe).masked_fill_(~valid, float("-inf"))


def selective_scores(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, slot_tokens: torch.Tensor
) -> torch.Tensor:
    """The selective-scoring contract computed through the full GEMM (fp32 [R, K], -inf at empty slots)."""
    return read_slots(full_logits(hidden, weight, bias), slot_tokens)


def selective_log_softmax(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, slot_tokens: torch.Tensor
) -> torch.Tensor:
    """selective_scores through the GEMM, then log-softmax over each row's valid slots."""
    return masked_log_softmax(selective_scores(hidden, weight, bias, slot_tokens))
