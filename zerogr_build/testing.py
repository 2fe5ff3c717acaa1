"""Test doubles and helpers for zerogr's tests and benchmarks.

The APIs in this module are used for testing and debugging and are prone to change. Don't use them in
production.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import numpy as np
import torch

from .tune.check import SelectiveCase, make_case

# --- runtime + tune (H1) ---------------------------------------------------------------------------------


class SeededModel:
    """A deterministic stand-in for a generative recommender over codebooks `sizes`, for decoding tests.

    Output layers: weights[t] fp32 [V_t, dim] (standard normal * scale) and biases[t] fp32 [V_t] (or None).
    Step function: hidden(step, prefix, request) = base[step] + req[request] + sum over j < step of
    emb[j][prefix[j]], with emb[j] [V_j, dim] * emb_scale, base [L, dim], req [batch_size, dim] * req_scale.
    Everything is drawn from one generator seeded with `seed`, so equal arguments give equal models.
    `brute_force` recomputes every SID's total log-probability in fp64 from the same tables.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        seed: int = 0,
        batch_size: int = 1,
        *,
        dim: int = 8,
        bias: bool = False,
        scale: float = 1.0,
        emb_scale: float = 0.7,
        req_scale: float = 1.0,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.sizes = tuple(int(v) for v in sizes)
        self.dim = dim
        self.weights = [torch.randn(v, dim, generator=g) * scale for v in self.sizes]
        self.biases = [torch.randn(v, generator=g) if bias else None for v in self.sizes]
        self.emb = [torch.randn(v, dim, generator=g) * emb_scale for v in self.sizes]
        self.base = torch.randn(len(self.sizes), dim, generator=g)
        self.req = torch.randn(batch_size, dim, generator=g) * req_scale

    def layers(self, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The per-step (weight, bias) pairs in `dtype`, as a Decoder takes them."""
        return [
            (w.to(dtype), None if b is None else b.to(dtype))
            for w, b in zip(self.weights, self.biases, strict=True)
        ]

    def step_fn(self, step: int, prefixes: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """hidden fp32 [R, dim] of prefixes int64 [R, step] of requests batch int64 [R]."""
        h = self.base[step].expand(prefixes.shape[0], self.dim) + self.req[batch]
        for j in range(step):
            h = h + self.emb[j][prefixes[:, j]]
        return h

    def to(self, device: str | torch.device) -> SeededModel:
        """A copy whose tables live on `device` (its step_fn then takes and returns tensors there)."""
        moved = copy.copy(self)
        moved.weights = [w.to(device) for w in self.weights]
        moved.biases = [None if b is None else b.to(device) for b in self.biases]
        moved.emb = [e.to(device) for e in self.emb]
        moved.base, moved.req = self.base.to(device), self.req.to(device)
        return moved

    def brute_force(
        self, sids: np.ndarray, order: str, request: int, dtype: torch.dtype = torch.float32
    ) -> dict[tuple[int, ...], float]:
        """{sid: total log-prob} in fp64 of every distinct SID of int [n, L] (every code if unconstrained),
        with weights and hidden vectors rounded to `dtype` first (what a Decoder with such weights sees).
        filter_first normalises over each prefix's catalog children, the other orders over all V_t."""
        if order == "unconstrained":
            leaves = np.array(list(itertools.product(*[range(v) for v in self.sizes])), dtype=np.int64)
        else:
            leaves = np.unique(np.asarray(sids, dtype=np.int64), axis=0)
        children: dict[tuple, set] = {}
        for s in {tuple(int(x) for x in row) for row in np.asarray(sids)}:
            for t in range(len(s)):
                children.setdefault(s[:t], set()).add(s[t])
        total = np.zeros(len(leaves))
        for t in range(len(self.sizes)):
            prefixes = torch.as_tensor(leaves[:, :t])
            h = self.step_fn(t, prefixes, torch.full((len(leaves),), request)).to(dtype).double()
            w, b = self.weights[t].to(dtype).double(), self.biases[t]
            logits = (h @ w.T + (0 if b is None else b.to(dtype).double())).numpy()
            for i, leaf in enumerate(leaves):
                row = logits[i]
                if order == "filter_first":
                    allowed = sorted(children[tuple(int(x) for x in leaf[:t])])
                    norm = np.logaddexp.reduce(row[allowed])
                else:
                    norm = np.logaddexp.reduce(row)
                total[i] += row[leaf[t]] - norm
        return {tuple(int(x) for x in leaf): float(v) for leaf, v in zip(leaves, total, strict=True)}


__all__ = ["SeededModel", "SelectiveCase", "make_case"]
