"""Double-buffered streaming of arrays to a device (the step tables of a bundle, in practice).

A bundle's arrays are memory-mapped `.npy` files. Moving them to a GPU naively (read everything into host
memory, then one big copy) serialises disk/page-cache reads and the PCIe copy. Here every array is cut into
chunks of `chunk_bytes`; chunk k is *prepared* (read from the source array into pinned host staging buffer
k % 2) while chunk k-1 is being *copied* from the other staging buffer on its own CUDA stream. Buffer b is
only overwritten after the event recorded behind its previous copy has completed, so at most two chunks are
in flight and the host never writes into memory a DMA engine is still reading.

The orchestration (`DeviceLoader`) talks to a *sink* that owns the staging buffers and destination memory:
`CudaSink` here (torch pinned host tensors, two `torch.cuda.Stream`s, one `torch.cuda.Event` per buffer);
the CPU tests and `scripts/bench_stream.py` on CPU-only machines use `zerogr_build.testing.FakeDeviceSink`,
a host-memory double whose copies read their staging buffer as late as a real asynchronous copy could. Both
go through the same chunk planner and the same loop, so the CPU tests exercise the code the GPU path runs.
Nothing here imports CUDA-only modules at load time; torch's CUDA calls happen only inside `CudaSink`.
Turning a SidIndex into the Decoder's tensors is device_tables.py's job.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

DEFAULT_CHUNK_BYTES = 64 << 20
"""64 MiB: the largest chunk. Large enough that per-copy launch overhead is negligible, small enough that
two pinned buffers are a modest, fixed host-memory cost whatever the bundle size."""
LOW_PRIORITY = 0  # CUDA's least priority (and the default)
LOADING_PRIORITY = -100  # "as high as the device allows": torch maps it to the device's greatest priority
MIN_AUTO_CHUNK_BYTES = 1 << 20
AUTO_CHUNKS = 16


def auto_chunk_bytes(total_bytes: int) -> int:
    """Chunk size for a load of `total_bytes`: about AUTO_CHUNKS chunks, between 1 MiB and 64 MiB.

    Only the last chunk's copy cannot overlap a read, so the exposed share of the copy time is about one
    chunk's worth: with ~16 chunks at most ~6% of it stays visible, while 1 MiB keeps per-copy overhead
    (a launch and an event, microseconds) small against the copy itself."""
    target = -(-int(total_bytes) // AUTO_CHUNKS)
    return int(min(DEFAULT_CHUNK_BYTES, max(MIN_AUTO_CHUNK_BYTES, target)))


NUM_STAGING_BUFFERS = 2


@dataclass(frozen=True)
class Chunk:
    """One unit of work: bytes [offset, offset+nbytes) of array `name`, staged through buffer `buffer`.

    `index` is the chunk's position in the whole load (0, 1, 2, ... across arrays); buffers alternate with
    it (buffer = index % NUM_STAGING_BUFFERS), so consecutive chunks always use different buffers.
    """

    index: int
    name: str
    offset: int
    nbytes: int
    buffer: int


def plan_chunks(sizes: Iterable[tuple[str, int]], chunk_bytes: int, *, first_index: int = 0) -> list[Chunk]:
    """Cut arrays of the given byte sizes into chunks of at most `chunk_bytes`, in order.

    sizes: (name, nbytes) pairs in load order. Returns chunks covering every byte of every array exactly
    once, array by array, offsets ascending; a zero-byte array yields no chunk. Pure function.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    chunks: list[Chunk] = []
    index = first_index
    for name, nbytes in sizes:
        for offset in range(0, int(nbytes), chunk_bytes):
            size = min(chunk_bytes, int(nbytes) - offset)
            chunks.append(Chunk(index, name, offset, size, index % NUM_STAGING_BUFFERS))
            index += 1
    return chunks


class Sink(Protocol):
    """Where chunks go. The loader calls, per array: `allocate`; per chunk: `wait_free(chunk)` (block until
    the previous copy from chunk.buffer completed), `staging(chunk)` (the host buffer the loader then writes
    the chunk's bytes into), `copy(chunk)` (enqueue the asynchronous copy); at the end `synchronize` and
    `result` per array."""

    chunk_bytes: int

    def allocate(self, name: str, nbytes: int) -> None: ...

    def wait_free(self, chunk: Chunk) -> None: ...

    def staging(self, chunk: Chunk) -> np.ndarray: ...

    def copy(self, chunk: Chunk) -> None: ...

    def synchronize(self) -> None: ...

    def result(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any: ...


@dataclass
class LoadStats:
    """What a load did: bytes and chunks moved, seconds spent preparing (host reads into staging),
    seconds blocked waiting for a staging buffer to come free, and total wall seconds."""

    bytes: int = 0
    chunks: int = 0
    arrays: int = 0
    prepare_s: float = 0.0
    wait_s: float = 0.0
    total_s: float = 0.0


def _byte_view(array: np.ndarray) -> np.ndarray:
    """uint8 [nbytes] view of a C-contiguous, little-endian copy-free view where possible (memmaps stay
    lazy: nothing is read until a chunk is sliced)."""
    arr = np.asarray(array)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and np.little_endian is False):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint8)


class DeviceLoader:
    """Streams arrays to a sink, one array at a time, as they are added (so a producer can add each
    table as soon as it exists). `finish()` waits for every copy and returns the device arrays by name."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.stats = LoadStats()
        self._next_index = 0
        self._meta: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self._started = time.perf_counter()
        self._finished = False

    def add(self, name: str, array: np.ndarray) -> None:
        """Queue `array` (any shape; memory-mapped is fine) under `name`; returns once its last chunk is
        enqueued (earlier chunks may still be copying)."""
        if self._finished:
            raise RuntimeError("DeviceLoader.add after finish()")
        if name in self._meta:
            raise ValueError(f"array {name!r} added twice")
        src = _byte_view(array)
        self._meta[name] = (np.asarray(array).dtype.newbyteorder("="), tuple(np.shape(array)))
        self.sink.allocate(name, int(src.nbytes))
        chunks = plan_chunks([(name, int(src.nbytes))], self.sink.chunk_bytes, first_index=self._next_index)
        for chunk in chunks:
            t0 = time.perf_counter()
            self.sink.wait_free(chunk)
            t1 = time.perf_counter()
            staging = self.sink.staging(chunk)
            # prepare: the read from the (memory-mapped) source happens here, on the host, while the
            # other buffer's copy runs on its stream.
            staging[: chunk.nbytes] = src[chunk.offset : chunk.offset + chunk.nbytes]
            t2 = time.perf_counter()
            self.sink.copy(chunk)
            self.stats.wait_s += t1 - t0
            self.stats.prepare_s += t2 - t1
        self._next_index += len(chunks)
        self.stats.chunks += len(chunks)
        self.stats.bytes += int(src.nbytes)
        self.stats.arrays += 1

    def add_all(self, arrays: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]) -> None:
        items = arrays.items() if isinstance(arrays, Mapping) else arrays
        for name, array in items:
            self.add(name, array)

    def finish(self) -> dict[str, Any]:
        """Wait for every copy; return {name: device array with the source's dtype and shape}."""
        self.sink.synchronize()
        self._finished = True
        self.stats.total_s = time.perf_counter() - self._started
        return {name: self.sink.result(name, dtype, shape) for name, (dtype, shape) in self._meta.items()}


# --------------------------------------------------------------------------------------------- sinks


class CudaSink:
    """Pinned host staging buffers, one CUDA stream and one event per buffer, destination tensors on
    `device`.

    Stream priority: CUDA's lowest priority is 0, which is also the default. `low_priority=True` creates
    the copy streams at 0, `low_priority=False` at the highest priority (torch clamps LOADING_PRIORITY to
    the device's range). CUDA applies priorities to kernels only: the copies themselves run on the copy
    engines and never occupy SMs, so what a live process protects is the serving work around them. Run
    serving on a higher-priority stream (e.g. `torch.cuda.Stream(priority=-1)`) and background loads with
    low_priority=True; the few kernels a load queues (widening tables, see device_tables.py) run on
    the loading thread's current stream, which in a fresh thread (HotSwap's) is the default stream, also at
    the lowest priority, so they yield to serving too.
    """

    def __init__(
        self,
        device: str | torch.device,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        low_priority: bool = False,
    ) -> None:
        import torch

        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaSink needs a cuda device, got {self.device}")
        self.chunk_bytes = int(chunk_bytes)
        priority = LOW_PRIORITY if low_priority else LOADING_PRIORITY
        self._blocking = bool(low_priority)  # a background load sleeps on its events instead of spinning
        self._streams = [
            torch.cuda.Stream(self.device, priority=priority) for _ in range(NUM_STAGING_BUFFERS)
        ]
        self._events: list[torch.cuda.Event | None] = [None] * NUM_STAGING_BUFFERS
        self._pinned = [
            torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=True)
            for _ in range(NUM_STAGING_BUFFERS)
        ]
        self._pinned_np = [t.numpy() for t in self._pinned]
        self._memory: dict[str, torch.Tensor] = {}

    def allocate(self, name: str, nbytes: int) -> None:
        import torch

        self._memory[name] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        # The allocation belongs to the current stream; the copy streams must not write before any work
        # that stream still has queued on memory the caching allocator may have just handed back.
        current = torch.cuda.current_stream(self.device)
        for stream in self._streams:
            stream.wait_stream(current)

    def _wait_buffer(self, buffer: int) -> None:
        event = self._events[buffer]
        if event is not None:
            event.synchronize()

    def wait_free(self, chunk: Chunk) -> None:
        self._wait_buffer(chunk.buffer)

    def staging(self, chunk: Chunk) -> np.ndarray:
        return self._pinned_np[chunk.buffer]

    def copy(self, chunk: Chunk) -> None:
        import torch

        stream = self._streams[chunk.buffer]
        dst = self._memory[chunk.name][chunk.offset : chunk.offset + chunk.nbytes]
        with torch.cuda.stream(stream):
            dst.copy_(self._pinned[chunk.buffer][: chunk.nbytes], non_blocking=True)
            event = torch.cuda.Event(blocking=self._blocking)
            event.record(stream)
        self._events[chunk.buffer] = event

    def synchronize(self) -> None:
        for buffer in range(NUM_STAGING_BUFFERS):
            self._wait_buffer(buffer)
        # Everything is complete, so tensors handed to the current stream are safe to use and to free.

    def result(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        import torch

        torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        return self._memory[name].view(torch_dtype).reshape(shape)


# --------------------------------------------------------------------------------------------- load markers


class LoadMarker(Protocol):
    """The end of a load's device work (copies and the widening kernels queued after them).

    `wait()` returns once that work has completed, so whatever reads the tables next - on any stream - sees
    them whole (HotSwap waits on it in its loader thread before a version can be swapped in)."""

    def wait(self) -> None: ...


class CudaLoadMarker:
    """A CUDA event recorded on the loading thread's current stream after the load queued its last kernel.

    blocking=True (background loads) makes `wait()` sleep in the driver instead of spinning a CPU core next
    to the serving process (D12); `wait_on(stream)` orders a stream after the load without a host wait."""

    def __init__(self, device: str | torch.device, *, blocking: bool) -> None:
        import torch

        self.device = torch.device(device)
        self.event = torch.cuda.Event(blocking=blocking)
        self.event.record(torch.cuda.current_stream(self.device))

    def wait(self) -> None:
        self.event.synchronize()

    def wait_on(self, stream: Any = None) -> None:
        import torch

        (stream if stream is not None else torch.cuda.current_stream(self.device)).wait_event(self.event)


def load_marker(
    device: str | torch.device, *, sink: Any = None, low_priority: bool = False
) -> LoadMarker | None:
    """The marker of the load just queued on this thread: the sink's own (`sink.load_marker()`, tests),
    a CudaLoadMarker on CUDA, None on the CPU (nothing there is asynchronous)."""
    import torch

    if sink is not None and hasattr(sink, "load_marker"):
        return sink.load_marker()
    if torch.device(device).type == "cuda":
        return CudaLoadMarker(device, blocking=low_priority)
    return None


# --------------------------------------------------------------------------------------------- API


def make_sink(
    device: str | torch.device, chunk_bytes: int = DEFAULT_CHUNK_BYTES, *, low_priority: bool = False
) -> Sink:
    """The sink for `device`: a CudaSink for cuda devices; ValueError for anything else (CPU needs no
    staging: see `load_arrays_to_device`)."""
    dev = str(device)
    if dev.startswith("cuda"):
        return CudaSink(dev, chunk_bytes, low_priority=low_priority)
    raise ValueError(f"no streaming sink for device {dev!r}")


def load_arrays_to_device(
    arrays: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
    device: str | torch.device,
    *,
    chunk_bytes: int | None = None,
    low_priority: bool = False,
    sink: Sink | None = None,
    stats: LoadStats | None = None,
) -> dict[str, torch.Tensor]:
    """Make every array resident on `device`; returns {name: tensor} with the source dtype and shape.

    cuda devices: double-buffered streaming (see module docstring) in chunks of `chunk_bytes` (None:
    auto_chunk_bytes of the total, never more than the largest array). cpu: a plain copy into torch-owned
    memory (memory-mapped pages are read once; nothing stays mapped). `sink` overrides the device's sink
    (tests pass zerogr_build.testing.FakeDeviceSink). `stats`, when given, is filled with the load's
    LoadStats.
    """
    import torch

    if sink is None and torch.device(device).type == "cpu":
        t0 = time.perf_counter()
        out: dict[str, torch.Tensor] = {}
        items = arrays.items() if isinstance(arrays, Mapping) else arrays
        for name, array in items:
            out[name] = torch.from_numpy(np.array(array, copy=True, order="C"))
            if stats is not None:
                stats.bytes += int(out[name].numel() * out[name].element_size())
                stats.arrays += 1
        if stats is not None:
            stats.total_s = time.perf_counter() - t0
        return out
    if sink is None:
        if not isinstance(arrays, Mapping):
            arrays = dict(arrays)
        sizes = [int(np.asarray(a).nbytes) for a in arrays.values()] or [1]
        if chunk_bytes is None:
            chunk_bytes = auto_chunk_bytes(sum(sizes))
        # Pinned memory is slow to allocate and scarce: never stage more than the largest array needs.
        chunk_bytes = max(1, min(chunk_bytes, max(sizes)))
        sink = make_sink(device, chunk_bytes, low_priority=low_priority)
    loader = DeviceLoader(sink)
    loader.add_all(arrays)
    result = loader.finish()
    if stats is not None:
        for key, value in vars(loader.stats).items():
            setattr(stats, key, value)
    return result
