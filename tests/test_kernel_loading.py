"""Kernel loading that never fails a search, on a CPU: the order cubin -> PTX ->
NVRTC -> torch with one warning per step down, checksums before any driver call, availability by a probe
launch, launch failures falling back to the torch reference. The driver is zerogr_build.testing's
FakeKernelLoader; what would reach it is checked byte for byte."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pytest
import torch

from zerogr_build.base import selective_torch
from zerogr_build.bundle import add_bundle_files, open_bundle
from zerogr_build.cuda import bundle_kernels as bk
from zerogr_build.cuda import selective as sc
from zerogr_build.testing import FakeDriverError, FakeKernelLoader, publish_catalog, random_catalog

FILES = {
    f"kernels/{arch}/selective.{kind}": f"{arch} {kind} image".encode() * 10
    for arch in ("sm_80", "sm_90")
    for kind in ("cubin", "ptx")
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels")
    _, published = publish_catalog(random_catalog(n=200, sizes=(4, 8, 16)), out)
    add_bundle_files(published.path, FILES)
    return open_bundle(published.path)


def _choose(bundle, arch: str, loader: FakeKernelLoader):
    said: list[str] = []
    kernels, reason = bk.choose_bundle_kernels(bundle, arch, 0, loader, warn=said.append)
    return kernels, reason, said


def test_a_healthy_device_loads_the_cubin_of_its_arch_with_the_checked_bytes(bundle):
    loader = FakeKernelLoader()
    kernels, reason, said = _choose(bundle, "sm_90", loader)
    assert (kernels.kind, kernels.origin, reason, said) == (
        "cubin",
        "kernels/sm_90/selective.cubin",
        None,
        [],
    )
    assert loader.calls == [
        ("load", "kernels/sm_90/selective.cubin", FILES["kernels/sm_90/selective.cubin"]),
        ("probe", "kernels/sm_90/selective.cubin", b""),
    ]


def test_each_failure_steps_down_once_with_its_cause(bundle):
    kernels, _, said = _choose(bundle, "sm_90", FakeKernelLoader(fail={"cubin"}))
    assert kernels.origin == "kernels/sm_90/selective.ptx"
    assert len(said) == 1 and "kernels/sm_90/selective.cubin" in said[0]
    assert "CUDA_ERROR_INVALID_IMAGE" in said[0] and said[0].endswith("trying kernels/sm_90/selective.ptx")

    kernels, _, said = _choose(bundle, "sm_90", FakeKernelLoader(fail={"launch:cubin"}))
    assert kernels.origin == "kernels/sm_90/selective.ptx" and "CUDA_ERROR_LAUNCH_FAILED" in said[0]

    kernels, _, said = _choose(bundle, "sm_90", FakeKernelLoader(fail={"cubin", "ptx"}))
    assert kernels.kind == "nvrtc" and len(said) == 3  # cubin, own PTX, sm_80 PTX
    assert said[-1].endswith("trying NVRTC")

    loader = FakeKernelLoader(fail={"cubin", "ptx", "nvrtc"})
    kernels, reason, said = _choose(bundle, "sm_90", loader)
    assert kernels is None and "NVRTC" in reason and "libnvrtc not found" in reason and len(said) == 3
    assert [c[0] for c in loader.calls] == ["load", "load", "load", "nvrtc"]


def test_ptx_serves_newer_archs_never_older_ones(bundle):
    assert bk.kernel_candidates(bundle, "sm_100") == [
        ("ptx", "kernels/sm_90/selective.ptx"),
        ("ptx", "kernels/sm_80/selective.ptx"),
    ]
    assert bk.kernel_candidates(bundle, "sm_86") == [("ptx", "kernels/sm_80/selective.ptx")]
    assert bk.kernel_candidates(bundle, "sm_75") == []
    kernels, _, said = _choose(bundle, "sm_75", FakeKernelLoader())
    assert kernels.kind == "nvrtc" and said == [
        f"{bundle.path} ships no compiled kernels for sm_75; compiling with NVRTC"
    ]


def test_a_flipped_byte_is_refused_before_any_driver_call(tmp_path):
    _, published = publish_catalog(random_catalog(n=100, sizes=(4, 8)), tmp_path)
    add_bundle_files(published.path, FILES)
    path = published.path / "kernels/sm_90/selective.cubin"
    data = bytearray(path.read_bytes())
    data[3] ^= 0x10
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    bundle = open_bundle(published.path, verify_checksums=False)
    with pytest.raises(sc.KernelChecksumError, match=r"kernels/sm_90/selective\.cubin: sha256 differs"):
        bk.read_checked_kernel_file(bundle, "kernels/sm_90/selective.cubin")
    loader = FakeKernelLoader()
    kernels, _, said = _choose(bundle, "sm_90", loader)
    assert all(origin != "kernels/sm_90/selective.cubin" for _, origin, _ in loader.calls)
    assert kernels.origin == "kernels/sm_90/selective.ptx" and "KernelChecksumError" in said[0]
    handed = loader.calls[0][2]
    assert hashlib.sha256(handed).hexdigest() == bundle.manifest["files"][kernels.origin]["sha256"]


def test_load_bundle_kernels_is_a_no_op_off_cuda(bundle):
    assert bk.load_bundle_kernels(bundle, "cpu") is None


@pytest.fixture
def fresh_registry(monkeypatch):
    monkeypatch.setattr(sc, "_DEFAULT_KERNELS", {})
    monkeypatch.setattr(sc, "_FAILED", {})


def test_availability_is_a_probe_launch_once_per_device(monkeypatch, fresh_registry):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    loads: list[int] = []

    def broken(index):
        loads.append(index)
        raise FakeDriverError("CUDA_ERROR_NO_BINARY_FOR_GPU")

    monkeypatch.setattr(sc.SelectiveKernels, "from_source", staticmethod(broken))
    with pytest.warns(sc.KernelFallbackWarning, match="CUDA_ERROR_NO_BINARY_FOR_GPU; selective_cuda dropped"):
        assert sc.usable("cuda:1") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sc.usable("cuda:1") is False  # decided once: no second load, no second warning
    assert loads == [1]


def test_a_launch_failure_answers_with_the_torch_reference(monkeypatch, fresh_registry):
    class Failing:
        calls = 0

        def scores(self, *args, **kwargs):
            Failing.calls += 1
            raise FakeDriverError("CUDA_ERROR_ILLEGAL_ADDRESS")

        def log_softmax(self, *args, **kwargs):
            raise AssertionError("not reached")

    monkeypatch.setattr(sc, "default_kernels", lambda index: Failing())
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 6, generator=gen), torch.randn(9, 6, generator=gen)
    tokens = torch.tensor([[0, 4, -1], [8, 9, 2], [-1, -1, -1]], dtype=torch.int32)
    want = selective_torch.selective_scores(hidden, weight, None, tokens)
    with pytest.warns(sc.KernelFallbackWarning, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        got = sc.selective_scores(hidden, weight, None, tokens)
    torch.testing.assert_close(got, want)
    out = torch.empty(3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sc.selective_log_softmax(hidden, weight, None, tokens, out=out) is out
    torch.testing.assert_close(out, selective_torch.selective_log_softmax(hidden, weight, None, tokens))
    assert Failing.calls == 1  # dropped after the first failure


def test_bad_operands_are_the_callers_error_not_a_fallback(monkeypatch, fresh_registry):
    class Checking:
        def scores(self, hidden, *args, **kwargs):
            raise ValueError("slot_tokens must be 2-D")

    monkeypatch.setattr(sc, "default_kernels", lambda index: Checking())
    with pytest.raises(ValueError, match="2-D"):
        sc.selective_scores(torch.zeros(1, 2), torch.zeros(2, 2), None, torch.zeros(3, dtype=torch.int32))
    assert sc._FAILED == {}


def test_from_bytes_hands_the_driver_exactly_the_checked_bytes(monkeypatch):
    seen: list[bytes] = []

    def from_file(cls, path, device=None):
        seen.append(Path(path).read_bytes())
        assert oct(Path(path).stat().st_mode & 0o777) == "0o600"
        return object.__new__(cls)

    monkeypatch.setattr(sc.SelectiveKernels, "from_file", classmethod(from_file))
    monkeypatch.setattr(sc, "_device_index", lambda device: 0)
    kernels = sc.SelectiveKernels.from_bytes(b"\x7fELF exact", "cubin", "kernels/sm_90/selective.cubin", 0)
    assert seen == [b"\x7fELF exact"] and kernels.origin == "kernels/sm_90/selective.cubin"


def test_int64_slot_tokens_are_narrowed_without_wrapping():
    """D4: 2**32 + 3 must not become the valid token 3; anything outside [0, V) is an empty slot (-1)."""
    from zerogr_build.cuda.launch import prepare_call

    tokens = torch.tensor([[2**32 + 3, 5, -(2**40), 9, 2**31, 0]], dtype=torch.int64)
    call = prepare_call(torch.zeros(1, 4), torch.zeros(9, 4), None, tokens, require_cuda=False)
    assert call.slot_tokens.dtype == torch.int32
    assert call.slot_tokens.tolist() == [[-1, 5, -1, -1, -1, 0]]


def test_cupy_stream_prefers_from_external_and_falls_back_to_external_stream():
    """D10: CuPy 14 wraps torch's stream with Stream.from_external; older CuPy gets ExternalStream."""
    from types import SimpleNamespace

    torch_stream = SimpleNamespace(cuda_stream=1234)
    calls: list = []

    class Stream:
        @staticmethod
        def from_external(obj):
            calls.append(("from_external", obj))
            return "new"

    def external(handle, device):
        calls.append(("ExternalStream", handle, device))
        return "old"

    cupy14 = SimpleNamespace(cuda=SimpleNamespace(Stream=Stream, ExternalStream=external))
    assert sc.cupy_stream(cupy14, torch_stream, 2) == "new" and calls == [("from_external", torch_stream)]
    calls.clear()
    cupy13 = SimpleNamespace(cuda=SimpleNamespace(Stream=object, ExternalStream=external))
    assert sc.cupy_stream(cupy13, torch_stream, 2) == "old" and calls == [("ExternalStream", 1234, 2)]


def test_torch_floor_covers_the_cuda_paths_uint16_tables():
    """D6: the device tables view uint16 tokens (torch.uint16: torch 2.3); the floor must say so and the
    installed torch must satisfy it."""
    import re

    import tomllib

    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    (spec,) = [d for d in deps if re.match(r"torch\b", d)]
    floor = tuple(int(x) for x in re.search(r">=\s*(\d+)\.(\d+)", spec).groups())
    assert floor >= (2, 3) and hasattr(torch, "uint16")
    assert tuple(int(x) for x in torch.__version__.split(".")[:2]) >= floor
