"""The two Decoder hooks the Hugging Face integration needs: BeamState.parents (reorder a KV cache with
the beams) and step(log_normalizer=...) (score_first / unconstrained normalised over a larger vocabulary
than the step's codes). Brute force: a beam at least as wide as the catalog keeps every prefix alive, so
the result must be every SID scored with sum_t (logit_t[code] - normaliser_t)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder

DIM = 6


def _case(seed: int, sizes: tuple[int, ...], n: int):
    rng = np.random.default_rng(seed)
    sids = np.stack([rng.integers(0, v, n) for v in sizes], axis=1)
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(sum(sizes) + 5, DIM, generator=g)  # the "language model vocabulary"
    offsets = np.concatenate([[3], 3 + np.cumsum(sizes)[:-1]])  # code c of step t is row offsets[t] + c
    emb = [torch.randn(v, DIM, generator=g) for v in sizes]
    base = torch.randn(len(sizes), DIM, generator=g)
    return sids, big, offsets, emb, base


def _hidden(base, emb, t: int, prefixes: torch.Tensor) -> torch.Tensor:
    h = base[t].expand(prefixes.shape[0], DIM).clone()
    for j in range(t):
        h = h + emb[j][prefixes[:, j]]
    return h


@pytest.mark.parametrize("order", ["score_first", "unconstrained"])
@pytest.mark.parametrize("formats", ["auto", "sparse", "dense"])
def test_log_normalizer_replaces_the_step_logsumexp(order: str, formats: str) -> None:
    sizes = (4, 5, 3)
    sids, big, offsets, emb, base = _case(7, sizes, 12)
    index = build_index(sids, sizes, step_formats=formats)
    weights = [big[o : o + v] for o, v in zip(offsets, sizes, strict=True)]
    dec = Decoder(index, weights, order=order)
    width = int(np.prod(sizes)) if order == "unconstrained" else len(np.unique(sids, axis=0))
    state = dec.start(1, width)
    for t in range(len(sizes)):
        hidden = _hidden(base, emb, t, state.prefixes)
        norm = torch.logsumexp(hidden @ big.T, dim=1)
        state = dec.step(state, hidden, log_normalizer=norm)
    res = dec.finish(state)

    leaves = itertools.product(*map(range, sizes)) if order == "unconstrained" else map(tuple, sids)
    expected = {}
    for sid in set(leaves):
        prefix = torch.tensor([sid], dtype=torch.int64)
        total = 0.0
        for t in range(len(sizes)):
            h = _hidden(base, emb, t, prefix[:, :t]).double()
            logits = h @ big.double().T
            total += float(logits[0, offsets[t] + sid[t]] - torch.logsumexp(logits, dim=1)[0])
        expected[sid] = total
    got = {tuple(s): float(v) for s, v in zip(res.sids[0].tolist(), res.scores[0], strict=True)}
    assert got.keys() == expected.keys()
    for sid, value in expected.items():
        assert got[sid] == pytest.approx(value, abs=1e-4)


def test_log_normalizer_ignored_under_filter_first() -> None:
    sizes = (4, 5, 3)
    sids, big, offsets, emb, base = _case(3, sizes, 10)
    index = build_index(sids, sizes)
    dec = Decoder(index, [big[o : o + v] for o, v in zip(offsets, sizes, strict=True)])
    plain, hooked = dec.start(2, 3), dec.start(2, 3)
    for t in range(len(sizes)):
        hidden = _hidden(base, emb, t, plain.prefixes)
        plain = dec.step(plain, hidden)
        hooked = dec.step(hooked, hidden, log_normalizer=torch.full((hidden.shape[0],), 123.0))
    a, b = dec.finish(plain), dec.finish(hooked)
    assert torch.equal(a.sids, b.sids) and torch.equal(a.scores, b.scores)


@pytest.mark.parametrize("order", ["filter_first", "score_first", "unconstrained"])
def test_parents_name_each_beams_previous_beam(order: str) -> None:
    sizes = (4, 5, 3)
    sids, big, offsets, emb, base = _case(11, sizes, 9)
    dec = Decoder(build_index(sids, sizes), [big[o : o + v] for o, v in zip(offsets, sizes, strict=True)])
    state = dec.start(3, 4, order=order)
    assert state.parents is None
    for t in range(len(sizes)):
        new = dec.step(state, _hidden(base, emb, t, state.prefixes))
        assert new.parents is not None and new.parents.shape == (new.num_beams,)
        real = torch.isfinite(new.scores)
        assert torch.equal(new.prefixes[real, :t], state.prefixes[new.parents[real]])
        # a beam's parent belongs to the same request
        assert torch.equal(state.batch[new.parents], new.batch)
        state = new
