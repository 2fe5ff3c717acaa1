"""Compiled kernels shipped in a bundle (``kernels/<arch>/selective.cubin|.ptx``, docs/bundle-format.md
section 11): checked against the manifest's sha256, then tried in order - the cubin for the device's arch,
PTX, NVRTC from the packaged source - each probed with a tiny launch; every step down warns once
(KernelFallbackWarning), and when nothing runs selective_cuda is dropped on that device so the torch
`selective` mode serves. The driver calls go through a loader object (`CupyKernelLoader`; the tests use
zerogr_build.testing.FakeKernelLoader), so the whole order is tested on a CPU.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..base.errors import BundleError
from ..bundle.kernel_files import MAX_KERNEL_BYTES
from .selective import (
    KernelChecksumError,
    KernelFallbackWarning,
    SelectiveKernels,
    _device_index,
    device_arch,
    drop_device,
    failure_cause,
    is_available,
    probe_kernels,
    set_default_kernels,
)


def read_checked_kernel_file(bundle: Any, name: str) -> bytes:
    """The bytes of a bundle's kernel file, read once and hashed against the manifest's sha256: these exact
    bytes are what may reach the driver. KernelChecksumError naming the file on a mismatch; BundleError
    (before reading anything) when the manifest lists more than MAX_KERNEL_BYTES for it."""
    path = bundle.file(name)
    listed = bundle.manifest["files"][name]["bytes"]
    if listed > MAX_KERNEL_BYTES:  # never read a huge listed file whole (open_bundle checked the size)
        raise BundleError(f"{path}: {listed} bytes, more than the {MAX_KERNEL_BYTES} a kernel file may have")
    with open(path, "rb") as f:
        data = f.read(listed + 1)  # a file grown since open_bundle fails the sha256 below
    want = bundle.manifest["files"][name]["sha256"]
    if hashlib.sha256(data).hexdigest() != want:
        raise KernelChecksumError(f"{path}: sha256 differs from the manifest's (file changed or corrupt)")
    return data


def _arch_number(arch: str) -> int:
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return int(digits) if digits else 0


def kernel_candidates(bundle: Any, arch: str, stem: str = "selective") -> list[tuple[str, str]]:
    """[(kind, bundle-relative name)] to try on a device of `arch`, in order: the cubin built for exactly
    `arch`, then PTX (the arch's own, then older archs' newest first: the driver JITs PTX forward only).
    Only files the manifest lists count."""
    listed = set(bundle.files("kernels/"))
    found = [f"kernels/{arch}/{stem}.cubin"] if f"kernels/{arch}/{stem}.cubin" in listed else []
    ptx_archs = sorted(
        {n.split("/")[1] for n in listed if n.endswith(f"/{stem}.ptx") and n.count("/") == 2},
        key=_arch_number,
        reverse=True,
    )
    found += [
        f"kernels/{a}/{stem}.ptx" for a in ptx_archs if a == arch or _arch_number(a) < _arch_number(arch)
    ]
    return [(n.rsplit(".", 1)[1], n) for n in found]


def bundle_kernel_file(bundle: Any, arch: str, stem: str = "selective") -> str | None:
    """The first of `kernel_candidates` (what a healthy device loads), or None when the bundle has none."""
    candidates = kernel_candidates(bundle, arch, stem)
    return candidates[0][1] if candidates else None


class CupyKernelLoader:
    """The real driver calls behind `choose_bundle_kernels` (zerogr_build.testing has a fake that fails at a
    chosen stage)."""

    def load_bytes(self, data: bytes, kind: str, origin: str, device_index: int) -> SelectiveKernels:
        return SelectiveKernels.from_bytes(data, kind, origin, device_index)

    def load_source(self, device_index: int) -> SelectiveKernels:
        return SelectiveKernels.from_source(device_index)

    def probe(self, kernels: Any) -> None:
        probe_kernels(kernels)


def choose_bundle_kernels(
    bundle: Any, arch: str, device_index: int, loader: Any, warn: Callable[[str], None] | None = None
) -> tuple[Any, str | None]:
    """Try the bundle's cubin for `arch`, then its PTX, then NVRTC from the packaged source: each is checked
    (checksum for files), loaded and probed with a tiny launch; every step down warns once naming the cause.

    Returns (kernels, None), or (None, reason) when nothing loads: the caller then drops selective_cuda and
    the torch `selective` mode serves."""
    say = warn or (lambda message: warnings.warn(message, KernelFallbackWarning, stacklevel=4))
    candidates = kernel_candidates(bundle, arch)
    if not candidates:
        say(f"{bundle.path} ships no compiled kernels for {arch}; compiling with NVRTC")
    for i, (kind, name) in enumerate(candidates):
        try:
            data = read_checked_kernel_file(bundle, name)
            kernels = loader.load_bytes(data, kind, name, device_index)
            loader.probe(kernels)
            return kernels, None
        except Exception as exc:  # noqa: BLE001 - any failure steps down, never fails the Decoder
            following = candidates[i + 1][1] if i + 1 < len(candidates) else "NVRTC"
            say(
                f"{name} does not run on cuda:{device_index} ({arch}): {failure_cause(exc)}; "
                f"trying {following}"
            )
    try:
        kernels = loader.load_source(device_index)
        loader.probe(kernels)
        return kernels, None
    except Exception as exc:  # noqa: BLE001
        return None, f"NVRTC could not build the CUDA kernels for cuda:{device_index}: {failure_cause(exc)}"


def load_bundle_kernels(bundle: Any, device: torch.device | str) -> SelectiveKernels | None:
    """Load the bundle's compiled kernels for this GPU (`choose_bundle_kernels`: cubin, PTX, NVRTC, each
    probed) and make them the process's kernels for the device. Returns them, or None: not a CUDA device,
    no CuPy (the mode is simply not there), or nothing loads (one warning; selective_cuda is dropped on this
    device and the Decoder scores with torch `selective`)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not is_available():
        return None
    index = _device_index(dev)
    kernels, reason = choose_bundle_kernels(bundle, device_arch(index), index, CupyKernelLoader())
    if kernels is None:
        drop_device(index, reason or "no kernels")
        return None
    kernels.probed = True
    # One kernel set per device: installing ours is what makes every selective_cuda call (the registry's
    # functions) use the shipped binary.
    set_default_kernels(kernels)
    return kernels
