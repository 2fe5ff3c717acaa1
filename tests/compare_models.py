"""Model functions for the `zerogr compare` tests (`--model tests.compare_models:NAME`). Not a test module.

A tiny deterministic 'model': hidden(request, prefix) = tanh(R[request] + sum_t E_t[prefix_t] + P[t]),
weights[t] = seeded Gaussian [V_t, D] scaled so probabilities are far from uniform. No training, so the
tests can recompute every score by brute force.
"""

from __future__ import annotations

import torch

D = 8
SEED = 1234


def _params(codebook_sizes, num_requests: int = 4096):
    g = torch.Generator().manual_seed(SEED)
    sizes = [int(v) for v in codebook_sizes]
    req = torch.randn(num_requests, D, generator=g)
    tok = [torch.randn(v, D, generator=g) for v in sizes]
    pos = torch.randn(len(sizes) + 1, D, generator=g)
    weights = [2.0 * torch.randn(v, D, generator=g) for v in sizes]
    return req, tok, pos, weights


def hidden_for(codebook_sizes, request_rows: torch.Tensor, prefixes: torch.Tensor) -> torch.Tensor:
    """Hidden float32 [R, D] for request rows int [R] (global request ids) and prefixes int [R, t]."""
    req, tok, pos, _ = _params(codebook_sizes)
    t = prefixes.shape[1]
    x = req[request_rows.long()] + pos[t]
    for j in range(t):
        x = x + tok[j][prefixes[:, j].long()]
    return torch.tanh(x)


def model_fn(bundle, request_ids: list):
    """The contract of zerogr_build.compare: (weights, step_fn) for integer request ids."""
    sizes = bundle.index.codebook_sizes
    _, _, _, weights = _params(sizes)
    rows = torch.as_tensor([int(r) for r in request_ids], dtype=torch.int64)

    def step_fn(step, prefixes, batch):
        return hidden_for(sizes, rows[batch.long()], prefixes)

    return weights, step_fn


def model_fn_with_bias(bundle, request_ids: list):
    """Same, with (weight, bias) pairs (bias = a fixed ramp) to exercise biased output layers."""
    weights, step_fn = model_fn(bundle, request_ids)
    return [(w, torch.linspace(-1.0, 1.0, w.shape[0])) for w in weights], step_fn


def wrong_shape_model(bundle, request_ids: list):
    """Weights whose last step has one token too many (must be refused with a clear message)."""
    weights, step_fn = model_fn(bundle, request_ids)
    weights[-1] = torch.zeros(weights[-1].shape[0] + 1, D)
    return weights, step_fn


def wrong_length_model(bundle, request_ids: list):
    weights, step_fn = model_fn(bundle, request_ids)
    return weights[:-1], step_fn


NOT_CALLABLE = 3


def random_model(bundle, request_ids: list):
    """Unseeded random hidden vectors: a model that is not deterministic (compare must refuse it)."""
    weights, _ = model_fn(bundle, request_ids)

    def step_fn(step, prefixes, batch):
        return torch.randn(prefixes.shape[0], D)

    return weights, step_fn
