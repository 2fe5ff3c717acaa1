"""Step tables on the decoder's device: the one path from a SidIndex (in memory or memory-mapped from a
bundle) to the tensors the Decoder reads.

    steps = index_to_device(index, "cuda:0", caps=None)    # tuple[DeviceStep, ...], one per step
    leaves = walk_step_tables(steps, sids)                  # SIDs -> leaves (-1: not in the catalog)

The Decoder's working dtypes are wider than the bundle's (indptr int64, tokens and next int32). On CUDA
the tables travel in their stored (narrow) dtypes through stream.py's double-buffered loader and are
widened on the device, so the PCIe copy moves the bundle's bytes; on the CPU they are converted in place
(zero-copy when the dtype already fits). Leaf offsets stay on the host (the Decoder maps leaves to items
there). `zerogr build --device` times exactly this path: what serving pays to make a version resident.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..base.errors import InputError
from ..index import SidIndex, StepMeta, StepTable
from .slots import default_slot_cap
from .stream import LoadStats, Sink, load_arrays_to_device

SlotCaps = int | list[int | None] | tuple | dict | None


@dataclass(frozen=True, eq=False)
class DeviceStep(StepMeta):
    """One step table on the decoder's device: the step's StepMeta fields, then

    cap: slots per beam in the main slot block (K; V_t at a dense step);
    sparse: indptr int64 [rows+1], tokens int32 [nnz]; dense: next int32 [rows, V].
    """

    cap: int
    indptr: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    next: torch.Tensor | None = None
    _flat_keys: list = field(default_factory=list, repr=False)  # cached flat_keys() (unconstrained lookup)

    @property
    def format(self) -> str:
        return "dense" if self.next is not None else "sparse"

    def flat_keys(self) -> torch.Tensor:
        """int64 [nnz]: row * V + token for every child, ascending (for looking up arbitrary prefixes)."""
        if not self._flat_keys:
            assert self.indptr is not None and self.tokens is not None
            counts = self.indptr[1:] - self.indptr[:-1]
            parent = torch.repeat_interleave(torch.arange(self.rows, device=counts.device), counts)
            self._flat_keys.append(parent * self.codebook_size + self.tokens.long())
        return self._flat_keys[0]


def _tensor(array: np.ndarray, dtype: type, device: torch.device) -> torch.Tensor:
    """`array` as a tensor on `device`; zero-copy on CPU when the dtype already fits (memory-mapped bundle
    arrays stay mapped - they are read-only, which torch warns about, but the decoder never writes them)."""
    array = np.ascontiguousarray(array, dtype=dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(array).to(device)


def to_device(
    table: StepTable, device: torch.device, cap: int | None = None, arrays: dict | None = None
) -> DeviceStep:
    """One step table on `device` (tokens widened to int32, indptr to int64) with slot cap `cap` (None:
    slots.default_slot_cap; clamped to 1..max_slots). arrays: the table already resident on `device` in
    those dtypes ({role: tensor}, from step_tables_on_device)."""
    if table.format == "dense":
        nxt = arrays["next"] if arrays is not None else _tensor(table.next, np.int32, device)
        return DeviceStep(**table.meta(), cap=table.codebook_size, next=nxt)
    cap = default_slot_cap(table) if cap is None else max(1, min(int(cap), table.max_slots))
    if arrays is not None:
        indptr, tokens = arrays["indptr"], arrays["tokens"]
    else:
        indptr = _tensor(table.indptr, np.int64, device)
        tokens = _tensor(table.tokens, np.int32, device)
    return DeviceStep(**table.meta(), cap=cap, indptr=indptr, tokens=tokens)


def step_arrays(index: SidIndex) -> Iterator[tuple[str, np.ndarray]]:
    """The step tables of a SidIndex under their bundle names: "step{t}.{role}" (role indptr/tokens/next)."""
    for table in index.steps:
        for role, array in table.arrays().items():
            yield f"step{table.step}.{role}", array


def widen_on_device(role: str, tensor: torch.Tensor) -> torch.Tensor:
    """The Decoder's working dtype of a resident table, converted on the device: indptr -> int64, tokens
    and next -> int32. uint16 tokens go through an int16 view and a mask (uint16 arithmetic has only
    partial CUDA support in torch)."""
    if role == "indptr":
        return tensor.to(torch.int64)
    if tensor.dtype == torch.uint16:
        return tensor.view(torch.int16).to(torch.int32) & 0xFFFF
    return tensor.to(torch.int32)


def step_tables_on_device(
    index: SidIndex,
    device: str | torch.device,
    *,
    low_priority: bool = False,
    chunk_bytes: int | None = None,
    sink: Sink | None = None,
    stats: LoadStats | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Per step, {role: tensor} on `device` in the Decoder's dtypes (see widen_on_device): every step table
    is streamed in its stored (narrow) dtype through the double-buffered loader, then widened on the device.

    sink: overrides the device's sink (tests pass zerogr_build.testing.FakeDeviceSink); stats: filled with
    the load's LoadStats (bytes moved are the bundle's, not the widened ones)."""
    resident = load_arrays_to_device(
        dict(step_arrays(index)),
        device,
        chunk_bytes=chunk_bytes,
        low_priority=low_priority,
        sink=sink,
        stats=stats,
    )
    out = []
    for table in index.steps:
        # pop: free each narrow copy as soon as its wide one exists
        out.append(
            {role: widen_on_device(role, resident.pop(f"step{table.step}.{role}")) for role in table.arrays()}
        )
    return out


def _per_step_caps(caps: SlotCaps, num_steps: int) -> list[int | None]:
    """caps as one entry per step (None: the default)."""
    if caps is None or isinstance(caps, int):
        return [caps] * num_steps
    if isinstance(caps, dict):
        return [caps.get(t) for t in range(num_steps)]
    per_step = list(caps)
    if len(per_step) != num_steps:
        raise InputError(f"slot_caps: {len(per_step)} entries for SIDs of length {num_steps}")
    return per_step


def index_to_device(
    index: SidIndex,
    device: str | torch.device,
    caps: SlotCaps = None,
    *,
    low_priority: bool = False,
    sink: Sink | None = None,
    stats: LoadStats | None = None,
) -> tuple[DeviceStep, ...]:
    """All step tables of `index` on `device`, one DeviceStep per step.

    Args:
        index: the SidIndex (in memory, or a bundle's memory-mapped one).
        device: "cpu", "cuda", "cuda:N" or a torch.device.
        caps: slot cap K of the sparse steps: None (defaults), one int for every sparse step, a per-step
            sequence or a {step: cap} mapping (None entries keep the default).
        low_priority: on CUDA, stream on low-priority copy streams (loading beside a live version).
        sink: stream through this sink whatever the device (tests: FakeDeviceSink, whose tensors are
            CPU tensors, so `device` must then be "cpu").
        stats: filled with the streamed load's LoadStats (untouched on the CPU without a sink: nothing
            is streamed there).
    """
    per_step = _per_step_caps(caps, index.num_steps)
    resident: list = [None] * index.num_steps
    if sink is not None or torch.device(device).type == "cuda":
        resident = step_tables_on_device(index, device, low_priority=low_priority, sink=sink, stats=stats)
    return tuple(to_device(table, device, per_step[t], resident[t]) for t, table in enumerate(index.steps))


def walk_step_tables(steps: Sequence[DeviceStep], sids: torch.Tensor) -> torch.Tensor:
    """int64 [n]: the leaf of each SID of int64 [n, L] (sids on the tables' device), walking the step tables
    from the root; -1 where a SID is not in the catalog (a token out of range or without a child)."""
    row = torch.zeros(sids.shape[0], dtype=torch.int64, device=sids.device)
    for t, table in enumerate(steps):
        tok = sids[:, t]
        ok = (row >= 0) & (tok >= 0) & (tok < table.codebook_size)
        safe_row, safe_tok = row.clamp(min=0), tok.clamp(0, table.codebook_size - 1)
        if table.format == "dense":
            assert table.next is not None
            nxt = table.next[safe_row, safe_tok].long()
        else:
            keys = table.flat_keys()
            key = safe_row * table.codebook_size + safe_tok
            pos = torch.searchsorted(keys, key).clamp(max=table.nnz - 1)
            nxt = torch.where(keys[pos] == key, pos, torch.full_like(pos, -1))
        row = torch.where(ok, nxt, torch.full_like(nxt, -1))
    return row


def measure_device_load(index: SidIndex, device: str) -> dict:
    """Load `index` onto `device` as the Decoder does (the load after a build), wait for the widening
    kernels it queued, free it again, and return {"device", **LoadStats} (bytes, chunks, seconds)."""
    stats = LoadStats()
    resident = index_to_device(index, device, stats=stats)  # the Decoder's own load
    torch.cuda.synchronize(device)  # the widening kernels it queued are part of the load
    del resident
    return {"device": device, **vars(stats)}
