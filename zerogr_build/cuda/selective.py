"""Selective scoring with the package's CUDA kernels (cuda/selective.cu), loaded through CuPy.

Contract (the same function as the torch reference, selective_torch.py):

    selective_scores(hidden [R, d], weight [V, d], bias [V] | None, slot_tokens int32 [R, K]) -> fp32 [R, K]
        dot(hidden[r], weight[slot_tokens[r, k]]) + bias[...], fp32 accumulation; -inf at empty slots (-1).
    selective_log_softmax(same) -> fp32 [R, K]
        the row's valid slots log-softmaxed; -inf at empty slots; a row with no valid slot is all -inf.

hidden, weight and bias share one dtype (float32, float16 or bfloat16) and one CUDA device. Layout rules
(checked, with a clear error): 2-D operands have unit stride along their last dimension and any row stride
(so slices of a larger matrix are read in place; a stride-0 ``hidden.expand(R, d)`` works too); bias is
1-D contiguous; slot_tokens is int32 (int64 is accepted and converted, one extra copy). Slot tokens
outside [0, V) are treated as empty, so a corrupt slot cannot read out of bounds. Tensors are exchanged
zero-copy (their data pointers are passed to the kernel) and kernels run on torch's current stream of the
tensors' device, so they order correctly with the torch work around them and can be captured in a CUDA
graph.

The kernels are compiled at load time with NVRTC (`SelectiveKernels.from_source`) or loaded from a cubin /
PTX file compiled ahead of time by compile.py (`SelectiveKernels.from_file`); `load_bundle_kernels` loads
the ones `zerogr tune` shipped in a bundle (``kernels/<arch>/selective.cubin``). Operand checks and launch
geometry are pure functions in launch.py. CuPy is an optional dependency, imported only inside
functions.
"""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base.device import cuda_index
from ..base.errors import ZerogrError
from .compile import SELECTIVE_ENTRY_POINTS, read_kernel_source
from .launch import (
    SLOTS_PER_BLOCK,
    LaunchGeometry,
    SelectiveCall,
    fused_geometry,
    kernel_args,
    prepare_call,
    row_log_softmax_geometry,
    scores_geometry,
    use_fused,
)

DEFAULT_SHARED_BYTES = 48 * 1024  # dynamic shared memory every device grants without opting in
STATIC_SHARED_MARGIN = 1024  # the kernels' own __shared__ arrays (272 bytes per ptxas), rounded up


class KernelLoadError(ZerogrError):
    """CuPy is missing, the device has no CUDA, or a kernel module could not be compiled or loaded."""


class KernelChecksumError(KernelLoadError):
    """A kernel file's bytes do not match the sha256 its bundle's manifest lists (never given to a driver)."""


class KernelFallbackWarning(UserWarning):
    """A CUDA kernel could not be compiled, loaded or launched: the next option (PTX, NVRTC, torch) runs."""


def is_available() -> bool:
    """True when CuPy imports and torch sees a CUDA device (the kernels can then be loaded)."""
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


def device_arch(device: torch.device | str | int | None = None) -> str:
    """``sm_NN`` of a CUDA device (what compile.compile_kernels and a bundle's ``kernels/<arch>/`` use)."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


# --------------------------------------------------------------------------------------------------------
# Loading and launching (CuPy, imported lazily)


def _cupy() -> Any:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy build that cannot find its CUDA libraries
        raise KernelLoadError(
            f"the CUDA selective kernels need CuPy (pip install 'zerogr[gpu]'): import failed: {exc}"
        ) from exc
    return cupy


def _device_index(device: torch.device | str | int | None) -> int:
    if not torch.cuda.is_available():
        raise KernelLoadError("the CUDA selective kernels need a CUDA device, and torch sees none")
    index = cuda_index(device)
    if index is None:
        raise KernelLoadError(f"the CUDA selective kernels need a CUDA device, got {torch.device(device)}")
    return index


class SelectiveKernels:
    """The selective-scoring kernels loaded on one CUDA device (one module, all entry points).

    Build with `from_source` (NVRTC) or `from_file` (cubin/PTX); then call `scores` / `log_softmax` with
    tensors on that device.
    """

    def __init__(self, module: Any, device_index: int, origin: str) -> None:
        cupy = _cupy()
        self.device_index = device_index
        self.origin = origin  # "nvrtc" or the path of the loaded file
        self._cupy = cupy
        self._functions: dict[str, Any] = {}
        self._shared_opt_in: dict[str, int] = {}
        props = torch.cuda.get_device_properties(device_index)
        self.sm_count = int(props.multi_processor_count)
        with cupy.cuda.Device(device_index):
            try:
                for name in SELECTIVE_ENTRY_POINTS:
                    self._functions[name] = module.get_function(name)
            except Exception as exc:
                raise KernelLoadError(
                    f"cannot load kernel entry points from {origin} on cuda:{device_index} "
                    f"({device_arch(device_index)}): {exc}"
                ) from exc
            # Dynamic shared memory a block may opt into, less a margin for the kernels' static shared memory.
            opt_in = getattr(props, "shared_memory_per_block_optin", None)
            if not opt_in:
                try:
                    opt_in = cupy.cuda.Device(device_index).attributes["MaxSharedMemoryPerBlockOptin"]
                except Exception:
                    opt_in = DEFAULT_SHARED_BYTES
            self.max_shared_bytes = int(opt_in) - STATIC_SHARED_MARGIN
        self._streams: dict[int, Any] = {}

    @classmethod
    def from_source(cls, device: torch.device | str | int | None = None) -> SelectiveKernels:
        """Compiles cuda/selective.cu with NVRTC for the device (CuPy caches the binary on disk)."""
        index = _device_index(device)
        cupy = _cupy()
        with cupy.cuda.Device(index):
            try:
                module = cupy.RawModule(code=read_kernel_source("selective.cu"))
            except Exception as exc:  # CuPy compiles lazily, but some versions compile here
                raise KernelLoadError(
                    f"NVRTC could not compile selective.cu for cuda:{index}: {exc}"
                ) from exc
        return cls(module, index, "nvrtc")

    @classmethod
    def from_file(cls, path: str | Path, device: torch.device | str | int | None = None) -> SelectiveKernels:
        """Loads a module compiled ahead of time (``.cubin`` for this exact arch, or ``.ptx``)."""
        file = Path(path)
        if not file.is_file():
            raise KernelLoadError(f"compiled kernel file {file} not found")
        index = _device_index(device)
        cupy = _cupy()
        with cupy.cuda.Device(index):
            try:
                module = cupy.RawModule(path=str(file))
            except Exception as exc:  # e.g. a cubin built for another architecture
                raise KernelLoadError(
                    f"cannot load kernel entry points from {file} on cuda:{index} "
                    f"({device_arch(index)}): {exc}"
                ) from exc
        return cls(module, index, str(file))

    @classmethod
    def from_bytes(
        cls, data: bytes, kind: str, origin: str, device: torch.device | str | int
    ) -> SelectiveKernels:
        """Loads a cubin/PTX image from exactly these bytes (already checked against their checksum).

        CuPy loads modules from paths only, so the bytes go to a private temp file first (mode 0600, in a
        fresh 0700 dir) that is removed once every entry point is loaded: what the driver reads is what
        was hashed, not whatever the bundle file holds by then."""
        index = _device_index(device)
        with tempfile.TemporaryDirectory(prefix="zerogr-kernel-") as tmp:
            path = Path(tmp) / f"module.{kind}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            kernels = cls.from_file(path, index)
        kernels.origin = origin
        return kernels

    # ---- public launches -------------------------------------------------------------------------------

    def scores(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        slot_tokens: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """fp32 [R, K] slot scores (-inf at empty slots). Writes into `out` when given."""
        call = self._fits(prepare_call(hidden, weight, bias, slot_tokens, out))
        if call.layout.rows and call.layout.slots:
            self._launch_scores(call)
        return call.out

    def log_softmax(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        slot_tokens: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        fused: bool | None = None,
    ) -> torch.Tensor:
        """fp32 [R, K] log-softmax over each row's valid slots (-inf at empty slots; empty rows all -inf).

        fused: True = one kernel (one block per row), False = scores kernel + in-place row log-softmax,
        None = `use_fused` decides by the device's SM count.
        """
        call = self._fits(prepare_call(hidden, weight, bias, slot_tokens, out))
        lay = call.layout
        if not (lay.rows and lay.slots):
            return call.out
        if fused is None:
            fused = use_fused(lay.rows, lay.slots, self.sm_count)
        if fused:
            geo = fused_geometry(lay.rows, lay.slots, lay.dim)
            self._launch(f"selective_log_softmax_{lay.suffix}", geo, kernel_args(call))
        else:
            self._launch_scores(call)
            geo = row_log_softmax_geometry(lay.rows, lay.slots)
            args = (np.uint64(call.out.data_ptr()), np.int64(lay.out_row_stride), np.int32(lay.slots))
            self._launch("selective_row_log_softmax_inplace", geo, args)
        return call.out

    # The contract's names, so a loaded module is checked like any scoring mode (tune does, per file).
    selective_scores = scores
    selective_log_softmax = log_softmax

    # ---- internals -------------------------------------------------------------------------------------

    def _fits(self, call: SelectiveCall) -> SelectiveCall:
        """Checks that a call fits these kernels: tensors on their device, hidden[r] in shared memory."""
        if call.hidden.device.index != self.device_index:
            raise ValueError(
                f"tensors are on {call.hidden.device} but these kernels were loaded on "
                f"cuda:{self.device_index}"
            )
        if 4 * call.layout.dim > self.max_shared_bytes:
            raise ValueError(
                f"d={call.layout.dim} needs {4 * call.layout.dim} bytes of shared memory per block; "
                f"cuda:{self.device_index} allows {self.max_shared_bytes}"
            )
        return call

    def _launch_scores(self, call: SelectiveCall) -> None:
        lay = call.layout
        geo = scores_geometry(lay.rows, lay.slots, lay.dim)
        per_block = min(lay.slots, SLOTS_PER_BLOCK)
        self._launch(f"selective_scores_{lay.suffix}", geo, (*kernel_args(call), np.int32(per_block)))

    def _launch(self, name: str, geo: LaunchGeometry, args: tuple[Any, ...]) -> None:
        cupy = self._cupy
        kernel = self._functions[name]
        with cupy.cuda.Device(self.device_index):
            needs_opt_in = geo.shared_bytes > DEFAULT_SHARED_BYTES - STATIC_SHARED_MARGIN
            if needs_opt_in and self._shared_opt_in.get(name, 0) < geo.shared_bytes:
                kernel.max_dynamic_shared_size_bytes = geo.shared_bytes
                self._shared_opt_in[name] = geo.shared_bytes
            with self._current_stream():
                kernel(geo.grid, geo.block, args, shared_mem=geo.shared_bytes)

    def _current_stream(self) -> Any:
        """torch's current stream on this device, wrapped for CuPy (cached per stream handle)."""
        current = torch.cuda.current_stream(self.device_index)
        stream = self._streams.get(current.cuda_stream)
        if stream is None:
            stream = cupy_stream(self._cupy, current, self.device_index)
            self._streams[current.cuda_stream] = stream
        return stream


def cupy_stream(cupy: Any, torch_stream: Any, device_index: int) -> Any:
    """A CuPy view of a torch stream: CuPy 14's ``Stream.from_external`` (the stream's
    ``__cuda_stream__`` protocol), else ``ExternalStream`` by handle (older CuPy; deprecated in 14)."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            return from_external(torch_stream)
        except (TypeError, AttributeError):  # a torch stream without __cuda_stream__
            pass
    return cupy.cuda.ExternalStream(torch_stream.cuda_stream, device_index)


# --------------------------------------------------------------------------------------------------------
# Module-level functions with the contract's signatures (one kernel set per device, probed before use)

_DEFAULT_KERNELS: dict[int, SelectiveKernels] = {}
_FAILED: dict[int, str] = {}  # device index -> why selective_cuda was dropped there
_DEFAULT_LOCK = threading.Lock()


def default_kernels(device: torch.device | str | int | None = None) -> SelectiveKernels:
    """The kernels for a device: the ones set by `set_default_kernels` (a bundle's), else compiled with
    NVRTC on first use; kept for the process."""
    index = _device_index(device)
    with _DEFAULT_LOCK:
        kernels = _DEFAULT_KERNELS.get(index)
        if kernels is None:
            kernels = SelectiveKernels.from_source(index)
            _DEFAULT_KERNELS[index] = kernels
    return kernels


def set_default_kernels(kernels: SelectiveKernels) -> None:
    """Makes `kernels` the ones `selective_scores` / `selective_log_softmax` use on their device."""
    with _DEFAULT_LOCK:
        _DEFAULT_KERNELS[kernels.device_index] = kernels
        _FAILED.pop(kernels.device_index, None)


def probe_kernels(kernels: Any) -> None:
    """Launch the kernels once on a tiny case (one row: a valid slot, an empty one and an out-of-range one,
    d = 5 so the scalar path runs) and compare with the torch reference; raises with the cause otherwise.
    This, not importing CuPy, is what decides that selective_cuda runs on a device."""
    from ..base import selective_torch

    dev = torch.device("cuda", kernels.device_index)
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(1, 5, generator=gen).to(dev)
    weight = torch.randn(3, 5, generator=gen).to(dev)
    tokens = torch.tensor([[2, -1, 7, 0]], dtype=torch.int32, device=dev)
    got = kernels.log_softmax(hidden, weight, None, tokens)
    want = selective_torch.selective_log_softmax(hidden, weight, None, tokens)
    torch.cuda.synchronize(dev)  # a launch error surfaces here, not in the middle of a search
    if not torch.allclose(got, want, atol=1e-5, rtol=1e-5, equal_nan=True):
        raise KernelLoadError(f"probe launch gave {got.tolist()}, the torch reference {want.tolist()}")


def usable(device: torch.device | str | int | None = None) -> bool:
    """True when selective_cuda runs on `device`: its kernels (a bundle's, else NVRTC's) loaded and a probe
    launch matched the torch reference. Decided once per device; a failure warns once (KernelFallbackWarning)
    and the mode is left out of that device's modes."""
    if not torch.cuda.is_available():
        return False
    index = cuda_index(device)
    if index is None:
        return False
    if index in _FAILED:
        return False
    if getattr(_DEFAULT_KERNELS.get(index), "probed", False):
        return True
    try:
        kernels = default_kernels(index)
        probe_kernels(kernels)
        kernels.probed = True
    except Exception as exc:  # noqa: BLE001 - any failure means "not on this device", never a failed search
        drop_device(index, f"the CUDA kernels do not run on cuda:{index}: {failure_cause(exc)}")
        return False
    return True


def drop_device(index: int, reason: str) -> None:
    """Leave selective_cuda out on device `index` from now on, with one warning naming `reason`."""
    with _DEFAULT_LOCK:
        first = index not in _FAILED
        _FAILED[index] = reason
        _DEFAULT_KERNELS.pop(index, None)
    if first:
        warnings.warn(f"{reason}; selective_cuda dropped, torch selective used", KernelFallbackWarning, 3)


def failure_cause(exc: BaseException) -> str:
    """``ErrorType: first line of the message`` (what a fallback warning names as the cause)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _launch_or_fallback(method: str, hidden: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    """Run a kernel launch on the device's kernels; any failure other than a bad operand drops the mode on
    that device (one warning) and the torch reference answers instead, so a search never fails on it."""
    from ..base import selective_torch

    index = hidden.device.index if hidden.device.index is not None else 0  # CUDA tensors carry one
    if index not in _FAILED:
        try:
            return getattr(default_kernels(index), method)(hidden, *args, **kwargs)
        except (TypeError, ValueError):  # the caller's operands: the same error from every mode
            raise
        except Exception as exc:  # noqa: BLE001 - NVRTC, driver or launch errors
            drop_device(index, f"a CUDA kernel failed on cuda:{index}: {failure_cause(exc)}")
    result = getattr(selective_torch, f"selective_{method}")(hidden, *args)
    out = kwargs.get("out")
    return result if out is None else out.copy_(result)


def selective_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    kernels: SelectiveKernels | None = None,
) -> torch.Tensor:
    """fp32 [R, K] slot scores on CUDA (see the module docstring); `kernels` defaults to the device's set
    (a failure there falls back to the torch reference with one warning)."""
    if kernels is not None:
        return kernels.scores(hidden, weight, bias, slot_tokens, out=out)
    return _launch_or_fallback("scores", hidden, (weight, bias, slot_tokens), {"out": out})


def selective_log_softmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    kernels: SelectiveKernels | None = None,
    fused: bool | None = None,
) -> torch.Tensor:
    """fp32 [R, K] log-softmax over valid slots on CUDA (see the module docstring)."""
    if kernels is not None:
        return kernels.log_softmax(hidden, weight, bias, slot_tokens, out=out, fused=fused)
    return _launch_or_fallback(
        "log_softmax", hidden, (weight, bias, slot_tokens), {"out": out, "fused": fused}
    )
