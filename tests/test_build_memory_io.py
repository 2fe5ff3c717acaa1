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


#: Peak RSS of the sort and table build of packed SIDs (index.build_index_packed, consume=True) above the
#: RSS of the process holding those SIDs, per item (L=4, V=2048, buffers mapped as at 100M items). The
#: previous code (second array of words, separate item order) measured 13.8 B/item here, this code 11.2.
SORT_PEAK_BYTES_PER_ITEM = 10.75

_PEAK_CHILD = """
import gc, sys
import zerogr_build.base.memory as memory
memory.MAPPED_MIN_BYTES = 1 << 20  # a small build's buffers are mappings too, as a large build's are
from zerogr_build.index.build import build_index_packed
from zerogr_build.index.pack import pack_sids
from zerogr_build.synthetic import generate_sids
def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024
sizes, items = [2048, 2048, 2048, 2048], int(sys.argv[1])
# kernels loaded (or compiled) first, on words large enough to be a mapping, as the measured build's are
build_index_packed(pack_sids(generate_sids(200_000, sizes, seed=1), sizes), consume=True)
packed = pack_sids(generate_sids(items, sizes, seed=0), sizes)
gc.collect()
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) restarts from the current RSS
index = build_index_packed(packed, consume=True)
print(status("VmHWM") - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
def test_sort_peak_memory_stays_under_a_per_item_bound():
    """Sorting 3M packed SIDs into step tables in a fresh process: the peak RSS above the packed input
    stays under a fixed bound per item. The words are scattered by first token into their sorted array
    while the consumed source rows are handed back, the item order overwrites the sorted words, and
    leaf starts are one bit per item: earlier code (a second array of words, a separate item order, or
    a byte per item for each position's first differing step: 11.2 B/item) breaks the bound."""
    import subprocess

    items = 3_000_000
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(items)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    per_item = int(proc.stdout.strip().splitlines()[-1]) / items
    assert per_item <= SORT_PEAK_BYTES_PER_ITEM, f"{per_item:.1f} B/item"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm (Linux, glibc)")
def test_trim_heap_hands_freed_small_blocks_back():
    """Blocks below malloc's mapping threshold, freed out of order (a few kept alive, so the heap's top
    never shrinks by itself), still count in RSS until trim_heap hands their pages back."""
    blocks = [np.ones(16_384, dtype=np.uint8) for _ in range(16_384)]  # 256 MiB of small heap blocks
    kept = blocks[::64]
    del blocks
    before = _rss_bytes()
    memory.trim_heap()
    assert before - _rss_bytes() >= 128 << 20
    del kept
