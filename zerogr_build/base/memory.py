"""Large output buffers whose pages are mapped in bulk just before they are written.

A build fills arrays of hundreds of MB to GB (packed sort keys, item ids, hash partitions) batch by batch.
Where those pages come from decides how long the first write takes, and both numpy defaults lose on some
machine:

* np.zeros (calloc): the kernel hands out one zeroed 4 KiB page per page fault, so the first write takes
  one fault per 4 KiB: 1.7 s per 800 MB measured on a 2-core VM (up to 5.9 s under load), 30x the copy.
* np.empty: numpy advises transparent huge pages for large arrays. That is fast when free memory is not
  fragmented (0.08 s per 800 MB) but stalls in compaction when it is (a full page cache after reading a
  big catalog): ~20x slower than calloc measured on an earlier machine.

fresh_zeros maps anonymous memory instead (zero pages, nothing committed yet), and populate_rows asks the
kernel to map the pages of the rows a batch is about to write in one call (MADV_POPULATE_WRITE): 0.3 s
per 800 MB, steady, no huge pages needed, and the writes after it never fault. Memory is committed only
for rows that arrive, so a footer that claims a billion rows costs nothing until they are read.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import operator

import numpy as np

#: Below this size np.zeros is used: the page faults of a small array cost nothing worth a mapping.
MAPPED_MIN_BYTES = 64 << 20

#: madvise(MADV_POPULATE_WRITE), Linux >= 5.14 (Python's mmap module names it from 3.13 on).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)

PAGE = mmap.PAGESIZE


def fresh_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """np.zeros(shape, dtype), C order; a large one is an anonymous mapping whose pages populate_rows maps
    in bulk (module docstring). The array owns its mapping: it is unmapped when the last view is gone.
    Where anonymous mappings fail, this is plain np.zeros."""
    dtype = np.dtype(dtype)
    dims = (operator.index(shape),) if not isinstance(shape, tuple) else tuple(map(operator.index, shape))
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes < MAPPED_MIN_BYTES:
        return np.zeros(dims, dtype=dtype)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, AttributeError):
        return np.zeros(dims, dtype=dtype)
    return np.frombuffer(mapping, dtype=dtype, count=count).reshape(dims)


def _mapping_of(array: np.ndarray) -> tuple[mmap.mmap, int] | None:
    """(the fresh_zeros mapping under `array`, the byte offset of array[0] in it), or None."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    owner = root.base.obj if isinstance(root.base, memoryview) else root.base
    if not isinstance(owner, mmap.mmap):
        return None
    return owner, array.__array_interface__["data"][0] - root.__array_interface__["data"][0]


def is_mapped(array: np.ndarray) -> bool:
    """Whether `array` lies in a fresh_zeros mapping (so release_rows can hand its rows back)."""
    return _mapping_of(array) is not None


def populate_rows(array: np.ndarray, start: int, stop: int) -> None:
    """Map the pages of rows [start, stop) of `array` (C-contiguous, from fresh_zeros, or a view of one)
    in one kernel call before they are written. A no-op for arrays that are no such mapping, and where the
    kernel has no MADV_POPULATE_WRITE (the writes then fault page by page, as with np.zeros): never an
    error."""
    found = _mapping_of(array)
    if found is None or stop <= start:
        return
    mapping, offset = found
    row_bytes = array.itemsize * (int(np.prod(array.shape[1:], dtype=np.int64)) if array.ndim > 1 else 1)
    first = (offset + start * row_bytes) // PAGE * PAGE  # madvise wants a page-aligned start
    end = min(offset + stop * row_bytes, len(mapping))
    with contextlib.suppress(OSError, ValueError):  # a hint: without it the writes fault as usual
        mapping.madvise(MADV_POPULATE_WRITE, first, end - first)


def release_rows(array: np.ndarray, start: int, stop: int) -> bool:
    """Hand the pages that lie wholly inside rows [start, stop) of `array` (1-D, from fresh_zeros, or a
    view of one) back to the kernel (MADV_DONTNEED: they read as zeros if touched again), so rows that are
    no longer needed stop counting in the process's memory. False (nothing done) for an array that is no
    such mapping or where the kernel refuses."""
    found = _mapping_of(array)
    if found is None:
        return False
    mapping, offset = found
    first = -(-(offset + start * array.itemsize) // PAGE) * PAGE
    end = (offset + stop * array.itemsize) // PAGE * PAGE
    if end <= first:
        return True
    try:
        mapping.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (OSError, ValueError, AttributeError):
        return False
    return True


def populated_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """fresh_zeros with every page mapped now: for a buffer that is about to be written whole."""
    array = fresh_zeros(shape, dtype)
    populate_rows(array, 0, array.shape[0] if array.ndim else 0)
    return array


def trim_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc malloc_trim), so memory that a phase freed in
    small blocks (numba's per-thread scratch, numpy arrays below malloc's mapping threshold) stops counting
    before the next phase allocates. A no-op where there is no such call."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
