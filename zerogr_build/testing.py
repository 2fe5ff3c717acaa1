"""Test doubles and test-only helpers of zerogr, one section per area.

The APIs in this module are used for testing and debugging and are prone to change. Don't use them in
production.
"""

from __future__ import annotations

import copy
import itertools
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .bundle import PublishedBundle, publish_bundle
from .catalog import Catalog
from .index import SidIndex, build_index
from .runtime.stream import DEFAULT_CHUNK_BYTES, NUM_STAGING_BUFFERS, Chunk
from .tune.check import SelectiveCase, make_case

# --- bundle + streaming ---------------------------------------------------------------------------


class StagingReuseError(RuntimeError):
    """A staging buffer was handed out again before the copy from it had completed."""


class FakeDeviceSink:
    """A host-memory stand-in for a device (a `runtime.stream.Sink`) that behaves like asynchronous copies
    at their worst, for CPU tests of the double-buffered loader and `scripts/bench_stream.py` on CPU-only
    machines.

    A copy is recorded as pending on its buffer and performed (staging -> destination) only when the loader
    waits for that buffer or synchronises -- the latest moment a real asynchronous copy could read the
    staging buffer -- so a loader that rewrote a buffer too early would corrupt the result; handing out a
    staging buffer whose copy is still pending also raises `StagingReuseError` outright. Destination memory
    starts poisoned (0xA5 bytes), so a byte no copy wrote shows in the result.

    gate: when given, a copy completes only once the gate is set (the load then stays visibly in
    progress, blocked at its next buffer reuse, until the test sets it). device_done: when given, the
    device work after the copies (`load_marker()`) completes only once it is set.
    `writes` lists (name, offset, nbytes, buffer) in copy order; `schedule` lists (event, chunk index,
    buffer) in the order things happened, event one of "prepare" (staging handed out for writing),
    "copy" (copy enqueued), "done" (copy completed).
    """

    POISON = 0xA5

    def __init__(
        self,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        gate: threading.Event | None = None,
        device_done: threading.Event | None = None,
    ):
        self.chunk_bytes = int(chunk_bytes)
        self.gate = gate
        self.device_done = device_done
        self._staging = [np.zeros(self.chunk_bytes, dtype=np.uint8) for _ in range(NUM_STAGING_BUFFERS)]
        self._pending: list[Chunk | None] = [None] * NUM_STAGING_BUFFERS
        self.memory: dict[str, np.ndarray] = {}
        self.writes: list[tuple[str, int, int, int]] = []
        self.schedule: list[tuple[str, int, int]] = []

    def allocate(self, name: str, nbytes: int) -> None:
        self.memory[name] = np.full(nbytes, self.POISON, dtype=np.uint8)

    def _complete(self, buffer: int) -> None:
        chunk = self._pending[buffer]
        if chunk is None:
            return
        if self.gate is not None:
            self.gate.wait()
        dst = self.memory[chunk.name]
        dst[chunk.offset : chunk.offset + chunk.nbytes] = self._staging[buffer][: chunk.nbytes]
        self._pending[buffer] = None
        self.schedule.append(("done", chunk.index, buffer))

    def wait_free(self, chunk: Chunk) -> None:
        self._complete(chunk.buffer)

    def staging(self, chunk: Chunk) -> np.ndarray:
        busy = self._pending[chunk.buffer]
        if busy is not None:
            raise StagingReuseError(
                f"staging buffer {chunk.buffer} handed out for chunk {chunk.index} while chunk {busy.index} "
                "is still copying from it"
            )
        self.schedule.append(("prepare", chunk.index, chunk.buffer))
        return self._staging[chunk.buffer]

    def copy(self, chunk: Chunk) -> None:
        if self._pending[chunk.buffer] is not None:
            raise StagingReuseError(f"copy of chunk {chunk.index} queued on busy buffer {chunk.buffer}")
        self.schedule.append(("copy", chunk.index, chunk.buffer))
        self.writes.append((chunk.name, chunk.offset, chunk.nbytes, chunk.buffer))
        self._pending[chunk.buffer] = chunk

    def synchronize(self) -> None:
        # Complete the older pending copy first (each stream is in order; across streams any order is legal).
        for _, buffer in sorted((c.index, b) for b, c in enumerate(self._pending) if c is not None):
            self._complete(buffer)

    def result(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.memory[name].view(dtype).reshape(shape))

    def load_marker(self) -> FakeLoadMarker:
        """The load's completion marker (runtime.stream.LoadMarker): device work queued after the copies
        (widening) that completes only once `device_done` is set (at once without it)."""
        return FakeLoadMarker(self)


class FakeLoadMarker:
    """FakeDeviceSink's LoadMarker: `wait()` blocks until the sink's `device_done` is set, then records
    ("loaded", -1, -1) in the sink's schedule."""

    def __init__(self, sink: FakeDeviceSink) -> None:
        self.sink = sink

    def wait(self) -> None:
        if self.sink.device_done is not None:
            self.sink.device_done.wait()
        self.sink.schedule.append(("loaded", -1, -1))


def random_catalog(
    seed: int = 0,
    n: int = 1500,
    sizes: tuple[int, ...] = (4, 40, 300),
    string_ids: bool = False,
    dup_share: float = 0.05,
) -> Catalog:
    """A Catalog of `n` random SIDs over codebooks `sizes` (about `dup_share` of the rows repeat another
    row's SID) with unique item ids: int64 from 10 up, or "item-<k>" strings."""
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, sizes, size=(n, len(sizes))).astype(np.uint32)
    dups = rng.random(n) < dup_share
    sids[dups] = sids[rng.integers(0, n, size=int(dups.sum()))]
    ids = rng.permutation(n * 3)[:n] + 10
    item_ids = pa.array([f"item-{i}" for i in ids]) if string_ids else pa.array(ids, type=pa.int64())
    return Catalog(
        sids=sids,
        item_ids=item_ids,
        codebook_sizes=tuple(sizes),
        codebook_inferred=False,
        files=[],
        fingerprint="sha256:test",
        rows=n,
    )


def publish_catalog(
    catalog: Catalog, out: str | Path, step_formats: Any = None, **kwargs: Any
) -> tuple[SidIndex, PublishedBundle]:
    """build_index + publish_bundle of `catalog` into OUT dir `out` with fixed manifest fields (model
    version "m-1", a catalog path and fingerprint, small settings); kwargs go to publish_bundle (keep,
    promote). Returns (index, PublishedBundle)."""
    index = build_index(catalog.sids, catalog.codebook_sizes, step_formats=step_formats)
    fields = {
        "model_version": "m-1",
        "catalog": {"path": "cat.parquet", "fingerprint": catalog.fingerprint},
        "settings": {"workers": 1, "out": Path(out)},
    }
    return index, publish_bundle(index, catalog.item_ids, out, manifest_fields=fields, **kwargs)


# --- runtime + tune ---------------------------------------------------------------------------------


class SeededModel:
    """A deterministic stand-in for a generative recommender over codebooks `sizes`, for decoding tests.

    Output layers: weights[t] fp32 [V_t, dim] (standard normal * scale) and biases[t] fp32 [V_t] (or None).
    Step function: hidden(step, prefix, request) = base[step] + req[request] + sum over j < step of
    emb[j][prefix[j]], with emb[j] [V_j, dim] * emb_scale, base [L, dim], req [batch_size, dim] * req_scale.
    Everything is drawn from one generator seeded with `seed`, so equal arguments give equal models.
    `brute_force` recomputes every SID's total log-probability in fp64 from the same tables.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        seed: int = 0,
        batch_size: int = 1,
        *,
        dim: int = 8,
        bias: bool = False,
        scale: float = 1.0,
        emb_scale: float = 0.7,
        req_scale: float = 1.0,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.sizes = tuple(int(v) for v in sizes)
        self.dim = dim
        self.weights = [torch.randn(v, dim, generator=g) * scale for v in self.sizes]
        self.biases = [torch.randn(v, generator=g) if bias else None for v in self.sizes]
        self.emb = [torch.randn(v, dim, generator=g) * emb_scale for v in self.sizes]
        self.base = torch.randn(len(self.sizes), dim, generator=g)
        self.req = torch.randn(batch_size, dim, generator=g) * req_scale

    def layers(self, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The per-step (weight, bias) pairs in `dtype`, as a Decoder takes them."""
        return [
            (w.to(dtype), None if b is None else b.to(dtype))
            for w, b in zip(self.weights, self.biases, strict=True)
        ]

    def step_fn(self, step: int, prefixes: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """hidden fp32 [R, dim] of prefixes int64 [R, step] of requests batch int64 [R]."""
        h = self.base[step].expand(prefixes.shape[0], self.dim) + self.req.index_select(0, batch)
        for j in range(step):
            h = h + self.emb[j].index_select(0, prefixes[:, j])
        return h

    def to(self, device: str | torch.device) -> SeededModel:
        """A copy whose tables live on `device` (its step_fn then takes and returns tensors there)."""
        moved = copy.copy(self)
        moved.weights = [w.to(device) for w in self.weights]
        moved.biases = [None if b is None else b.to(device) for b in self.biases]
        moved.emb = [e.to(device) for e in self.emb]
        moved.base, moved.req = self.base.to(device), self.req.to(device)
        return moved

    def brute_force(
        self, sids: np.ndarray, order: str, request: int, dtype: torch.dtype = torch.float32
    ) -> dict[tuple[int, ...], float]:
        """{sid: total log-prob} in fp64 of every distinct SID of int [n, L] (every code if unconstrained),
        with weights and hidden vectors rounded to `dtype` first (what a Decoder with such weights sees).
        filter_first normalises over each prefix's catalog children, the other orders over all V_t."""
        if order == "unconstrained":
            leaves = np.array(list(itertools.product(*[range(v) for v in self.sizes])), dtype=np.int64)
        else:
            leaves = np.unique(np.asarray(sids, dtype=np.int64), axis=0)
        children: dict[tuple, set] = {}
        for s in {tuple(int(x) for x in row) for row in np.asarray(sids)}:
            for t in range(len(s)):
                children.setdefault(s[:t], set()).add(s[t])
        total = np.zeros(len(leaves))
        for t in range(len(self.sizes)):
            prefixes = torch.as_tensor(leaves[:, :t])
            h = self.step_fn(t, prefixes, torch.full((len(leaves),), request)).to(dtype).double()
            w, b = self.weights[t].to(dtype).double(), self.biases[t]
            logits = (h @ w.T + (0 if b is None else b.to(dtype).double())).numpy()
            for i, leaf in enumerate(leaves):
                row = logits[i]
                if order == "filter_first":
                    allowed = sorted(children[tuple(int(x) for x in leaf[:t])])
                    norm = np.logaddexp.reduce(row[allowed])
                else:
                    norm = np.logaddexp.reduce(row)
                total[i] += row[leaf[t]] - norm
        return {tuple(int(x) for x in leaf): float(v) for leaf, v in zip(leaves, total, strict=True)}


# --- GPU kernels ------------------------------------------------------------------------------------------


class FakeDriverError(RuntimeError):
    """What FakeKernelLoader raises at a stage chosen to fail (stands for a CUDA driver / NVRTC error)."""


@dataclass
class FakeKernels:
    """What FakeKernelLoader "loads": where it came from (kind cubin | ptx | nvrtc, bundle file name)."""

    kind: str
    origin: str
    device_index: int
    probed: bool = False


def fake_kernel_file(kind: str, arch: str = "sm_90", body: bytes = b"") -> bytes:
    """Bytes that pass verify's kind check for a kernel file (bundle/kernel_files.py) without being one
    that runs: a cubin is a CUDA ELF header for `arch` and one null section header, then `body`; a PTX file a
    ``.version`` and ``.target <arch>`` preamble plus `body`."""
    if kind == "ptx":
        return f".version 9.0\n.target {arch}\n".encode() + body
    sm = int("".join(ch for ch in arch[3:] if ch.isdigit()))
    ident = b"\x7fELF\x02\x01\x01\x41\x08" + bytes(7)
    flags = 0x6000004 | (sm << 8)  # CUDA ELF ABI 8: the SM number in bits 8-15
    header = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 190, 1, 0, 0, 64, flags, 64, 56, 0, 64, 1, 0)
    return header + bytes(64) + body  # one (null) section header right after the ELF header


class FakeKernelLoader:
    """The driver side of runtime.scoring.bundle_kernels.choose_bundle_kernels, without a GPU.

    fail: stages that raise FakeDriverError - "cubin", "ptx" (loading such a file), "nvrtc" (compiling the
    source), "launch" (the probe launch of anything) or "launch:<kind>". calls records (stage, origin,
    bytes handed over) in order, so a test sees exactly which bytes would have reached the driver."""

    def __init__(self, fail: tuple[str, ...] | set[str] = ()) -> None:
        self.fail = set(fail)
        self.calls: list[tuple[str, str, bytes]] = []

    def load_bytes(self, data: bytes, kind: str, origin: str, device_index: int) -> FakeKernels:
        self.calls.append(("load", origin, bytes(data)))
        if kind in self.fail:
            raise FakeDriverError(f"CUDA_ERROR_INVALID_IMAGE: cannot load {kind}")
        return FakeKernels(kind, origin, device_index)

    def load_source(self, device_index: int) -> FakeKernels:
        self.calls.append(("nvrtc", "selective.cu", b""))
        if "nvrtc" in self.fail:
            raise FakeDriverError("NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: libnvrtc not found")
        return FakeKernels("nvrtc", "nvrtc", device_index)

    def probe(self, kernels: FakeKernels) -> None:
        self.calls.append(("probe", kernels.origin, b""))
        if "launch" in self.fail or f"launch:{kernels.kind}" in self.fail:
            raise FakeDriverError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")
        kernels.probed = True


__all__ = ["SeededModel", "SelectiveCase", "make_case"]


# --- hostile inputs ---


def finishes(fn: Any, timeout: float = 10.0) -> Any:
    """fn() on a daemon thread: its result, or its exception re-raised, or AssertionError when it still runs
    after `timeout` s (a FIFO or /dev/zero read that never ends; the thread is abandoned)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"still running after {timeout} s (hangs or reads without bound)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- CLI output ---


def stderr_lines(text: str) -> list[str]:
    """The non-blank lines of a command's stderr, without the one-time numba compile notice that a cold
    first run prints before anything else (`pipeline.KernelCompileWarning`): tests that count a command's
    lines (e.g. "bad input is one line") then hold whether or not this process compiled the kernels."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith(_COMPILE_NOTICE)]


_COMPILE_NOTICE = "WARNING: compiling the build kernels"


# --- decoding without host reads ---

_HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero")


def replay_without_host_reads(
    monkeypatch: Any, dec: Any, start: Any, hiddens: Sequence[Any], mode: Any
) -> Any:
    """Replay `dec.step` from state `start` with the precomputed hidden vectors while every way of reading
    a tensor value back to the host raises; returns the final state. A step that syncs the host (what
    CUDA-graph capture forbids) fails the calling test. monkeypatch: pytest's fixture (undone here)."""

    def no_host_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a decoding step read a tensor value back to the host")

    for name in _HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, no_host_read)
    monkeypatch.setattr(torch, "nonzero", no_host_read)
    try:
        state = start
        for hidden in hiddens:
            state = dec.step(state, hidden, mode=mode)
    finally:
        monkeypatch.undo()
    return state
