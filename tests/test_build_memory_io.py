"""The build's large buffers are mapped in bulk as rows arrive (_memory.fresh_zeros + populate_rows) and every
bundle file starts its disk write as it goes (bundle.files.HashingFile + start_writeback), without
changing what is written."""

from __future__ import annotations

import hashlib
import mmap
import resource
import sys

import numpy as np
import pytest

import zerogr_build.base.memory as memory
from zerogr_build.bundle import files


def _owner(array: np.ndarray):
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


@pytest.mark.parametrize("shape, dtype", [(1000, np.uint64), ((300, 7), np.uint16), (0, np.int64)])
def test_fresh_zeros_is_a_writable_zeroed_mapping(monkeypatch, shape, dtype):
    monkeypatch.setattr(memory, "MAPPED_MIN_BYTES", 1)  # small arrays take the mapped path too
    array = memory.fresh_zeros(np.int64(shape) if isinstance(shape, int) else shape, dtype)
    assert array.shape == ((shape,) if isinstance(shape, int) else shape) and array.dtype == dtype
    assert array.flags.writeable and array.flags.c_contiguous and not array.any()
    if array.size:
        assert isinstance(_owner(array), mmap.mmap)
        array.reshape(-1)[-1] = 5
        assert array.sum() == 5


def test_fresh_zeros_small_arrays_are_plain_zeros():
    array = memory.fresh_zeros(16, np.int32)
    assert not isinstance(_owner(array), mmap.mmap) and not array.any()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populated_rows_are_written_without_page_faults(monkeypatch):
    """populate_rows maps a row range (of a view too) in one call: writing it afterwards faults nothing,
    while writing rows that were not populated faults about once per page."""
    monkeypatch.setattr(memory, "MAPPED_MIN_BYTES", 1)
    rows, width = 4096, 512  # 4 KiB per row: one page each
    array = memory.fresh_zeros((rows, width), np.uint64)
    view = array[1024:]
    memory.populate_rows(view, 0, 1024)  # rows 1024..2047 of the whole array
    before = _minor_faults()
    array[1024:2048] = 1
    populated = _minor_faults() - before
    before = _minor_faults()
    array[2048:3072] = 1
    unpopulated = _minor_faults() - before
    assert populated < 16 and unpopulated > 512, (populated, unpopulated)
    assert array[:1024].sum() == 0 and array[1024:3072].all()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_fresh_zeros_commit_no_memory_until_rows_arrive():
    """A footer claiming many rows costs address space, not memory: 512 MB mapped, RSS barely moves."""
    before = _rss_bytes()
    array = memory.fresh_zeros(64 << 20, np.uint64)
    assert _rss_bytes() - before < 32 << 20
    memory.populate_rows(array, 0, 1 << 20)  # 8 MB of rows arrive
    assert 8 << 20 <= _rss_bytes() - before < 48 << 20
    del array


def test_hashing_file_starts_writeback_over_every_stretch_it_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "WRITEBACK_BYTES", 100)
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(files, "start_writeback", lambda fd, offset, nbytes: calls.append((offset, nbytes)))
    pieces = [bytes([k]) * size for k, size in enumerate([30, 90, 5, 250, 1, 99, 100])]
    out = files.HashingFile(tmp_path / "f.bin")
    for piece in pieces:
        out.write(piece)
    out.close()
    data = b"".join(pieces)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert out.bytes == len(data) and out.hexdigest() == hashlib.sha256(data).hexdigest()
    # Contiguous stretches from byte 0, each at least WRITEBACK_BYTES, none past what was written.
    assert calls and calls[0][0] == 0 and all(n >= 100 for _, n in calls)
    assert all(a + n == b for (a, n), (b, _) in zip(calls, calls[1:], strict=False))
    assert sum(n for _, n in calls) > len(data) - 100


def test_start_writeback_on_a_real_file_is_harmless(tmp_path):
    path = tmp_path / "g.bin"
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
        f.flush()
        files.start_writeback(f.fileno(), 0, 4096)
    assert path.read_bytes() == b"x" * 4096
