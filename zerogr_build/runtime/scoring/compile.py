"""Ahead-of-time compilation of the package's CUDA kernels with nvcc (cubin or PTX per architecture).

`tune` ships the compiled files inside a bundle (``kernels/<arch>/<name>.<kind>``, docs/bundle-format.md
section 11) so a serving process loads them with `selective_cuda.load_bundle_kernels` instead of compiling
at start-up. The CUDA sources are
package data (``zerogr_build/runtime/scoring/kernels/*.cu``), found next to this module.

Nothing here needs a GPU or CuPy: only the nvcc executable.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from zerogr_build.errors import ZerogrError

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
SUPPORTED_ARCHS = ("sm_80", "sm_90")
KINDS = ("cubin", "ptx")
# Every extern "C" entry point of kernels/selective.cu; the loader and the tests check against this list.
SELECTIVE_ENTRY_POINTS = (
    "selective_scores_f32",
    "selective_scores_f16",
    "selective_scores_bf16",
    "selective_log_softmax_f32",
    "selective_log_softmax_f16",
    "selective_log_softmax_bf16",
    "selective_row_log_softmax_inplace",
)
_ARCH_PATTERN = re.compile(r"^sm_\d{2,3}[af]?$")


class KernelCompileError(ZerogrError):
    """nvcc is missing, or it rejected a kernel source (the message carries its output)."""


def kernel_sources() -> list[Path]:
    """Paths of every ``.cu`` file shipped in the package, sorted by name."""
    sources = sorted(KERNEL_DIR.glob("*.cu"))
    if not sources:
        raise KernelCompileError(f"no CUDA kernel sources found in {KERNEL_DIR} (broken installation?)")
    return sources


def kernel_source_path(name: str = "selective.cu") -> Path:
    """Path of one kernel source by file name, e.g. ``selective.cu``."""
    path = KERNEL_DIR / name
    if not path.is_file():
        raise KernelCompileError(f"kernel source {path} not found (broken installation?)")
    return path


def read_kernel_source(name: str = "selective.cu") -> str:
    """Text of one kernel source (what NVRTC compiles at run time)."""
    return kernel_source_path(name).read_text(encoding="utf-8")


def compiled_kernel_name(source: str | Path, kind: str) -> str:
    """File name of a compiled kernel inside ``kernels/<arch>/``: ``selective.cu`` -> ``selective.cubin``."""
    _check_kind(kind)
    return f"{Path(source).stem}.{kind}"


def find_nvcc() -> str:
    """Path of nvcc: ``$PATH`` first, then ``$CUDA_HOME/bin`` / ``$CUDA_PATH/bin`` / /usr/local/cuda/bin."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    raise KernelCompileError(
        "nvcc not found on PATH or in $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin: install the "
        "CUDA toolkit to compile kernels ahead of time (serving can still compile them with CuPy/NVRTC)"
    )


def compile_kernels(
    arch: str,
    kind: str,
    out_dir: str | Path,
    *,
    sources: list[Path] | None = None,
    nvcc: str | None = None,
    extra_flags: tuple[str, ...] = (),
    timeout_s: float = 300.0,
) -> list[Path]:
    """Compile every kernel source with nvcc for one architecture.

    arch: ``"sm_80"`` or ``"sm_90"`` (any ``sm_NN`` nvcc accepts is passed through); kind: ``"cubin"``
    (machine code for exactly that architecture) or ``"ptx"`` (virtual ISA ``compute_NN``, JIT-compiled by
    the driver on that architecture or newer). Writes ``out_dir/<stem>.<kind>`` for each source (each file
    replaced atomically) and returns their paths in source order. Raises KernelCompileError when nvcc is
    missing or fails.
    """
    _check_kind(kind)
    if not _ARCH_PATTERN.match(arch):
        raise KernelCompileError(
            f"bad CUDA architecture {arch!r}: expected sm_NN, e.g. one of {', '.join(SUPPORTED_ARCHS)}"
        )
    nvcc_path = nvcc or find_nvcc()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources if sources is not None else kernel_sources():
        target = out / compiled_kernel_name(source, kind)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=out)
        os.close(fd)
        cmd = [nvcc_path, f"-{kind}", f"-arch={arch}", "-O3", *extra_flags, "-o", tmp_name, str(source)]
        try:
            _run_nvcc(cmd, timeout_s)
            os.replace(tmp_name, target)
        finally:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
        written.append(target)
    return written


def ptxas_report(arch: str, source: str | Path | None = None, *, nvcc: str | None = None) -> str:
    """ptxas resource usage (registers, spills, shared memory per entry point) for one source and arch.

    Compiles to a throw-away cubin with ``-Xptxas -v`` and returns nvcc's diagnostic text.
    """
    src = Path(source) if source is not None else kernel_source_path()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc or find_nvcc(), "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v"]
        return _run_nvcc([*cmd, "-o", str(Path(tmp) / "report.cubin"), str(src)], 300.0)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise KernelCompileError(f"bad kernel kind {kind!r}: expected one of {', '.join(KINDS)}")


def _run_nvcc(cmd: list[str], timeout_s: float) -> str:
    """Runs nvcc; returns its combined output, raising KernelCompileError with that output on failure."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise KernelCompileError(f"cannot run nvcc at {cmd[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise KernelCompileError(f"nvcc timed out after {timeout_s:.0f} s: {' '.join(cmd)}") from exc
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise KernelCompileError(f"nvcc failed (exit {proc.returncode}): {' '.join(cmd)}\n{output.strip()}")
    return output
