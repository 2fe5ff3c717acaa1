"""What a compiled kernel file must look like (docs/bundle-format.md section 11.2), checked from its first
KERNEL_HEAD_BYTES and its size alone, so a check never reads a whole (possibly huge, hostile) file.

Pure functions, shared by `verify`, the serving loader and the kernel cache (zerogr_build/cuda/nvcc.py),
which applies the same rules to nvcc's fresh output and to every cache entry before its bytes are shipped.
"""

from __future__ import annotations

import re
import struct

# A check reads at most this much of a kernel file: the ELF header, or the PTX preamble with `.target`.
KERNEL_HEAD_BYTES = 4096
# The package's kernels compile to 100-200 KB per file; anything near this size is not one of them.
MAX_KERNEL_BYTES = 64 << 20
KERNEL_KINDS = ("cubin", "ptx")

ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
EM_CUDA = 190
_ELF64_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # e_ident .. e_shstrndx: 64 bytes
# CUDA ELF ABI version 8 and newer keep the SM number in bits 8-15 of e_flags, older ones in bits 0-7.
_NEW_ABI_VERSION = 8
_PTX_TARGET = re.compile(rb"^\s*\.target\s+([A-Za-z0-9_]+)", re.MULTILINE)
_ARCH_NUMBER = re.compile(r"^sm_(\d{2,3})[af]?$")


def arch_number(arch: str) -> int | None:
    """``"sm_90"`` -> 90, ``"sm_90a"`` -> 90; None when `arch` is not sm_NN."""
    match = _ARCH_NUMBER.match(arch)
    return int(match.group(1)) if match else None


def cubin_problem(head: bytes, size: int, arch: str | None = None) -> str | None:
    """Why `head` (the first KERNEL_HEAD_BYTES of a file of `size` bytes) is not a cubin for `arch`, or
    None when it is one: a 64-bit little-endian ELF image for NVIDIA CUDA (e_machine 190) whose SM number
    is the arch's and whose section headers lie inside the file (a truncated image fails that)."""
    if not head.startswith(ELF_MAGIC):
        return "not a cubin (no ELF header)"
    if len(head) < _ELF64_HEADER.size:
        return f"not a cubin (ELF header cut short: {len(head)} bytes)"
    fields = _ELF64_HEADER.unpack_from(head)
    ident, machine, flags = fields[0], fields[2], fields[7]
    shoff, shentsize, shnum = fields[6], fields[11], fields[12]
    if ident[4] != _ELFCLASS64 or ident[5] != _ELFDATA2LSB:
        return "not a cubin (not a 64-bit little-endian ELF image)"
    if machine != EM_CUDA:
        return f"not a cubin (ELF machine {machine}, CUDA is {EM_CUDA})"
    if shoff + shentsize * shnum > size or shnum == 0:
        return f"not a whole cubin (section headers end past its {size} bytes: truncated?)"
    want = arch_number(arch) if arch is not None else None
    if want is not None:
        sm = (flags >> 8) & 0xFF if ident[8] >= _NEW_ABI_VERSION else flags & 0xFF
        if sm != want:
            return f"a cubin for sm_{sm}, not {arch}"
    return None


def ptx_problem(head: bytes, arch: str | None = None) -> str | None:
    """Why `head` (the first KERNEL_HEAD_BYTES of a file) is not a PTX module for `arch`, or None: it must
    be text with a ``.version`` and a ``.target`` directive naming exactly `arch`."""
    if b"\0" in head:
        return "not a PTX module (binary data)"
    match = _PTX_TARGET.search(head)
    if match is None:
        return "not a PTX module (no .target directive)"
    if b".version" not in head[: match.start()]:
        return "not a PTX module (no .version directive before .target)"
    target = match.group(1).decode("ascii", errors="replace")
    if arch is not None and target != arch:
        return f"a PTX module for {target}, not {arch}"
    return None


def kernel_problem(head: bytes, size: int, kind: str, arch: str | None = None) -> str | None:
    """Why a compiled kernel file of `kind` ("cubin" or "ptx") for `arch` is not one (None when it is):
    too large (MAX_KERNEL_BYTES), empty, or its head fails `cubin_problem` / `ptx_problem`. `head` is the
    file's first KERNEL_HEAD_BYTES (more is ignored), `size` its length in bytes."""
    if kind not in KERNEL_KINDS:
        return f"unknown kernel kind {kind!r}"
    if size > MAX_KERNEL_BYTES:
        return f"{size} bytes, more than the {MAX_KERNEL_BYTES} a kernel file may have"
    if size == 0:
        return "empty"
    head = head[:KERNEL_HEAD_BYTES]
    return cubin_problem(head, size, arch) if kind == "cubin" else ptx_problem(head, arch)
