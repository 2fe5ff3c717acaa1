"""The quality gate: `zerogr compare --min-overlap/--max-recall-gap/--record`, the quality/<key>.json record,
Decoder(order="auto") following it, SidMap's JSON form, and `compare --hf-model` (tiny models, no
downloads). scripts/rebuild.sh with the gate: tests/test_quality_gate_rebuild.py."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.compare_models import model_fn
from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.bundle import add_bundle_files, open_bundle, publish_bundle, verify_bundle
from zerogr_build.bundle.quality import (
    MAX_QUALITY_BYTES,
    find_quality,
    load_quality,
    quality_bytes,
    quality_file_name,
    quality_key,
)
from zerogr_build.cli import app
from zerogr_build.cli.compare import GATE_FAILED_EXIT
from zerogr_build.compare import (
    CompareReport,
    GateThresholds,
    Requests,
    compare_orders,
    decide,
    quality_document,
    read_token_requests,
    record_quality,
)
from zerogr_build.index import build_index
from zerogr_build.integrations.sid_map import SidMap
from zerogr_build.pipeline import inspect_bundle
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.testing import SeededModel, stderr_lines

SIZES = (4, 4, 2)
TAG = "m-1"
runner = CliRunner()


@pytest.fixture
def bundle_dir(tmp_path):
    """20 distinct SIDs of the 32 possible, item ids 100 + row, model version "m-1"."""
    rng = np.random.default_rng(7)
    codes = np.array(np.unravel_index(rng.choice(np.prod(SIZES), 20, replace=False), SIZES)).T
    index = build_index(codes, SIZES, step_formats="0=dense,1=sparse,2=sparse")
    items = pa.array(100 + np.arange(20), type=pa.int64())
    return publish_bundle(index, items, tmp_path / "b", manifest_fields={"model_version": TAG}).path


def _requests(tmp_path, n=12, targets=True):
    path = tmp_path / "requests.parquet"
    columns = {"request_id": list(range(n))}
    if targets:
        columns["target_item"] = [100 + (3 * i) % 20 for i in range(n)]
    pq.write_table(pa.table(columns), path)
    return str(path)


def _compare(bundle_dir, req, *extra):
    args = ["compare", str(bundle_dir), "--model", "tests.compare_models:model_fn", "--requests", req]
    return runner.invoke(app, [*args, "--k", "1,3", "--beam-width", "3", *extra])


def _report(overlap, recall=None):
    ks = sorted(overlap)
    return CompareReport(
        requests=4, beam_width=max(ks), ks=ks, overlap=overlap, requests_differing=dict.fromkeys(ks, 0.0),
        recall=recall or {}, ndcg={}, invalid_mass={}, invalid_mass_max={}, boost_spread={}, score_gap={},
        unconstrained_invalid_rate=0.0, with_targets=4 if recall else 0, seconds=0.0,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- decide
def test_decide_takes_the_worst_k_and_the_recall_lost_by_filter_first():
    passed = decide(_report({1: 1.0, 5: 0.996}), GateThresholds(0.995))
    assert passed.passed and passed.order == "filter_first" and passed.worst_overlap_k == 5
    failed = decide(_report({1: 0.99, 5: 1.0}), GateThresholds(0.995))
    assert not failed.passed and failed.order == "score_first" and "overlap@1 = 0.9900" in failed.reasons[0]
    recall = {"filter_first": {1: 0.30, 5: 0.50}, "score_first": {1: 0.32, 5: 0.45}}
    loses = decide(_report({1: 1.0, 5: 1.0}, recall), GateThresholds(0.9, max_recall_gap=0.01))
    assert not loses.passed and loses.recall_gap_k == 1 and loses.recall_gap == pytest.approx(0.02)
    gains_only = {"filter_first": {1: 0.40, 5: 0.60}, "score_first": {1: 0.30, 5: 0.50}}
    ok = decide(_report({1: 1.0, 5: 1.0}, gains_only), GateThresholds(0.9, max_recall_gap=0.0))
    assert ok.passed and ok.recall_gap == pytest.approx(-0.10)
    with pytest.raises(InputError, match="needs requests with a target_item"):
        decide(_report({1: 1.0}), GateThresholds(0.9, max_recall_gap=0.1))
    for bad in (1.5, -0.1, math.nan):
        with pytest.raises(InputError, match="must be a number in"):
            GateThresholds(bad)


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_gate_records_the_decision_and_decoder_auto_follows_it(bundle_dir, tmp_path):
    req = _requests(tmp_path)
    report = compare_orders(
        open_bundle(bundle_dir), model_fn, Requests(list(range(12)), None), beam_width=3, ks=(1, 3)
    )
    assert 0 < min(report.overlap.values()) < 1  # the orders disagree here: the gate has a real decision
    model = SeededModel(SIZES, 1, batch_size=2)

    def auto_order(**kw):
        return Decoder(open_bundle(bundle_dir), model.layers(), order="auto", **kw)

    assert auto_order().order == "filter_first" and auto_order().quality is None  # no record yet
    res = _compare(bundle_dir, req, "--min-overlap", "1.0", "--record")
    assert res.exit_code == GATE_FAILED_EXIT == 10, res.output
    assert "quality gate FAILED" in res.stdout and "recorded order score_first for model m-1" in res.stdout
    record = find_quality(open_bundle(bundle_dir), TAG)
    assert record.order == "score_first" and not record.passed and record.min_overlap == 1.0
    assert record.overlap == pytest.approx(report.overlap)
    dec = auto_order()
    assert dec.order == "score_first" and dec.quality.model_version == TAG
    assert auto_order(model_version="other-model").order == "filter_first"  # its own record: none
    explicit = Decoder(open_bundle(bundle_dir), model.layers())
    assert explicit.order == "filter_first"  # the default order is unchanged by a record
    assert torch.equal(
        dec.search(model.step_fn, 2, 3).sids, explicit.search(model.step_fn, 2, 3, order="score_first").sids
    )

    res = _compare(bundle_dir, req, "--min-overlap", "0", "--max-recall-gap", "1", "--record", "--json")
    assert res.exit_code == 0, res.output
    gate = json.loads(res.stdout)["gate"]
    assert (
        gate["passed"] and gate["order"] == "filter_first" and gate["recorded"]["file"] == "quality/m-1.json"
    )
    assert auto_order().order == "filter_first" and auto_order().quality.passed
    verified = verify_bundle(bundle_dir)
    assert verified["quality"] == {TAG: "filter_first"} and verified["unlisted_files"] == []
    (row,) = inspect_bundle(bundle_dir)["quality"]
    assert row["order"] == "filter_first" and row["model_version"] == TAG and row["min_overlap"] == 0
    res = runner.invoke(app, ["inspect", str(bundle_dir)])
    assert "quality gate, model m-1: order filter_first (passed" in res.stdout

    res = _compare(bundle_dir, req, "--min-overlap", "0.1", "--model-tag", "t5@2026/01", "--record")
    assert res.exit_code == 0, res.output
    odd = quality_file_name("t5@2026/01")
    assert odd.startswith("quality/tag-") and odd in open_bundle(bundle_dir).manifest["files"]
    assert auto_order(model_version="t5@2026/01").quality.model_version == "t5@2026/01"


def test_a_gate_that_compares_nothing_is_exit_2_and_records_nothing(bundle_dir, tmp_path):
    """An --available file naming no catalog item: filter-first decodes nothing for every request, which is
    no evidence that the orders agree (it was overlap 1.0 and a passing gate)."""
    req = _requests(tmp_path)
    stale = tmp_path / "stale.parquet"
    pq.write_table(pa.table({"item_id": pa.array([999_001, 999_002], pa.int64())}), stale)
    res = _compare(bundle_dir, req, "--min-overlap", "0.99", "--record", "--available", str(stale))
    assert res.exit_code == 2, res.output
    assert "nothing to compare" in res.stderr
    assert not (bundle_dir / "quality").exists()


def test_gate_without_record_only_sets_the_exit_code(bundle_dir, tmp_path):
    req = _requests(tmp_path)
    assert _compare(bundle_dir, req, "--min-overlap", "1.0").exit_code == GATE_FAILED_EXIT
    assert _compare(bundle_dir, req, "--min-overlap", "0.1").exit_code == 0
    assert open_bundle(bundle_dir).files("quality/") == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--record"], "--record and --max-recall-gap need --min-overlap"),
        (["--min-overlap", "1.5"], "--min-overlap must be a number in [0, 1]"),
        (["--min-overlap", "0.9", "--max-recall-gap", "-1"], "--max-recall-gap must be a number"),
        (["--hf-model", "x"], "give exactly one of --model"),
        (["--sid-map", "x.json"], "--hf-model and --sid-map go together"),
        (["--model", "x:y", "--hf-model", "m", "--sid-map", "s"], "give exactly one of --model"),
        (["--k", "1,5"], "--k 5 is larger than the beam width 3"),  # F25
        (["--min-overlap", "0.9", "--model-tag", " ", "--record"], "--model-tag must not be empty"),
    ],
)
def test_cli_gate_bad_input_exits_2_with_one_line(bundle_dir, tmp_path, extra, message):
    res = _compare(bundle_dir, _requests(tmp_path), *extra)
    assert res.exit_code == 2, res.output
    lines = stderr_lines(res.stderr)
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert open_bundle(bundle_dir).files("quality/") == []


def test_k_larger_than_the_beam_width_is_refused_everywhere(bundle_dir, tmp_path):
    """F25: a beam of 2 cannot fill a top-5 list; refused before any decoding (CLI, default --k too)."""
    req = _requests(tmp_path)
    args = ["compare", str(bundle_dir), "--model", "tests.compare_models:model_fn", "--requests", req]
    res = runner.invoke(app, [*args, "--beam-width", "2"])  # default --k 1,5,10,20
    assert res.exit_code == 2 and "--k 20 is larger than the beam width 2" in res.stderr
    with pytest.raises(InputError, match="--k 5 is larger than the beam width 2"):
        compare_orders(open_bundle(bundle_dir), model_fn, Requests([0], None), beam_width=2, ks=(1, 5))


def test_record_needs_a_model_name(tmp_path):
    published = publish_bundle(
        build_index(np.array([[0, 1], [1, 0]]), (2, 2)), pa.array([1, 2]), tmp_path / "b"
    )
    req = _requests(tmp_path, targets=False)
    args = ["compare", str(published.path), "--model", "tests.compare_models:model_fn", "--requests", req]
    res = runner.invoke(app, [*args, "--k", "1", "--min-overlap", "0.5", "--record"])
    assert res.exit_code == 2 and "has no model version" in res.stderr and "--model-tag" in res.stderr
    res = runner.invoke(app, [*args, "--k", "1", "--min-overlap", "0.5", "--max-recall-gap", "0.1"])
    assert res.exit_code == 2 and "--max-recall-gap needs ground truth" in res.stderr
    res = runner.invoke(app, [*args, "--k", "1", "--min-overlap", "0.5", "--record", "--model-tag", "x"])
    assert res.exit_code == 0, res.output
    assert find_quality(open_bundle(published.path), "x").passed


# ---------------------------------------------------------------------------------------------- hostile
def _document(**changes):
    doc = {
        "format": "zerogr-quality", "format_version": 1, "model_version": TAG, "order": "filter_first",
        "passed": True, "thresholds": {"min_overlap": 0.995, "max_recall_gap": None},
        "overlap": {"1": 1.0, "5": 0.999},
    }  # fmt: skip
    doc.update(changes)
    return json.dumps(doc).encode()


BROKEN = [
    ("not JSON", b"{", "not valid JSON"),
    ("not UTF-8", b"\xff\xfe{}", "not valid JSON"),
    ("nested 100k deep", b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ("a list", b"[]", "must be a JSON object"),
    ("format", _document(format="zerogr-plan"), "format must be 'zerogr-quality'"),
    ("version true", _document(format_version=True), "format_version must be 1"),
    ("other model", _document(model_version="m-2"), "does not belong in m-1.json"),
    ("order", _document(order="fastest"), "order must be one of"),
    ("contradiction", _document(order="filter_first", passed=False), "contradicts passed"),
    ("passed 1", _document(passed=1), "passed must be true or false"),
    ("threshold 2", _document(thresholds={"min_overlap": 2}), "min_overlap must be a number in [0, 1]"),
    ("NaN", _document().replace(b"0.999", b"NaN"), "not valid JSON"),
    ("overlap text", _document(overlap={"1": "1.0"}), "overlap[1] must be a number"),
    ("overlap key", _document(overlap={"01": 1.0}), "is not an integer K"),
    ("overlap empty", _document(overlap={}), "overlap must be a non-empty object"),
    ("too big", b" " * (MAX_QUALITY_BYTES + 1), "larger than"),
]


@pytest.mark.parametrize(("name", "content", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_quality_record_warns_once_and_auto_means_score_first(bundle_dir, name, content, words):
    """The served model's record cannot be read: the exact order (it may have been the record that said
    score_first)."""
    add_bundle_files(bundle_dir, {"quality/m-1.json": content})
    bundle = open_bundle(bundle_dir)  # listed and checksummed: the bundle itself is intact
    with pytest.raises(BundleError, match=words.replace("[", r"\[").replace("]", r"\]")):
        find_quality(bundle, TAG)
    model = SeededModel(SIZES, 1, batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = Decoder(bundle, model.layers(), order="auto")
        dec.search(model.step_fn, 2, 3)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert message.startswith(f"order='auto': a broken quality record: {bundle.path}/quality/m-1.json")
    assert message.endswith("; using score_first (exact for every model)") and words in message
    assert dec.order == "score_first" and dec.quality is None
    with pytest.raises(BundleError, match="m-1.json"):
        verify_bundle(bundle_dir)
    (row,) = inspect_bundle(bundle_dir)["quality"]
    assert row["file"] == "quality/m-1.json" and words in row["error"]


def test_quality_bytes_refuses_what_the_reader_would_refuse(tmp_path):
    assert load_quality_round_trip(tmp_path, json.loads(_document())).order == "filter_first"
    with pytest.raises(ValueError, match="contradicts passed"):
        quality_bytes(json.loads(_document(passed=False)))
    assert quality_key("ml1m-t5.v2") == "ml1m-t5.v2" and quality_key("../x").startswith("tag-")
    assert quality_key(".hidden").startswith("tag-") and len(quality_key("a" * 200)) == 36


def load_quality_round_trip(tmp_path, document):
    path = tmp_path / "q.json"
    path.write_bytes(quality_bytes(document))
    return load_quality(path, expect_key=quality_key(document["model_version"]))


def test_record_quality_replaces_through_the_journal(bundle_dir):
    report = _report({1: 0.5})
    for floor, order in ((0.9, "score_first"), (0.1, "filter_first")):
        thresholds = GateThresholds(floor)
        decision = decide(report, thresholds)
        assert (
            record_quality(bundle_dir, quality_document(report, thresholds, decision, TAG))
            == "quality/m-1.json"
        )
        assert find_quality(open_bundle(bundle_dir), TAG).order == order
    assert not (bundle_dir / "manifest.json.journal").exists()


# ---------------------------------------------------------------------------------------------- SidMap
@st.composite
def sid_maps(draw):
    steps = draw(st.integers(1, 4))
    eos = draw(st.one_of(st.none(), st.integers(0, 10_000)))
    if draw(st.booleans()):
        return SidMap.from_offsets([draw(st.integers(0, 5000)) for _ in range(steps)], eos_token_id=eos)
    rows = []
    for t in range(steps):
        codes = draw(st.lists(st.integers(0, 50), min_size=1, max_size=6, unique=True))
        tokens = draw(st.lists(st.integers(0, 9000), min_size=len(codes), max_size=len(codes), unique=True))
        rows += [(tok, t, c) for tok, c in zip(tokens, codes, strict=True)]
    order = draw(st.permutations(range(len(rows))))
    return SidMap.from_table([rows[i] for i in order], eos_token_id=eos)


@settings(max_examples=60, deadline=None)
@given(sid_map=sid_maps())
def test_sid_map_save_load_round_trip(tmp_path_factory, sid_map):
    path = sid_map.save(tmp_path_factory.mktemp("m") / "sid_map.json")
    back = SidMap.load(path)
    assert back.offsets == sid_map.offsets and back.eos_token_id == sid_map.eos_token_id
    assert (back.table is None) == (sid_map.table is None)
    if sid_map.table is not None:
        assert back.table.dtype == np.int64 and np.array_equal(back.table, sid_map.table)
    assert back.to_dict() == sid_map.to_dict() == json.loads(path.read_text())


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[1, 2]", "must be a JSON object"),
        ('{"offsets": [3, 7], "offset": [1]}', "unknown key 'offset'"),
        ('{"offsets": [3.0, 7]}', "offsets must be a list of integers"),
        ('{"offsets": [true, 7]}', "offsets must be a list of integers"),
        ('{"offsets": [3], "table": [[3, 0, 0]]}', "exactly one of 'offsets' and 'table'"),
        ("{}", "exactly one of 'offsets' and 'table'"),
        ('{"offsets": [-1]}', "non-negative integer"),
        ('{"offsets": []}', "needs one offset per step"),
        ('{"offsets": [3], "eos_token_id": 1.5}', "eos_token_id must be an integer or null"),
        ('{"table": [[3, 0]]}', "table must be a list of [token, step, code]"),
        ('{"table": [[3, 0, 0], [3, 0, 1]]}', "repeats the (token, step) pair"),
        ('{"table": [[3, 1, 0]]}', "steps must be 0..L-1"),
        ('{"format": "zerogr-plan", "offsets": [3]}', "format must be 'zerogr-sid-map'"),
        ('{"format_version": 2, "offsets": [3]}', "format_version must be 1"),
        ('{"offsets": [NaN]}', "not valid JSON"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_sid_map_load_refuses_with_one_line_naming_the_file(tmp_path, content, words):
    path = tmp_path / "sid_map.json"
    path.write_text(content)
    with pytest.raises(InputError) as info:
        SidMap.load(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)
    assert "\n" not in str(info.value)


def test_sid_map_load_missing_file(tmp_path):
    with pytest.raises(InputError, match="sid map file not found"):
        SidMap.load(tmp_path / "nope.json")


# ---------------------------------------------------------------------------------------------- hf
HF_SID_OFFSET = 3  # conftest's tiny models: 0 pad, 1 eos, 2 bos, SID tokens from 3


@pytest.fixture
def hf_setup(tmp_path, tiny_hf_models):
    """A bundle (codebooks 4, 4, 2; 20 SIDs), its SidMap saved, a token requests file, the saved models."""
    rng = np.random.default_rng(11)
    codes = np.array(np.unravel_index(rng.choice(np.prod(SIZES), 20, replace=False), SIZES)).T
    published = publish_bundle(build_index(codes, SIZES), pa.array(100 + np.arange(20)), tmp_path / "b")
    sid_map = SidMap.from_offsets([HF_SID_OFFSET, HF_SID_OFFSET + 4, HF_SID_OFFSET + 8], eos_token_id=1)
    sid_map.save(tmp_path / "sid_map.json")
    ids = [rng.integers(13, 40, rng.integers(1, 7)).tolist() for _ in range(9)]
    masks = [[0] * (len(r) > 2) + [1] * (len(r) - (len(r) > 2)) for r in ids]  # some rows padded in-file
    targets = [100 + int(t) for t in rng.integers(0, 20, 9)]
    pq.write_table(
        pa.table({"input_ids": ids, "attention_mask": masks, "target_item": targets}), tmp_path / "r.parquet"
    )
    return published.path, sid_map, tmp_path / "r.parquet", tmp_path


@pytest.mark.parametrize("kind", ["gpt2", "bart"])
def test_compare_hf_model_equals_hf_search_plus_compare_searches(hf_setup, tiny_hf_models, kind):
    from zerogr_build.compare import compare_searches
    from zerogr_build.integrations import hf

    bundle_path, sid_map, requests_path, tmp_path = hf_setup
    model = tiny_hf_models[kind]
    model.save_pretrained(tmp_path / kind)
    args = [
        "compare",
        str(bundle_path),
        "--hf-model",
        str(tmp_path / kind),
        "--sid-map",
        str(tmp_path / "sid_map.json"),
    ]
    res = runner.invoke(
        app, [*args, "--requests", str(requests_path), "--k", "1,3,5", "--batch-size", "4", "--json"]
    )
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout)

    requests = read_token_requests(requests_path)
    gen = hf.SidGenerator(model, open_bundle(bundle_path), sid_map)
    inputs_of = hf.token_inputs(requests, pad_token_id=0, left_pad=not model.config.is_encoder_decoder)
    lib = compare_searches(
        open_bundle(bundle_path), hf.hf_search(gen, inputs_of), requests.requests, ks=(1, 3, 5), batch_size=4
    ).to_dict()
    for key in ("seconds", "extra"):
        cli.pop(key), lib.pop(key)
    assert _close(cli, lib)
    assert cli["with_targets"] == 9 and set(cli["recall"]) == {"filter_first", "score_first", "unconstrained"}
    assert hf.model_hash(model) == json.loads(res.stdout)["extra"]["model_hash"]


def _close(a, b) -> bool:
    """Equal structures, floats within 1e-6 (the CLI reloads the model from disk: the same weights)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert len(a) == len(b)
        return all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-6)
        return True
    assert a == b
    return True


def test_read_token_requests_refuses_bad_rows(tmp_path):
    cases = [
        ({"user": [[1]]}, "missing column 'input_ids'"),
        ({"input_ids": [1, 2]}, "must be a list of integers"),
        ({"input_ids": [[1], []]}, "row 1 is empty"),
        ({"input_ids": [[1], None]}, "row 1 is null"),
        ({"input_ids": [[1, 99]]}, "token id 99 outside the model's vocabulary (0..39)"),
        ({"input_ids": [[1, -2]]}, "token id -2 outside"),
        ({"input_ids": [[1, 2]], "attention_mask": [[1]]}, "1 values, 'input_ids' has 2 tokens"),
        ({"input_ids": [[1, 2]], "attention_mask": [[0, 0]]}, "values must be 0 or 1 with at least one 1"),
        ({"input_ids": [[1, 2]], "attention_mask": [[1, 2]]}, "values must be 0 or 1"),
    ]
    for columns, words in cases:
        path = tmp_path / "r.parquet"
        pq.write_table(pa.table(columns), path)
        with pytest.raises(InputError) as info:
            read_token_requests(path, vocab_size=40)
        assert words in str(info.value), (columns, str(info.value))
    path.write_text("not parquet")
    with pytest.raises(InputError, match="not a Parquet file"):
        read_token_requests(path)


def test_cli_hf_model_that_cannot_load_exits_2(hf_setup):
    bundle_path, _, requests_path, tmp_path = hf_setup
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "no-such-model"}')
    for model_dir, words in (
        (tmp_path / "missing", "not a directory"),
        (tmp_path / "empty", "no config.json"),
        (tmp_path / "broken", "cannot load"),
    ):
        sid_map = str(tmp_path / "sid_map.json")
        res = runner.invoke(app, [
            "compare", str(bundle_path), "--hf-model", str(model_dir), "--sid-map", sid_map,
            "--requests", str(requests_path), "--k", "1",
        ])  # fmt: skip
        lines = stderr_lines(res.stderr)
        assert res.exit_code == 2 and len(lines) == 1 and words in lines[0], res.output


def test_an_untagged_bundle_serves_the_order_its_records_decided(tmp_path):
    """rebuild.sh without --model-version files the record under --model-tag or the model's hash; a
    Decoder(order="auto") given no model version must still follow it (before: filter_first after a
    failed gate), and of records that disagree the exact order wins."""
    rng = np.random.default_rng(7)
    codes = np.array(np.unravel_index(rng.choice(np.prod(SIZES), 20, replace=False), SIZES)).T
    index = build_index(codes, SIZES, step_formats="0=dense,1=sparse,2=sparse")
    untagged = publish_bundle(index, pa.array(100 + np.arange(20), type=pa.int64()), tmp_path / "u").path
    model = SeededModel(SIZES, 1, batch_size=2)

    def auto_order():
        return Decoder(open_bundle(untagged), model.layers(), order="auto").order

    req = _requests(tmp_path)
    assert auto_order() == "filter_first"  # no record: the documented default
    res = _compare(untagged, req, "--min-overlap", "1.0", "--model-tag", "ckpt-a", "--record")
    assert res.exit_code == GATE_FAILED_EXIT, res.output
    assert auto_order() == "score_first"
    res = _compare(untagged, req, "--min-overlap", "0", "--model-tag", "ckpt-b", "--record")
    assert res.exit_code == 0, res.output
    assert auto_order() == "score_first"  # ckpt-a says score_first: exact for every model
    tagged = Decoder(open_bundle(untagged), model.layers(), order="auto", model_version="ckpt-b")
    assert tagged.order == "filter_first"  # a named model version still gets its own record


def test_one_broken_record_of_an_untagged_bundle_never_discards_the_valid_ones(tmp_path):
    """Untagged bundle: a broken record (another model's, or a foreign tool's) is skipped with its warning
    and the valid records decide; records that all break give the exact order, score_first."""
    rng = np.random.default_rng(7)
    codes = np.array(np.unravel_index(rng.choice(np.prod(SIZES), 20, replace=False), SIZES)).T
    index = build_index(codes, SIZES, step_formats="0=dense,1=sparse,2=sparse")
    untagged = publish_bundle(index, pa.array(100 + np.arange(20), type=pa.int64()), tmp_path / "u").path
    model = SeededModel(SIZES, 1, batch_size=2)

    def auto_order() -> tuple[str, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            order = Decoder(open_bundle(untagged), model.layers(), order="auto").order
        return order, [str(w.message) for w in caught]

    add_bundle_files(untagged, {"quality/ckpt-z.json": b"[]"})  # the only record, broken
    order, said = auto_order()
    assert order == "score_first" and len(said) == 1 and "ckpt-z.json" in said[0]
    res = _compare(untagged, _requests(tmp_path), "--min-overlap", "0", "--model-tag", "ckpt-b", "--record")
    assert res.exit_code == 0, res.output
    order, said = auto_order()  # ckpt-b's valid filter_first record decides; the broken one is skipped
    assert order == "filter_first" and len(said) == 1 and "ckpt-z.json" in said[0] and "skipped" in said[0]
    res = _compare(untagged, _requests(tmp_path), "--min-overlap", "1.0", "--model-tag", "ckpt-a", "--record")
    assert res.exit_code == GATE_FAILED_EXIT, res.output
    assert auto_order()[0] == "score_first"  # the valid records disagree: the exact order
