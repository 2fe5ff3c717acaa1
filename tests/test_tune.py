"""`zerogr tune` on CPU, end to end on a small bundle, plus the kernel check and plan lookup it relies on."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from zerogr_build.bundle import add_bundle_files, open_bundle, publish_bundle, verify_bundle
from zerogr_build.errors import InputError
from zerogr_build.index import build_index
from zerogr_build.runtime.scoring import get_mode
from zerogr_build.tune import (
    TunedPlan,
    TuneSettings,
    check_mode_against_reference,
    current_device_key,
    fastest,
    find_plan,
    load_weights_file,
    parse_device,
    parse_dtypes,
    parse_int_list,
    plan_table,
    time_modes,
    tune_bundle,
)

SIZES = (16, 64, 256)
SETTINGS = TuneSettings(batch_sizes=(1, 4), beam_width=8, hidden_dim=16, warmup=1, iters=3)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    """A small 3-step bundle: dense step 0, sparse steps 1 and 2 (so modes matter at two steps)."""
    rng = np.random.default_rng(7)
    n = 4000
    sids = np.stack([rng.integers(0, v, n) for v in SIZES], axis=1)
    index = build_index(sids, SIZES, step_formats="0=dense,1=sparse,2=sparse")
    out = tmp_path_factory.mktemp("bundles")
    return publish_bundle(index, pa.array(np.arange(n, dtype=np.int64)), out).path


@pytest.fixture(scope="module")
def tuned(bundle_dir):
    return tune_bundle(bundle_dir, "cpu", SETTINGS)


def test_plan_is_complete_and_chooses_the_fastest(tuned, bundle_dir):
    plan = tuned.plan
    assert tuned.plan_path == bundle_dir / "plans" / f"{current_device_key('cpu')}.json"
    assert json.loads(tuned.plan_path.read_text()) == plan
    assert plan["format"] == "zerogr-plan" and plan["device"]["type"] == "cpu"
    assert plan["settings"]["batch_sizes"] == [1, 4] and plan["settings"]["dtypes"] == ["fp32"]
    assert plan["modes"] == ["full", "selective"] and plan["refused"] == [] and plan["kernels"] is None
    keys = {(e["step"], e["batch_size"], e["dtype"]) for e in plan["entries"]}
    assert keys == {(t, b, "fp32") for t in range(3) for b in (1, 4)}
    for e in plan["entries"]:
        expected_modes = {"full"} if e["format"] == "dense" else {"full", "selective"}
        assert set(e["timings_ms"]) == expected_modes
        assert all(v > 0 and math.isfinite(v) for v in e["timings_ms"].values())
        assert e["timings_ms"][e["mode"]] == min(e["timings_ms"].values())
        assert e["rows"] == (e["batch_size"] if e["step"] == 0 else e["batch_size"] * 8)


def test_bundle_still_verifies_and_lists_the_plan(tuned, bundle_dir):
    report = verify_bundle(bundle_dir)
    assert report["ok"]
    bundle = open_bundle(bundle_dir)
    assert f"plans/{current_device_key('cpu')}.json" in bundle.manifest["files"]
    assert current_device_key("cpu") in bundle.plans()


def test_several_device_plans_live_in_one_bundle(tuned, bundle_dir):
    other = dict(tuned.plan, device_key="cuda-some-gpu-sm90")
    add_bundle_files(bundle_dir, {"plans/cuda-some-gpu-sm90.json": json.dumps(other).encode()})
    again = tune_bundle(bundle_dir, "cpu", SETTINGS)  # re-tuning replaces only this device's plan
    bundle = open_bundle(bundle_dir)
    assert set(bundle.plans()) == {current_device_key("cpu"), "cuda-some-gpu-sm90"}
    assert verify_bundle(bundle_dir)["ok"]
    assert find_plan(bundle, "cpu").data == again.plan


def _step_fn(dim: int):
    table = torch.randn(997, dim, generator=torch.Generator().manual_seed(3))

    def step_fn(step, prefixes, batch):
        key = (
            (prefixes * torch.tensor([31, 17, 7][: prefixes.shape[1]], dtype=torch.long)).sum(dim=1)
            + batch * 101
            + step
        )
        return table[key % table.shape[0]]

    return step_fn


def test_planned_decoder_matches_forced_modes(tuned, bundle_dir):
    from zerogr_build.runtime.decoder import Decoder
    from zerogr_build.tune import random_weights

    bundle = open_bundle(bundle_dir)
    weights = random_weights(SIZES, SETTINGS.hidden_dim, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan fits: no fallback warning
        planned = Decoder(bundle, weights, device="cpu", plan="auto")
    plan = find_plan(bundle, "cpu")
    assert planned.plan is not None
    for t in (1, 2):
        for batch in (1, 3, 4, 50):
            assert planned.mode_for(t, batch) == plan.mode_for(t, batch, "fp32")
    step_fn = _step_fn(SETTINGS.hidden_dim)
    forced = Decoder(bundle, weights, device="cpu")
    for batch in (1, 4):
        got = planned.search(step_fn, batch, 8)
        for mode in ("full", "selective"):
            want = forced.search(step_fn, batch, 8, mode=mode)
            assert torch.equal(got.sids, want.sids) and torch.equal(got.leaves, want.leaves)
            torch.testing.assert_close(got.scores, want.scores, rtol=1e-5, atol=1e-5)


def test_decoder_without_a_plan_for_its_device_warns_and_falls_back(tmp_path):
    from zerogr_build.runtime.decoder import Decoder

    rng = np.random.default_rng(1)
    index = build_index(rng.integers(0, 8, (50, 2)), (8, 8))
    path = publish_bundle(index, pa.array(np.arange(50)), tmp_path).path
    bundle = open_bundle(path)
    assert find_plan(bundle, "cpu") is None
    with pytest.warns(UserWarning, match="no plan"):
        dec = Decoder(bundle, [torch.randn(8, 4), torch.randn(8, 4)], plan="auto")
    assert dec.plan is None


def _shifted_mode(reference):
    """A real but wrong implementation: reads the weight row of the next token."""

    class Shifted:
        @staticmethod
        def selective_scores(h, w, b, tok):
            moved = torch.where(tok >= 0, (tok + 1) % w.shape[0], tok)
            return reference.selective_scores(h, w, b, moved)

        @staticmethod
        def selective_log_softmax(h, w, b, tok):
            moved = torch.where(tok >= 0, (tok + 1) % w.shape[0], tok)
            return reference.selective_log_softmax(h, w, b, moved)

    return Shifted


def test_kernel_check_accepts_an_equal_function_and_refuses_a_wrong_one():
    reference = get_mode("selective", "cpu")
    full = get_mode("full", "cpu")  # another implementation of the same contract (fp32: rounding only)
    assert check_mode_against_reference(full, reference, "cpu", "fp32", vocab=300, hidden_dim=24) is None
    problem = check_mode_against_reference(
        _shifted_mode(reference), reference, "cpu", "fp32", vocab=300, hidden_dim=24
    )
    assert problem is not None and "row" in problem and "slot" in problem


def test_kernel_check_refuses_nan_wrong_padding_and_crashes():
    reference = get_mode("selective", "cpu")

    class Nan:
        selective_log_softmax = staticmethod(reference.selective_log_softmax)

        @staticmethod
        def selective_scores(h, w, b, tok):
            out = reference.selective_scores(h, w, b, tok)
            out[3, 2] = float("nan")
            return out

    class NoPadding:
        selective_log_softmax = staticmethod(reference.selective_log_softmax)

        @staticmethod
        def selective_scores(h, w, b, tok):
            return reference.selective_scores(h, w, b, tok.clamp(min=0))

    class Crash:
        @staticmethod
        def selective_scores(h, w, b, tok):
            raise RuntimeError("illegal memory access")

    kw = {"vocab": 50, "hidden_dim": 8}
    assert "NaN" in check_mode_against_reference(Nan, reference, "cpu", "fp32", **kw)
    assert "-inf pattern" in check_mode_against_reference(NoPadding, reference, "cpu", "bf16", **kw)
    assert "raised RuntimeError" in check_mode_against_reference(Crash, reference, "cpu", "fp16", **kw)


def test_plan_lookup_nearest_batch_and_availability():
    entries = [
        {"step": 1, "batch_size": b, "dtype": "fp32", "mode": m, "timings_ms": t}
        for b, m, t in [
            (1, "selective", {"full": 2.0, "selective": 1.0, "selective_cuda": 1.5}),
            (32, "selective_cuda", {"full": 3.0, "selective": 2.0, "selective_cuda": 0.5}),
            (128, "full", {"full": 1.0, "selective": 2.0}),
        ]
    ]
    plan = TunedPlan("k", {"entries": entries})
    assert plan.mode_for(1, 1, "fp32") == "selective"
    assert plan.mode_for(1, 5, "fp32") == "selective"  # log-nearest to 1 (5/1 < 32/5)
    assert plan.mode_for(1, 8, "fp32") == "selective_cuda"  # 32/8 == 8/1 tie -> the larger batch
    assert plan.mode_for(1, 1000, "fp32") == "full"
    assert plan.mode_for(1, 32, "fp32", available=["full", "selective"]) == "selective"
    assert plan.mode_for(0, 32, "fp32") is None and plan.mode_for(1, 32, "bf16") is None


def test_time_modes_interleaves_and_takes_medians():
    calls = []
    fake_ms = iter([5.0, 1.0, 7.0, 2.0, 6.0, 3.0])
    medians = time_modes(calls.append, ["a", "b"], lambda fn: (fn(), next(fake_ms))[1], warmup=2, iters=3)
    assert calls == ["a", "a", "b", "b", "a", "b", "a", "b", "a", "b"]
    assert medians == {"a": 6.0, "b": 2.0} and fastest(medians) == "b"


def test_tune_with_a_weights_file(tmp_path, bundle_dir):
    from safetensors.torch import save_file

    layers = {f"step{t}": torch.randn(v, 12) for t, v in enumerate(SIZES)}
    path = tmp_path / "w.safetensors"
    save_file(layers, str(path))
    loaded = load_weights_file(path, SIZES)
    assert all(torch.equal(loaded[t], layers[f"step{t}"]) for t in range(3))
    bad = tmp_path / "bad.safetensors"
    save_file(
        {"step0": torch.randn(16, 12), "step1": torch.randn(65, 12), "step2": torch.randn(256, 12)}, str(bad)
    )
    with pytest.raises(InputError, match="step1"):
        load_weights_file(bad, SIZES)
    with pytest.raises(InputError, match="2 steps|3 steps"):
        load_weights_file(path, SIZES[:2])
    result = tune_bundle(
        bundle_dir, "cpu", TuneSettings(batch_sizes=(2,), beam_width=4, weights=str(path), warmup=0, iters=1)
    )
    assert result.plan["settings"]["hidden_dim"] == 12 and result.plan["settings"]["weights"] == str(path)


def test_option_parsing():
    assert parse_device(0, None) == "cuda:0" and parse_device(None, "cpu") == "cpu"
    assert parse_device(None, "cuda") == "cuda:0"
    for gpu, dev in [(None, None), (1, "cpu"), (None, "tpu"), (-1, None)]:
        with pytest.raises(InputError):
            parse_device(gpu, dev)
    assert parse_int_list("1, 8,32", "--batch-sizes") == (1, 8, 32)
    with pytest.raises(InputError, match="--batch-sizes"):
        parse_int_list("1,x", "--batch-sizes")
    assert parse_dtypes("fp32,bf16") == ("fp32", "bf16")
    with pytest.raises(InputError):
        parse_dtypes("fp8")


def test_tune_refuses_cuda_without_cuda(bundle_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InputError, match="CUDA"):
        tune_bundle(bundle_dir, "cuda:0", SETTINGS)


def test_plan_table_renders_every_entry(tuned):
    table = plan_table(tuned.plan)
    assert table.row_count == len(tuned.plan["entries"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tune_checks_kernels_and_ships_them(bundle_dir):
    result = tune_bundle(bundle_dir, "cuda:0", SETTINGS)
    plan = result.plan
    assert plan["refused"] == [], plan["refused"]
    assert {e["dtype"] for e in plan["entries"]} == {"fp32", "bf16"}
    if "selective_cuda" in plan["modes"] and not (plan["kernels"] or {}).get("skipped"):
        assert any(name.endswith(".cubin") for name in result.kernel_files)
    assert verify_bundle(bundle_dir)["ok"]


def test_compiled_kernels_are_shipped_only_after_loading_and_checking():
    import shutil

    from zerogr_build.tune import compile_and_check_kernels

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU tune test on CUDA machines")
    files, refused, skipped = compile_and_check_kernels("cpu", "sm_90", ["fp32"], lambda mode, dtype: None)
    assert skipped is None  # nvcc compiled them ...
    assert files == {}  # ... but a file that cannot be loaded and checked here is refused, not shipped
    assert {r["mode"] for r in refused} == {"kernels/sm_90/selective.cubin", "kernels/sm_90/selective.ptx"}
    assert all(r["reason"].startswith("cannot load") for r in refused)
