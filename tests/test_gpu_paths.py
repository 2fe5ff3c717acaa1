"""Issue 10's GPU paths on a real device (marked gpu; skipped without CUDA + CuPy): kernels shipped by
`zerogr build` load as cubin, a corrupt cubin steps down to PTX, a bundle without kernels to NVRTC; the probe
launch makes selective_cuda available; hot swap orders the load's device work before serving; NaN, int64
tokens and padded views match the torch reference on the device; CuPy wraps torch's stream."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from zerogr_build.cuda import selective as sc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not sc.is_available(), reason="needs a CUDA device and CuPy (pip install 'zerogr[gpu]')"
    ),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A bundle published by `zerogr build` on this machine, with kernels for this GPU's arch."""
    from zerogr_build.config import BuildSettings
    from zerogr_build.pipeline import build_bundle

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH: the build cannot ship kernels here")
    work = tmp_path_factory.mktemp("gpu_paths")
    rng = np.random.default_rng(0)
    sids = rng.integers(0, 64, size=(5000, 3))
    col = pa.array([list(map(int, r)) for r in sids], type=pa.list_(pa.int32()))
    pq.write_table(
        pa.table({"item_id": pa.array(np.arange(5000), pa.int64()), "sid": col}), work / "c.parquet"
    )
    arch = sc.device_arch(0)
    settings = BuildSettings(
        out=str(work / "out"), codebook_sizes=(64, 64, 64), kernel_archs=tuple(dict.fromkeys((arch, "sm_80")))
    )
    return Path(build_bundle(str(work / "c.parquet"), settings)["bundle"])


def _fresh(monkeypatch):
    monkeypatch.setattr(sc, "_DEFAULT_KERNELS", {})
    monkeypatch.setattr(sc, "_FAILED", {})


def test_built_bundle_kernels_load_as_cubin_and_serve(built, monkeypatch):
    from zerogr_build.bundle import open_bundle
    from zerogr_build.cuda.bundle_kernels import load_bundle_kernels
    from zerogr_build.runtime.scoring import available_modes

    _fresh(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernels = load_bundle_kernels(open_bundle(built), "cuda:0")
    assert kernels.origin == f"kernels/{sc.device_arch(0)}/selective.cubin"
    assert sc.usable("cuda:0") and "selective_cuda" in available_modes("cuda:0")


def test_corrupt_cubin_steps_down_to_ptx_and_no_kernels_to_nvrtc(built, tmp_path, monkeypatch):
    from zerogr_build.bundle import open_bundle
    from zerogr_build.cuda.bundle_kernels import load_bundle_kernels

    _fresh(monkeypatch)
    copy = tmp_path / built.name
    shutil.copytree(built, copy)
    cubin = copy / f"kernels/{sc.device_arch(0)}/selective.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.chmod(0o644)
    cubin.write_bytes(bytes(data))
    with pytest.warns(sc.KernelFallbackWarning, match="KernelChecksumError"):
        kernels = load_bundle_kernels(open_bundle(copy, verify_checksums=False), "cuda:0")
    assert kernels.origin.endswith(".ptx")


def test_hot_swap_orders_the_load_before_serving(built):
    from zerogr_build.runtime.serving.hotswap import HotSwap
    from zerogr_build.runtime.stream import CudaLoadMarker

    sizes = (64, 64, 64)
    weights = [torch.randn(v, 32, device="cuda:0") for v in sizes]
    live = HotSwap.for_decoder(weights, device="cuda:0")
    live.load_next(built).result()
    live.swap()
    serving = torch.cuda.Stream(priority=-1)
    live.load_next(built)  # background, low priority
    new = live.swap()
    marker = new.decoder.loaded
    assert isinstance(marker, CudaLoadMarker) and marker.event.query()
    with torch.cuda.stream(serving):
        state = new.decoder.start(2, 8)
        h = torch.randn(int(state.prefixes.shape[0]), 32, device="cuda:0")
        state = new.decoder.step(state, h)
    serving.synchronize()
    live.close()


def test_nan_int64_and_padded_views_match_torch_on_the_device(monkeypatch):
    from zerogr_build.base import selective_torch

    _fresh(monkeypatch)
    kernels = sc.default_kernels(0)
    gen = torch.Generator().manual_seed(3)
    weight = torch.zeros(97, 72)[:, :70]
    weight.copy_(torch.randn(97, 70, generator=gen))
    weight = torch.zeros(97, 72, device="cuda")[:, :70].copy_(weight.cuda())
    hidden = torch.randn(6, 70, generator=gen).cuda()
    hidden[2, 1] = float("nan")
    tokens = torch.randint(0, 97, (6, 80), generator=gen).cuda()
    tokens[0, :3] = torch.tensor([2**32 + 3, -(2**40), 97])
    for fused in (True, False):
        got = kernels.log_softmax(hidden, weight, None, tokens, fused=fused).cpu()
        want = selective_torch.selective_log_softmax(hidden, weight, None, tokens).cpu()
        assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[2]).any()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
        assert torch.isneginf(got[0, :3]).all()


def test_cupy_wraps_torchs_current_stream():
    import cupy

    stream = torch.cuda.Stream()
    wrapped = sc.cupy_stream(cupy, stream, 0)
    assert wrapped.ptr == stream.cuda_stream
