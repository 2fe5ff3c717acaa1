"""The pure half of the CUDA selective-scoring backend: operand checks, launch geometry, kernel arguments.

Nothing here needs CuPy or a GPU, so all of it is tested on the CPU (tests/test_kernels.py, and
tests/test_kernels_emulated.py runs the kernels with exactly this geometry). selective.py loads the
kernels and launches them with what this module computes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..base.dtypes import dtype_name
from ..base.errors import InputError

ENTRY_SUFFIX = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}  # dtype name -> kernel entry-point suffix
MAX_WARPS = 8  # 256 threads per block; matches __launch_bounds__(256) in selective.cu
SLOTS_PER_BLOCK = 64  # slots one block of the two-pass scores kernel owns
MAX_GRID_Y = 65535
_INT32_MAX = 2**31 - 1


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


@dataclass(frozen=True, eq=False)
class SelectiveCall:
    """The tensors of one checked call, ready to launch: slot_tokens int32, out fp32 [R, K].

    Shape: hidden [R, d], weight [V, d], bias [V] | None, slot_tokens [R, K], out [R, K]; layout holds the
    shapes and strides the kernels are given."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    slot_tokens: torch.Tensor
    out: torch.Tensor
    layout: SelectiveOperands


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
    suffix = entry_suffix(hidden.dtype)
    if suffix is None:
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
        suffix=suffix,
    )


def prepare_call(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot_tokens: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    require_cuda: bool = True,
) -> SelectiveCall:
    """check_operands, then int64 slot tokens narrowed to int32 and the fp32 [R, K] output allocated.

    Narrowing never wraps: an int64 token outside [0, V) becomes -1 (empty, like the torch reference)
    first, so 2**32 + 3 cannot turn into the valid token 3."""
    layout = check_operands(hidden, weight, bias, slot_tokens, out, require_cuda=require_cuda)
    if slot_tokens.dtype != torch.int32:
        in_range = (slot_tokens >= 0) & (slot_tokens < layout.vocab)
        slot_tokens = torch.where(in_range, slot_tokens, -1).to(torch.int32).contiguous()
    if out is None:
        out = torch.empty((layout.rows, layout.slots), dtype=torch.float32, device=hidden.device)
    layout = replace(layout, slots_row_stride=slot_tokens.stride(0), out_row_stride=out.stride(0))
    return SelectiveCall(hidden, weight, bias, slot_tokens, out, layout)


def entry_suffix(dtype: torch.dtype) -> str | None:
    """The kernel entry-point suffix of a dtype ("f32", "f16", "bf16"); None when the kernels lack it."""
    try:
        return ENTRY_SUFFIX[dtype_name(dtype)]
    except InputError:
        return None


def kernel_args(call: SelectiveCall) -> tuple[object, ...]:
    """The arguments every scores / log-softmax entry point starts with, as the C types it declares."""
    lay = call.layout
    # Order and C types must match the entry points' parameter lists in selective.cu exactly.
    return (
        np.uint64(call.hidden.data_ptr()),
        np.int64(lay.hidden_row_stride),
        np.uint64(call.weight.data_ptr()),
        np.int64(lay.weight_row_stride),
        np.uint64(call.bias.data_ptr() if call.bias is not None else 0),
        np.uint64(call.slot_tokens.data_ptr()),
        np.int64(lay.slots_row_stride),
        np.uint64(call.out.data_ptr()),
        np.int64(lay.out_row_stride),
        np.int32(lay.slots),
        np.int32(lay.dim),
        np.int64(lay.vocab),
    )


def _warps_for(work_items: int) -> int:
    return max(1, min(MAX_WARPS, work_items))


def scores_geometry(rows: int, slots: int, dim: int) -> LaunchGeometry:
    """selective_scores_*: a block per (row, chunk of SLOTS_PER_BLOCK slots), a warp per slot at a time."""
    per_block = min(slots, SLOTS_PER_BLOCK)
    chunks = -(-slots // per_block)
    if chunks > MAX_GRID_Y:
        raise ValueError(f"K={slots} slots exceed the kernel's limit of {MAX_GRID_Y * SLOTS_PER_BLOCK}")
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


__all__ = [
    "ENTRY_SUFFIX",
    "LaunchGeometry",
    "SelectiveCall",
    "SelectiveOperands",
    "check_operands",
    "entry_suffix",
    "fused_geometry",
    "kernel_args",
    "prepare_call",
    "row_log_softmax_geometry",
    "scores_geometry",
    "use_fused",
]
