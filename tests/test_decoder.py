"""Decoder exactness against brute force, padding, heavy rows, items, immutability.

Brute force: with a beam at least as wide as the number of distinct SIDs, every prefix survives every step,
so the search is exhaustive and its result must be *every* catalog SID, each scored with the sum of its
per-step log-probabilities under the order's normalisation (filter_first: over the prefix's valid
children; score_first: over all V_t), sorted best first, padded after. The step function is a fixed,
seeded function of (step, prefix, request), so the reference recomputes the same hidden vectors in fp64.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.slots import MIN_CAP
from zerogr_build.testing import SeededModel, replay_without_host_reads

from .reference import reference_steps

DIM = 8


def check_exhaustive(res, model, sids, order, batch_size, atol):
    """Every request's result == all SIDs with brute-force scores, best first, then padding."""
    assert not torch.isnan(res.scores).any()
    for b in range(batch_size):
        expected = model.brute_force(sids, order, b)
        scores = res.scores[b].numpy()
        finite = np.isfinite(scores)
        n = len(expected)
        assert finite.sum() == n
        assert finite[:n].all() and not finite[n:].any()  # padding only at the end
        assert np.all(np.diff(scores[:n]) <= 1e-6)  # best first
        got = [tuple(int(x) for x in s) for s in res.sids[b, :n].tolist()]
        assert set(got) == set(expected)
        for sid, score in zip(got, scores[:n], strict=True):
            assert score == pytest.approx(expected[sid], abs=atol)
        assert (res.sids[b, n:] == -1).all()
        assert (res.leaves[b, n:] == -1).all()


catalogs = st.integers(1, 5).flatmap(
    lambda length: st.tuples(
        st.lists(st.integers(1, 6), min_size=length, max_size=length),
        st.integers(1, 40),
        st.integers(0, 2**31 - 1),
        st.lists(st.sampled_from(["auto", "sparse", "dense"]), min_size=length, max_size=length),
    )
)


def make_catalog(sizes, n, seed):
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, sizes, size=(n, len(sizes)))
    if n > 2:  # force duplicates (several items per SID)
        sids[-1] = sids[0]
    return sids


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catalogs, st.sampled_from([None, 1, 2]), st.booleans())
def test_exhaustive_search_equals_brute_force(catalog, cap, bias):
    sizes, n, seed, formats = catalog
    sids = make_catalog(sizes, n, seed)
    index = build_index(sids, sizes, step_formats=dict(enumerate(formats)))
    model = SeededModel(sizes, seed, batch_size=2, bias=bias)
    beam = index.num_leaves + 3  # wide enough to keep every prefix, plus padding
    for order in ("filter_first", "score_first"):
        dec = Decoder(index, model.layers(), order=order, slot_caps=cap)
        for mode in ("full", "selective", "selective_numba"):
            res = dec.search(model.step_fn, 2, beam, mode=mode)
            check_exhaustive(res, model, sids, order, 2, atol=1e-4)
            leaf_sids = index.leaf_sids()
            real = res.leaves >= 0
            assert (torch.as_tensor(leaf_sids)[res.leaves[real]] == res.sids[real]).all()


@settings(max_examples=25, deadline=None)
@given(catalogs, st.integers(1, 3), st.sampled_from([None, 1]))
def test_narrow_beams_are_real_sids_with_right_items(catalog, beam, cap):
    sizes, n, seed, formats = catalog
    sids = make_catalog(sizes, n, seed)
    index = build_index(sids, sizes, step_formats=dict(enumerate(formats)))
    model = SeededModel(sizes, seed + 1, batch_size=3, bias=False)
    _, leaves, leaf_items = reference_steps(sids)
    item_ids = np.array([f"item{i}" for i in range(n)], dtype=object)
    for order in ("filter_first", "score_first"):
        dec = Decoder(index, model.layers(), order=order, slot_caps=cap)
        for mode in ("full", "selective", "selective_numba"):
            res = dec.search(model.step_fn, 3, beam, mode=mode)
            assert res.sids.shape == (3, beam, len(sizes))
            assert res.scores.shape == res.leaves.shape == (3, beam)
            rows = dec.items(res)
            named = dec.items(res, items=item_ids)
            for b in range(3):
                expected = model.brute_force(sids, order, b)
                n_real = min(beam, len(leaves))
                assert torch.isfinite(res.scores[b, :n_real]).all()
                for m in range(beam):
                    leaf = int(res.leaves[b, m])
                    if m >= n_real:
                        assert leaf == -1 and rows[b][m] == [] and res.scores[b, m] == float("-inf")
                        continue
                    sid = tuple(int(x) for x in res.sids[b, m])
                    assert leaves[leaf] == sid  # a real SID, and its leaf is the right one
                    assert float(res.scores[b, m]) == pytest.approx(expected[sid], abs=1e-4)
                    assert rows[b][m] == leaf_items[leaf]
                    assert named[b][m] == [f"item{i}" for i in leaf_items[leaf]]


def heavy_catalog() -> tuple[np.ndarray, tuple[int, ...]]:
    """One prefix with 40 children (far above the p99-based cap), every other prefix with one or two."""
    sizes = (16, 64, 64)
    rows = [(0, 1, v) for v in range(40)] + [(0, 2, v) for v in range(25)]
    rows += [(a, b, (a * 7 + b) % 64) for a in range(1, 16) for b in range(0, 64, 3)]
    rows += [(a, b, (a + b) % 64) for a in range(1, 16) for b in range(0, 64, 9)]
    return np.array(rows, dtype=np.int64), sizes


@pytest.mark.parametrize("order", ["filter_first", "score_first"])
@pytest.mark.parametrize("mode", ["full", "selective", "selective_numba"])
def test_heavy_rows_take_the_overflow_path_exactly(order, mode):
    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes, step_formats="sparse")
    model = SeededModel(sizes, 7, batch_size=2, bias=True)
    dec = Decoder(index, model.layers(), order=order)
    assert dec.slot_caps[2] == MIN_CAP < index.steps[2].max_slots == 40  # the cap really binds
    res = dec.search(model.step_fn, 2, index.num_leaves + 5, mode=mode)
    check_exhaustive(res, model, sids, order, 2, atol=1e-4)
    # Narrow searches, where a heavy row's lane is cut to M, are checked exactly (every step's top M
    # against brute force) by test_narrow_step_keeps_the_top_m_children_of_all_beams.


def _push(model: SeededModel, step: int, token: int, request: int, prefix: tuple[int, ...]) -> None:
    """Make `token` the clear favourite of `request` at `step` after `prefix` (weight row += hidden dir)."""
    h = model.step_fn(step, torch.tensor([prefix], dtype=torch.int64), torch.tensor([request]))[0]
    model.weights[step][token] += 6 * h / h.norm()


@pytest.mark.parametrize("order", ["filter_first", "score_first"])
@pytest.mark.parametrize("mode", ["full", "selective", "selective_numba"])
def test_narrow_step_keeps_the_top_m_children_of_all_beams(order, mode):
    """Each step keeps exactly the best M of all children of a request's live beams, also when they come
    from a heavy row cut to M inside its overflow lane (M = 4 < lane width 64: the cut really binds)."""
    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes, step_formats="sparse")
    model = SeededModel(sizes, 7, batch_size=2, bias=True)
    _push(model, 0, 0, 0, ())
    _push(model, 1, 1, 0, (0,))  # request 0 -> prefix (0, 1): 40 children at the last step
    children: dict[tuple, set] = {}
    for sid in {tuple(row) for row in sids.tolist()}:
        for t in range(len(sid)):
            children.setdefault(sid[:t], set()).add(sid[t])
    dec = Decoder(index, model.layers(), order=order)
    beam = 4
    state = dec.start(2, beam)
    for t in range(len(sizes)):
        hidden = model.step_fn(t, state.prefixes, state.batch)
        new = dec.step(state, hidden, mode=mode)
        weight, bias = model.weights[t].double(), model.biases[t].double()
        logits = (hidden.double() @ weight.T + bias).numpy()
        for request in range(2):
            candidates = []
            for r in torch.nonzero(state.batch == request).flatten().tolist():
                if not np.isfinite(float(state.scores[r])):
                    continue
                prefix = tuple(state.prefixes[r].tolist())
                allowed = sorted(children[prefix])
                norm = np.logaddexp.reduce(logits[r][allowed] if order == "filter_first" else logits[r])
                for v in allowed:
                    candidates.append((float(state.scores[r]) + logits[r, v] - norm, (*prefix, v)))
            want = sorted(candidates, reverse=True)[:beam]
            mine = torch.nonzero(new.batch == request).flatten().tolist()
            got = [(float(new.scores[i]), tuple(new.prefixes[i].tolist())) for i in mine]
            got = [g for g in got if np.isfinite(g[0])]
            assert [sid for _, sid in got] == [sid for _, sid in want]
            np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want], atol=1e-4)
        state = new
    assert (state.prefixes[:beam, :2] == torch.tensor([0, 1])).all()  # request 0 ended in the heavy row


def test_overflow_lanes_hold_a_whole_request():
    """All M survivors of a request come from one heavy beam: lanes must supply M candidates each."""
    sizes = (2, 50)
    sids = np.array([(0, v) for v in range(50)] + [(1, 3)], dtype=np.int64)
    index = build_index(sids, sizes, step_formats="sparse")
    model = SeededModel(sizes, 3, batch_size=1, bias=False)
    with torch.no_grad():
        model.weights[0][0] += 5 * model.base[0] / model.base[0].norm()  # push request 0 onto prefix (0,)
    for cap in (1, 2, None):
        dec = Decoder(index, model.layers(), slot_caps=cap)
        for mode in ("full", "selective", "selective_numba"):
            res = dec.search(model.step_fn, 1, 51, mode=mode)
            check_exhaustive(res, model, sids, "filter_first", 1, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(1, 12), st.integers(0, 10**6))
def test_unconstrained_is_exhaustive_over_all_codes(sizes, n, seed):
    sids = make_catalog(sizes, n, seed)
    index = build_index(sids, sizes)
    model = SeededModel(sizes, seed, batch_size=1, bias=True)
    dec = Decoder(index, model.layers(), order="unconstrained")
    total = int(np.prod(sizes))
    res = dec.search(model.step_fn, 1, total)
    expected = model.brute_force(sids, "unconstrained", 0)
    got = [tuple(int(x) for x in s) for s in res.sids[0].tolist()]
    assert set(got) == set(expected)
    for sid, score in zip(got, res.scores[0].tolist(), strict=True):
        assert score == pytest.approx(expected[sid], abs=1e-4)
    catalog = {tuple(int(x) for x in r) for r in sids}
    leaf_sids = index.leaf_sids()
    for sid, leaf in zip(got, res.leaves[0].tolist(), strict=True):
        if sid in catalog:
            assert tuple(leaf_sids[leaf]) == sid
        else:
            assert leaf == -1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catalogs, st.sampled_from([1, 2]), st.integers(1, 6))
def test_static_shapes_give_the_same_beams_as_dynamic_lanes(catalog, cap, beam):
    """One max_slots-wide lane per beam (static_shapes) must pick exactly what sized-to-fit lanes pick."""
    sizes, n, seed, formats = catalog
    sids = make_catalog(sizes, n, seed)
    index = build_index(sids, sizes, step_formats=dict(enumerate(formats)))
    model = SeededModel(sizes, seed, batch_size=2, bias=True)
    for order, mode in itertools.product(
        ("filter_first", "score_first"), ("full", "selective", "selective_numba")
    ):
        dynamic = Decoder(index, model.layers(), order=order, slot_caps=cap)
        static = Decoder(index, model.layers(), order=order, slot_caps=cap, static_shapes=True)
        for width in (beam, index.num_leaves + 2):
            a = dynamic.search(model.step_fn, 2, width, mode=mode)
            b = static.search(model.step_fn, 2, width, mode=mode)
            torch.testing.assert_close(b.scores, a.scores, rtol=0, atol=1e-5)
            real = torch.isfinite(a.scores)
            assert torch.equal(b.leaves[real], a.leaves[real]) and torch.equal(b.sids[real], a.sids[real])


@pytest.mark.parametrize("order", ["filter_first", "score_first"])
@pytest.mark.parametrize("mode", ["full", "selective", "selective_numba"])
def test_static_shapes_read_nothing_back_to_the_host(order, mode, monkeypatch):
    """With static_shapes no step turns a tensor into a Python value (a device->host sync on CUDA),
    heavy rows included; the exhaustive result still equals brute force."""
    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes, step_formats="sparse")
    model = SeededModel(sizes, 5, batch_size=2, bias=True)
    dec = Decoder(index, model.layers(), order=order, static_shapes=True)
    assert dec.slot_caps[2] < index.steps[2].max_slots  # heavy beams exist: the lanes are used
    hiddens, state = [], dec.start(2, index.num_leaves + 3)
    states = [state]
    for t in range(len(sizes)):  # hidden vectors first: step_fn itself may read values
        hiddens.append(model.step_fn(t, state.prefixes, state.batch))
        state = dec.step(state, hiddens[-1], mode=mode)
        states.append(state)

    replayed = replay_without_host_reads(monkeypatch, dec, states[0], hiddens, mode)
    assert torch.equal(replayed.prefixes, states[-1].prefixes)
    check_exhaustive(dec.finish(replayed), model, sids, order, 2, atol=1e-4)


def test_step_returns_new_state_and_never_mutates_input():
    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes)
    model = SeededModel(sizes, 1, batch_size=2, bias=False)
    dec = Decoder(index, model.layers())
    state = dec.start(2, 8)
    assert state.prefixes.shape == (2, 0) and state.batch.tolist() == [0, 1]
    for t in range(len(sizes)):
        hidden = model.step_fn(t, state.prefixes, state.batch)
        before = [x.clone() for x in (state.prefixes, state.batch, state.scores, state.rows)]
        hidden_before = hidden.clone()
        new = dec.step(state, hidden, mode="selective")
        assert new is not state and new.step == state.step + 1
        for x, y in zip(before, (state.prefixes, state.batch, state.scores, state.rows), strict=True):
            assert torch.equal(x, y)
        assert torch.equal(hidden, hidden_before)
        again = dec.step(state, hidden, mode="selective")  # same input -> same output
        assert torch.equal(again.prefixes, new.prefixes)
        assert new.prefixes.shape == (16, t + 1) and new.batch.tolist() == [0] * 8 + [1] * 8
        state = new


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights(dtype):
    sizes = (4, 5, 6)
    sids = make_catalog(sizes, 30, 5)
    index = build_index(sids, sizes, step_formats="sparse")  # dense steps would round through the GEMM
    model = SeededModel(sizes, 5, batch_size=2, bias=True, scale=0.5)
    dec = Decoder(index, model.layers(dtype))
    assert dec.dtype == dtype
    beam = index.num_leaves
    # selective accumulates in fp32 from the rounded inputs; full rounds the GEMM output to `dtype`
    for mode, atol in (("selective", 2e-3), ("selective_numba", 2e-3), ("full", 0.15)):
        res = dec.search(model.step_fn, 2, beam, mode=mode)
        check_exhaustive(res, _Cast(model, dtype), sids, "filter_first", 2, atol=atol)


class _Cast:
    """The seeded model's brute force with weights/hidden rounded to `dtype` first (what the decoder sees)."""

    def __init__(self, model, dtype):
        self.model, self.dtype = model, dtype

    def brute_force(self, sids, order, request):
        return self.model.brute_force(sids, order, request, dtype=self.dtype)


def test_bundle_items_and_plans(tmp_path):
    from zerogr_build.bundle import open_bundle, publish_bundle

    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes)
    ids = pa.array([f"sku-{i}" for i in range(len(sids))])
    published = publish_bundle(index, ids, tmp_path / "bundles")
    bundle = open_bundle(published.path)
    model = SeededModel(sizes, 2, batch_size=2, bias=False)
    # the plan says "selective" where the heuristic says otherwise, so following the plan is observable
    assert "selective" not in [Decoder(index, model.layers()).mode_for(t, 2) for t in range(3)]
    plan = {"entries": [{"step": t, "batch_size": 4, "dtype": "fp32", "mode": "selective"} for t in range(3)]}
    dec = Decoder(bundle, model.layers(), plan=plan)
    assert [dec.mode_for(t, 2) for t in range(3)] == ["selective"] * 3
    res = dec.search(model.step_fn, 2, 5)
    _, leaves, leaf_items = reference_steps(sids)
    items = dec.items(res)
    for b in range(2):
        for m in range(5):
            leaf = int(res.leaves[b, m])
            assert items[b][m] == [f"sku-{i}" for i in leaf_items[leaf]]
    forced = Decoder(index, model.layers()).search(model.step_fn, 2, 5, mode="selective")
    assert torch.equal(forced.sids, res.sids) and torch.allclose(forced.scores, res.scores)
    half = Decoder(bundle, model.layers(torch.bfloat16), plan=plan)  # the plan has fp32 entries only
    with pytest.warns(UserWarning, match="no entry for step 0 at bf16"):
        assert half.mode_for(0, 2) == "full"


def test_bad_inputs_raise_input_error():
    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes)
    model = SeededModel(sizes, 0, batch_size=1, bias=False)
    with pytest.raises(InputError):
        Decoder(index, model.layers()[:2])
    with pytest.raises(InputError):
        Decoder(index, [torch.zeros(5, DIM)] + model.layers()[1:])
    with pytest.raises(InputError):
        Decoder(index, model.layers(), order="static")
    with pytest.raises(InputError, match="disagree on d"):  # hidden [R, d] must fit every step's layer
        Decoder(index, model.layers()[:2] + [torch.zeros(sizes[2], DIM + 1)])
    with pytest.raises(InputError, match="'weight'"):
        Decoder(index, model.layers()[:2] + [{"bias": torch.zeros(sizes[2])}])
    for caps in ([4, 4], [4, 4, 4, 4]):  # per-step sequences must name every step, no more
        with pytest.raises(InputError, match="slot_caps"):
            Decoder(index, model.layers(), slot_caps=caps)
    dec = Decoder(index, model.layers())
    state = dec.start(1, 4)
    with pytest.raises(InputError):
        dec.step(state, torch.zeros(3, DIM))
    with pytest.raises(InputError):
        dec.step(state, torch.zeros(1, DIM), mode="selective_cuda")  # not on CPU
    with pytest.raises(InputError):
        dec.finish(state)
    for modes in (["full", "full"], ["full"] * 4):
        with pytest.raises(InputError, match="mode"):
            dec.search(model.step_fn, 1, 4, mode=modes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_search_matches_brute_force_in_every_mode():
    from zerogr_build.runtime.scoring import available_modes

    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes, step_formats="0=dense")
    model = SeededModel(sizes, 11, batch_size=2, bias=True)
    cuda_model = model.to("cuda:0")
    modes = available_modes("cuda:0")
    assert {"full", "selective"} <= set(modes)
    for order in ("filter_first", "score_first"):
        dec = Decoder(index, cuda_model.layers(), device="cuda:0", order=order)
        for mode in modes:
            res = dec.search(cuda_model.step_fn, 2, index.num_leaves + 2, mode=mode)
            cpu = type(res)(res.sids.cpu(), res.scores.cpu(), res.leaves.cpu(), res.order)
            check_exhaustive(cpu, model, sids, order, 2, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("order", ["filter_first", "score_first"])
def test_cuda_graph_replays_a_static_shapes_step(order):
    """static_shapes: a sparse step with heavy beams captures in a CUDA graph and replays exactly."""
    sids, sizes = heavy_catalog()
    index = build_index(sids, sizes, step_formats="sparse")
    model = SeededModel(sizes, 3, batch_size=2, bias=True)
    layers = [(w.cuda(), None if b is None else b.cuda()) for w, b in model.layers()]
    dec = Decoder(index, layers, device="cuda:0", order=order, static_shapes=True)
    state = dec.start(2, 16)
    for t in range(2):
        state = dec.step(state, model.step_fn(t, state.prefixes.cpu(), state.batch.cpu()).cuda())
    hidden = model.step_fn(2, state.prefixes.cpu(), state.batch.cpu()).cuda()
    eager = dec.step(state, hidden)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (allocator, kernels)
        dec.step(state, hidden)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = dec.step(state, hidden)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.prefixes, eager.prefixes)
    torch.testing.assert_close(captured.scores, eager.scores)
