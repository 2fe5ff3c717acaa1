"""Double-buffered table streaming: chunk planning, ordering and buffer reuse (CPU, fake device sink), the
step tables' one path to the device (runtime.device_tables), and bytes on a real CUDA device (marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.index import build_index
from zerogr_build.runtime.device_tables import (
    DeviceStep,
    index_to_device,
    step_arrays,
    step_tables_on_device,
    widen_on_device,
)
from zerogr_build.runtime.slots import default_slot_cap
from zerogr_build.runtime.stream import (
    NUM_STAGING_BUFFERS,
    Chunk,
    DeviceLoader,
    LoadStats,
    load_arrays_to_device,
    plan_chunks,
)
from zerogr_build.testing import FakeDeviceSink, StagingReuseError

DTYPES = [np.uint8, np.uint16, np.int32, np.int64, np.float32]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=0, max_size=6),
    chunk_bytes=st.integers(1, 97),
    first=st.integers(0, 5),
)
def test_plan_chunks_covers_every_byte_once_in_order(sizes, chunk_bytes, first):
    named = [(f"a{i}", n) for i, n in enumerate(sizes)]
    chunks = plan_chunks(named, chunk_bytes, first_index=first)
    assert [c.index for c in chunks] == list(range(first, first + len(chunks)))
    for c in chunks:
        assert 0 < c.nbytes <= chunk_bytes
        assert c.buffer == c.index % NUM_STAGING_BUFFERS
    # consecutive chunks never share a staging buffer
    assert all(a.buffer != b.buffer for a, b in zip(chunks, chunks[1:], strict=False))
    for name, n in named:
        mine = [c for c in chunks if c.name == name]
        covered = np.zeros(n, dtype=np.int64)
        for c in mine:
            covered[c.offset : c.offset + c.nbytes] += 1
        assert (covered == 1).all()
        assert [c.offset for c in mine] == sorted(c.offset for c in mine)
    # arrays are streamed one after another, in the given order
    order = [c.name for c in chunks]
    assert order == sorted(order, key=lambda s: int(s[1:]))


def test_plan_chunks_rejects_bad_chunk_size():
    with pytest.raises(ValueError):
        plan_chunks([("a", 10)], 0)


def _random_arrays(rng: np.random.Generator, count: int) -> dict[str, np.ndarray]:
    arrays = {}
    for i in range(count):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(x) for x in rng.integers(0, 40, size=int(rng.integers(1, 3))))
        info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
        if info is not None:
            arrays[f"arr{i}"] = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        else:
            arrays[f"arr{i}"] = rng.standard_normal(shape).astype(dtype)
    return arrays


def _check_schedule(sink: FakeDeviceSink) -> None:
    """Every prepare into buffer b comes after the copy last queued from b completed, and the loader
    overlaps: chunk k+1 is prepared before chunk k's copy is waited for."""
    done: set[int] = set()
    last_copy_on: dict[int, int] = {}
    queued: set[int] = set()
    for event, index, buffer in sink.schedule:
        if event == "prepare":
            previous = last_copy_on.get(buffer)
            assert previous is None or previous in done, f"chunk {index} staged over running copy {previous}"
        elif event == "copy":
            last_copy_on[buffer] = index
            queued.add(index)
        elif event == "done":
            assert index in queued
            done.add(index)
    assert done == queued
    position = {(e, i): p for p, (e, i, _) in enumerate(sink.schedule)}
    for k in range(len(queued) - 1):
        assert position[("prepare", k + 1)] < position[("done", k)], "no overlap between chunk k and k+1"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 6), chunk_bytes=st.integers(1, 200))
def test_fake_sink_load_is_byte_exact_and_ordered(seed, count, chunk_bytes):
    arrays = _random_arrays(np.random.default_rng(seed), count)
    sink = FakeDeviceSink(chunk_bytes)
    stats = LoadStats()
    out = load_arrays_to_device(arrays, "fake", sink=sink, stats=stats)
    assert list(out) == list(arrays)
    for name, src in arrays.items():
        got = out[name].numpy()
        assert got.dtype == src.dtype and got.shape == src.shape
        assert got.tobytes() == src.tobytes()
    expected = plan_chunks([(n, a.nbytes) for n, a in arrays.items()], chunk_bytes)
    assert sink.writes == [(c.name, c.offset, c.nbytes, c.buffer) for c in expected]
    assert stats.chunks == len(expected) and stats.bytes == sum(a.nbytes for a in arrays.values())
    _check_schedule(sink)


def test_memory_mapped_arrays_stream_from_disk(tmp_path):
    rng = np.random.default_rng(3)
    src = rng.integers(0, 2**31 - 1, size=(123, 7), dtype=np.int32)
    np.save(tmp_path / "a.npy", src)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    sink = FakeDeviceSink(100)
    out = load_arrays_to_device({"a": mapped}, "fake", sink=sink)
    assert np.array_equal(out["a"].numpy(), src)
    assert len(sink.writes) == -(-src.nbytes // 100)


def test_non_contiguous_and_big_endian_sources():
    base = np.arange(60, dtype=np.int64).reshape(6, 10)
    arrays = {"strided": base[:, ::3], "be": np.arange(10, dtype=">i4")}
    out = load_arrays_to_device(arrays, "fake", sink=FakeDeviceSink(16))
    assert np.array_equal(out["strided"].numpy(), base[:, ::3])
    assert np.array_equal(out["be"].numpy(), np.arange(10, dtype=np.int32))


def test_incremental_adds_continue_buffer_alternation():
    sink = FakeDeviceSink(10)
    loader = DeviceLoader(sink)
    loader.add("a", np.arange(5, dtype=np.int32))  # 20 bytes -> chunks 0, 1
    loader.add("b", np.arange(3, dtype=np.uint8))  # 3 bytes -> chunk 2
    with pytest.raises(ValueError):
        loader.add("a", np.zeros(1))
    out = loader.finish()
    assert [w[3] for w in sink.writes] == [0, 1, 0]
    assert out["b"].tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError):
        loader.add("c", np.zeros(1))


def test_cpu_device_copies_into_torch_memory(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.uint16))
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    out = load_arrays_to_device({"a": mapped}, "cpu")
    assert out["a"].dtype == torch.uint16 and out["a"].to(torch.int64).tolist() == list(range(10))


# --- the test double itself (zerogr_build.testing.FakeDeviceSink) -------------------------------------
# Not production code: the loader tests above can only catch a loader that reuses a staging buffer too
# early because the double refuses it and models the late read of a real asynchronous copy. These two
# tests pin those two properties of the double.


def test_fake_sink_refuses_buffer_reuse_before_copy_completes():
    sink = FakeDeviceSink(8)
    sink.allocate("a", 32)
    first, third = Chunk(0, "a", 0, 8, 0), Chunk(2, "a", 16, 8, 0)
    sink.staging(first)[:8] = 1
    sink.copy(first)
    with pytest.raises(StagingReuseError):
        sink.staging(third)
    with pytest.raises(StagingReuseError):
        sink.copy(third)
    sink.wait_free(third)
    assert sink.memory["a"][:8].tolist() == [1] * 8 and sink.memory["a"][8:].tolist() == [0xA5] * 24
    sink.staging(third)  # free now


def test_fake_sink_copies_read_staging_late():
    """A copy reads its staging buffer only when it completes, so overwriting the buffer early (what the
    loader must never do) would corrupt the destination: the fake sink models the hazard, not just logs it."""
    sink = FakeDeviceSink(4)
    sink.allocate("a", 4)
    chunk = Chunk(0, "a", 0, 4, 0)
    buf = sink.staging(chunk)
    buf[:4] = [1, 2, 3, 4]
    sink.copy(chunk)
    assert sink.memory["a"].tolist() == [0xA5] * 4  # nothing copied yet: still poisoned
    buf[:4] = [9, 9, 9, 9]  # bypasses the loader: a hazard a real async copy could also see
    sink.synchronize()
    assert sink.memory["a"].tolist() == [9, 9, 9, 9]


# --- the step tables on a device (runtime.device_tables) ---------------------------------------------


def _small_index():
    rng = np.random.default_rng(11)
    sids = rng.integers(0, 12, size=(300, 3))
    return build_index(sids, (12, 12, 12), step_formats="0=dense,1=sparse,2=sparse")


def _check_device_steps(index, steps, caps) -> None:
    """Every DeviceStep holds its table's metadata and the table widened (indptr int64, tokens/next int32)."""
    assert len(steps) == index.num_steps
    for table, step, cap in zip(index.steps, steps, caps, strict=True):
        assert isinstance(step, DeviceStep) and step.meta() == table.meta() and step.format == table.format
        assert step.cap == cap
        for role, array in table.arrays().items():
            tensor = getattr(step, role)
            assert tensor.dtype == (torch.int64 if role == "indptr" else torch.int32)
            assert np.array_equal(tensor.numpy(), np.asarray(array).astype(np.int64))


@pytest.mark.parametrize("streamed", [False, True])
def test_index_to_device_gives_the_decoder_its_tables(streamed):
    """The host path (CPU) and the streamed path (what CUDA runs, here through the fake sink) give the same
    DeviceSteps: meta shared with the table, widened arrays, slot caps as asked (clamped to max_slots)."""
    index = _small_index()
    sink, stats = (FakeDeviceSink(64), LoadStats()) if streamed else (None, None)
    steps = index_to_device(index, "cpu", sink=sink, stats=stats)
    _check_device_steps(index, steps, [12] + [default_slot_cap(t) for t in index.steps[1:]])
    caps = index_to_device(index, "cpu", {1: 1, 2: 10_000}, sink=FakeDeviceSink(64) if streamed else None)
    _check_device_steps(index, caps, [12, 1, index.steps[2].max_slots])
    if streamed:
        # Only the step tables travel, in the bundle's narrow dtypes (leaf offsets stay on the host).
        assert stats.bytes == index.index_bytes and stats.arrays == sum(len(t.arrays()) for t in index.steps)
        assert {name for name, *_ in sink.writes} == {name for name, _ in step_arrays(index)}
    with pytest.raises(InputError, match="slot_caps"):
        index_to_device(index, "cpu", [4, 4])


def test_cuda_sink_is_refused_for_non_cuda_devices():
    from zerogr_build.runtime.stream import make_sink

    with pytest.raises(ValueError):
        make_sink("cpu")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("low_priority", [False, True])
def test_cuda_bytes_on_device_equal_the_source(low_priority):
    arrays = _random_arrays(np.random.default_rng(5), 6)
    arrays["big"] = np.random.default_rng(6).integers(0, 2**31 - 1, size=300_000, dtype=np.int32)
    out = load_arrays_to_device(arrays, "cuda:0", chunk_bytes=1 << 16, low_priority=low_priority)
    for name, src in arrays.items():
        assert out[name].device.type == "cuda"
        assert out[name].cpu().numpy().tobytes() == src.tobytes()


@pytest.mark.gpu
@needs_cuda
def test_cuda_step_tables_on_device_equal_the_tables():
    index = _small_index()
    stats = LoadStats()
    tables = step_tables_on_device(index, "cuda:0", chunk_bytes=256, stats=stats)
    assert stats.bytes == index.index_bytes and stats.chunks > 2 * len(tables)  # really chunked
    for table, resident in zip(index.steps, tables, strict=True):
        for role, array in table.arrays().items():
            assert resident[role].device.type == "cuda"
            assert np.array_equal(resident[role].cpu().numpy(), np.asarray(array).astype(np.int64))


def test_step_tables_widened_like_the_decoder_expects():
    rng = np.random.default_rng(4)
    sizes = (4, 65536)
    sids = np.stack([rng.integers(0, 4, 500), rng.integers(30000, 65536, 500)], axis=1)
    index = build_index(sids, sizes, step_formats="0=dense,1=sparse")
    assert index.steps[1].tokens.dtype == np.uint16 and index.steps[1].tokens.max() > 32767
    tables = step_tables_on_device(index, "cpu")
    assert tables[0]["next"].dtype == torch.int32
    assert tables[1]["indptr"].dtype == torch.int64 and tables[1]["tokens"].dtype == torch.int32
    assert np.array_equal(tables[1]["tokens"].numpy(), index.steps[1].tokens.astype(np.int64))
    big = torch.from_numpy(np.array([0, 1, 32767, 32768, 65535], dtype=np.uint16))
    assert widen_on_device("tokens", big).tolist() == [0, 1, 32767, 32768, 65535]


def test_decoder_tables_stream_only_the_step_tables():
    """The Decoder keeps leaf offsets on the host: loading its tables moves only the step tables' bytes."""
    index = _small_index()
    sink = FakeDeviceSink(64)
    tables = step_tables_on_device(index, "fake", sink=sink)
    assert {name for name, *_ in sink.writes} == {
        f"step{t.step}.{role}" for t in index.steps for role in t.arrays()
    }
    assert sum(nbytes for _, _, nbytes, _ in sink.writes) == index.index_bytes
    for table, resident in zip(index.steps, tables, strict=True):
        assert set(resident) == set(table.arrays())
        for role, array in table.arrays().items():
            assert np.array_equal(resident[role].numpy(), array)


def test_auto_chunk_size_bounds():
    from zerogr_build.runtime.stream import DEFAULT_CHUNK_BYTES, MIN_AUTO_CHUNK_BYTES, auto_chunk_bytes

    assert auto_chunk_bytes(10) == MIN_AUTO_CHUNK_BYTES
    assert auto_chunk_bytes(300 << 20) == -(-(300 << 20) // 16)
    assert auto_chunk_bytes(10 << 30) == DEFAULT_CHUNK_BYTES


def test_bundle_tables_stream_the_bundle_files_bytes(tmp_path):
    """A bundle's memory-mapped step tables reach the device byte for byte as their .npy payloads (narrow
    dtypes on the wire, widened only once resident)."""
    import pyarrow as pa

    from zerogr_build.bundle import open_bundle, publish_bundle

    index = _small_index()
    path = publish_bundle(index, pa.array(np.arange(index.num_items)), tmp_path).path
    bundle = open_bundle(path)
    sink = FakeDeviceSink(64)
    steps = index_to_device(bundle.index, "cpu", sink=sink)
    for name, _ in step_arrays(bundle.index):
        assert sink.memory[name].tobytes() == np.load(path / f"{name}.npy").tobytes()
    _check_device_steps(bundle.index, steps, [12] + [default_slot_cap(t) for t in index.steps[1:]])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("low_priority", [False, True])
def test_cuda_bundle_and_decoder_tables_equal_the_bundle(tmp_path, low_priority):
    import pyarrow as pa

    from zerogr_build.bundle import open_bundle, publish_bundle
    from zerogr_build.runtime.decoder import Decoder

    rng = np.random.default_rng(8)
    sizes = (4, 65536)
    sids = np.stack([rng.integers(0, 4, 3000), rng.integers(0, 65536, 3000)], axis=1)
    index = build_index(sids, sizes, step_formats="0=dense,1=sparse")
    path = publish_bundle(index, pa.array(np.arange(3000)), tmp_path).path
    bundle = open_bundle(path)
    stats = LoadStats()
    steps = index_to_device(bundle.index, "cuda:0", low_priority=low_priority, stats=stats)
    step_files = [name for step in bundle.manifest["steps"] for name in step["files"].values()]
    assert stats.bytes == sum(np.load(path / name).nbytes for name in step_files)
    assert all(t.device.type == "cuda" for s in steps for t in (s.indptr, s.tokens, s.next) if t is not None)
    weights = [torch.randn(v, 8) for v in sizes]
    dec = Decoder(bundle, weights, device="cuda:0", low_priority=low_priority)
    assert torch.equal(dec.steps[0].next.cpu(), torch.from_numpy(np.asarray(index.steps[0].next)))
    assert torch.equal(dec.steps[1].indptr.cpu(), torch.from_numpy(index.steps[1].indptr.astype(np.int64)))
    assert torch.equal(dec.steps[1].tokens.cpu(), torch.from_numpy(index.steps[1].tokens.astype(np.int32)))
