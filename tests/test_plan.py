"""Plans (runtime/plan.py): lookup by nearest batch, the heuristic, the strict reader of plans/<key>.json
(docs/bundle-format.md, section 11), and Decoder(plan="auto") falling back with one warning on a broken
file."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from zerogr_build.base.device import device_key
from zerogr_build.base.errors import BundleError, InputError
from zerogr_build.bundle import add_bundle_files, open_bundle, publish_bundle
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.plan import (
    HEURISTIC_FALLBACK,
    MAX_PLAN_BYTES,
    PLAN_FORMAT,
    PLAN_FORMAT_VERSION,
    find_plan,
    heuristic_mode,
    load_plan,
)
from zerogr_build.testing import SeededModel

# ------------------------------------------------------------------------------------------ lookup


def test_plan_lookup_nearest_batch_dtype_and_availability():
    plan = load_plan(
        [
            {"step": 1, "batch_size": 1, "dtype": "fp32", "mode": "full"},
            {"step": 1, "batch_size": 32, "dtype": "fp32", "mode": "selective"},
            {"step": 1, "batch_size": 8, "dtype": "bf16", "mode": "full"},
            {
                "step": 2,
                "batch_size": 8,
                "dtype": "fp32",
                "mode": "selective_cuda",
                "timings_ms": {"full": 3.0, "selective": 1.0, "selective_cuda": 0.5},
            },
        ]
    )
    assert plan.mode_for(1, 1, torch.float32) == "full"
    assert plan.mode_for(1, 4, "float32") == "full"  # log(4/1) < log(32/4)
    assert plan.mode_for(1, 6, torch.float32) == "selective"  # log(32/6) < log(6/1)
    assert plan.mode_for(1, 1000, torch.float32) == "selective"
    assert plan.mode_for(1, 2, torch.bfloat16) == "full"
    assert plan.mode_for(0, 8, torch.float32) is None
    assert plan.mode_for(1, 8, torch.float16) is None
    assert plan.mode_for(2, 8, torch.float32) == "selective_cuda"
    # not available here: the fastest available mode the entry timed, else nothing usable
    assert plan.mode_for(2, 8, torch.float32, available=["full", "selective"]) == "selective"
    assert plan.mode_for(2, 8, torch.float32, available=["full"]) == "full"
    assert plan.mode_for(1, 32, torch.float32, available=["full"]) is None  # no timings recorded


@pytest.mark.parametrize("listed", [(2, 8), (8, 2)])
def test_plan_ties_go_to_the_larger_batch(listed):
    """Batch 4 is equally far (log scale) from 2 and 8: the entry of 8 wins, in whichever order listed."""
    modes = {2: "full", 8: "selective"}
    plan = load_plan([{"step": 0, "batch_size": b, "dtype": "fp32", "mode": modes[b]} for b in listed])
    assert plan.mode_for(0, 4, torch.float32) == "selective"
    assert plan.mode_for(0, 3, torch.float32) == "full" and plan.mode_for(0, 5, torch.float32) == "selective"


def test_heuristic():
    kw = dict(codebook_size=8192, device_type="cpu", available=["full", "selective"])
    assert heuristic_mode(step_format="dense", cap=8192, order="filter_first", **kw) == "full"
    assert heuristic_mode(step_format="sparse", cap=8, order="filter_first", **kw) == "selective"
    assert heuristic_mode(step_format="sparse", cap=8, order="score_first", **kw) == "full"
    assert heuristic_mode(step_format="sparse", cap=8, order="unconstrained", **kw) == "full"
    assert heuristic_mode(step_format="sparse", cap=256, order="filter_first", **kw) == "selective"
    assert heuristic_mode(step_format="sparse", cap=257, order="filter_first", **kw) == "full"
    cuda = dict(codebook_size=8192, device_type="cuda", available=["full", "selective", "selective_cuda"])
    assert heuristic_mode(step_format="sparse", cap=1024, order="filter_first", **cuda) == "selective_cuda"
    assert heuristic_mode(step_format="sparse", cap=1025, order="filter_first", **cuda) == "full"


# ------------------------------------------------------------------------------------------ reading

KEY = device_key("cpu")


def _doc(**changes) -> dict:
    """A minimal valid plan document for this machine's CPU (one entry), with top-level fields changed."""
    entry = {"step": 0, "batch_size": 1, "dtype": "fp32", "mode": "full", "timings_ms": {"full": 1.0}}
    doc = {
        "format": PLAN_FORMAT,
        "format_version": PLAN_FORMAT_VERSION,
        "device_key": KEY,
        "entries": [entry],
    }
    return doc | changes


def _entry(**changes) -> dict:
    return _doc(entries=[{"step": 0, "batch_size": 1, "dtype": "fp32", "mode": "full"} | changes])


# (name, file bytes, words the refusal must contain)
BROKEN = [
    ("a list", b"[]", "must be a JSON object"),
    ("not JSON", b"{", "not valid JSON"),
    ("not UTF-8", b'{"format": "\xff"}', "not valid JSON"),
    ("nested 100k deep", b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ("another format", _doc(format="zerogr-bundle"), "format must be 'zerogr-plan'"),
    ("a newer version", _doc(format_version=2), "format_version must be 1"),
    ("version true", _doc(format_version=True), "format_version must be 1"),
    ("no device key", {k: v for k, v in _doc().items() if k != "device_key"}, "device_key must be"),
    ("entries an int", _doc(entries=5), "entries must be a list"),
    ("entry a string", _doc(entries=["full"]), "entries[0] must be an object"),
    ("step 1e999", _entry(step=float("inf")), "step must be an integer >= 0"),
    ("step 1.0", _entry(step=1.0), "step must be an integer >= 0"),
    ("step true", _entry(step=True), "step must be an integer >= 0"),
    ("step -1", _entry(step=-1), "step must be an integer >= 0"),
    ("batch 1e999", _entry(batch_size=float("inf")), "batch_size must be an integer >= 1"),
    ("batch 0", _entry(batch_size=0), "batch_size must be an integer >= 1"),
    ("dtype alias", _entry(dtype="float32"), "dtype must be one of fp32, fp16, bf16"),
    ("no mode", _entry(mode=None), "mode must be a non-empty string"),
    ("mode a dict", _entry(mode={"x": 1}), "mode must be a non-empty string"),
    ("timings text", _entry(timings_ms={"full": "fast"}), "timings_ms must map"),
    ("timings NaN", _entry(timings_ms={"full": float("nan")}), "timings_ms must map"),
    ("timings a list", _entry(timings_ms=[1.0]), "timings_ms must map"),
    ("two entries, one key", _doc(entries=_doc()["entries"] * 2), "a second entry for step 0"),
]


def _bytes(content) -> bytes:
    return content if isinstance(content, bytes) else json.dumps(content).encode()  # NaN/inf as JSON does


def _file_words(content, words: str) -> str:
    """What a plan file's error names: a file is read as strict JSON, where NaN and Infinity are not JSON."""
    raw = _bytes(content)
    return "is not JSON" if b"NaN" in raw or b"Infinity" in raw else words


@pytest.mark.parametrize("name,content,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_load_plan_refuses_a_broken_file_naming_it(tmp_path, name, content, words):
    path = tmp_path / f"{KEY}.json"
    path.write_bytes(_bytes(content))
    words = _file_words(content, words)
    with pytest.raises(BundleError) as info:
        load_plan(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)


def test_load_plan_accepts_the_spec_and_in_memory_forms(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc(extra={"ignored": True})))  # unknown fields are ignored
    plan = load_plan(path)
    assert plan.device_key == KEY and plan.path == path and plan.mode_for(0, 1, "fp32") == "full"
    assert load_plan(plan) is plan
    assert load_plan({"entries": []}).entries == () and load_plan([]).device_key is None
    with pytest.raises(InputError, match="plan: entries\\[0\\]: batch_size"):
        load_plan([{"step": 0, "batch_size": 0, "dtype": "fp32", "mode": "full"}])
    with pytest.raises(InputError, match="format_version must be 1"):
        load_plan(_doc(format_version=3))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_PLAN_BYTES + 1))
    with pytest.raises(BundleError, match="larger than"):
        load_plan(big)
    with pytest.raises(BundleError, match="cannot read plan"):
        load_plan(tmp_path / "missing.json")


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory):
    sids = np.random.default_rng(3).integers(0, 8, (60, 2))
    out = tmp_path_factory.mktemp("b")
    return publish_bundle(build_index(sids, (8, 8)), pa.array(np.arange(60)), out).path


HOSTILE_NAMES = ("a list", "not UTF-8", "nested 100k deep", "entries an int", "step 1e999", "timings text")
HOSTILE = [b for b in BROKEN if b[0] in HOSTILE_NAMES]


@pytest.mark.parametrize("name,content,words", HOSTILE, ids=[b[0] for b in HOSTILE])
def test_auto_plan_with_a_broken_file_warns_once_and_uses_the_heuristic(small_bundle, name, content, words):
    add_bundle_files(small_bundle, {f"plans/{KEY}.json": _bytes(content)})
    words = _file_words(content, words)
    bundle = open_bundle(small_bundle)
    with pytest.raises(BundleError, match=words):
        find_plan(bundle, "cpu")
    model = SeededModel((8, 8), 1, batch_size=2)
    heuristic = Decoder(bundle, model.layers()).search(model.step_fn, 2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = Decoder(bundle, model.layers(), plan="auto")
        res = dec.search(model.step_fn, 2, 4)
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert message.startswith(f"plan='auto': ignoring a broken plan: {bundle.path / 'plans' / KEY}.json: ")
    assert words in message and message.endswith(f"; using {HEURISTIC_FALLBACK}")
    assert dec.plan is None and torch.equal(res.sids, heuristic.sids)


def test_find_plan_checks_the_key_inside_the_file(small_bundle):
    wrong_key = json.dumps(_doc(device_key="cuda-x-sm90")).encode()
    add_bundle_files(small_bundle, {f"plans/{KEY}.json": wrong_key})
    with pytest.raises(BundleError, match="device_key 'cuda-x-sm90' differs from the file name's"):
        find_plan(open_bundle(small_bundle), "cpu")
    add_bundle_files(small_bundle, {f"plans/{KEY}.json": json.dumps(_doc()).encode()})
    found = find_plan(open_bundle(small_bundle), "cpu")
    assert found is not None and found.device_key == KEY and found.path.name == f"{KEY}.json"


# ------------------------------------------------------------------------------------------ choosing


def test_decoder_warns_once_per_step_when_the_plan_cannot_be_followed():
    sids = np.random.default_rng(3).integers(0, 8, (60, 2))
    index = build_index(sids, (8, 8), step_formats="sparse")
    model = SeededModel((8, 8), 1, batch_size=2)
    unknown = [{"step": t, "batch_size": 2, "dtype": "fp32", "mode": "warp_drive"} for t in range(2)]
    dec = Decoder(index, model.layers(), plan=unknown)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            dec.search(model.step_fn, 2, 4)
    assert sorted(str(w.message) for w in caught) == [
        f"plan mode 'warp_drive' for step {t} unavailable here; using the heuristic mode choice for step {t}"
        for t in range(2)
    ]
