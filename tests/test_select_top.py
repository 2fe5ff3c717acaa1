"""selective_numba.select_top, a filter-first step's best M candidates per request in one pass: against a
brute force (every beam's totals from log_softmax_totals, sorted by total, then beam, then slot), and the
decoder's search through it against the same search through the [R, K] totals and topk."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.index import build_index
from zerogr_build.runtime import scoring as scoring_registry
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.items.constraints import ItemMask, ItemSets
from zerogr_build.runtime.scoring import selective_numba
from zerogr_build.testing import SeededModel

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def brute_force(hidden, weight, bias, tokens, first, used, scores, requests, m, allowed=None):
    """(values [B, M], beam [B, M], slot [B, M]): every beam's slots as one row each through
    log_softmax_totals (the kernel the [R, K] path runs), all candidates of a request sorted by total
    (NaN first), then beam, then slot; -inf / first beam / slot 0 past the last. allowed(b, p): whether
    request b may take the slot at tokens[p] (else it is emptied first)."""
    rows = hidden.shape[0]
    per = rows // requests
    width = max(1, int(used.max()) if rows else 1)
    grid = torch.full((rows, width), -1, dtype=torch.int32)
    for r in range(rows):
        for k in range(int(used[r])):
            p = int(first[r]) + k
            if allowed is None or allowed(r // per, p):
                grid[r, k] = tokens[p]
    totals = selective_numba.log_softmax_totals(hidden, weight, bias, grid, scores)
    values = torch.full((requests, m), float("-inf"))
    beam = torch.zeros((requests, m), dtype=torch.int64)
    slot = torch.zeros((requests, m), dtype=torch.int64)
    vocab = weight.shape[0]
    for b in range(requests):
        found = []
        for i in range(per):
            r = b * per + i
            for k in range(int(used[r])):
                if 0 <= int(grid[r, k]) < vocab:
                    v = float(totals[r, k])
                    found.append((0 if np.isnan(v) else 1, -v if not np.isnan(v) else 0.0, i, k, v))
        found.sort()
        for j, (_, _, i, k, v) in enumerate(found[:m]):
            values[b, j], beam[b, j], slot[b, j] = v, b * per + i, k
        for j in range(len(found), m):
            beam[b, j] = b * per
    return values, beam, slot


@settings(max_examples=80, deadline=None)
@given(
    requests=st.integers(1, 4),
    per=st.integers(1, 5),
    m=st.integers(1, 12),
    dim=st.integers(1, 24),
    vocab=st.integers(1, 20),
    bias=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    ties=st.booleans(),
    words=st.sampled_from([None, np.uint8, np.int32]),
    kill_share=st.sampled_from([0.0, 0.2, 0.6]),
    seed=st.integers(0, 2**31 - 1),
)
def test_select_top_matches_the_sorted_totals_of_every_slot(requests, per, m, dim, vocab, bias, dtype,
                                                             ties, words, kill_share, seed):  # fmt: skip
    """Also with slots emptied by include-set words (every word type) and by kills (sorted request *
    stride + slot keys, duplicates and keys of no beam's slots among them)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    rows = requests * per
    used = torch.as_tensor(rng.integers(0, 9, rows), dtype=torch.int64)
    first = torch.as_tensor(rng.integers(0, 5, rows), dtype=torch.int64) + torch.cumsum(used, 0) - used
    tokens = torch.as_tensor(
        rng.integers(-2, vocab + 2, int(first.max() + used.max()) + 3), dtype=torch.int32
    )
    weight = torch.randn(vocab, dim, generator=g).to(DTYPES[dtype])
    hidden = torch.randn(rows, dim, generator=g).to(DTYPES[dtype])
    if ties:  # every slot of a beam scores alike: the order among equal totals decides
        hidden = torch.zeros_like(hidden)
    b = torch.randn(vocab, generator=g).to(DTYPES[dtype]) if bias and not ties else None
    scores = torch.randn(rows, generator=g)
    if rows > 1:
        scores[rng.integers(0, rows)] = float("-inf")  # a beam with no real continuation
    limits, allowed = {}, None
    if words is not None or kill_share:
        n, stride = tokens.shape[0], tokens.shape[0] + int(rng.integers(0, 3))
        slot_words = rng.integers(0, 4, n).astype(words or np.int64)
        request_words = rng.integers(0, 4, requests).astype(words or np.int64)
        killed = [int(q) for q in range(requests * stride) if q % stride < n and rng.random() < kill_share]
        killed += killed[: len(killed) // 3]  # duplicates
        kills = np.sort(np.asarray(killed, dtype=np.int64))
        if words is not None:
            limits.update(
                slot_words=torch.from_numpy(slot_words), request_words=torch.from_numpy(request_words)
            )
        if kill_share:
            limits.update(kills=torch.from_numpy(kills), kill_stride=stride)

        def allowed(req, p):
            word_ok = words is None or (slot_words[p] & request_words[req]) != 0
            return bool(word_ok) and not (kill_share and req * stride + p in set(killed))

    got = selective_numba.select_top(hidden, weight, b, tokens, first, used, scores, requests, m, **limits)
    want = brute_force(hidden, weight, b, tokens, first, used, scores, requests, m, allowed)
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x, y), (x, y)


def test_nan_totals_go_first_as_topk_puts_them():
    weight = torch.eye(3)
    hidden = torch.tensor([[float("nan"), 0.0, 0.0], [1.0, 0.0, 0.0]])
    tokens = torch.tensor([0, 1, 2, 0, 1, 2], dtype=torch.int32)
    first, used = torch.tensor([0, 3]), torch.tensor([3, 3])
    values, beam, slot = selective_numba.select_top(
        hidden, weight, None, tokens, first, used, torch.zeros(2), 1, 4
    )
    assert torch.isnan(values[0, 0]) and beam[0, 0] == 0
    want, _ = torch.topk(selective_numba.log_softmax_totals(hidden, weight, None, tokens.view(2, 3),
                                                             torch.zeros(2)).view(1, 6), 4)  # fmt: skip
    assert torch.equal(torch.isnan(values), torch.isnan(want))
    assert torch.equal(values[~torch.isnan(values)], want[~torch.isnan(want)])


def test_slots_outside_the_tokens_are_refused():
    with pytest.raises(ValueError, match="outside tokens"):
        selective_numba.select_top(
            torch.zeros(1, 2), torch.zeros(3, 2), None, torch.zeros(4, dtype=torch.int32),
            torch.tensor([2]), torch.tensor([3]), torch.zeros(1), 1, 2,
        )  # fmt: skip


def catalog(seed: int, n: int, sizes: tuple[int, ...]) -> np.ndarray:
    """SIDs with a heavy head: half the items share a few first tokens, so some rows pass any cap."""
    rng = np.random.default_rng(seed)
    sids = np.stack([rng.integers(0, v, n) for v in sizes], axis=1)
    sids[: n // 2, 0] = rng.integers(0, 2, n // 2)
    return sids


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    beam=st.sampled_from([1, 3, 8, 40]),
    cap=st.sampled_from([None, 2]),
    constrained=st.booleans(),
)
def test_a_search_through_it_is_the_search_through_the_totals_and_topk(seed, beam, cap, constrained):
    """Same beams, same scores, bit for bit (different orders among equal totals aside: none here), with
    heavy beams (a small cap) and with availability and exclusions."""
    sizes = (6, 5, 7)
    sids = catalog(seed, 300, sizes)
    index = build_index(sids, sizes, step_formats="sparse")
    model = SeededModel(sizes, seed % 1000, batch_size=3, bias=True)
    caps = None if cap is None else [cap] * 3
    dec = Decoder(index, model.layers(), slot_caps=caps)
    kwargs = {}
    if constrained:
        rng = np.random.default_rng(seed)
        dec.set_availability(ItemMask.from_bool(index, rng.random(len(sids)) < 0.7))
        dec.set_item_sets(ItemSets.from_mapping(index, {"a": np.arange(0, 300, 3), "b": np.arange(150)}))
        kwargs["exclude"] = [rng.integers(0, len(sids), 20).tolist(), None, [0, 1, 2]]
        kwargs["include"] = [None, ["a"], ["a", "b"]]
    selected = dec.search(model.step_fn, 3, beam, mode="selective_numba", order="filter_first", **kwargs)
    original = scoring_registry._BUILTIN["selective_numba"]
    try:
        scoring_registry._BUILTIN["selective_numba"] = dataclasses.replace(original, select_top=None)
        topk = dec.search(model.step_fn, 3, beam, mode="selective_numba", order="filter_first", **kwargs)
    finally:
        scoring_registry._BUILTIN["selective_numba"] = original
    assert torch.equal(selected.scores, topk.scores)
    assert torch.equal(selected.sids, topk.sids)
    assert torch.equal(selected.leaves, topk.leaves)
