"""The build's large buffers come pre-faulted (_memory.populated_zeros) and every bundle file starts its disk
write as it goes (bundle.files.HashingFile + start_writeback), without changing what is written."""

from __future__ import annotations

import hashlib
import mmap

import numpy as np
import pytest

import zerogr_build._memory as memory
from zerogr_build.bundle import files


def _owner(array: np.ndarray):
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


@pytest.mark.parametrize("shape, dtype", [(1000, np.uint64), ((300, 7), np.uint16), (0, np.int64)])
def test_populated_zeros_is_a_writable_zeroed_mapping(monkeypatch, shape, dtype):
    monkeypatch.setattr(memory, "POPULATE_MIN_BYTES", 1)  # small arrays take the mapped path too
    array = memory.populated_zeros(shape, dtype)
    assert array.shape == ((shape,) if isinstance(shape, int) else shape) and array.dtype == dtype
    assert array.flags.writeable and array.flags.c_contiguous and not array.any()
    if array.size:
        assert isinstance(_owner(array), mmap.mmap)
        array.reshape(-1)[-1] = 5
        assert array.sum() == 5


def test_populated_zeros_small_arrays_are_plain_zeros():
    array = memory.populated_zeros(16, np.int32)
    assert not isinstance(_owner(array), mmap.mmap) and not array.any()


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
