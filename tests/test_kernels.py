"""CUDA selective-scoring kernels: nvcc compilation (CPU CI) and exactness against the torch reference (GPU).

CPU part: every kernel source is compiled with nvcc for sm_80 and sm_90, to cubin and to PTX, and every
entry point the loader needs must be in the result (skipped, saying so, only when nvcc is missing); ptxas
must report no register spills; launch geometry and operand checks are exercised as the pure functions they
are, and so is the choice of the compiled file a bundle ships for an architecture. GPU part (marked `gpu`,
skipped without CUDA + CuPy): the kernels against `selective_torch` on fresh random inputs (the shared
`make_case`), with the output buffer poisoned with NaN first and every element checked, empty slots, rows
without any valid slot, out-of-range tokens, fp32/fp16/bf16, d not a multiple of the vector width, strided
and misaligned operands, both log-softmax paths, torch streams and CUDA graphs, and the bundle's cubin/PTX
loaded by `load_bundle_kernels` (what the Decoder does) against the NVRTC path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zerogr_build.base.dtypes import dtype_name
from zerogr_build.bundle import add_bundle_files, open_bundle, publish_bundle
from zerogr_build.cuda import bundle_kernels as bk
from zerogr_build.cuda import compile as kc
from zerogr_build.cuda import launch as cl
from zerogr_build.cuda import selective as sc
from zerogr_build.index import build_index
from zerogr_build.testing import make_case
from zerogr_build.tune.check import CHECK_TOLERANCE

ARCHS = ("sm_80", "sm_90")
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(
    NVCC is None, reason="nvcc not on PATH: install the CUDA toolkit to compile-check the kernels"
)


# ------------------------------------------------------------------------------------------------------
# CPU: ahead-of-time compilation


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", kc.KINDS)
def test_every_kernel_compiles_with_every_entry_point(tmp_path: Path, arch: str, kind: str) -> None:
    paths = kc.compile_kernels(arch, kind, tmp_path)
    assert [p.name for p in paths] == [f"{src.stem}.{kind}" for src in kc.kernel_sources()]
    selective = tmp_path / f"selective.{kind}"
    data = selective.read_bytes()
    if kind == "ptx":
        text = data.decode()
        assert re.search(rf"^\.target\s+{arch}\b", text, re.M), f"PTX not targeting {arch}"
        entries = set(re.findall(r"\.visible \.entry (\w+)\(", text))
        assert set(kc.SELECTIVE_ENTRY_POINTS) <= entries, set(kc.SELECTIVE_ENTRY_POINTS) - entries
    else:
        assert data[:4] == b"\x7fELF"
        for name in kc.SELECTIVE_ENTRY_POINTS:
            assert name.encode() + b"\x00" in data, f"{name} missing from the cubin's symbols"
    assert not list(tmp_path.glob("*.tmp")), "temporary nvcc outputs left behind"


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_no_register_spills(arch: str) -> None:
    report = kc.ptxas_report(arch)
    compiled = re.findall(r"Compiling entry function '(\w+)'", report)
    assert set(kc.SELECTIVE_ENTRY_POINTS) <= set(compiled)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(a == "0" and b == "0" for a, b in spills), report


def test_compile_rejects_bad_arch_kind_and_missing_nvcc(tmp_path: Path) -> None:
    with pytest.raises(kc.KernelCompileError, match="architecture"):
        kc.compile_kernels("compute_90", "cubin", tmp_path)
    with pytest.raises(kc.KernelCompileError, match="kind"):
        kc.compile_kernels("sm_90", "fatbin", tmp_path)
    with pytest.raises(kc.KernelCompileError, match="cannot run nvcc"):
        kc.compile_kernels("sm_90", "ptx", tmp_path, nvcc=str(tmp_path / "no-such-nvcc"))
    assert not list(tmp_path.iterdir())


@needs_nvcc
def test_nvcc_failure_is_reported_with_its_output(tmp_path: Path) -> None:
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k() { this is not cuda; }\n')
    with pytest.raises(kc.KernelCompileError, match="nvcc failed"):
        kc.compile_kernels("sm_90", "ptx", tmp_path / "out", sources=[broken])
    assert not (tmp_path / "out" / "broken.ptx").exists()


def test_sources_are_package_data() -> None:
    assert kc.kernel_source_path("selective.cu") in kc.kernel_sources()
    source = kc.read_kernel_source()
    for name in kc.SELECTIVE_ENTRY_POINTS:
        assert re.search(rf"\b{name}\b", source), name
    # NVRTC next to a CuPy wheel may have no CUDA include directory: the source must not need one.
    assert "#include" not in source
    assert kc.compiled_kernel_name("selective.cu", "cubin") == "selective.cubin"


def _find_nvrtc() -> str | None:
    """libnvrtc from $ZEROGR_NVRTC_LIB, the system, or the nvidia-cuda-nvrtc wheel; None if absent."""
    explicit = os.environ.get("ZEROGR_NVRTC_LIB")
    if explicit:
        return explicit
    found = ctypes.util.find_library("nvrtc")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for root in nvidia.__path__:
        for lib in sorted(Path(root).glob("*/lib/libnvrtc.so*")):
            return str(lib)
    return None


@pytest.mark.parametrize("arch", ARCHS)
def test_source_compiles_with_nvrtc_without_include_paths(arch: str) -> None:
    """What CuPy's RawModule does at load time: NVRTC, no -I options, exactly the packaged source."""
    lib_path = _find_nvrtc()
    if lib_path is None:
        pytest.skip("libnvrtc not found (set ZEROGR_NVRTC_LIB or install nvidia-cuda-nvrtc)")
    lib_dir = Path(lib_path).parent
    for builtins in sorted(lib_dir.glob("libnvrtc-builtins.so*")):  # NVRTC dlopens it by name
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()
    source = kc.read_kernel_source().encode()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"selective.cu", 0, None, None) == 0
    options = (ctypes.c_char_p * 1)(f"-arch=compute_{arch[3:]}".encode())
    status = nvrtc.nvrtcCompileProgram(prog, 1, options)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    assert status == 0, log.value.decode(errors="replace")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    entries = set(re.findall(r"\.visible \.entry (\w+)\(", ptx.value.decode()))
    assert set(kc.SELECTIVE_ENTRY_POINTS) <= entries


# ------------------------------------------------------------------------------------------------------
# CPU: loader logic that needs no device (import hygiene, operand checks, launch geometry)


def test_importing_the_loader_does_not_import_cupy() -> None:
    code = (
        "import sys, zerogr_build.cuda.selective as s; "
        "assert 'cupy' not in sys.modules, 'cupy imported at module load'; print(s.is_available())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_is_available_false_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert sc.is_available() is False
    with pytest.raises(sc.KernelLoadError, match="CUDA device"):
        sc.SelectiveKernels.from_source()


def _operands(dtype: torch.dtype = torch.float32, r: int = 3, k: int = 4, d: int = 8, v: int = 10):
    hidden = torch.randn(r, d).to(dtype)
    weight = torch.randn(v, d).to(dtype)
    bias = torch.randn(v).to(dtype)
    slots = torch.randint(-1, v, (r, k), dtype=torch.int32)
    return hidden, weight, bias, slots


@pytest.mark.parametrize(
    "dtype,suffix", [(torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")]
)
def test_check_operands_accepts_the_contract_and_reports_strides(dtype: torch.dtype, suffix: str) -> None:
    hidden, weight, bias, slots = _operands(dtype)
    big = torch.randn(10, 20).to(dtype)
    ops = cl.check_operands(hidden[::1], big[:, 4:12], bias, slots, require_cuda=False)
    assert (ops.rows, ops.slots, ops.dim, ops.vocab, ops.suffix) == (3, 4, 8, 10, suffix)
    strides = (ops.hidden_row_stride, ops.weight_row_stride, ops.slots_row_stride, ops.out_row_stride)
    assert strides == (8, 20, 4, 4)
    ops = cl.check_operands(hidden[0].expand(3, 8), weight, None, slots, require_cuda=False)
    assert ops.hidden_row_stride == 0


def test_check_operands_rejects_contract_violations() -> None:
    hidden, weight, bias, slots = _operands()
    bad = [
        ((hidden.double(), weight.double(), None, slots), TypeError, "not supported"),
        ((hidden, weight.half(), None, slots), TypeError, "weight dtype"),
        ((hidden, weight, bias.half(), slots), TypeError, "bias dtype"),
        ((hidden, weight, None, slots.float()), TypeError, "slot_tokens must be int32"),
        ((hidden, weight[:, :5], None, slots), ValueError, "d differs"),
        ((hidden[:2], weight, None, slots), ValueError, "rows"),
        ((hidden, weight, bias[:9], slots), ValueError, "bias must have shape"),
        ((hidden, weight, torch.randn(10, 2)[:, 0], slots), ValueError, "bias must be contiguous"),
        ((hidden.t().contiguous().t(), weight, None, slots), ValueError, "hidden must have unit stride"),
        ((hidden, weight.t().contiguous().t(), None, slots), ValueError, "weight must have unit stride"),
        ((hidden[0], weight, None, slots), ValueError, "hidden must be 2-D"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            cl.check_operands(*args, require_cuda=False)
    with pytest.raises(ValueError, match="out must have shape"):
        cl.check_operands(hidden, weight, None, slots, torch.empty(3, 5), require_cuda=False)
    with pytest.raises(TypeError, match="out must be float32"):
        out16 = torch.empty(3, 4, dtype=torch.float16)
        cl.check_operands(hidden, weight, None, slots, out16, require_cuda=False)
    with pytest.raises(ValueError, match="need CUDA tensors"):
        cl.check_operands(hidden, weight, None, slots)


SM_COUNT = 132  # an H100's


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 5000), slots=st.integers(1, 200_000), dim=st.integers(0, 20_000))
@example(rows=SM_COUNT - 1, slots=cl.SLOTS_PER_BLOCK + 1, dim=8)
@example(rows=SM_COUNT, slots=cl.SLOTS_PER_BLOCK + 1, dim=8)
@example(rows=1, slots=cl.SLOTS_PER_BLOCK, dim=8)
def test_launch_geometry_covers_every_slot_once(rows: int, slots: int, dim: int) -> None:
    geo = cl.scores_geometry(rows, slots, dim)
    per_block = min(slots, cl.SLOTS_PER_BLOCK)
    grid_r, chunks, grid_z = geo.grid
    assert (grid_r, grid_z) == (rows, 1) and geo.shared_bytes == 4 * dim and chunks <= 65535
    # Block y owns slots [y * per_block, min(K, (y + 1) * per_block)): a partition of range(K), none empty.
    assert (chunks - 1) * per_block < slots <= chunks * per_block
    fused = cl.fused_geometry(rows, slots, dim)
    for g in (geo, fused, cl.row_log_softmax_geometry(rows, slots)):
        threads = g.block[0]
        assert threads % 32 == 0 and 32 <= threads <= 32 * cl.MAX_WARPS
    assert fused.grid == (rows, 1, 1)
    # The consequence use_fused is for: the fused kernel (one block per row) is chosen exactly when it
    # occupies every SM or the two-pass scores kernel would launch no more blocks than it does.
    fused_blocks, two_pass_blocks = fused.grid[0], geo.grid[0] * geo.grid[1]
    fills_the_gpu = fused_blocks >= SM_COUNT
    assert cl.use_fused(rows, slots, sm_count=SM_COUNT) == (fills_the_gpu or two_pass_blocks == fused_blocks)


def _bundle_with_files(tmp_path: Path, files: dict[str, bytes]):
    sids = np.array([[0, 1], [1, 0], [1, 1]])
    version = publish_bundle(build_index(sids, (2, 2)), pa.array([10, 11, 12]), tmp_path / "out").path
    if files:
        add_bundle_files(version, files)
    return open_bundle(version)


def test_bundle_kernel_file_prefers_the_cubin_of_the_arch(tmp_path: Path) -> None:
    """Which shipped file load_bundle_kernels loads: cubin of exactly this arch, else its PTX, else none;
    only files the manifest lists count."""
    none = _bundle_with_files(tmp_path / "a", {})
    assert bk.bundle_kernel_file(none, "sm_90") is None
    ptx = _bundle_with_files(tmp_path / "b", {"kernels/sm_90/selective.ptx": b"ptx"})
    assert bk.bundle_kernel_file(ptx, "sm_90") == "kernels/sm_90/selective.ptx"
    assert bk.bundle_kernel_file(ptx, "sm_80") is None
    (ptx.path / "kernels" / "sm_90" / "selective.cubin").write_bytes(b"\x7fELF")  # on disk, not listed
    assert bk.bundle_kernel_file(ptx, "sm_90") == "kernels/sm_90/selective.ptx"
    both = _bundle_with_files(
        tmp_path / "c", {"kernels/sm_90/selective.ptx": b"ptx", "kernels/sm_90/selective.cubin": b"\x7fELF"}
    )
    assert bk.bundle_kernel_file(both, "sm_90") == "kernels/sm_90/selective.cubin"
    assert bk.bundle_kernel_file(both, "sm_80") is None
    assert bk.load_bundle_kernels(both, "cpu") is None  # not a CUDA device: nothing to load


# ------------------------------------------------------------------------------------------------------
# GPU: kernels against the torch reference

requires_gpu = pytest.mark.skipif(
    not sc.is_available(), reason="needs a CUDA device and CuPy (pip install 'zerogr[gpu]')"
)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _cuda_case(gen: torch.Generator, dtype: torch.dtype, rows: int, slots: int, dim: int, vocab: int, **kw):
    return make_case(gen, dtype, rows, slots, dim, vocab, device="cuda", **kw)


def _poisoned(rows: int, slots: int) -> torch.Tensor:
    return torch.full((rows, slots), float("nan"), dtype=torch.float32, device="cuda")


def _check_scores(got: torch.Tensor, hidden, weight, bias, tokens) -> None:
    from zerogr_build.base import selective_torch

    want = selective_torch.selective_scores(hidden, weight, bias, tokens.long())
    valid = (tokens >= 0) & (tokens < weight.shape[0])
    assert not torch.isnan(got).any(), "NaN left in the output (an element was never written)"
    assert torch.equal(torch.isneginf(got), ~valid), "-inf exactly at the empty slots"
    assert torch.isfinite(got[valid]).all()
    rtol, atol = CHECK_TOLERANCE[dtype_name(hidden.dtype)]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _check_log_softmax(got: torch.Tensor, hidden, weight, bias, tokens) -> None:
    from zerogr_build.base import selective_torch

    want = selective_torch.selective_log_softmax(hidden, weight, bias, tokens.long())
    valid = (tokens >= 0) & (tokens < weight.shape[0])
    assert not torch.isnan(got).any(), "NaN in the output"
    assert torch.equal(torch.isneginf(got), ~valid)
    has_valid = valid.any(dim=1)
    row_mass = torch.logsumexp(got[has_valid], dim=1)
    torch.testing.assert_close(row_mass, torch.zeros_like(row_mass), rtol=0, atol=1e-5)
    rtol, atol = CHECK_TOLERANCE[dtype_name(hidden.dtype)]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def nvrtc_kernels():
    return sc.SelectiveKernels.from_source(torch.cuda.current_device())


SHAPES = [  # (R, K, d, V): single slot, d below/between vector widths, > 64 slots (several blocks), big R
    (1, 1, 1, 3),
    (5, 3, 7, 11),
    (9, 17, 130, 257),
    (37, 70, 64, 500),
    (1, 300, 96, 1000),
    (300, 9, 1000, 4096),
    (3, 5, 13000, 50),  # 52 kB of shared memory: needs the opt-in above 48 kB
]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_scores_match_reference(nvrtc_kernels, dtype, shape, with_bias) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, shape, with_bias)).encode()))
    rows, slots, dim, vocab = shape
    case = _cuda_case(gen, dtype, rows, slots, dim, vocab, with_bias=with_bias)
    out = _poisoned(rows, slots)
    got = nvrtc_kernels.scores(*case, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    _check_scores(got, *case)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fused", [True, False, None])
def test_log_softmax_matches_reference(nvrtc_kernels, dtype, shape, fused) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(repr((dtype, shape, fused)).encode()))
    rows, slots, dim, vocab = shape
    case = _cuda_case(gen, dtype, rows, slots, dim, vocab, with_bias=True)
    got = nvrtc_kernels.log_softmax(*case, out=_poisoned(rows, slots), fused=fused)
    torch.cuda.synchronize()
    _check_log_softmax(got, *case)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_without_valid_slots_are_all_neg_inf(nvrtc_kernels, dtype) -> None:
    hidden = torch.randn(4, 40, device="cuda").to(dtype)
    weight = torch.randn(30, 40, device="cuda").to(dtype)
    tokens = torch.full((4, 100), -1, dtype=torch.int32, device="cuda")
    tokens[2, 50] = 3  # one row with a single valid slot: log-prob exactly 0
    for fused in (True, False):
        got = nvrtc_kernels.log_softmax(hidden, weight, None, tokens, out=_poisoned(4, 100), fused=fused)
        torch.cuda.synchronize()
        assert not torch.isnan(got).any()
        expected = torch.full((4, 100), float("-inf"), device="cuda")
        expected[2, 50] = 0.0
        assert torch.equal(got, expected)
    scores = nvrtc_kernels.scores(hidden, weight, None, tokens, out=_poisoned(4, 100))
    assert torch.isneginf(scores).sum().item() == 399


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_misaligned_and_broadcast_operands(nvrtc_kernels, dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    rows, slots, dim, vocab = 16, 12, 72, 300
    hidden, weight, bias, tokens = _cuda_case(gen, dtype, rows, slots, dim, vocab, with_bias=True)
    wide = torch.zeros(vocab, dim + 24, dtype=dtype, device="cuda")
    wide[:, 3 : 3 + dim] = weight  # row stride 96, base 3 elements in: not 16-byte aligned -> scalar path
    misaligned = wide[:, 3 : 3 + dim]
    aligned_view = torch.zeros(vocab, dim + 8, dtype=dtype, device="cuda")
    aligned_view[:, :dim] = weight  # row stride 80 elements: 16-byte aligned for every dtype
    tall = torch.zeros(2 * rows, dim, dtype=dtype, device="cuda")
    tall[::2] = hidden
    token_cols = torch.full((rows, 2 * slots), 5, dtype=torch.int32, device="cuda")
    token_cols[:, :slots] = tokens
    for w in (misaligned, aligned_view[:, :dim]):
        for h, t in ((tall[::2], token_cols[:, :slots]), (hidden, tokens.long())):
            got = nvrtc_kernels.scores(h, w, bias, t, out=_poisoned(rows, slots))
            torch.cuda.synchronize()
            _check_scores(got, hidden, weight, bias, tokens)
    one = hidden[:1].expand(rows, dim)  # stride 0 between rows
    got = nvrtc_kernels.log_softmax(one, weight, bias, tokens, out=_poisoned(rows, slots))
    torch.cuda.synchronize()
    _check_log_softmax(got, one.contiguous(), weight, bias, tokens)
    out_wide = torch.full((rows, slots + 5), float("nan"), device="cuda")
    got = nvrtc_kernels.scores(hidden, weight, bias, tokens, out=out_wide[:, :slots])
    torch.cuda.synchronize()
    _check_scores(got, hidden, weight, bias, tokens)
    assert torch.isnan(out_wide[:, slots:]).all(), "wrote outside the out view"


@pytest.mark.gpu
@requires_gpu
def test_module_functions_empty_shapes_and_device_errors() -> None:
    gen = torch.Generator().manual_seed(11)
    case = _cuda_case(gen, torch.bfloat16, 6, 10, 33, 40, with_bias=False)
    _check_scores(sc.selective_scores(*case), *case)
    _check_log_softmax(sc.selective_log_softmax(*case), *case)
    hidden, weight, bias, tokens = case
    assert sc.selective_scores(hidden[:0], weight, None, tokens[:0]).shape == (0, 10)
    assert sc.selective_log_softmax(hidden, weight, None, tokens[:, :0]).shape == (6, 0)
    with pytest.raises(ValueError, match="device"):
        sc.selective_scores(hidden, weight.cpu(), None, tokens)
    with pytest.raises(TypeError, match="weight dtype"):
        sc.selective_scores(hidden, weight.float(), None, tokens)


@pytest.mark.gpu
@requires_gpu
def test_runs_on_torchs_current_stream_and_in_cuda_graphs(nvrtc_kernels) -> None:
    gen = torch.Generator().manual_seed(3)
    rows, slots, dim, vocab = 64, 16, 256, 2048
    hidden, weight, bias, tokens = _cuda_case(gen, torch.float16, rows, slots, dim, vocab, with_bias=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Produced and consumed on `side` only: correct results need the kernel on the current stream.
        h = hidden.float().mul(2.0).to(torch.float16)
        torch.cuda._sleep(10_000_000)
        out = nvrtc_kernels.log_softmax(h * 0.5, weight, bias, tokens)
        result = out.clone()
    side.synchronize()
    _check_log_softmax(result, hidden, weight, bias, tokens)

    static_hidden = hidden.clone()
    static_out = _poisoned(rows, slots)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        nvrtc_kernels.log_softmax(static_hidden, weight, bias, tokens, out=static_out)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvrtc_kernels.log_softmax(static_hidden, weight, bias, tokens, out=static_out)
    fresh = (torch.randn(rows, dim, generator=gen) / dim**0.5).to(torch.float16).cuda()
    static_hidden.copy_(fresh)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check_log_softmax(static_out, fresh, weight, bias, tokens)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", kc.KINDS)
def test_compiled_file_matches_nvrtc(nvrtc_kernels, tmp_path: Path, kind: str) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH on this GPU machine: cannot compile the cubin/PTX to load")
    arch = sc.device_arch()
    (path,) = kc.compile_kernels(arch, kind, tmp_path / "compiled")
    bundle = _bundle_with_files(tmp_path, {f"kernels/{arch}/{path.name}": path.read_bytes()})
    try:
        with pytest.warns(sc.KernelFallbackWarning, match="ships no compiled kernels"):
            fallback = bk.load_bundle_kernels(_bundle_with_files(tmp_path / "none", {}), "cuda:0")
        assert fallback is not None and fallback.origin == "nvrtc"  # a bundle without kernels: NVRTC
        from_file = bk.load_bundle_kernels(bundle, torch.device("cuda", torch.cuda.current_device()))
        assert from_file is not None and from_file.origin == f"kernels/{arch}/{path.name}"
        assert sc.default_kernels() is from_file  # the module-level functions now use the shipped file
    finally:
        sc.set_default_kernels(nvrtc_kernels)
    gen = torch.Generator().manual_seed(5)
    for dtype in DTYPES:
        case = _cuda_case(gen, dtype, 50, 80, 200, 999, with_bias=True)
        for fused in (True, False):
            a = from_file.log_softmax(*case, out=_poisoned(50, 80), fused=fused)
            b = nvrtc_kernels.log_softmax(*case, out=_poisoned(50, 80), fused=fused)
            torch.cuda.synchronize()
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
            _check_log_softmax(a, *case)
        a = from_file.scores(*case, out=_poisoned(50, 80))
        b = nvrtc_kernels.scores(*case, out=_poisoned(50, 80))
        torch.cuda.synchronize()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@requires_gpu
def test_cubin_for_another_arch_fails_loudly(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH on this GPU machine")
    major = torch.cuda.get_device_capability()[0]
    other = "sm_80" if major >= 9 else "sm_90"  # another major version: an sm_80 cubin runs on any 8.x
    (path,) = kc.compile_kernels(other, "cubin", tmp_path)
    with pytest.raises(sc.KernelLoadError, match="cannot load kernel entry points"):
        sc.SelectiveKernels.from_file(path)
