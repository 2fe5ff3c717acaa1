"""`zerogr rebuild` with the quality gate (--gate-model/--gate-sid-map/--gate-requests), on two tiny BART
models saved with save_pretrained that differ only in final_logits_bias on the tokens that spell no code:

- clean: -60 there. The catalog holds every code combination and every step shares one code vocabulary
  (offsets all 3), so every code is a valid child of every prefix: the model puts no mass on invalid
  tokens, filter-first equals score-first, the gate passes and records filter_first.
- leaky: +2 there: most of the mass sits on invalid tokens, differently per beam, so filter-first's
  renormalisation reorders the beams; overlap@5 is 0.875 < 0.995, the gate records score_first, and
  rebuild promotes anyway and exits 10.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.bundle import open_bundle
from zerogr_build.bundle.quality import find_quality
from zerogr_build.runtime.decoder import Decoder

from .cli_runs import TUNE_ARGS, run_rebuild

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
GATE_ARGS = "--k 1,5 --beam-width 5 --batch-size 16"
V, L, VOCAB, OFFSET = 4, 3, 40, 3  # codes are tokens 3..6 at every step


def _bart(invalid_bias: float):
    import torch
    import transformers

    torch.manual_seed(5)
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        init_std=0.3, pad_token_id=0, eos_token_id=1, bos_token_id=2, decoder_start_token_id=2,
        forced_bos_token_id=None, forced_eos_token_id=None,
    )  # fmt: skip
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        not_a_code = torch.ones(VOCAB, dtype=torch.bool)
        not_a_code[OFFSET : OFFSET + V] = False
        model.final_logits_bias.zero_()
        model.final_logits_bias[0, not_a_code] = invalid_bias
    return model


@pytest.fixture(scope="module")
def gate_inputs(tmp_path_factory):
    """catalog.parquet (all 64 SIDs), sid_map.json, requests.parquet (16 requests), clean/ and leaky/."""
    from zerogr_build.integrations.sid_map import SidMap

    root = tmp_path_factory.mktemp("gate")
    sids = [list(s) for s in itertools.product(range(V), repeat=L)]
    pq.write_table(pa.table({"item_id": np.arange(len(sids)), "sid": sids}), root / "catalog.parquet")
    SidMap.from_offsets([OFFSET] * L).save(root / "sid_map.json")
    rng = np.random.default_rng(0)
    ids = [rng.integers(OFFSET + V, VOCAB, rng.integers(2, 7)).tolist() for _ in range(16)]
    pq.write_table(
        pa.table({"input_ids": ids, "target_item": rng.integers(0, 64, 16)}), root / "requests.parquet"
    )
    for name, bias in (("clean", -60.0), ("leaky", 2.0)):
        _bart(bias).save_pretrained(root / name)
    return root


def _rebuild(root, out, model_dir, *extra):
    args = [
        root / "catalog.parquet", "--out", out, "--codebook-sizes", "4,4,4", "--device", "cpu",
        "--tune-args", TUNE_ARGS, "--gate-model", model_dir, "--gate-sid-map", root / "sid_map.json",
        "--gate-requests", root / "requests.parquet", "--gate-args", GATE_ARGS, *extra,
    ]  # fmt: skip
    return run_rebuild(*args, cwd=root)


def test_a_model_without_mass_on_invalid_codes_passes_and_records_filter_first(gate_inputs, tmp_path):
    out = tmp_path / "bundles"
    done = _rebuild(gate_inputs, out, gate_inputs / "clean", "--model-version", "bart-clean")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str((out / "v000001").resolve())
    assert (out / "LATEST").read_text() == "v000001\n"
    assert "quality gate passed" in done.stderr
    bundle = open_bundle(out)
    record = find_quality(bundle, "bart-clean")
    assert record.passed and record.order == "filter_first" and record.overlap == {1: 1.0, 5: 1.0}
    assert record.min_overlap == 0.995 and bundle.files("quality/") == ["quality/bart-clean.json"]
    assert max(record.data["report"]["invalid_mass"]["filter_first"]) < 1e-6  # no mass on invalid codes
    layers = [np.zeros((V, 4), dtype=np.float32)] * L
    assert Decoder(bundle, layers, order="auto").quality.model_version == "bart-clean"


def test_a_model_with_mass_on_invalid_codes_records_score_first_promotes_and_exits_10(gate_inputs, tmp_path):
    from zerogr_build.integrations import hf

    out = tmp_path / "bundles"
    done = _rebuild(gate_inputs, out, gate_inputs / "leaky")
    assert done.returncode == 10, done.stderr
    assert done.stdout.strip() == str((out / "v000001").resolve())  # promoted, so printed
    assert "QUALITY GATE FAILED" in done.stderr
    assert (out / "LATEST").read_text() == "v000001\n"  # the index is valid: promoted anyway
    bundle = open_bundle(out)
    model = hf.load_hf_model(gate_inputs / "leaky")
    tag = hf.model_hash(model)  # no --model-version: the record is filed under the model's hash
    record = find_quality(bundle, tag)
    assert not record.passed and record.order == "score_first" and record.overlap[5] < 0.995
    assert record.data["model"]["model"] == str(gate_inputs / "leaky")
    gen = hf.SidGenerator(model, bundle, hf.SidMap.load(gate_inputs / "sid_map.json"), order="auto")
    assert gen.decoder.order == "score_first" and gen.decoder.quality.model_version == tag
    manifest = json.loads((out / "v000001" / "manifest.json").read_text())
    assert any(name.startswith("plans/") for name in manifest["files"])  # tuned as well


def test_a_gate_that_cannot_run_does_not_promote(gate_inputs, tmp_path):
    out = tmp_path / "bundles"
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    done = _rebuild(gate_inputs, out, empty)
    assert done.returncode == 11, done.stderr
    assert (
        done.stdout == "" and "quality gate could not run" in done.stderr and "no config.json" in done.stderr
    )
    assert "removed the unpromoted version v000001" in done.stderr
    assert not (out / "v000001").exists() and not (out / "LATEST").exists()  # no orphan left behind
    half_gate = ("--out", out, "--gate-model", "x")
    half = run_rebuild(gate_inputs / "catalog.parquet", *half_gate, cwd=tmp_path, timeout=60)
    assert half.returncode == 2 and "--gate-requests" in half.stderr
    missing = run_rebuild(
        gate_inputs / "catalog.parquet", "--out", out, "--codebook-sizes", "4,4,4", "--gate-model", empty,
        "--gate-sid-map", tmp_path / "nope.json", "--gate-requests", gate_inputs / "requests.parquet",
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "--gate-sid-map" in missing.stderr and "no such file" in missing.stderr
    assert not list(out.glob("v*"))  # set-up errors are found before anything is built


def test_a_failed_gate_still_pushes_the_promoted_version_to_the_fleet(gate_inputs, tmp_path, s3_bucket):
    """Exit 10 means promoted with score_first recorded: --push publishes it, so the fleet gets the record
    for the model that failed instead of keeping a version without one."""
    import boto3

    out = tmp_path / "bundles"
    done = _rebuild(gate_inputs, out, gate_inputs / "leaky", "--push", f"s3://{s3_bucket}/fleet")
    assert done.returncode == 10, done.stderr
    s3 = boto3.client("s3")
    assert s3.get_object(Bucket=s3_bucket, Key="fleet/LATEST")["Body"].read() == b"v000001\n"
    pushed = json.loads(s3.get_object(Bucket=s3_bucket, Key="fleet/v000001/manifest.json")["Body"].read())
    assert any(name.startswith("quality/") for name in pushed["files"])
