"""Ahead-of-time compilation of the package's CUDA kernels with nvcc (cubin or PTX per architecture).

`tune` ships the compiled files inside a bundle (``kernels/<arch>/<name>.<kind>``, docs/bundle-format.md
section 11) so a serving process loads them with `bundle_kernels.load_bundle_kernels` instead of compiling
at start-up. The CUDA sources are
package data (``zerogr_build/cuda/*.cu``), found next to this module.

The nvcc invocation and the compiled-file cache are zerogr_build/cuda/nvcc.py's (torch-free, so the
build uses it without importing torch); this module re-exports them next to the entry-point list.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .nvcc import (
    KERNEL_DIR,
    KINDS,
    SUPPORTED_ARCHS,
    KernelCompileError,
    compile_kernels,
    compiled_kernel_name,
    find_nvcc,
    kernel_sources,
    run_nvcc,
)

# Every extern "C" entry point of cuda/selective.cu; the loader and the tests check against this list.
SELECTIVE_ENTRY_POINTS = (
    "selective_scores_f32",
    "selective_scores_f16",
    "selective_scores_bf16",
    "selective_log_softmax_f32",
    "selective_log_softmax_f16",
    "selective_log_softmax_bf16",
    "selective_row_log_softmax_inplace",
)


def kernel_source_path(name: str = "selective.cu") -> Path:
    """Path of one kernel source by file name, e.g. ``selective.cu``."""
    path = KERNEL_DIR / name
    if not path.is_file():
        raise KernelCompileError(f"kernel source {path} not found (broken installation?)")
    return path


def read_kernel_source(name: str = "selective.cu") -> str:
    """Text of one kernel source (what NVRTC compiles at run time)."""
    return kernel_source_path(name).read_text(encoding="utf-8")


def ptxas_report(arch: str, source: str | Path | None = None, *, nvcc: str | None = None) -> str:
    """ptxas resource usage (registers, spills, shared memory per entry point) for one source and arch.

    Compiles to a throw-away cubin with ``-Xptxas -v`` and returns nvcc's diagnostic text.
    """
    src = Path(source) if source is not None else kernel_source_path()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc or find_nvcc(), "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v"]
        return run_nvcc([*cmd, "-o", str(Path(tmp) / "report.cubin"), str(src)], 300.0)


__all__ = [
    "KERNEL_DIR",
    "KINDS",
    "SELECTIVE_ENTRY_POINTS",
    "SUPPORTED_ARCHS",
    "KernelCompileError",
    "compile_kernels",
    "compiled_kernel_name",
    "find_nvcc",
    "kernel_source_path",
    "kernel_sources",
    "read_kernel_source",
    "ptxas_report",
]
