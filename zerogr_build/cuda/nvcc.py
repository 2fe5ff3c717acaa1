"""Ahead-of-time compilation of the package's CUDA kernels with nvcc (the per-user cache: cache.py).

`zerogr build` ships a cubin per configured architecture plus PTX in every bundle it publishes
(``kernels/<arch>/<stem>.cubin`` and ``.ptx``, docs/bundle-format.md section 11), so a serving box loads
machine code instead of compiling with NVRTC at start-up. nvcc runs only when the kernel source, the
architecture or the toolkit changed: compiled files are cached under ``kernel_cache_dir()`` keyed by
(sha256 of the sources and flags, nvcc's version, arch). `tune` on a GPU compiles through the same
`compile_kernels`.

The cache is untrusted input, like a bundle from elsewhere: every entry carries its own sha256 (written
in the same file, renamed into place atomically) and is opened without following symlinks, must be a
regular file of this user that nobody else can write, and its bytes are checked - checksum, then the
kernel kind and architecture (bundle/kernel_files.py) - before they are shipped. A bad entry is
discarded and recompiled; a cache dir that cannot be used means compiling into a temporary dir. Both
warn once (KernelCacheWarning). nvcc's own output passes the same kind check before it is cached or
shipped, nvcc runs in its own process group (a timeout kills the whole group), and a toolkit that timed
out or wrote garbage is not run again in this process.

Torch-free and GPU-free (a leaf module: the build imports it without paying for torch); only the nvcc
executable is needed, and without it `bundle_kernel_files` says why in one line instead of failing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..base.errors import InputError, ZerogrError
from ..bundle.kernel_files import KERNEL_HEAD_BYTES, kernel_problem

# The CUDA sources are package data next to the scoring code that loads them (found without importing it).
KERNEL_DIR = Path(__file__).resolve().parent  # the .cu sources sit beside their loader
SUPPORTED_ARCHS = ("sm_80", "sm_90")
KINDS = ("cubin", "ptx")
NVCC_FLAGS = ("-O3",)
_ARCH_PATTERN = re.compile(r"^sm_\d{2,3}[af]?$")
# Seconds one nvcc compile (and `nvcc --version`) may take before its whole process group is killed.
NVCC_TIMEOUT_S = 300.0
NVCC_VERSION_TIMEOUT_S = 60.0
# nvcc executables that timed out or wrote something that is not a kernel: not run again in this process.
_FAILED_TOOLKITS: dict[str, str] = {}


class KernelCompileError(ZerogrError):
    """nvcc is missing, or it rejected a kernel source (the message carries its output)."""


def kernel_sources() -> list[Path]:
    """Paths of every ``.cu`` file shipped in the package, sorted by name."""
    sources = sorted(KERNEL_DIR.glob("*.cu"))
    if not sources:
        raise KernelCompileError(f"no CUDA kernel sources found in {KERNEL_DIR} (broken installation?)")
    return sources


def compiled_kernel_name(source: str | Path, kind: str) -> str:
    """File name of a compiled kernel inside ``kernels/<arch>/``: ``selective.cu`` -> ``selective.cubin``."""
    _check_kind(kind)
    return f"{Path(source).stem}.{kind}"


def check_arch(arch: str) -> str:
    """`arch` when it reads ``sm_NN`` (what nvcc's -arch and a bundle's ``kernels/<arch>/`` use)."""
    if not isinstance(arch, str) or not _ARCH_PATTERN.match(arch):
        raise KernelCompileError(
            f"bad CUDA architecture {arch!r}: expected sm_NN, e.g. one of {', '.join(SUPPORTED_ARCHS)}"
        )
    return arch


def parse_kernel_archs(value: str | Sequence[str], option: str = "--kernel-archs") -> tuple[str, ...]:
    """``"sm_80,sm_90"`` or a list -> ("sm_80", "sm_90"); "" or [] -> () (no kernels). InputError when bad."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    names = [n for n in names if n != ""] if isinstance(value, str) else names
    for name in names:
        if not isinstance(name, str) or not _ARCH_PATTERN.match(name):
            raise InputError(f"{option}: bad CUDA architecture {name!r} (expected sm_NN, e.g. sm_80,sm_90)")
    if len(set(names)) != len(names):
        raise InputError(f"{option}: names an architecture twice: {names}")
    return tuple(names)


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
    timeout_s: float | None = None,
) -> list[Path]:
    """Compile every kernel source with nvcc for one architecture.

    arch: ``"sm_80"`` or ``"sm_90"`` (any ``sm_NN`` nvcc accepts is passed through); kind: ``"cubin"``
    (machine code for exactly that architecture) or ``"ptx"`` (virtual ISA ``compute_NN``, JIT-compiled by
    the driver on that architecture or newer). Writes ``out_dir/<stem>.<kind>`` for each source (each file
    replaced atomically, and only after it passed the kind check of bundle/kernel_files.py: a cubin for
    `arch`, a PTX module targeting it) and returns their paths in source order. Raises KernelCompileError
    when nvcc is missing, fails, times out (NVCC_TIMEOUT_S unless `timeout_s`) or writes something else.
    """
    _check_kind(kind)
    check_arch(arch)
    nvcc_path = nvcc or find_nvcc()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources if sources is not None else kernel_sources():
        target = out / compiled_kernel_name(source, kind)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=out)
        os.close(fd)
        cmd = [nvcc_path, f"-{kind}", f"-arch={arch}", *NVCC_FLAGS, *extra_flags, "-o", tmp_name, str(source)]
        try:
            run_nvcc(cmd, NVCC_TIMEOUT_S if timeout_s is None else timeout_s)
            _check_output(Path(tmp_name), nvcc_path, arch, kind, Path(source).name)
            os.replace(tmp_name, target)
        finally:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
        written.append(target)
    return written


def _check_output(path: Path, nvcc: str, arch: str, kind: str, source: str) -> None:
    """KernelCompileError (and nvcc remembered as failing) when nvcc's output file is not a `kind` for
    `arch`: such a file is never cached or shipped."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(KERNEL_HEAD_BYTES)
    problem = kernel_problem(head, size, kind, arch)
    if problem is not None:
        reason = f"nvcc at {nvcc} wrote a bad {kind} for {arch} from {source}: {problem}"
        _FAILED_TOOLKITS[nvcc] = reason
        raise KernelCompileError(reason)


def run_nvcc(cmd: list[str], timeout_s: float) -> str:
    """Runs nvcc; returns its combined output, raising KernelCompileError with that output on failure.

    nvcc runs in a process group of its own: on a timeout the whole group (nvcc, cicc, ptxas) is killed,
    and that nvcc is remembered as failing, so later calls in this process fail at once instead of
    waiting `timeout_s` again (`forget_failed_toolkits` clears that)."""
    nvcc = cmd[0]
    if nvcc in _FAILED_TOOLKITS:
        raise KernelCompileError(f"{_FAILED_TOOLKITS[nvcc]} (earlier in this run; not run again)")
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        raise KernelCompileError(f"cannot run nvcc at {nvcc}: {exc}") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reason = f"nvcc at {nvcc} timed out after {timeout_s:.0f} s"
        _FAILED_TOOLKITS[nvcc] = reason
        raise KernelCompileError(f"{reason}: {' '.join(cmd)}") from None
    except BaseException:  # KeyboardInterrupt too: never leave the compiler running behind us
        _kill_group(proc)
        raise
    output = (stdout or "") + (stderr or "")
    if proc.returncode != 0:
        raise KernelCompileError(f"nvcc failed (exit {proc.returncode}): {' '.join(cmd)}\n{output.strip()}")
    return output


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL nvcc's process group (it leads one: start_new_session), then reap nvcc and close its pipes
    without waiting on them (a process that left the group could hold them open)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def forget_failed_toolkits() -> None:
    """Let nvcc executables that timed out or wrote bad output earlier in this process run again."""
    _FAILED_TOOLKITS.clear()


# --------------------------------------------------------------------------------------------------------
# The cache: (source hash, nvcc version, arch) -> compiled files


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise KernelCompileError(f"bad kernel kind {kind!r}: expected one of {', '.join(KINDS)}")
