"""The CUDA kernels' logic, run on the CPU: cuda/selective.cu compiled as C++ against a tiny emulation of
the CUDA features it uses, then compared with the torch reference (selective_torch).

Why: CPU CI has no GPU, and compiling with nvcc proves only that the kernels build. Here the packaged
source itself (indexing, slot loops, block partitioning from `cuda.launch`'s launch geometry, vectorised
and scalar paths, warp shuffles, the online log-sum-exp and its block reduction, -inf handling) runs with
one OS thread per CUDA thread: `__syncthreads` is a block-wide barrier, `__shfl_xor_sync` a warp-wide
exchange through memory between two barriers, `__shared__` memory is shared by the block's threads, and
blocks run one after another. A divergent barrier or shuffle would deadlock (caught by a timeout). The one
inline-PTX line (fp16 -> fp32 `cvt`) is replaced by the same conversion on the host. What this cannot show
(memory-model effects of real warps, speed, NVRTC/CuPy loading) is covered by the GPU tests in
test_kernels.py. Skipped when no C++20 compiler (g++ or clang++ with <barrier>) is found.
"""

from __future__ import annotations

import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_build.base import selective_torch as st
from zerogr_build.cuda import compile as kc
from zerogr_build.cuda import launch as cl
from zerogr_build.testing import make_case

SHIM = r"""
#include <barrier>
#include <math.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>
struct float4 { float x, y, z, w; };
struct uint4 { unsigned int x, y, z, w; };
struct float2 { float x, y; };
struct dim3_ { unsigned x, y, z; };
inline float2 make_float2(float a, float b) { return float2{a, b}; }
thread_local dim3_ threadIdx, blockIdx;
dim3_ blockDim, gridDim;
std::barrier<>* g_block_barrier;
std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
float g_shfl[32][32];
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int offset) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    g_shfl[warp][lane] = v;
    g_warp_barriers[warp]->arrive_and_wait();
    const float r = g_shfl[warp][lane ^ offset];
    g_warp_barriers[warp]->arrive_and_wait();
    return r;
}
template <typename T> inline T __ldg(const T* p) { return *p; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float emu_half_to_float(unsigned short b) { _Float16 h; std::memcpy(&h, &b, 2); return (float)h; }
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
namespace zg { alignas(16) float4 zg_dynamic_smem[1 << 14]; }

template <typename F>
void launch(dim3_ grid, dim3_ block, F body) {
    gridDim = grid;
    blockDim = block;
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> bar(block.x);
            g_block_barrier = &bar;
            g_warp_barriers.clear();
            for (unsigned w = 0; w < block.x / 32; ++w) g_warp_barriers.emplace_back(new std::barrier<>(32));
            std::memset(zg::zg_dynamic_smem, 0xff, sizeof(zg::zg_dynamic_smem));  // NaN-poisoned
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < block.x; ++t)
                threads.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {bx, by, 0}; body(); });
            for (auto& th : threads) th.join();
        }
}
"""

HARNESS = r"""
static std::vector<char> read_file(const char* path) {
    std::vector<char> v;
    FILE* f = fopen(path, "rb");
    if (!f) return v;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    v.resize(n);  // exactly sized: under AddressSanitizer any read past an operand's extent is caught
    if (fread(v.data(), 1, n, f) != (size_t)n) exit(3);
    fclose(f);
    return v;
}
// argv: entry gridx gridy block R K d V hidden_stride weight_stride slots_stride out_stride has_bias
//       slots_per_block weight_byte_offset hidden.bin weight.bin bias.bin tokens.bin out.bin (rewritten)
int main(int argc, char** argv) {
    if (argc != 21) return 2;
    const std::string entry = argv[1];
    const dim3_ grid{(unsigned)atoi(argv[2]), (unsigned)atoi(argv[3]), 1};
    const dim3_ block{(unsigned)atoi(argv[4]), 1, 1};
    const int R = atoi(argv[5]), K = atoi(argv[6]), d = atoi(argv[7]);
    const long long V = atoll(argv[8]), hs = atoll(argv[9]), ws = atoll(argv[10]), ss = atoll(argv[11]);
    const long long os = atoll(argv[12]), woff = atoll(argv[15]);
    const int has_bias = atoi(argv[13]), spb = atoi(argv[14]);
    auto H = read_file(argv[16]), W = read_file(argv[17]), B = read_file(argv[18]), T = read_file(argv[19]);
    auto O = read_file(argv[20]);
    // weight copied to a 16-byte aligned address + woff bytes, in an allocation that ends exactly there
    char* wraw = static_cast<char*>(::operator new[](W.size() + woff, std::align_val_t(16)));
    char* wbase = wraw + woff;
    std::memcpy(wbase, W.data(), W.size());
    const void* h = H.data();
    const void* w = wbase;
    const void* b = has_bias ? (const void*)B.data() : nullptr;
    const int* t = (const int*)T.data();
    float* o = (float*)O.data();
#define SCORES(NAME, T) \
    if (entry == #NAME) launch(grid, block, [&] { \
        NAME((const T*)h, hs, (const T*)w, ws, (const T*)b, t, ss, o, os, K, d, V, spb); });
#define LSM(NAME, T) \
    if (entry == #NAME) launch(grid, block, [&] { \
        NAME((const T*)h, hs, (const T*)w, ws, (const T*)b, t, ss, o, os, K, d, V); });
    SCORES(selective_scores_f32, float)
    SCORES(selective_scores_f16, zg::f16)
    SCORES(selective_scores_bf16, zg::bf16)
    LSM(selective_log_softmax_f32, float)
    LSM(selective_log_softmax_f16, zg::f16)
    LSM(selective_log_softmax_bf16, zg::bf16)
    if (entry == "selective_row_log_softmax_inplace")
        launch(grid, block, [&] { selective_row_log_softmax_inplace(o, os, K); });
    FILE* f = fopen(argv[20], "wb");
    fwrite(O.data(), 1, (size_t)R * os * 4, f);
    fclose(f);
    ::operator delete[](wraw, std::align_val_t(16));
    return 0;
}
"""


def _emulated_source() -> str:
    source = kc.read_kernel_source()
    cvt = 'asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));'
    assert cvt in source and "extern __shared__" in source, "kernel changed: update the emulation test"
    source = source.replace(cvt, "f = emu_half_to_float(x.bits);")
    return SHIM + source.replace("extern __shared__", "extern") + HARNESS


SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer")


def _build(work: Path, flags: tuple[str, ...]) -> Path:
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++/clang++) to build the CPU emulation of the kernels")
    (work / "emulated.cpp").write_text(_emulated_source())
    exe = work / "emulated"
    cmd = [
        compiler,
        "-std=c++20",
        "-O1",
        "-pthread",
        "-w",
        *flags,
        "-o",
        str(exe),
        str(work / "emulated.cpp"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        if "barrier" in proc.stderr or "_Float16" in proc.stderr or "c++20" in proc.stderr:
            pytest.skip(f"{compiler} lacks C++20 <barrier> or _Float16: {proc.stderr.strip()[:200]}")
        if flags and ("sanitize" in proc.stderr or "asan" in proc.stderr or "ubsan" in proc.stderr):
            pytest.skip(f"{compiler} cannot build with {' '.join(flags)}: {proc.stderr.strip()[:200]}")
        pytest.fail(f"emulated kernel source does not compile:\n{proc.stderr}")
    return exe


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("kernel_emulation"), ())


@pytest.fixture(scope="module")
def sanitized_harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same harness under AddressSanitizer + UndefinedBehaviorSanitizer (every operand buffer exactly
    sized, so a read one element past an extent aborts the run)."""
    return _build(tmp_path_factory.mktemp("kernel_emulation_asan"), SANITIZE)


def _raw(t: torch.Tensor | None) -> bytes:
    """The bytes a kernel may read: contiguous, or for a 2-D view with unit last stride (a padded weight
    such as zeros(V, 72)[:, :70]) its storage from the first to the last element, rows `stride(0)` apart."""
    if t is None:
        return b""
    if t.dim() == 2 and t.stride(1) == 1 and t.stride(0) != t.shape[1] and t.shape[0] > 0:
        extent = (t.shape[0] - 1) * t.stride(0) + t.shape[1]
        t = t.as_strided((extent,), (1,))
    t = t.contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


class Emulated:
    """Runs one entry point of the emulated kernels on strided host buffers, like the launcher would."""

    def __init__(self, exe: Path, work: Path) -> None:
        self.exe = exe
        self.work = work

    def launch(
        self,
        entry,
        geometry,
        hidden_buf,
        hidden_stride,
        weight,
        bias,
        tokens_buf,
        out,
        *,
        dims,
        slots_per_block=0,
        weight_byte_offset=0,
    ):
        rows, slots, dim, vocab = dims
        paths = []
        for name, data in (("h", hidden_buf), ("w", weight), ("b", bias), ("t", tokens_buf), ("o", out)):
            path = self.work / f"{name}.bin"
            path.write_bytes(_raw(data) if not isinstance(data, np.ndarray) else data.tobytes())
            paths.append(str(path))
        args = [
            entry,
            *geometry.grid[:2],
            geometry.block[0],
            rows,
            slots,
            dim,
            vocab,
            hidden_stride,
            weight.stride(0),
            tokens_buf.stride(0),
            out.shape[1],
            int(bias is not None),
            slots_per_block,
            weight_byte_offset,
            *paths,
        ]
        proc = subprocess.run([str(self.exe), *map(str, args)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{entry} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        return np.fromfile(paths[-1], dtype=np.float32).reshape(out.shape)


SHAPES = [  # (R, K, d, V): one slot; d below the vector width; d = 130 (vector + tail); K > 64 (3 blocks)
    (1, 1, 1, 3),
    (5, 3, 7, 11),
    (6, 17, 130, 257),
    (3, 150, 64, 500),
    (2, 5, 3000, 20),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_emulated_kernels_match_reference(harness: Path, tmp_path: Path, dtype, shape) -> None:
    _check_case(harness, tmp_path, dtype, shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_padded_weight_view_runs_vector_loads_with_a_scalar_tail(
    harness: Path, tmp_path: Path, dtype
) -> None:
    """D8: rows 72 elements apart (16-byte aligned) but d = 70: vector packs, then a scalar tail."""
    _check_case(harness, tmp_path, dtype, (6, 40, 70, 97), weight_pad=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_scores_propagate_like_the_torch_reference(harness: Path, tmp_path: Path, dtype) -> None:
    """D5: a NaN score is NaN in the output, never -inf: row 2 has a NaN hidden element (every valid
    score NaN), row 3 one NaN weight row among finite ones; both match torch's masked_log_softmax."""
    _check_case(harness, tmp_path, dtype, (5, 70, 13, 50), nan=True)


SANITIZED_CASES = [  # (dtype, shape, weight_pad, nan): every code path once, with the new cases
    (torch.float32, (5, 3, 7, 11), 0, False),
    (torch.float16, (6, 17, 130, 257), 0, False),
    (torch.bfloat16, (3, 150, 64, 500), 0, False),
    (torch.float32, (6, 40, 70, 97), 2, False),
    (torch.float16, (4, 9, 70, 33), 2, False),
    (torch.float32, (5, 70, 13, 50), 0, True),
]


@pytest.mark.parametrize(("dtype", "shape", "weight_pad", "nan"), SANITIZED_CASES)
def test_emulated_kernels_under_asan_and_ubsan(
    sanitized_harness: Path, tmp_path: Path, dtype, shape, weight_pad, nan
):
    _check_case(sanitized_harness, tmp_path, dtype, shape, weight_pad=weight_pad, nan=nan)


def _check_case(exe: Path, tmp_path: Path, dtype, shape, *, weight_pad: int = 0, nan: bool = False) -> None:
    """Every entry point on one case (strided operands, aligned and misaligned weight) against the torch
    reference. weight_pad: weight rows d + pad elements apart (a padded view); nan: NaN injected."""
    rows, slots, dim, vocab = shape
    seed = zlib.crc32(repr((dtype, shape)).encode())
    hidden, weight, bias, tokens = make_case(seed, dtype, rows, slots, dim, vocab, with_bias=rows % 2 == 1)
    if weight_pad:
        padded = torch.zeros(vocab, dim + weight_pad, dtype=dtype)
        padded[:, :dim] = weight
        weight = padded[:, :dim]
    if nan:
        hidden[2, 1] = float("nan")
        weight[int(tokens[3][(tokens[3] >= 0) & (tokens[3] < vocab)][0])] = float("nan")
    # Strided operands, as the launcher passes them: hidden rows 2*d apart, token rows K+2 apart, out rows
    # K+3 apart (the padding must stay NaN: nothing may be written outside [R, K]).
    hidden_buf = torch.zeros(2 * rows, dim, dtype=dtype)
    hidden_buf[::2] = hidden
    tokens_buf = torch.full((rows, slots + 2), 1, dtype=torch.int32)
    tokens_buf[:, :slots] = tokens
    want_scores = st.selective_scores(hidden, weight, bias, tokens.long()).numpy()
    want_log = st.selective_log_softmax(hidden, weight, bias, tokens.long()).numpy()
    valid = ((tokens >= 0) & (tokens < vocab)).numpy()
    emu = Emulated(exe, tmp_path)
    suffix = cl.entry_suffix(dtype)
    element = torch.empty((), dtype=dtype).element_size()

    def run(entry, geometry, out, **kw):
        """One launch on the strided buffers, writing into `out` fp32 [R, K + 3] (NaN-poisoned)."""
        return emu.launch(
            entry, geometry, hidden_buf, 2 * dim, weight, kw.pop("bias", bias), tokens_buf, out,
            dims=(rows, slots, dim, vocab), **kw,
        )  # fmt: skip

    def poisoned() -> np.ndarray:
        return np.full((rows, slots + 3), np.nan, dtype=np.float32)

    results = {}
    for offset in (0, element):  # 16-byte aligned weight (vector loads) and misaligned (scalar loads)
        geo = cl.scores_geometry(rows, slots, dim)
        per_block = min(slots, cl.SLOTS_PER_BLOCK)
        scores = run(
            f"selective_scores_{suffix}",
            geo,
            poisoned(),
            slots_per_block=per_block,
            weight_byte_offset=offset,
        )
        results[f"scores+{offset}"] = (scores, want_scores)
        geo = cl.fused_geometry(rows, slots, dim)
        fused = run(f"selective_log_softmax_{suffix}", geo, poisoned(), weight_byte_offset=offset)
        results[f"fused+{offset}"] = (fused, want_log)
    geo = cl.row_log_softmax_geometry(rows, slots)
    two_pass = run("selective_row_log_softmax_inplace", geo, results["scores+0"][0].copy(), bias=None)
    results["two-pass"] = (two_pass, want_log)
    for name, (full, want) in results.items():
        assert np.isnan(full[:, slots:]).all(), f"{name}: wrote outside the [R, K] view"
        got = full[:, :slots]
        assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: NaN exactly where torch has NaN"
        assert nan or not np.isnan(got).any(), f"{name}: NaN left (an element was never written, or 0 * inf)"
        assert np.array_equal(np.isneginf(got), ~valid), f"{name}: -inf must be exactly the empty slots"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
        if not name.startswith("scores"):
            has_valid = valid.any(axis=1) & ~np.isnan(want).any(axis=1)
            mass = torch.logsumexp(torch.from_numpy(got[has_valid]), dim=1)
            torch.testing.assert_close(mass, torch.zeros_like(mass), rtol=0, atol=1e-5)
