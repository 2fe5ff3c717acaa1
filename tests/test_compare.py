"""zerogr compare: exact against brute-force scoring of every catalog SID, plus CLI errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from tests.compare_models import hidden_for, model_fn, model_fn_with_bias
from zerogr_build.base.errors import InputError
from zerogr_build.bundle import open_bundle, publish_bundle
from zerogr_build.cli import app
from zerogr_build.compare import (
    Requests,
    compare_orders,
    load_model_fn,
    parse_ks,
    read_requests,
    valid_token_mask,
)
from zerogr_build.compare.metrics import ndcg_at_k, overlap_at_k, recall_at_k
from zerogr_build.index import build_index
from zerogr_build.testing import stderr_lines

SIZES = (4, 4, 2)
N_SIDS = 20
runner = CliRunner()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """20 distinct SIDs of the 32 possible codes (so a beam of 32 is exhaustive), item ids 100 + row."""
    rng = np.random.default_rng(7)
    codes = np.array(np.unravel_index(rng.choice(np.prod(SIZES), N_SIDS, replace=False), SIZES)).T
    index = build_index(codes, SIZES, step_formats="0=dense,1=sparse,2=sparse")
    out = tmp_path_factory.mktemp("bundles")
    published = publish_bundle(index, pa.array(100 + np.arange(N_SIDS), type=pa.int64()), out)
    return open_bundle(published.path)


def brute_force(bundle, request_ids, biased=False):
    """Per request: items ranked by total log-prob under each order, and per-step invalid masses of
    every distinct prefix (what an exhaustive beam holds at that step)."""
    leaves = bundle.index.leaf_sids()
    items = bundle.items().to_pylist()  # unique SIDs: leaf j holds exactly item j (leaf order)
    fn = model_fn_with_bias if biased else model_fn
    weights, _ = fn(bundle, request_ids)
    ranked = {"filter_first": [], "score_first": []}
    masses = [[] for _ in SIZES]
    spreads = [[] for _ in SIZES]  # per step, per request: max - min of -log(1 - mass) over prefixes
    gaps = {"filter_first": [], "score_first": []}  # per request: sorted totals
    for r in request_ids:
        totals = {"filter_first": np.zeros(len(leaves)), "score_first": np.zeros(len(leaves))}
        for t in range(len(SIZES)):
            w, b = weights[t] if biased else (weights[t], None)
            pref = torch.as_tensor(leaves[:, :t], dtype=torch.int64)
            logits = (hidden_for(SIZES, torch.full((len(leaves),), r), pref) @ w.T).double()
            if b is not None:
                logits = logits + b.double()
            valid = np.zeros(logits.shape, dtype=bool)
            for i in range(len(leaves)):
                same = (leaves[:, :t] == leaves[i, :t]).all(axis=1)
                valid[i, np.unique(leaves[same, t])] = True
            all_lp = torch.log_softmax(logits, 1).numpy()
            valid_lp = torch.log_softmax(logits.masked_fill(~torch.as_tensor(valid), -math.inf), 1).numpy()
            rows = np.arange(len(leaves))
            totals["score_first"] += all_lp[rows, leaves[:, t]]
            totals["filter_first"] += valid_lp[rows, leaves[:, t]]
            _, first = np.unique(leaves[:, :t], axis=0, return_index=True)
            probs = np.exp(all_lp[first])
            mass = (probs * ~valid[first]).sum(axis=1)
            masses[t].extend(mass.tolist())
            if len(first) >= 2:
                boost = -np.log1p(-mass)
                spreads[t].append(boost.max() - boost.min())
        for order, tot in totals.items():
            ranked[order].append([items[j] for j in np.argsort(-tot, kind="stable")])
            gaps[order].append(np.sort(tot)[::-1])
    spread = [float(np.mean(v)) if v else 0.0 for v in spreads]
    return ranked, [float(np.mean(m)) for m in masses], spread, gaps


@pytest.mark.parametrize("biased", [False, True])
def test_compare_matches_brute_force(bundle, biased):
    ids = list(range(5))
    targets = [100, 105, None, 119, 111]
    ranked, masses, spread, gaps = brute_force(bundle, ids, biased)
    fn = model_fn_with_bias if biased else model_fn
    ks = [1, 5, 10, 20]
    report = compare_orders(bundle, fn, Requests(ids, targets), beam_width=32, ks=ks, batch_size=2)
    ff, sf = ranked["filter_first"], ranked["score_first"]
    for k in ks:
        assert report.overlap[k] == pytest.approx(overlap_at_k(ff, sf, k))
        differing = np.mean([set(a[:k]) != set(b[:k]) for a, b in zip(ff, sf, strict=True)])
        assert report.requests_differing[k] == pytest.approx(differing)
    keep = [i for i, t in enumerate(targets) if t is not None]
    for order in ("filter_first", "score_first"):
        lists = [ranked[order][i] for i in keep]
        tg = [targets[i] for i in keep]
        for k in ks:
            assert report.recall[order][k] == pytest.approx(recall_at_k(lists, tg, k))
            assert report.ndcg[order][k] == pytest.approx(ndcg_at_k(lists, tg, k))
    assert report.with_targets == 4
    # The exhaustive beam holds every distinct prefix at every step, in both orders.
    for order in ("filter_first", "score_first"):
        assert report.invalid_mass[order] == pytest.approx(masses, abs=1e-5)
        assert report.boost_spread[order] == pytest.approx(spread, abs=1e-4)
        for k in ks:
            expect = np.mean([g[0] - g[k - 1] for g in gaps[order]])
            assert report.score_gap[order][k] == pytest.approx(expect, abs=1e-4)
    # A beam of 32 keeps all 32 codes unconstrained: 12 of them are not catalog SIDs.
    assert report.unconstrained_invalid_rate == pytest.approx(12 / 32)
    assert report.overlap[20] == pytest.approx(1.0)  # top-20 of a 20-item catalog is the whole catalog


def reference_beam_search(bundle, request, order, beam_width):
    """Beam search by hand over the catalog's distinct SIDs for one request, in float64: every beam's valid
    children, scored by log-softmax over those children (filter_first) or over all V_t (score_first),
    the best `beam_width` totals kept. Returns the final [(total, sid)] best first and, per step, the
    invalid mass of every beam entering that step."""
    leaves = [tuple(row) for row in bundle.index.leaf_sids().tolist()]
    weights, _ = model_fn(bundle, [request])
    beams = [(0.0, ())]
    masses = []
    for t in range(len(SIZES)):
        prefixes = torch.tensor([sid for _, sid in beams], dtype=torch.int64).reshape(len(beams), t)
        hidden = hidden_for(SIZES, torch.full((len(beams),), request), prefixes)
        logits = (hidden @ weights[t].T).double()
        candidates, step_masses = [], []
        for (total, sid), row in zip(beams, logits, strict=True):
            valid = sorted({leaf[t] for leaf in leaves if leaf[:t] == sid})
            all_lp = torch.log_softmax(row, 0)
            step_masses.append(1.0 - float(all_lp[valid].exp().sum()))
            lp = torch.log_softmax(row[valid], 0) if order == "filter_first" else all_lp[valid]
            candidates += [(total + float(v), (*sid, tok)) for tok, v in zip(valid, lp, strict=True)]
        masses.append(step_masses)
        beams = sorted(candidates, key=lambda c: -c[0])[:beam_width]
    return beams, masses


def test_narrow_beam_report_matches_a_reference_beam_search(bundle):
    """A beam of 3 keeps 3 of the 20 SIDs: the report must equal a hand-run beam search of each order."""
    requests, width, ks = list(range(12)), 3, (1, 3)
    report = compare_orders(bundle, model_fn, Requests(requests, None), beam_width=width, ks=ks)
    sids = map(tuple, bundle.index.leaf_sids().tolist())
    item_of = dict(zip(sids, bundle.items().to_pylist(), strict=True))
    tops, mass, gap, spread = {}, {}, {}, {}
    for order in ("filter_first", "score_first"):
        runs = [reference_beam_search(bundle, r, order, width) for r in requests]
        tops[order] = [[item_of[sid] for _, sid in beams] for beams, _ in runs]  # unique SIDs: 1 item each
        mass[order] = [np.concatenate([m[t] for _, m in runs]) for t in range(len(SIZES))]
        gap[order] = {k: np.mean([b[0][0] - b[k - 1][0] for b, _ in runs]) for k in ks}
        spread[order] = [
            np.mean([np.ptp(-np.log1p(-np.array(m[t]))) for _, m in runs if len(m[t]) > 1] or [0.0])
            for t in range(len(SIZES))
        ]
    ff, sf = tops["filter_first"], tops["score_first"]
    for k in ks:
        shares = [len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ff, sf, strict=True)]
        assert report.overlap[k] == pytest.approx(np.mean(shares))
        differ = [set(a[:k]) != set(b[:k]) for a, b in zip(ff, sf, strict=True)]
        assert report.requests_differing[k] == pytest.approx(np.mean(differ))
    assert 0 < report.requests_differing[1] < 1  # the orders disagree on some requests, not on all
    for order in ("filter_first", "score_first"):
        assert report.invalid_mass[order] == pytest.approx([m.mean() for m in mass[order]], abs=1e-5)
        assert report.invalid_mass_max[order] == pytest.approx([m.max() for m in mass[order]], abs=1e-5)
        assert report.boost_spread[order] == pytest.approx(spread[order], abs=1e-4)
        assert report.score_gap[order] == pytest.approx(gap[order], abs=1e-4)
    assert report.beam_width == 3 and report.recall == {} and report.with_targets == 0
    assert json.loads(json.dumps(report.to_dict()))["overlap"].keys() == {"1", "3"}


def test_valid_token_mask_dense_and_sparse(bundle):
    leaves = bundle.index.leaf_sids()
    for t, table in enumerate(bundle.index.steps):
        prefixes, rows = np.unique(leaves[:, :t], axis=0, return_inverse=True)
        rows = np.asarray(rows).reshape(-1)
        distinct = np.unique(rows)
        mask = valid_token_mask(table, np.concatenate([distinct, [-1]]))
        for r in distinct:
            expect = np.zeros(SIZES[t], dtype=bool)
            expect[leaves[rows == r, t]] = True
            assert np.array_equal(mask[r], expect)
        assert not mask[-1].any()


_OK = [torch.zeros(v, 3) for v in SIZES]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([_OK[0], torch.zeros(5, 3), _OK[2]], r"weights\[1\] has shape \[5, 3\], expected \[4, d\]"),
        (_OK[:2], "2 per-step output layers"),
        ([_OK[0], torch.zeros(4, 2), _OK[2]], "disagree on d"),
        ([(_OK[0], torch.zeros(3)), _OK[1], _OK[2]], r"bias of weights\[0\]"),
    ],
)
def test_bad_model_weights_are_refused_before_decoding(bundle, weights, message):
    def bad_model(bundle, request_ids):
        def step_fn(step, prefixes, batch):
            raise AssertionError("decoding started with weights that do not fit the bundle")

        return weights, step_fn

    with pytest.raises(InputError, match=f"^model: (.* )?{message}"):
        compare_orders(bundle, bad_model, Requests([0], None), beam_width=2, ks=(1,))


def test_load_model_fn_errors():
    assert load_model_fn("tests.compare_models:model_fn") is model_fn
    for spec, msg in [
        ("tests.compare_models", "expected module:function"),
        ("no_such_module_zg:fn", "cannot import module"),
        ("tests.compare_models:nope", "has no attribute"),
        ("tests.compare_models:NOT_CALLABLE", "not callable"),
    ]:
        with pytest.raises(InputError, match=msg):
            load_model_fn(spec)


def test_read_requests_and_parse_ks(tmp_path):
    f = tmp_path / "r.parquet"
    pq.write_table(pa.table({"request_id": [3, 1], "target_item": [None, 104]}), f)
    req = read_requests(f)
    assert req.ids == [3, 1] and req.targets == [None, 104]
    pq.write_table(pa.table({"user": [3, 1]}), f)
    with pytest.raises(InputError, match="missing column 'request_id'"):
        read_requests(f)
    assert parse_ks("20,1,5,5") == [1, 5, 20]
    with pytest.raises(InputError):
        parse_ks("1,x")


def _requests_file(tmp_path, columns):
    f = tmp_path / "requests.parquet"
    pq.write_table(pa.table(columns), f)
    return str(f)


def test_cli_compare_json_and_table(bundle, tmp_path):
    req = _requests_file(tmp_path, {"request_id": [0, 1, 2], "target_item": [100, 101, 102]})
    args = ["compare", str(bundle.path), "--model", "tests.compare_models:model_fn", "--requests", req]
    res = runner.invoke(app, args + ["--k", "1,5", "--beam-width", "8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["requests"] == 3 and out["beam_width"] == 8 and set(out["overlap"]) == {"1", "5"}
    assert set(out["recall"]) == {"filter_first", "score_first", "unconstrained"}
    res = runner.invoke(app, args + ["--k", "1,5"])
    assert res.exit_code == 0, res.output
    assert "overlap" in res.stdout and "invalid probability mass" in res.stdout


@pytest.mark.parametrize(
    ("model", "columns", "message"),
    [
        ("no_such_module_zg:fn", {"request_id": [0]}, "cannot import module"),
        ("tests.compare_models:missing", {"request_id": [0]}, "has no attribute"),
        ("tests.compare_models:wrong_shape_model", {"request_id": [0]}, r"weights[2] has shape [3, 8]"),
        ("tests.compare_models:wrong_length_model", {"request_id": [0]}, "2 per-step output layers"),
        ("tests.compare_models:model_fn", {"user_id": [0]}, "missing column 'request_id'"),
        ("tests.compare_models:random_model", {"request_id": [0, 1]}, "function must be deterministic"),
    ],
)
def test_cli_compare_errors_exit_2(bundle, tmp_path, model, columns, message):
    req = _requests_file(tmp_path, columns)
    res = runner.invoke(app, ["compare", str(bundle.path), "--model", model, "--requests", req])
    assert res.exit_code == 2, res.output
    lines = stderr_lines(res.stderr)
    assert len(lines) == 1 and message in lines[0], res.stderr
