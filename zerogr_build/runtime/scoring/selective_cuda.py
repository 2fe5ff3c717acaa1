"""Selective scoring with the package's CUDA kernels (kernels/selective.cu), loaded through CuPy.

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
PTX file compiled ahead of time by compile.py (`SelectiveKernels.from_file`, e.g. a bundle's
``kernels/<arch>/selective.cubin``). CuPy is an optional dependency and is imported only inside functions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from zerogr_build.errors import ZerogrError
from zerogr_build.runtime.scoring.compile import SELECTIVE_ENTRY_POINTS, read_kernel_source

DTYPE_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
MAX_WARPS = 8  # 256 threads per block; matches __launch_bounds__(256) in selective.cu
SLOTS_PER_BLOCK = 64  # slots one block of the two-pass scores kernel owns
DEFAULT_SHARED_BYTES = 48 * 1024  # dynamic shared memory every device grants without opting in
STATIC_SHARED_MARGIN = 1024  # the kernels' own __shared__ arrays (272 bytes per ptxas), rounded up
_MAX_GRID_Y = 65535
_INT32_MAX = 2**31 - 1


class KernelLoadError(ZerogrError):
    """CuPy is missing, the device has no CUDA, or a kernel module could not be compiled or loaded."""


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


def find_compiled_kernel(kernels_root: str | Path, arch: str, stem: str = "selective") -> Path | None:
    """The compiled module to load for `arch` from a bundle's ``kernels/`` dir, or None when none fits.

    Prefers ``<arch>/<stem>.cubin`` (machine code for exactly this architecture), then ``<arch>/<stem>.ptx``.
    """
    for kind in ("cubin", "ptx"):
        path = Path(kernels_root) / arch / f"{stem}.{kind}"
        if path.is_file():
            return path
    return None


# --------------------------------------------------------------------------------------------------------
# Operand checks and launch geometry (pure; no CuPy)


@dataclass(frozen=True)
class SelectiveOperands:
    """Validated shapes and element strides of one selective-scoring call."""

    rows: int  # R
    slots: int  # K
    dim: int  # d
    vocab: int  # V
    hidden_row_stride: int
    weight_row_stride: int
    slots_row_stride: int
    out_row_stride: int
    suffix: str  # entry-point dtype suffix: f32 | f16 | bf16


@dataclass(frozen=True)
class LaunchGeometry:
    """Grid, block and dynamic shared memory of one kernel launch."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


def check_operands(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    require_cuda: bool = True,
) -> SelectiveOperands:
    """Checks the contract's dtypes, shapes, devices and layout; TypeError/ValueError names the operand.

    out, when given, must be float32 [R, K] with unit last-dimension stride on the same device.
    """
    for name, t in (("hidden", hidden), ("weight", weight), ("slot_tokens", slot_tokens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if hidden.dtype not in DTYPE_SUFFIX:
        raise TypeError(f"hidden dtype {hidden.dtype} not supported: use float32, float16 or bfloat16")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight dtype {weight.dtype} differs from hidden dtype {hidden.dtype}")
    if slot_tokens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_tokens must be int32 (or int64, converted), got {slot_tokens.dtype}")
    rows, dim = hidden.shape
    vocab = weight.shape[0]
    slots = slot_tokens.shape[1]
    if weight.shape[1] != dim:
        raise ValueError(f"weight is {tuple(weight.shape)} but hidden is {tuple(hidden.shape)}: d differs")
    if slot_tokens.shape[0] != rows:
        raise ValueError(f"slot_tokens has {slot_tokens.shape[0]} rows but hidden has {rows}")
    operands = [("hidden", hidden), ("weight", weight), ("slot_tokens", slot_tokens)]
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dtype != hidden.dtype:
            raise TypeError(f"bias dtype {bias.dtype} differs from hidden dtype {hidden.dtype}")
        if bias.dim() != 1 or bias.shape[0] != vocab:
            raise ValueError(f"bias must have shape ({vocab},), got {tuple(bias.shape)}")
        if vocab > 1 and bias.stride(0) != 1:
            raise ValueError("bias must be contiguous (stride 1)")
        operands.append(("bias", bias))
    if out is not None:
        if out.dtype != torch.float32:
            raise TypeError(f"out must be float32, got {out.dtype}")
        if tuple(out.shape) != (rows, slots):
            raise ValueError(f"out must have shape {(rows, slots)}, got {tuple(out.shape)}")
        operands.append(("out", out))
    for name, t in operands:
        if t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name} must have unit stride along its last dimension, got {t.stride()}")
    device = hidden.device
    for name, t in operands:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but hidden is on {device}: use one device")
    if require_cuda and device.type != "cuda":
        raise ValueError(f"the CUDA selective kernels need CUDA tensors, got hidden on {device}")
    if max(rows, slots, dim) > _INT32_MAX:
        raise ValueError(f"R={rows}, K={slots}, d={dim}: each must be below 2**31")
    return SelectiveOperands(
        rows=rows,
        slots=slots,
        dim=dim,
        vocab=vocab,
        hidden_row_stride=hidden.stride(0),
        weight_row_stride=weight.stride(0),
        slots_row_stride=slot_tokens.stride(0),
        out_row_stride=out.stride(0) if out is not None else slots,
        suffix=DTYPE_SUFFIX[hidden.dtype],
    )


def _warps_for(work_items: int) -> int:
    return max(1, min(MAX_WARPS, work_items))


def scores_geometry(rows: int, slots: int, dim: int) -> LaunchGeometry:
    """selective_scores_*: a block per (row, chunk of SLOTS_PER_BLOCK slots), a warp per slot at a time."""
    per_block = min(slots, SLOTS_PER_BLOCK)
    chunks = -(-slots // per_block)
    if chunks > _MAX_GRID_Y:
        raise ValueError(f"K={slots} slots exceed the kernel's limit of {_MAX_GRID_Y * SLOTS_PER_BLOCK}")
    return LaunchGeometry((rows, chunks, 1), (32 * _warps_for(per_block), 1, 1), 4 * dim)


def fused_geometry(rows: int, slots: int, dim: int) -> LaunchGeometry:
    """selective_log_softmax_*: one block per row, its warps striding over the row's slots."""
    return LaunchGeometry((rows, 1, 1), (32 * _warps_for(slots), 1, 1), 4 * dim)


def row_log_softmax_geometry(rows: int, slots: int) -> LaunchGeometry:
    """selective_row_log_softmax_inplace: one block per row, one thread per slot at a time."""
    return LaunchGeometry((rows, 1, 1), (32 * _warps_for(-(-slots // 32)), 1, 1), 0)


def use_fused(rows: int, slots: int, sm_count: int) -> bool:
    """Whether the one-kernel log-softmax (one block per row) fills the GPU.

    With fewer rows than SMs and more slots than one block of the scores kernel takes, one block per row
    leaves most SMs idle (e.g. batch 1 at a dense step: R = 1, K = V), so scores run over R x K/64 blocks
    and a light second kernel normalises each row instead.
    """
    return rows >= sm_count or slots <= SLOTS_PER_BLOCK


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
    if device is None:
        return torch.cuda.current_device()
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        raise KernelLoadError(f"the CUDA selective kernels need a CUDA device, got {dev}")
    return dev.index if dev.index is not None else torch.cuda.current_device()


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
        """Compiles kernels/selective.cu with NVRTC for the device (CuPy caches the binary on disk)."""
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
        ops, slot_tokens, out = self._prepare(hidden, weight, bias, slot_tokens, out)
        if ops.rows and ops.slots:
            self._launch_scores(ops, hidden, weight, bias, slot_tokens, out)
        return out

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
        ops, slot_tokens, out = self._prepare(hidden, weight, bias, slot_tokens, out)
        if not (ops.rows and ops.slots):
            return out
        if fused is None:
            fused = use_fused(ops.rows, ops.slots, self.sm_count)
        if fused:
            geo = fused_geometry(ops.rows, ops.slots, ops.dim)
            args = self._common_args(ops, hidden, weight, bias, slot_tokens, out)
            self._launch(f"selective_log_softmax_{ops.suffix}", geo, args)
        else:
            self._launch_scores(ops, hidden, weight, bias, slot_tokens, out)
            np = _numpy()
            geo = row_log_softmax_geometry(ops.rows, ops.slots)
            args = (np.uint64(out.data_ptr()), np.int64(ops.out_row_stride), np.int32(ops.slots))
            self._launch("selective_row_log_softmax_inplace", geo, args)
        return out

    # ---- internals -------------------------------------------------------------------------------------

    def _prepare(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        slot_tokens: torch.Tensor,
        out: torch.Tensor | None,
    ) -> tuple[SelectiveOperands, torch.Tensor, torch.Tensor]:
        """Checks operands; returns (operands, int32 slot tokens, fp32 output buffer)."""
        ops = check_operands(hidden, weight, bias, slot_tokens, out)
        if slot_tokens.dtype != torch.int32:
            slot_tokens = slot_tokens.to(torch.int32).contiguous()
            ops = replace(ops, slots_row_stride=slot_tokens.stride(0))
        if hidden.device.index != self.device_index:
            raise ValueError(
                f"tensors are on {hidden.device} but these kernels were loaded on cuda:{self.device_index}"
            )
        if 4 * ops.dim > self.max_shared_bytes:
            raise ValueError(
                f"d={ops.dim} needs {4 * ops.dim} bytes of shared memory per block; "
                f"cuda:{self.device_index} allows {self.max_shared_bytes}"
            )
        if out is None:
            out = torch.empty((ops.rows, ops.slots), dtype=torch.float32, device=hidden.device)
        return ops, slot_tokens, out

    def _common_args(
        self,
        ops: SelectiveOperands,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        slot_tokens: torch.Tensor,
        out: torch.Tensor,
    ) -> tuple[Any, ...]:
        # Order and C types must match the entry points' parameter lists in selective.cu exactly.
        np = _numpy()
        return (
            np.uint64(hidden.data_ptr()),
            np.int64(ops.hidden_row_stride),
            np.uint64(weight.data_ptr()),
            np.int64(ops.weight_row_stride),
            np.uint64(bias.data_ptr() if bias is not None else 0),
            np.uint64(slot_tokens.data_ptr()),
            np.int64(ops.slots_row_stride),
            np.uint64(out.data_ptr()),
            np.int64(ops.out_row_stride),
            np.int32(ops.slots),
            np.int32(ops.dim),
            np.int64(ops.vocab),
        )

    def _launch_scores(
        self,
        ops: SelectiveOperands,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        slot_tokens: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        geo = scores_geometry(ops.rows, ops.slots, ops.dim)
        per_block = min(ops.slots, SLOTS_PER_BLOCK)
        args = (*self._common_args(ops, hidden, weight, bias, slot_tokens, out), _numpy().int32(per_block))
        self._launch(f"selective_scores_{ops.suffix}", geo, args)

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
        handle = torch.cuda.current_stream(self.device_index).cuda_stream
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._cupy.cuda.ExternalStream(handle, self.device_index)
            self._streams[handle] = stream
        return stream


def _numpy() -> Any:
    import numpy

    return numpy


# --------------------------------------------------------------------------------------------------------
# Module-level functions with the contract's signatures (NVRTC-compiled kernels, one set per device)

_DEFAULT_KERNELS: dict[int, SelectiveKernels] = {}
_DEFAULT_LOCK = threading.Lock()


def default_kernels(device: torch.device | str | int | None = None) -> SelectiveKernels:
    """The NVRTC-compiled kernels for a device, compiled on first use and kept for the process."""
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


def load_compiled_kernels(
    kernels_root: str | Path, device: torch.device | str | int | None = None, *, make_default: bool = True
) -> SelectiveKernels | None:
    """Loads a bundle's ahead-of-time kernels (``kernels_root/<arch>/selective.cubin|ptx``) for the device.

    Returns None when the bundle has no file for the device's architecture (the caller then keeps the
    NVRTC build). With make_default, the module-level functions use them from now on for that device.
    """
    index = _device_index(device)
    path = find_compiled_kernel(kernels_root, device_arch(index))
    if path is None:
        return None
    kernels = SelectiveKernels.from_file(path, index)
    if make_default:
        set_default_kernels(kernels)
    return kernels


def selective_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    kernels: SelectiveKernels | None = None,
) -> torch.Tensor:
    """fp32 [R, K] slot scores on CUDA (see the module docstring); `kernels` defaults to the NVRTC build."""
    k = kernels if kernels is not None else default_kernels(hidden.device)
    return k.scores(hidden, weight, bias, slot_tokens, out=out)


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
    k = kernels if kernels is not None else default_kernels(hidden.device)
    return k.log_softmax(hidden, weight, bias, slot_tokens, out=out, fused=fused)
