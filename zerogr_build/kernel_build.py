"""Ahead-of-time compilation of the package's CUDA kernels with nvcc, and the per-user cache of the results.

`zerogr build` ships a cubin per configured architecture plus PTX in every bundle it publishes
(``kernels/<arch>/<stem>.cubin`` and ``.ptx``, docs/bundle-format.md section 11), so a serving box loads
machine code instead of compiling with NVRTC at start-up. nvcc runs only when the kernel source, the
architecture or the toolkit changed: compiled files are cached under ``kernel_cache_dir()`` keyed by
(sha256 of the sources and flags, nvcc's version, arch). `tune` on a GPU compiles through the same
`compile_kernels`.

Torch-free and GPU-free (a leaf module: the build imports it without paying for torch); only the nvcc
executable is needed, and without it `bundle_kernel_files` says why in one line instead of failing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .errors import InputError, ZerogrError

# The CUDA sources are package data next to the scoring code that loads them (found without importing it).
KERNEL_DIR = Path(__file__).resolve().parent / "runtime" / "scoring" / "kernels"
SUPPORTED_ARCHS = ("sm_80", "sm_90")
DEFAULT_KERNEL_ARCHS = SUPPORTED_ARCHS
KINDS = ("cubin", "ptx")
NVCC_FLAGS = ("-O3",)
CACHE_ENV = "ZEROGR_CACHE_DIR"
_ARCH_PATTERN = re.compile(r"^sm_\d{2,3}[af]?$")


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
            run_nvcc(cmd, timeout_s)
            os.replace(tmp_name, target)
        finally:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
        written.append(target)
    return written


def run_nvcc(cmd: list[str], timeout_s: float) -> str:
    """Runs nvcc; returns its combined output, raising KernelCompileError with that output on failure."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (FileNotFoundError, PermissionError) as exc:
        raise KernelCompileError(f"cannot run nvcc at {cmd[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise KernelCompileError(f"nvcc timed out after {timeout_s:.0f} s: {' '.join(cmd)}") from exc
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        raise KernelCompileError(f"nvcc failed (exit {proc.returncode}): {' '.join(cmd)}\n{output.strip()}")
    return output


# --------------------------------------------------------------------------------------------------------
# The cache: (source hash, nvcc version, arch) -> compiled files


def kernel_cache_dir() -> Path:
    """``$ZEROGR_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/zerogr/kernels``, else
    ~/.cache/zerogr/kernels."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "zerogr")
    return Path(root) / "kernels"


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """nvcc's ``--version`` text (the toolkit identity that is part of the cache key)."""
    return run_nvcc([nvcc, "--version"], 60.0).strip()


def sources_digest(sources: Sequence[Path] | None = None) -> str:
    """sha256 over every kernel source's name and bytes plus the nvcc flags (the source part of the key)."""
    h = hashlib.sha256()
    for source in sources if sources is not None else kernel_sources():
        h.update(Path(source).name.encode() + b"\0" + Path(source).read_bytes() + b"\0")
    h.update("\0".join(NVCC_FLAGS).encode())
    return h.hexdigest()


def cache_key(nvcc: str, sources: Sequence[Path] | None = None) -> str:
    """Name of the cache folder for these sources compiled by this nvcc (one subfolder per arch)."""
    toolkit = hashlib.sha256(nvcc_version(nvcc).encode()).hexdigest()
    return f"{sources_digest(sources)[:20]}-{toolkit[:12]}"


def cached_kernel_files(
    archs: Sequence[str],
    *,
    nvcc: str | None = None,
    cache_dir: str | Path | None = None,
    sources: list[Path] | None = None,
) -> dict[str, bytes]:
    """{``kernels/<arch>/<stem>.<kind>``: bytes} for every arch x (cubin, ptx) x source, compiled with
    nvcc only where the cache has no entry for (sources, nvcc version, arch). Cache entries are written
    atomically (compile_kernels renames each finished file into place), so concurrent builds share them.
    Raises KernelCompileError when nvcc is missing or fails."""
    nvcc_path = nvcc or find_nvcc()
    srcs = sources if sources is not None else kernel_sources()
    root = Path(cache_dir) if cache_dir is not None else kernel_cache_dir()
    key_dir = root / cache_key(nvcc_path, srcs)
    files: dict[str, bytes] = {}
    for arch in archs:
        check_arch(arch)
        for kind in KINDS:
            missing = [s for s in srcs if not (key_dir / arch / compiled_kernel_name(s, kind)).is_file()]
            if missing:
                compile_kernels(arch, kind, key_dir / arch, sources=missing, nvcc=nvcc_path)
            for source in srcs:
                name = compiled_kernel_name(source, kind)
                files[f"kernels/{arch}/{name}"] = (key_dir / arch / name).read_bytes()
    return dict(sorted(files.items()))


def bundle_kernel_files(archs: Sequence[str]) -> tuple[dict[str, bytes], str | None]:
    """What `zerogr build` adds to a version: (files as cached_kernel_files, None), or ({}, one-line
    reason) when nvcc is missing or fails - the build carries on without kernels then. () archs: ({}, None).
    """
    if not archs:
        return {}, None
    try:
        return cached_kernel_files(archs), None
    except KernelCompileError as exc:
        return {}, str(exc).splitlines()[0]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise KernelCompileError(f"bad kernel kind {kind!r}: expected one of {', '.join(KINDS)}")
