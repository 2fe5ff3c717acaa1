"""Plan reuse: `zerogr tune --reuse-from PREV` copies PREV's plan when the documented rule holds, measures
otherwise, and the copy is amended like a measured plan (verify passes)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerogr_build import __version__
from zerogr_build.base.device import device_info, device_key
from zerogr_build.bundle import add_bundle_files, load_manifest, publish_bundle, verify_bundle
from zerogr_build.cli import app
from zerogr_build.config import TuneSettings
from zerogr_build.index import build_index
from zerogr_build.tune import tune_bundle
from zerogr_build.tune.reuse import REUSE_TOLERANCE, measured_settings, reuse_plan, reuse_refusal

SIZES = (16, 16, 16)
TUNE = TuneSettings(batch_sizes=(2,), beam_width=4, warmup=0, iters=1, hidden_dim=8)
TUNE_ARGS = ["--batch-sizes", "2", "--beam-width", "4", "--warmup", "0", "--iters", "1", "--hidden-dim", "8"]


def sids_of(seed: int, n: int = 800) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 16, size=(n, 3))


def grown(sids: np.ndarray) -> np.ndarray:
    """The same SIDs plus 300 items under existing prefixes with new last tokens: step 2 gains children."""
    extra = sids[:300].copy()
    extra[:, 2] = np.random.default_rng(99).integers(0, 16, size=300)
    return np.concatenate([sids, extra])


def publish(out, sids, offset: int = 0):
    items = pa.array(offset + np.arange(len(sids)), type=pa.int64())
    return publish_bundle(build_index(sids, SIZES), items, out).path


# ------------------------------------------------------------------------------------------ the rule


def base_case():
    info = {
        "type": "cpu",
        "name": "CPU X",
        "compute_capability": None,
        "arch": "x86_64",
        "threads": 2,
        "driver": None,
        "cuda_runtime": None,
        "torch": "2.13",
        "cupy": None,
    }
    wanted = {
        "batch_sizes": [1, 8],
        "beam_width": 16,
        "dtypes": ["fp32"],
        "hidden_dim": 128,
        "order": "filter_first",
    }
    steps = [
        {"step": 0, "format": "dense", "rows": 1, "nnz": 16, "max_slots": 16},
        {"step": 1, "format": "sparse", "rows": 16, "nnz": 200, "max_slots": 15},
        {"step": 2, "format": "sparse", "rows": 200, "nnz": 700, "max_slots": 9},
    ]
    manifest = {"version": 1, "codebook_sizes": list(SIZES), "steps": steps}
    measured = {**wanted, "warmup": 3, "seed": 0}
    plan = {"zerogr_version": __version__, "device": dict(info), "settings": measured}
    return plan, manifest, copy.deepcopy(manifest), info, wanted


def test_the_same_shapes_device_and_settings_reuse():
    plan, prev, new, info, wanted = base_case()
    assert reuse_refusal(plan, prev, new, info, wanted) is None


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda p, n, i, w: p.update(zerogr_version="0.0.1"), "zerogr 0.0.1"),
        (lambda p, n, i, w: p.pop("zerogr_version"), "unknown version"),
        (lambda p, n, i, w: i.update(name="CPU Y"), "device name"),
        (lambda p, n, i, w: i.update(threads=4), "device threads"),
        (lambda p, n, i, w: i.update(torch="2.14"), "device torch"),
        (lambda p, n, i, w: w.update(beam_width=32), "beam_width"),
        (lambda p, n, i, w: w.update(dtypes=["fp32", "bf16"]), "dtypes"),
        (lambda p, n, i, w: w.update(batch_sizes=[1, 8, 32]), "batch_sizes"),
        (lambda p, n, i, w: w.update(hidden_dim=64), "hidden_dim"),
        (lambda p, n, i, w: n.update(codebook_sizes=[16, 16, 32]), "codebook sizes"),
        (lambda p, n, i, w: n["steps"][2].update(format="dense"), "step 2 format"),
        (lambda p, n, i, w: n["steps"][2].update(rows=221), "step 2 rows changed by +10.5%"),
        (lambda p, n, i, w: n["steps"][1].update(nnz=179), "step 1 nnz changed by -10.5%"),
        (lambda p, n, i, w: n["steps"][2].update(max_slots=10), "step 2 max_slots changed by +11.1%"),
    ],
)
def test_each_broken_rule_is_named(change, words):
    plan, prev, new, info, wanted = base_case()
    change(plan, new, info, wanted)
    refusal = reuse_refusal(plan, prev, new, info, wanted)
    assert refusal is not None and words in refusal


def test_warmup_iters_and_seed_do_not_matter():
    plan, prev, new, info, wanted = base_case()
    plan["settings"].update(warmup=0, iters=99, seed=5)
    assert reuse_refusal(plan, prev, new, info, wanted) is None


@settings(max_examples=200, deadline=None)
@given(
    old=st.integers(1, 10_000),
    new=st.integers(1, 12_000),
    tol=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
    field=st.sampled_from(["rows", "nnz", "max_slots"]),
)
def test_tolerance_matches_the_documented_inequality(old, new, tol, field):
    """Refused exactly when |new - old| > tol * old (brute force in exact integer arithmetic)."""
    plan, prev, cur, info, wanted = base_case()
    prev["steps"][2][field], cur["steps"][2][field] = old, new
    allowed = abs(new - old) * 100 <= round(tol * 100) * old
    assert (reuse_refusal(plan, prev, cur, info, wanted, tol) is None) == allowed


# ------------------------------------------------------------------------------------------ on disk


def test_reuse_copies_the_plan_with_the_amend_protocol_and_verify_passes(tmp_path):
    out = tmp_path / "bundles"
    v1 = publish(out, sids_of(1))
    measured = tune_bundle(v1, "cpu", TUNE)
    v2 = publish(out, sids_of(1), offset=5000)  # a model update with the same SIDs: the same shapes
    outcome = reuse_plan(v2, v1, "cpu", TUNE)
    assert outcome.reused and outcome.refusal is None
    key = device_key(device_info("cpu"))
    assert outcome.plan_path == v2 / f"plans/{key}.json"
    written = json.loads(outcome.plan_path.read_text())
    assert written["entries"] == measured.plan["entries"]
    assert written["bundle_version"] == 2
    assert written["reused_from"]["bundle_version"] == 1 and written["reused_from"]["measured_in"] == 1
    assert f"plans/{key}.json" in load_manifest(v2)["files"]
    assert verify_bundle(v2)["ok"]
    assert not (v2 / ".journal.json").exists() and not list(v2.rglob(".tmp-*"))

    v3 = publish(out, sids_of(1), offset=9000)  # reusing a reused plan keeps where it was measured
    again = reuse_plan(v3, v2, "cpu", TUNE)
    assert again.reused and again.plan["reused_from"] == {
        **again.plan["reused_from"],
        "bundle_version": 2,
        "measured_in": 1,
    }
    assert verify_bundle(v3)["ok"]


def test_reuse_is_refused_and_nothing_written_when_shapes_changed(tmp_path):
    out = tmp_path / "bundles"
    v1 = publish(out, sids_of(1))
    tune_bundle(v1, "cpu", TUNE)
    v2 = publish(out, grown(sids_of(1)))
    before = (v2 / "manifest.json").read_bytes()
    outcome = reuse_plan(v2, v1, "cpu", TUNE)
    assert not outcome.reused and "step 2 nnz changed by +" in outcome.refusal
    assert (v2 / "manifest.json").read_bytes() == before
    wider = TuneSettings(**{**TUNE.__dict__, "beam_width": 8})
    v3 = publish(out, sids_of(1))
    assert "beam_width" in reuse_plan(v3, v1, "cpu", wider).refusal


def test_a_damaged_previous_plan_is_a_refusal_not_an_error(tmp_path):
    out = tmp_path / "bundles"
    v1 = publish(out, sids_of(1))
    result = tune_bundle(v1, "cpu", TUNE)
    raw = bytearray(result.plan_path.read_bytes())
    raw[raw.index(b'"entries"') + 2] ^= 0x01  # still the right size: only the checksum can tell
    result.plan_path.write_bytes(bytes(raw))
    v2 = publish(out, sids_of(1))
    outcome = reuse_plan(v2, v1, "cpu", TUNE)
    assert not outcome.reused and "sha256" in outcome.refusal
    assert not outcome.reused and not [n for n in load_manifest(v2)["files"] if n.startswith("plans/")]
    missing = reuse_plan(v2, tmp_path / "nope", "cpu", TUNE)
    assert not missing.reused and "no such bundle" in missing.refusal
    assert "being tuned" in reuse_plan(v2, v2, "cpu", TUNE).refusal


def test_tune_cli_reuse_from_and_retune(tmp_path):
    out = tmp_path / "bundles"
    v1 = publish(out, sids_of(1))
    runner = CliRunner()
    first = runner.invoke(app, ["tune", str(v1), "--device", "cpu", *TUNE_ARGS, "--json"])
    assert first.exit_code == 0, first.output
    v2 = publish(out, sids_of(1))
    reused = runner.invoke(
        app, ["tune", str(v2), "--device", "cpu", *TUNE_ARGS, "--reuse-from", str(out / "v000001"), "--json"]
    )
    assert reused.exit_code == 0, reused.output
    summary = json.loads(reused.stdout)
    assert summary["reused_from"] == 1 and summary["reuse_refused"] is None
    assert "reused the plan of" in reused.stderr
    assert verify_bundle(v2)["ok"]

    v3 = publish(out, sids_of(1))
    forced = runner.invoke(
        app, ["tune", str(v3), "--device", "cpu", *TUNE_ARGS, "--reuse-from", str(v1), "--retune", "--json"]
    )
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["reused_from"] is None
    assert "reused_from" not in json.loads((v3 / json.loads(forced.stdout)["plan"]).read_text())

    v4 = publish(out, grown(sids_of(1)))
    refused = runner.invoke(
        app, ["tune", str(v4), "--device", "cpu", *TUNE_ARGS, "--reuse-from", str(v1), "--json"]
    )
    assert refused.exit_code == 0, refused.output
    assert json.loads(refused.stdout)["reused_from"] is None
    assert "not reusing the plan" in refused.stderr
    assert "changed by" in json.loads(refused.stdout)["reuse_refused"]
    assert verify_bundle(v4)["ok"]


def test_measured_settings_match_what_tune_records(tmp_path):
    out = tmp_path / "bundles"
    v1 = publish(out, sids_of(1))
    plan = tune_bundle(v1, "cpu", TUNE).plan
    wanted = measured_settings(TUNE, "cpu", TUNE.hidden_dim)
    assert {k: plan["settings"][k] for k in wanted} == wanted
    assert plan["zerogr_version"] == __version__
    assert REUSE_TOLERANCE == 0.10


@pytest.mark.parametrize(
    ("field", "odd"),
    [("reused_from", "v000000"), ("reused_from", 5), ("reused_from", [1]),
     ("reused_from", {"measured_in": "x"}), ("bundle_version", "one"), ("created_at", {"when": 1})],
)  # fmt: skip
def test_any_value_in_an_informational_field_of_prev_reuses_or_refuses_never_crashes(tmp_path, field, odd):
    """PREV's plan is valid but an informational field (which readers must not need) holds an odd JSON
    value: the plan is reused and the odd value is not copied (it was an AttributeError, exit 1)."""
    out = tmp_path / "bundles"
    v1 = publish(out, sids_of(1))
    result = tune_bundle(v1, "cpu", TUNE)
    plan = json.loads(result.plan_path.read_text())
    plan[field] = odd
    name = result.plan_path.relative_to(v1).as_posix()
    add_bundle_files(v1, {name: (json.dumps(plan, indent=2) + "\n").encode()})
    v2 = publish(out, sids_of(1), offset=5000)
    outcome = reuse_plan(v2, v1, "cpu", TUNE)
    assert outcome.reused, outcome.refusal
    copied = outcome.plan["reused_from"]
    assert copied["bundle_version"] == 1
    assert copied["measured_in"] in (1, None) and copied["plan_created_at"] in (plan.get("created_at"), None)
    assert isinstance(copied["plan_created_at"], (str, type(None)))
    assert verify_bundle(v2)["ok"]
