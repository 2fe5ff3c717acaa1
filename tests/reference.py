"""Brute-force references the tests compare against (plain Python, obviously correct, slow)."""

from __future__ import annotations

import numpy as np


def reference_steps(
    sids: np.ndarray,
) -> tuple[list[list[list[tuple[int, int]]]], list[tuple[int, ...]], dict]:
    """Per step, per row, the list of (token, next_row) children, straight from the definition.

    Returns (steps, leaves, leaf_items): steps[t][r] = [(v, next_row), ...] ascending v; leaves = distinct
    SIDs sorted; leaf_items[leaf] = catalog rows of that leaf, ascending.
    """
    rows = [tuple(int(x) for x in row) for row in np.asarray(sids)]
    num_steps = len(rows[0])
    leaves = sorted(set(rows))
    steps = []
    for t in range(num_steps):
        prefixes = sorted({leaf[:t] for leaf in leaves})
        longer = sorted({leaf[: t + 1] for leaf in leaves})
        rank = {p: i for i, p in enumerate(longer)}
        steps.append([sorted((q[t], rank[q]) for q in longer if q[:t] == p) for p in prefixes])
    leaf_rank = {leaf: i for i, leaf in enumerate(leaves)}
    leaf_items: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        leaf_items.setdefault(leaf_rank[row], []).append(i)
    return steps, leaves, leaf_items


def selective_reference(hidden, weight, bias, slot_tokens):
    """fp64 loops straight from the contract: dot + bias at valid slots, -inf elsewhere; its log-softmax."""
    h, w = hidden.double().numpy(), weight.double().numpy()
    b = None if bias is None else bias.double().numpy()
    tokens = slot_tokens.numpy()
    out = np.full(tokens.shape, -np.inf)
    for r in range(tokens.shape[0]):
        for k in range(tokens.shape[1]):
            tok = int(tokens[r, k])
            if 0 <= tok < w.shape[0]:
                out[r, k] = h[r] @ w[tok] + (0.0 if b is None else b[tok])
    logp = np.full(tokens.shape, -np.inf)
    for r in range(tokens.shape[0]):
        valid = np.isfinite(out[r])
        if valid.any():
            logp[r, valid] = out[r, valid] - np.logaddexp.reduce(out[r, valid])
    return out, logp
