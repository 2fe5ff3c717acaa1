"""Quality reproduction library: data parsing/split, residual k-means SIDs, metrics, model determinism."""

from __future__ import annotations

import math
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.movielens import data as qdata
from experiments.movielens.data import (
    Interactions,
    leave_one_out,
    parse_inter,
    parse_items,
    read_ml100k_wheel,
)
from experiments.movielens.fakes import synthetic_ml_files, write_fake_wheel
from experiments.movielens.sids import (
    add_collision_token,
    genre_features,
    kmeans,
    residual_kmeans,
    semantic_ids,
)
from zerogr_build.base.errors import InputError
from zerogr_build.compare.metrics import ndcg_at_k, overlap_at_k, recall_at_k, top_k_items

# ------------------------------------------------------------------------------------------------ data


def test_parse_and_split_by_timestamp():
    inter = parse_inter(
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        "7\t30\t5\t300\n7\t10\t3\t100\n7\t20\t4\t200\n7\t40\t1\t400\n"
        "8\t10\t2\t50\n8\t30\t2\t60\n"  # 2 events: dropped (min_events=3)
        "9\t20\t1\t10\n9\t40\t1\t10\n9\t10\t1\t5\n"  # tie at 10: file order decides
    )
    split = leave_one_out(inter)
    assert split.user_ids.tolist() == [7, 9]
    assert split.item_ids.tolist() == [10, 20, 30, 40]
    # user 7 by time: 10, 20, 30, 40 -> train [10, 20], valid 30, test 40
    assert split.train_sequences[0].tolist() == [0, 1]
    assert split.valid_targets[0] == 2 and split.test_targets[0] == 3
    assert split.test_histories[0].tolist() == [0, 1, 2]
    # user 9: 10 (t=5), 20 (t=10, first in file), 40 (t=10)
    assert split.train_sequences[1].tolist() == [0] and split.test_targets[1] == 3


def test_parse_items_and_genres():
    info = parse_items(
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "1\tToy Story\t1995\tAnimation Children's Comedy\n2\tHeat\t1995\tAction Crime\n"
    )
    assert info.item_ids.tolist() == [1, 2] and info.titles == ["Toy Story", "Heat"]
    g = genre_features(info.genres)
    assert g.shape == (2, 5) and g.sum(axis=1).tolist() == [3.0, 2.0]


def test_parse_inter_missing_column():
    with pytest.raises(InputError, match="timestamp"):
        parse_inter("user_id:token\titem_id:token\trating:float\n1\t2\t3\n", source="x.inter")


def test_wheel_reading_and_cache_without_network(tmp_path, monkeypatch):
    inter_text, item_text = synthetic_ml_files(n_users=5, n_items=8)
    wheel = write_fake_wheel(tmp_path / "recbole-1.2.1-py3-none-any.whl", inter_text, item_text)
    inter, info = read_ml100k_wheel(wheel)
    assert isinstance(inter, Interactions) and len(info.item_ids) == 8
    assert len(inter.users) == len(inter_text.strip().splitlines()) - 1

    def no_network(*a, **k):
        raise AssertionError("pip must not run when the wheel is cached")

    monkeypatch.setattr(qdata.subprocess, "run", no_network)
    assert qdata.fetch_recbole_wheel(tmp_path) == wheel
    with pytest.raises(InputError, match="not a recbole wheel"):
        read_ml100k_wheel(tmp_path / "missing.whl")
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("README", "not recbole")
    with pytest.raises(InputError, match="not a recbole wheel"):
        read_ml100k_wheel(other)


# ------------------------------------------------------------------------------------------------ SIDs


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an emptied cluster would divide by zero
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 120),
    dim=st.integers(1, 6),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    dup=st.integers(0, 3),
    seed=st.integers(0, 10_000),
)
def test_semantic_ids_unique_and_prefix_is_residual_code(n, dim, sizes, dup, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    if dup and n > 1:
        x[: min(dup + 1, n)] = x[0]  # identical embeddings must still get distinct SIDs
    sids, cb = semantic_ids(x, sizes, iters=10, seed=seed)
    assert sids.shape == (n, len(sizes) + 1)
    assert len(np.unique(sids, axis=0)) == n
    assert np.array_equal(sids[:, :-1], residual_kmeans(x, sizes, iters=10, seed=seed))
    for t, v in enumerate(cb):
        assert sids[:, t].min() >= 0 and sids[:, t].max() < v
    # last token = rank among items with the same code, in row order; its codebook = largest group
    codes = sids[:, :-1]
    for i in range(n):
        same_before = (codes[:i] == codes[i]).all(axis=1).sum()
        assert sids[i, -1] == same_before
    assert cb[-1] == sids[:, -1].max() + 1


def test_add_collision_token_hand_example():
    sids, last = add_collision_token(np.array([[1, 2], [0, 0], [1, 2], [1, 2], [0, 1]]))
    assert sids[:, -1].tolist() == [0, 0, 1, 2, 0] and last == 3


def test_kmeans_separates_clusters_deterministically():
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = np.concatenate([c + rng.normal(scale=0.1, size=(30, 2)) for c in centers])
    c1, l1 = kmeans(x, 3, seed=5)
    c2, l2 = kmeans(x, 3, seed=5)
    assert np.array_equal(l1, l2) and np.array_equal(c1, c2)
    for g in range(3):  # every true cluster maps to exactly one label
        assert len(set(l1[g * 30 : (g + 1) * 30])) == 1
    assert len(set(l1)) == 3
    _, labels = kmeans(x[:2], 5)
    assert sorted(labels.tolist()) == [0, 1]  # k capped at N, no empty clusters


# --------------------------------------------------------------------------------------------- metrics


def test_metrics_hand_computed():
    ff = [["a", "b", "c"], ["x", "y"], []]
    sf = [["b", "a", "d"], ["z", "x"], ["q"]]
    # request 3: filter-first found nothing where score-first found "q": a miss (0), never a pass
    assert overlap_at_k(ff, sf, 1) == pytest.approx((0 + 0 + 0) / 3)
    assert overlap_at_k(ff, sf, 2) == pytest.approx((1.0 + 0.5 + 0) / 3)
    assert overlap_at_k(ff, sf, 3) == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)
    assert overlap_at_k([["a"], []], [["a"], []], 2) == 1.0  # both empty: nothing to compare, skipped
    assert math.isnan(overlap_at_k([[], []], [[], []], 1))  # no request compared: not 1.0
    targets = ["c", "x", "q"]
    assert recall_at_k(ff, targets, 1) == pytest.approx(1 / 3)
    assert recall_at_k(ff, targets, 3) == pytest.approx(2 / 3)
    assert ndcg_at_k(ff, targets, 3) == pytest.approx((1 / math.log2(4) + 1.0 + 0.0) / 3)
    assert ndcg_at_k(ff, targets, 2) == pytest.approx(1 / 3)


def test_top_k_items_dedupes_in_beam_order():
    beams = [[["a", "b"], ["b"], [], ["c"]], [[], []]]
    assert top_k_items(beams, 2) == [["a", "b"], []]
    assert top_k_items(beams, 5) == [["a", "b", "c"], []]


# ----------------------------------------------------------------------------------------------- model


def _tiny_setup():
    from experiments.movielens.model import ModelConfig

    inter_text, _ = synthetic_ml_files(n_users=12, n_items=20, seed=3)
    split = leave_one_out(parse_inter(inter_text))
    sids, sizes = semantic_ids(np.random.default_rng(0).normal(size=(len(split.item_ids), 4)), (3, 3))
    cfg = ModelConfig(
        d_model=8, n_heads=2, enc_layers=1, dec_layers=1, max_history=6, epochs=2, batch_windows=4
    )
    return split, sids, sizes, cfg


def test_training_is_deterministic_and_step_fn_paths_agree():
    from experiments.movielens.model import RequestEncoder, train_model

    split, sids, sizes, cfg = _tiny_setup()
    a = train_model(split.train_sequences, sids, sizes, cfg)
    b = train_model(split.train_sequences, sids, sizes, cfg)
    for pa_, pb_ in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa_, pb_)
    enc = RequestEncoder(a, split.test_histories[:3], sids)
    prefixes = torch.as_tensor(sids[[0, 1, 2, 3, 4, 5], :2])
    packed = enc.step_fn(2, prefixes, torch.tensor([2, 0, 1, 0, 1, 2]))  # equal beams per request
    single = enc.step_fn(2, prefixes[:5], torch.tensor([2, 0, 1, 0, 1]))  # uneven: one memory per beam
    assert packed.shape == (6, cfg.d_model)
    assert torch.allclose(packed[:5], single, atol=1e-5)
    # the hidden vector a beam gets does not depend on which other beams share its request
    alone = enc.step_fn(2, prefixes[:1], torch.tensor([2]))
    assert torch.allclose(alone[0], packed[0], atol=1e-5)
    weights = a.output_weights()
    assert [tuple(w.shape) for w in weights] == [(v, cfg.d_model) for v in sizes]


def test_saved_run_reloads_for_zerogr_compare(tmp_path, monkeypatch):
    from experiments.movielens import ml100k
    from experiments.movielens.model import train_model
    from experiments.movielens.run import model_fn_for, save_run

    split, sids, sizes, cfg = _tiny_setup()
    model = train_model(split.train_sequences, sids, sizes, cfg)
    histories = {int(u): h for u, h in zip(split.user_ids, split.test_histories, strict=True)}
    _, requests = save_run(tmp_path, model, sids, histories, {int(split.user_ids[0]): 5})
    monkeypatch.setenv("ZEROGR_ML100K_RUN", str(tmp_path))
    ids = [int(u) for u in split.user_ids[:3]]
    w_new, fn_new = ml100k.model_fn(None, ids)
    w_old, fn_old = model_fn_for(model, histories, sids)(None, ids)
    for x, y in zip(w_new, w_old, strict=True):
        assert torch.equal(x, y)
    prefixes, batch = torch.as_tensor(sids[:3, :1]), torch.tensor([0, 1, 2])
    assert torch.equal(fn_new(1, prefixes, batch), fn_old(1, prefixes, batch))
    import pyarrow.parquet as pq

    table = pq.read_table(requests).to_pydict()
    assert table["request_id"] == [int(u) for u in split.user_ids]
    assert table["target_item"][0] == 5 and table["target_item"][1] is None
