"""Large output buffers whose pages exist before the first write.

A build fills arrays of hundreds of MB to GB (packed sort keys, item ids, hash partitions) batch by batch.
Where those pages come from decides how long the first write takes, and both numpy defaults lose on some
machine:

* np.zeros (calloc): the kernel hands out one zeroed 4 KiB page per page fault, so the first write takes
  one fault per 4 KiB: 1.7 s per 800 MB measured on a 2-core VM, 30x the copy itself.
* np.empty: numpy advises transparent huge pages for large arrays. That is fast when free memory is not
  fragmented (0.08 s per 800 MB) but stalls in compaction when it is (a full page cache after reading a
  big catalog): ~20x slower than calloc measured on an earlier machine.

populated_zeros maps anonymous memory with MAP_POPULATE instead: the kernel zeroes and maps every 4 KiB
page in one call (0.29 s per 800 MB, no huge pages needed), and the writes after it never fault.
"""

from __future__ import annotations

import mmap

import numpy as np

#: Below this size np.zeros is used: the page faults of a small array cost nothing worth a mapping.
POPULATE_MIN_BYTES = 64 << 20


def populated_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """np.zeros(shape, dtype), with every page already mapped when it is large (module docstring).

    The array owns its mapping: it is unmapped when the last view of the array is gone. Where the
    platform has no MAP_POPULATE, or the mapping fails, this is plain np.zeros.
    """
    dtype = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if nbytes < POPULATE_MIN_BYTES or populate is None:
        return np.zeros(dims, dtype=dtype)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    except OSError:
        return np.zeros(dims, dtype=dtype)
    return np.frombuffer(mapping, dtype=dtype, count=count).reshape(dims)
