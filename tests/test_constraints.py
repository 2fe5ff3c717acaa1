"""Item constraints (availability mask, include sets, exclude lists) against the oracle: for every request
the result equals decoding on an index built from scratch from that request's allowed items only - same
SIDs, same scores (fp tolerance), same items - in both orders and modes, dense and sparse steps, shared
SIDs, heavy rows (slot cap 1 forces overflow lanes), static shapes and empty allowed sets (all padding)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerogr_build.base.errors import InputError
from zerogr_build.bundle import open_bundle, publish_bundle
from zerogr_build.cli import app
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.items.constraints import ItemMask, ItemSets, row_item_bounds
from zerogr_build.testing import SeededModel, replay_without_host_reads

BATCH = 3


def random_case(seed: int, length: int, num_sets: int = 3):
    """A catalog with shared SIDs (duplicate rows) and one heavy prefix, a mask, `num_sets` overlapping sets
    and per-request include/exclude arguments (catalog rows are the item ids of an in-memory index)."""
    rng = np.random.default_rng(seed)
    sizes = tuple(int(v) for v in rng.integers(2, 7, size=length))
    n = int(rng.integers(1, 40))
    sids = rng.integers(0, sizes, size=(n, length))
    heavy = np.tile(sids[:1], (int(rng.integers(0, 8)), 1))
    heavy[:, -1] = rng.integers(0, sizes[-1], size=heavy.shape[0])  # many children under one prefix
    sids = np.concatenate([sids, heavy, sids[rng.integers(0, n, size=int(rng.integers(0, 6)))]])
    n = sids.shape[0]
    available = rng.random(n) < rng.choice([0.2, 0.6, 1.0])
    share = 0.4 if num_sets <= 3 else 3.0 / num_sets  # many sets: smaller ones, so a union can be small
    sets = {f"s{i}": np.flatnonzero(rng.random(n) < share) for i in range(num_sets)}
    include, exclude = [], []
    for _ in range(BATCH):
        named = rng.choice(list(sets), int(rng.integers(1, min(num_sets, 4) + 1)), replace=False)
        include.append(None if rng.random() < 0.4 else [str(x) for x in named])
        exclude.append(rng.choice(n, int(rng.integers(0, n // 2 + 1))).tolist() if rng.random() < 0.7 else [])
    return sids, sizes, available, sets, include, exclude


def allowed_rows(n, available, sets, include, exclude) -> np.ndarray:
    """The catalog rows request may return, by the issue's definition (brute force)."""
    ok = available.copy()
    if include:
        union = np.zeros(n, dtype=bool)
        for name in include:
            union[sets[name]] = True
        ok &= union
    ok[np.asarray(exclude, dtype=np.int64)] = False
    return np.flatnonzero(ok)


def check_against_rebuild(res, items, sids, sizes, model, layers, order, mode, width, allowed_per_request):
    for b, rows in enumerate(allowed_per_request):
        if rows.size == 0:
            assert (
                torch.isinf(res.scores[b]).all() and (res.leaves[b] == -1).all() and (res.sids[b] == -1).all()
            )
            assert all(beam == [] for beam in items[b])
            continue
        oracle = Decoder(build_index(sids[rows], sizes), layers, order=order)
        ref = oracle.search(model.step_fn, BATCH, width, mode=mode)
        ref_items = oracle.items(ref, items=rows.tolist())
        torch.testing.assert_close(res.scores[b], ref.scores[b], rtol=0, atol=1e-4)
        real = torch.isfinite(ref.scores[b])
        assert torch.equal(res.sids[b][real], ref.sids[b][real])
        assert (res.leaves[b][~real] == -1).all()
        assert [items[b][m] for m in range(width) if real[m]] == [
            ref_items[b][m] for m in range(width) if real[m]
        ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 3),
    order=st.sampled_from(["filter_first", "score_first"]),
    mode=st.sampled_from(["full", "selective"]),
    formats=st.sampled_from(["sparse", "dense", "auto", "0=dense"]),
    width=st.integers(1, 12),
    static=st.booleans(),
    num_sets=st.sampled_from([1, 3, 9, 21, 70]),  # set words of uint8, 16, 32, 64 bits and two uint64s
    sets_first=st.booleans(),  # set_item_sets then set_availability: the set words follow the new mask
)
def test_constrained_search_equals_search_on_a_rebuilt_index(
    seed, length, order, mode, formats, width, static, num_sets, sets_first
):
    sids, sizes, available, sets, include, exclude = random_case(seed, length, num_sets)
    formats = "dense" if formats == "0=dense" and length == 1 else formats
    model = SeededModel(sizes, seed % 1000, batch_size=BATCH, bias=True)
    layers = model.layers()
    index = build_index(sids, sizes, step_formats=formats)
    dec = Decoder(index, layers, order=order, slot_caps=1, static_shapes=static)  # cap 1: lanes everywhere
    if sets_first:
        dec.set_item_sets(ItemSets.from_mapping(index, sets))
        dec.set_availability(ItemMask.from_bool(index, ~available))  # replaced below: a stale mask
        dec.set_availability(ItemMask.from_bool(index, available))
    else:
        dec.set_availability(ItemMask.from_bool(index, available))
        dec.set_item_sets(ItemSets.from_mapping(index, sets))
    res = dec.search(model.step_fn, BATCH, width, mode=mode, include=include, exclude=exclude)
    allowed = [allowed_rows(len(sids), available, sets, include[b], exclude[b]) for b in range(BATCH)]
    check_against_rebuild(res, dec.items(res), sids, sizes, model, layers, order, mode, width, allowed)


@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_row_item_bounds_cover_each_rows_leaves(seed, length):
    """Row j of step s covers exactly the items whose SID starts with that row's prefix."""
    rng = np.random.default_rng(seed)
    sizes = tuple(int(v) for v in rng.integers(1, 5, size=length))
    sids = rng.integers(0, sizes, size=(int(rng.integers(1, 30)), length))
    index = build_index(sids, sizes, step_formats=str(rng.choice(["sparse", "dense", "auto"])))
    order = np.asarray(index.item_order)
    for s, bounds in enumerate(row_item_bounds(index), start=1):
        prefixes = sorted({tuple(p) for p in sids[:, :s].tolist()})
        assert len(bounds) == len(prefixes) + 1 and bounds[0] == 0 and bounds[-1] == len(sids)
        for j, prefix in enumerate(prefixes):
            covered = sorted(order[bounds[j] : bounds[j + 1]].tolist())
            assert covered == sorted(np.flatnonzero((sids[:, :s] == prefix).all(axis=1)).tolist())


def small_case():
    sids = np.array([[0, 0], [0, 1], [0, 1], [1, 2], [2, 0], [2, 1]])
    model = SeededModel((3, 3), 2, batch_size=2)
    return sids, model, build_index(sids, (3, 3))


def test_shared_sid_loses_only_its_excluded_item():
    sids, model, index = small_case()
    dec = Decoder(index, model.layers())
    res = dec.search(model.step_fn, 2, 6, exclude=[[1], []])
    items = dec.items(res)
    got = {tuple(s): it for s, it in zip(res.sids[0].tolist(), items[0], strict=True)}
    assert got[(0, 1)] == [2]  # rows 1 and 2 share SID (0, 1); row 1 is excluded
    assert {tuple(s): it for s, it in zip(res.sids[1].tolist(), items[1], strict=True)}[(0, 1)] == [1, 2]


def test_empty_allowed_set_gives_all_padding_not_an_error():
    sids, model, index = small_case()
    dec = Decoder(index, model.layers(), order="score_first")
    dec.set_availability(ItemMask.from_bool(index, np.zeros(len(sids), bool)))
    res = dec.search(model.step_fn, 2, 4)
    assert torch.isinf(res.scores).all() and (res.leaves == -1).all() and (res.sids == -1).all()
    assert dec.items(res) == [[[]] * 4] * 2


def test_unknown_ids_warn_once_and_unknown_set_names_raise():
    sids, model, index = small_case()
    dec = Decoder(index, model.layers())
    with pytest.warns(UserWarning, match="2 of 3 excluded item ids are not in the catalog") as caught:
        dec.search(model.step_fn, 2, 4, exclude=[[0, 99, 100], []])
    assert len(caught) == 1
    with pytest.warns(UserWarning, match="not in the catalog"):
        ItemMask.from_ids(index, [0, 7])
    dec.set_item_sets(ItemSets.from_mapping(index, {"comedy": [0, 1]}))
    with pytest.raises(InputError, match="'drama'"):
        dec.search(model.step_fn, 2, 4, include=[["comedy", "drama"], None])
    with pytest.raises(InputError, match="2 requests"):
        dec.search(model.step_fn, 2, 4, exclude=[[0]])


def test_a_search_keeps_the_mask_it_started_with():
    """set_availability swaps one reference: a running search keeps its snapshot; the next sees the new."""
    sids, model, index = small_case()
    dec = Decoder(index, model.layers())
    only_first = np.zeros(len(sids), bool)
    only_first[0] = True
    state = dec.start(2, 4)
    dec.set_availability(ItemMask.from_bool(index, only_first))
    for t in range(2):
        state = dec.step(state, model.step_fn(t, state.prefixes, state.batch))
    assert torch.isfinite(dec.finish(state).scores).all()
    res = dec.search(model.step_fn, 2, 4)
    assert res.sids[:, 0].tolist() == [[0, 0], [0, 0]] and torch.isinf(res.scores[:, 1:]).all()
    dec.set_availability(None)
    assert torch.isfinite(dec.search(model.step_fn, 2, 4).scores).all()


def test_mask_from_parquet_with_a_flag_column(tmp_path):
    sids, model, index = small_case()
    path = tmp_path / "available.parquet"
    pq.write_table(pa.table({"item": [0, 3, 5, 77], "in_stock": [True, False, True, True]}), path)
    with pytest.warns(UserWarning, match="1 of 3"):
        mask = ItemMask.from_parquet(index, path)
    assert np.flatnonzero(mask.available[np.argsort(index.item_order)]).tolist() == [0, 5]


@pytest.mark.parametrize("order", ["filter_first", "score_first"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_static_shapes_constrained_step_reads_nothing_back(order, mode, monkeypatch):
    sids, sizes, available, sets, include, exclude = random_case(11, 3)
    model = SeededModel(sizes, 3, batch_size=BATCH, bias=True)
    index = build_index(sids, sizes, step_formats="sparse")
    dec = Decoder(index, model.layers(), order=order, slot_caps=1, static_shapes=True)
    dec.set_availability(ItemMask.from_bool(index, available))
    dec.set_item_sets(ItemSets.from_mapping(index, sets))
    state = dec.start(BATCH, 6, include=include, exclude=exclude)
    states, hiddens = [state], []
    for t in range(len(sizes)):
        hiddens.append(model.step_fn(t, state.prefixes, state.batch))
        state = dec.step(state, hiddens[-1], mode=mode)
        states.append(state)

    replayed = replay_without_host_reads(monkeypatch, dec, states[0], hiddens, mode)
    assert torch.equal(replayed.prefixes, states[-1].prefixes)
    allowed = [allowed_rows(len(sids), available, sets, include[b], exclude[b]) for b in range(BATCH)]
    res = dec.finish(replayed)
    check_against_rebuild(res, dec.items(res), sids, sizes, model, model.layers(), order, mode, 6, allowed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["full", "selective", "selective_cuda"])
def test_constrained_search_on_cuda_equals_rebuild(mode):
    sids, sizes, available, sets, include, exclude = random_case(5, 3)
    model = SeededModel(sizes, 1, batch_size=BATCH, bias=True)
    index = build_index(sids, sizes, step_formats="sparse")
    dec = Decoder(index, model.layers(), device="cuda", slot_caps=1)
    dec.set_availability(ItemMask.from_bool(index, available))
    dec.set_item_sets(ItemSets.from_mapping(index, sets))

    def step_fn(t, prefixes, batch):
        return model.step_fn(t, prefixes.cpu(), batch.cpu()).cuda()

    res = dec.search(step_fn, BATCH, 8, mode=mode, include=include, exclude=exclude)
    res_cpu = type(res)(res.sids.cpu(), res.scores.cpu(), res.leaves.cpu(), res.order, res.constraints)
    allowed = [allowed_rows(len(sids), available, sets, include[b], exclude[b]) for b in range(BATCH)]
    layers = model.layers()
    check_against_rebuild(
        res_cpu, dec.items(res), sids, sizes, model, layers, "filter_first", "full", 8, allowed
    )


def test_unconstrained_order_rejects_nothing_and_ignores_the_mask():
    sids, model, index = small_case()
    dec = Decoder(index, model.layers())
    dec.set_availability(ItemMask.from_bool(index, np.zeros(len(sids), bool)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = dec.search(model.step_fn, 2, 3, order="unconstrained")
    assert torch.isfinite(res.scores).all()


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory):
    """Item ids 100 + row on SIDs of (4, 4, 2) with shared SIDs (what tests.compare_models expects)."""
    sids = np.random.default_rng(3).integers(0, (4, 4, 2), size=(40, 3))
    out = tmp_path_factory.mktemp("bundles")
    published = publish_bundle(build_index(sids, (4, 4, 2)), pa.array(100 + np.arange(40), pa.int64()), out)
    return sids, open_bundle(published.path)


def test_cli_inspect_available_counts_valid_prefixes(small_bundle, tmp_path):
    sids, bundle = small_bundle
    chosen = [0, 5, 6, 17, 39]
    path = tmp_path / "available.parquet"
    pq.write_table(pa.table({"item_id": [100 + i for i in chosen] + [100 + 1, 999]}), path)
    res = CliRunner().invoke(app, ["inspect", str(bundle.path), "--available", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert "1 of 7 rows name item ids that are not in the catalog" in res.stderr
    report = json.loads(res.stdout)["available"]
    rows = chosen + [1]
    assert report["items"] == len(rows)
    assert report["valid_prefixes"] == [len({tuple(p) for p in sids[rows, :s].tolist()}) for s in (1, 2, 3)]
    res = CliRunner().invoke(app, ["inspect", str(bundle.path), "--available", str(path)])
    assert res.exit_code == 0 and "prefixes with an available item" in res.stdout, res.output


def test_cli_compare_available_decodes_only_available_items(small_bundle, tmp_path):
    """Only the three target items are available: every order's top-5 then holds each request's target."""
    _, bundle = small_bundle
    req = tmp_path / "requests.parquet"
    pq.write_table(pa.table({"request_id": [0, 1, 2], "target_item": [103, 120, 131]}), req)
    mask = tmp_path / "available.parquet"
    pq.write_table(pa.table({"item": [103, 120, 131, 104], "ok": [True, True, True, False]}), mask)
    args = ["compare", str(bundle.path), "--model", "tests.compare_models:model_fn", "--requests", str(req)]
    res = CliRunner().invoke(
        app, [*args, "--k", "5", "--beam-width", "8", "--json", "--available", str(mask)]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["extra"]["available_items"] == 3
    assert out["recall"]["filter_first"]["5"] == 1.0 and out["recall"]["score_first"]["5"] == 1.0
