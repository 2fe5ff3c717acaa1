"""`zerogr tune` on CPU, end to end on a small bundle, plus the kernel check, timing and option parsing it
relies on, and a Decoder following the plan it writes."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch

from zerogr_build.base.device import device_for, device_key
from zerogr_build.base.errors import InputError
from zerogr_build.bundle import add_bundle_files, open_bundle, publish_bundle, verify_bundle
from zerogr_build.config import TuneSettings, parse_dtypes, parse_positive_ints
from zerogr_build.cuda import selective as selective_cuda
from zerogr_build.cuda.bundle_kernels import load_bundle_kernels
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.plan import find_plan
from zerogr_build.runtime.scoring import get_mode
from zerogr_build.runtime.weights import load_weights_file
from zerogr_build.testing import SeededModel
from zerogr_build.tune import compile_and_check_kernels, tune_bundle
from zerogr_build.tune.check import check_mode_against_reference
from zerogr_build.tune.timing import fastest, time_modes

SIZES = (16, 64, 256)
SETTINGS = TuneSettings(batch_sizes=(1, 4), beam_width=8, hidden_dim=16, warmup=1, iters=3)


def _publish(out):
    """A small 3-step bundle: dense step 0, sparse steps 1 and 2 (so modes matter at two steps)."""
    rng = np.random.default_rng(7)
    n = 4000
    sids = np.stack([rng.integers(0, v, n) for v in SIZES], axis=1)
    index = build_index(sids, SIZES, step_formats="0=dense,1=sparse,2=sparse")
    return publish_bundle(index, pa.array(np.arange(n, dtype=np.int64)), out).path


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    return _publish(tmp_path_factory.mktemp("bundles"))


@pytest.fixture(scope="module")
def tuned(bundle_dir):
    return tune_bundle(bundle_dir, "cpu", SETTINGS)


def test_plan_is_complete_and_chooses_the_fastest(tuned, bundle_dir):
    plan = tuned.plan
    assert tuned.plan_path == bundle_dir / "plans" / f"{device_key('cpu')}.json"
    assert json.loads(tuned.plan_path.read_text()) == plan
    assert plan["format"] == "zerogr-plan" and plan["device"]["type"] == "cpu"
    assert plan["settings"]["batch_sizes"] == [1, 4] and plan["settings"]["dtypes"] == ["fp32"]
    assert plan["modes"] == ["full", "selective", "selective_numba"]
    assert plan["refused"] == [] and plan["kernels"] is None
    keys = {(e["step"], e["batch_size"], e["dtype"]) for e in plan["entries"]}
    assert keys == {(t, b, "fp32") for t in range(3) for b in (1, 4)}
    for e in plan["entries"]:
        expected_modes = {"full"} if e["format"] == "dense" else {"full", "selective", "selective_numba"}
        assert set(e["timings_ms"]) == expected_modes
        assert all(v > 0 and math.isfinite(v) for v in e["timings_ms"].values())
        assert e["timings_ms"][e["mode"]] == min(e["timings_ms"].values())
        assert e["rows"] == (e["batch_size"] if e["step"] == 0 else e["batch_size"] * 8)


def test_bundle_still_verifies_and_lists_the_plan(tuned, bundle_dir):
    report = verify_bundle(bundle_dir)
    assert report["ok"]
    bundle = open_bundle(bundle_dir)
    assert f"plans/{device_key('cpu')}.json" in bundle.manifest["files"]
    assert device_key("cpu") in bundle.plans()


def test_several_device_plans_live_in_one_bundle(tuned, bundle_dir):
    other = dict(tuned.plan, device_key="cuda-some-gpu-sm90")
    add_bundle_files(bundle_dir, {"plans/cuda-some-gpu-sm90.json": json.dumps(other).encode()})
    again = tune_bundle(bundle_dir, "cpu", SETTINGS)  # re-tuning replaces only this device's plan
    bundle = open_bundle(bundle_dir)
    assert set(bundle.plans()) == {device_key("cpu"), "cuda-some-gpu-sm90"}
    assert verify_bundle(bundle_dir)["ok"]
    assert find_plan(bundle, "cpu").data == again.plan


def test_decoder_follows_the_plan_tune_wrote_step_by_step(tmp_path):
    """Decoder(plan="auto") runs each step with the mode the bundle's plan names. The plan written by tune is
    rewritten to pick, at every sparse step, the mode the heuristic would NOT pick; with bf16 weights the
    two modes score differently (full rounds the GEMM output to bf16, selective accumulates in fp32), so
    the search shows which mode ran at each step."""
    path = _publish(tmp_path)
    tuned = tune_bundle(path, "cpu", replace(SETTINGS, dtypes=("bf16",)))
    model = SeededModel(SIZES, 3, batch_size=4, dim=SETTINGS.hidden_dim, scale=SETTINGS.hidden_dim**-0.5)
    weights = model.layers(torch.bfloat16)
    heuristic = Decoder(open_bundle(path), weights)
    other = {"full": "selective", "selective": "full", "selective_numba": "full"}
    entries = [
        dict(e, mode=other[heuristic.mode_for(e["step"], e["batch_size"])]) if e["format"] == "sparse" else e
        for e in tuned.plan["entries"]
    ]
    rewritten = json.dumps(dict(tuned.plan, entries=entries)).encode()
    add_bundle_files(path, {f"plans/{device_key('cpu')}.json": rewritten})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the plan fits: no fallback warning
        planned = Decoder(open_bundle(path), weights, plan="auto")
    for batch in (1, 3, 4):  # 3: the plan's nearest batch size is 4
        plan_modes = [planned.plan.mode_for(t, batch, "bf16") for t in range(3)]
        assert plan_modes[1:] == [other[heuristic.mode_for(t, batch)] for t in (1, 2)]
        got = planned.search(model.step_fn, batch, 8)
        want = heuristic.search(model.step_fn, batch, 8, mode=plan_modes)
        ignored = heuristic.search(model.step_fn, batch, 8)
        assert not torch.equal(want.scores, ignored.scores)  # the modes are told apart by the scores
        assert torch.equal(got.scores, want.scores) and torch.equal(got.sids, want.sids)


def test_decoder_without_a_plan_for_its_device_warns_and_falls_back(tmp_path):
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
    assert device_for(0, None) == "cuda:0" and device_for(None, "cpu") == "cpu"
    assert device_for(None, "cuda") == "cuda:0" and device_for(None, "cuda:3") == "cuda:3"
    for gpu, dev in [(None, None), (1, "cpu"), (None, "tpu"), (-1, None), (None, "cuda:"), (None, "cpu\n")]:
        with pytest.raises(InputError):
            device_for(gpu, dev)
    assert parse_positive_ints("1, 8,32", "--batch-sizes") == (1, 8, 32)
    for bad in ("1,x", "0", "", "4,-1"):
        with pytest.raises(InputError, match="--batch-sizes"):
            parse_positive_ints(bad, "--batch-sizes")
    assert parse_dtypes("fp32,bf16") == ("fp32", "bf16") and parse_dtypes(None) is None
    for bad in ("fp8", "", "fp32,float64"):
        with pytest.raises(InputError, match="--dtypes"):
            parse_dtypes(bad)


def test_tune_refuses_cuda_without_cuda(bundle_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InputError, match="CUDA"):
        tune_bundle(bundle_dir, "cuda:0", SETTINGS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tune_checks_kernels_and_ships_them(bundle_dir):
    if not selective_cuda.is_available():
        pytest.skip("no CuPy on this GPU machine: no kernel mode to check or ship")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH on this GPU machine: tune cannot compile kernels to ship")
    result = tune_bundle(bundle_dir, "cuda:0", SETTINGS)
    plan = result.plan
    arch = selective_cuda.device_arch("cuda:0")
    assert plan["refused"] == [], plan["refused"]
    assert "selective_cuda" in plan["modes"]
    assert {e["dtype"] for e in plan["entries"]} == {"fp32", "bf16"}
    shipped = [f"kernels/{arch}/selective.cubin", f"kernels/{arch}/selective.ptx"]
    assert plan["kernels"] == {"arch": arch, "files": shipped, "skipped": None}
    assert sorted(result.kernel_files) == shipped
    assert verify_bundle(bundle_dir)["ok"]
    bundle = open_bundle(bundle_dir)
    assert set(bundle.files("kernels/")) == set(shipped)
    loaded = load_bundle_kernels(bundle, "cuda:0")  # what Decoder(plan="auto") loads
    assert loaded is not None and loaded.origin == str(bundle.file(shipped[0]))


def test_compiled_kernels_are_shipped_only_after_loading_and_checking():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU tune test on CUDA machines")
    files, refused, skipped = compile_and_check_kernels("cpu", "sm_90", ["fp32"], lambda mode, dtype: None)
    assert skipped is None  # nvcc compiled them ...
    assert files == {}  # ... but a file that cannot be loaded and checked here is refused, not shipped
    assert {r["mode"] for r in refused} == {"kernels/sm_90/selective.cubin", "kernels/sm_90/selective.ptx"}
    assert all(r["reason"].startswith("cannot load") for r in refused)
