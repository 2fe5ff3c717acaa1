"""The driver's half of a partitioned build: from the partitions' counts, the global shape of the index
(index.partition's offsets, each step's format chosen as the local build chooses it), then every file of
the version written partition by partition, each partition's arrays fetched one at a time and shifted to
their global numbers. Files are the local build's byte for byte: .npy arrays with the header of the whole
array first, items.parquet in the same row groups (bundle.publish.ItemsWriter)."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..base.progress import Progress
from ..bundle.files import CHUNK_BYTES, HashingFile, _crash_point, npy_header
from ..bundle.format import ITEMS_NAME, LEAF_OFFSETS_NAME, step_file_name
from ..bundle.publish import ItemsWriter
from ..index.formats import FormatPolicy, choose_format, indptr_dtype, token_dtype
from ..index.partition import dense_rows, global_offsets, global_totals
from ..index.tables import leaf_map_dtype
from .tasks import PartitionSummary


@dataclass(frozen=True)
class StepShape:
    """One step table as the manifest describes it (index.tables.StepTable without its arrays)."""

    step: int
    format: str
    codebook_size: int
    rows: int
    nnz: int
    max_slots: int
    array_dtypes: tuple[tuple[str, np.dtype], ...]

    @property
    def valid_share(self) -> float:
        return self.nnz / (self.rows * self.codebook_size) if self.rows else 0.0

    @property
    def nbytes(self) -> int:
        if self.format == "dense":
            return self.rows * self.codebook_size * 4
        dtypes = dict(self.array_dtypes)
        return (self.rows + 1) * dtypes["indptr"].itemsize + self.nnz * dtypes["tokens"].itemsize

    def dtypes(self) -> dict[str, np.dtype]:
        return dict(self.array_dtypes)


@dataclass(frozen=True)
class IndexShape:
    """A whole index's shape (what bundle.publish.bundle_manifest reads from a SidIndex)."""

    codebook_sizes: tuple[int, ...]
    steps: tuple[StepShape, ...]
    num_leaves: int
    num_items: int

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def index_bytes(self) -> int:
        return sum(step.nbytes for step in self.steps)


@dataclass(frozen=True)
class Placement:
    """Where every partition goes: continues bool [P] (starts inside the previous partition's last first
    token), offsets int64 [P, L] (global_offsets), item_offsets int64 [P], totals int64 [L]."""

    continues: np.ndarray
    offsets: np.ndarray
    item_offsets: np.ndarray
    totals: np.ndarray


def place_partitions(summaries: Sequence[PartitionSummary | None], num_steps: int) -> Placement:
    """Placement of the partitions (None: an empty partition) in partition order."""
    parts = len(summaries)
    counts = np.zeros((parts, num_steps), dtype=np.int64)
    continues = np.zeros(parts, dtype=bool)
    rows = np.zeros(parts, dtype=np.int64)
    last_token = None
    for p, summary in enumerate(summaries):
        if summary is None:
            continue
        counts[p], rows[p] = summary.counts, summary.rows
        continues[p] = last_token is not None and summary.first_token == last_token
        last_token = summary.last_token
    return Placement(
        continues, global_offsets(counts, continues), np.cumsum(rows) - rows, global_totals(counts, continues)
    )


def index_shape(
    summaries: Sequence[PartitionSummary | None],
    placement: Placement,
    codebook_sizes: tuple[int, ...],
    formats: dict[int, str],
    policy: FormatPolicy,
) -> IndexShape:
    """The global IndexShape: rows and children per step from the totals, formats chosen by the local
    rule (choose_format), max_slots from the partitions' widest rows and their merged rows."""
    totals = placement.totals
    steps = []
    for t, size in enumerate(codebook_sizes):
        rows = 1 if t == 0 else int(totals[t - 1])
        nnz = int(totals[t])
        fmt = choose_format(rows, nnz, size, formats[t], policy, step=t)
        widest = nnz if t == 0 else _max_slots(summaries, placement.continues, t)
        if fmt == "dense":
            dtypes: tuple[tuple[str, np.dtype], ...] = (("next", np.dtype(np.int32)),)
            widest = size
        else:
            dtypes = (("indptr", indptr_dtype(nnz)), ("tokens", token_dtype(size)))
        steps.append(StepShape(t, fmt, int(size), rows, nnz, int(widest), dtypes))
    return IndexShape(
        codebook_sizes, tuple(steps), int(totals[-1]), int(placement.item_offsets[-1] + _last_rows(summaries))
    )


def _last_rows(summaries: Sequence[PartitionSummary | None]) -> int:
    last = summaries[-1]
    return last.rows if last is not None else 0


def _max_slots(summaries: Sequence[PartitionSummary | None], continues: np.ndarray, t: int) -> int:
    """Children of step t's widest row: a partition's own rows, or (t = 1) a first token's row merged
    across the partitions it spans."""
    widest, open_row = 0, 0
    for p, summary in enumerate(summaries):
        if summary is None:
            continue
        widest = max(widest, int(summary.max_slots[t]))
        if t != 1:
            continue
        merged = (
            open_row + int(summary.first_row_slots[t]) if continues[p] else int(summary.first_row_slots[t])
        )
        widest = max(widest, merged)
        single_row = summary.counts[0] == 1
        open_row = merged if single_row else int(summary.last_row_slots[t])
    return widest


#: Elements shifted to global numbers at a time (32 MiB of int64).
SHIFT_SLICE = 1 << 22


PAGE = 4096
MADV_DONTNEED = 4


def release_shared_pages(address: int, nbytes: int) -> None:
    """Drop this process's view of the whole pages of [address, address + nbytes) when they lie in a shared
    mapping (a result read zero-copy from the engine's object store, e.g. Ray's plasma memory): its RSS
    goes back down while the data stays in the store. Private memory is never touched (Linux; a no-op
    elsewhere)."""
    start, end = -(-address // PAGE) * PAGE, (address + nbytes) // PAGE * PAGE
    if end <= start or not sys.platform.startswith("linux"):
        return
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= start and end <= hi:
                if perms[3] == "s":
                    ctypes.CDLL(None).madvise(
                        ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED
                    )
                return


def release_result(value: Any) -> None:
    """release_shared_pages for every buffer of a fetched result (numpy array or pyarrow Array) the
    driver is done with."""
    if isinstance(value, np.ndarray):
        release_shared_pages(value.__array_interface__["data"][0], value.nbytes)
    elif isinstance(value, pa.Array):
        for buffer in value.buffers():
            if buffer is not None:
                release_shared_pages(buffer.address, buffer.size)


class NpyStream:
    """A .npy file written in pieces: the header of the whole array first (its shape known from the
    counts), then the rows as they come, hashed on the way; close() checks every element arrived."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.dtype, self.shape = np.dtype(dtype).newbyteorder("<"), shape
        self.file = HashingFile(path)
        self.file.write(npy_header(self.dtype, shape))
        self.elements = 0

    def append(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=self.dtype)
        self.elements += data.size
        view = memoryview(data.reshape(-1)).cast("B") if data.size else memoryview(b"")
        for start in range(0, view.nbytes, CHUNK_BYTES):
            self.file.write(view[start : start + CHUNK_BYTES])

    def append_shifted(self, array: np.ndarray, offset: int) -> None:
        """Append `array` + offset, converted a slice at a time (no whole int64 copy of a partition's
        offsets)."""
        for start in range(0, array.shape[0], SHIFT_SLICE):
            self.append(array[start : start + SHIFT_SLICE].astype(np.int64) + offset)

    def close(self) -> dict[str, Any]:
        self.file.close()
        expected = int(np.prod(self.shape))
        if self.elements != expected:
            raise RuntimeError(
                f"{self.file.path.name}: {self.elements} elements written, {expected} expected"
            )
        return {"bytes": self.file.bytes, "sha256": self.file.hexdigest()}


#: The index of each array in build_partition's results, for a catalog of L steps.
def tokens_at(t: int) -> int:
    return 1 + t


def starts_at(t: int, num_steps: int) -> int:
    return num_steps + t


def leaf_offsets_at(num_steps: int) -> int:
    return 2 * num_steps


def items_at(num_steps: int) -> int:
    return 2 * num_steps + 1


def write_version_files(
    tmp: Path,
    shape: IndexShape,
    placement: Placement,
    summaries: Sequence[PartitionSummary | None],
    fetch: Callable[[int, int], Any],
    item_type: pa.DataType,
    progress: Progress,
) -> dict[str, dict]:
    """Write every data file of the version into `tmp`, partition by partition.

    fetch(p, k): result k of partition p's build (tasks.build_partition's list), fetched when needed and
    dropped after use, so the driver holds one array of one partition at a time (plus step 0 and dense
    rows being merged). Returns {name: {bytes, sha256}}."""
    num_steps = shape.num_steps
    streams: dict[str, NpyStream] = {}
    for table in shape.steps:
        for role, dtype in table.dtypes().items():
            dims = (
                (table.rows, table.codebook_size)
                if role == "next"
                else (table.rows + 1 if role == "indptr" else table.nnz,)
            )
            streams[step_file_name(table.step, role)] = NpyStream(
                tmp / step_file_name(table.step, role), dtype, dims
            )
    leaf_dtype = leaf_map_dtype(shape.num_leaves, shape.num_items)
    if leaf_dtype is not None:
        streams[LEAF_OFFSETS_NAME] = NpyStream(
            tmp / LEAF_OFFSETS_NAME, np.dtype(leaf_dtype), (shape.num_leaves + 1,)
        )
    items_file = HashingFile(tmp / ITEMS_NAME)
    pending: dict[int, np.ndarray] = {}  # dense step t's last row, open until the next partition shows
    root = (
        np.full(shape.steps[0].codebook_size, -1, dtype=np.int32)
        if shape.steps[0].format == "dense"
        else None
    )
    progress.stage("write", total=shape.num_items)
    try:
        with ItemsWriter(items_file, item_type) as items:
            for p, summary in enumerate(summaries):
                if summary is None:
                    continue
                cont = bool(placement.continues[p])
                offsets = placement.offsets[p]
                for table in shape.steps:
                    t = table.step
                    tokens = fetch(p, tokens_at(t))
                    if t == 0:
                        own = tokens[1:] if cont else tokens
                        if root is not None:
                            root[own.astype(np.int64)] = np.arange(offsets[0], offsets[0] + own.shape[0])
                        else:
                            streams[step_file_name(0, "tokens")].append(own)
                        continue
                    starts = fetch(p, starts_at(t, num_steps))
                    merged = cont and t == 1
                    if table.format == "dense":
                        _append_dense(
                            streams[step_file_name(t, "next")],
                            pending,
                            t,
                            dense_rows(starts, tokens, int(offsets[t]), table.codebook_size),
                            merged,
                        )
                    else:
                        own_starts = starts[1 if merged else 0 : -1]
                        streams[step_file_name(t, "indptr")].append_shifted(own_starts, int(offsets[t]))
                        streams[step_file_name(t, "tokens")].append(tokens)
                    release_result(tokens)
                    release_result(starts)
                    del tokens, starts
                if leaf_dtype is not None:
                    leaf = fetch(p, leaf_offsets_at(num_steps))
                    streams[LEAF_OFFSETS_NAME].append_shifted(leaf[:-1], int(placement.item_offsets[p]))
                    release_result(leaf)
                    del leaf
                part_items = fetch(p, items_at(num_steps))
                items.append(part_items)  # keeps no view of part_items (ItemsWriter copies the tail)
                progress.advance(len(part_items))
                release_result(part_items)
                del part_items
                _crash_point("partition_written")
        items_file.close()
        first = shape.steps[0]
        if root is not None:
            streams[step_file_name(0, "next")].append(root[None, :])
        else:
            streams[step_file_name(0, "indptr")].append(np.array([0, first.nnz]))
        for table in shape.steps[1:]:
            if table.format == "dense":
                if table.step in pending:
                    streams[step_file_name(table.step, "next")].append(pending.pop(table.step)[None, :])
            else:
                streams[step_file_name(table.step, "indptr")].append(np.array([table.nnz]))
        if leaf_dtype is not None:
            streams[LEAF_OFFSETS_NAME].append(np.array([shape.num_items]))
        files = {name: stream.close() for name, stream in streams.items()}
    finally:
        for stream in streams.values():
            stream.file.close()
        items_file.close()
    files[ITEMS_NAME] = {"bytes": items_file.bytes, "sha256": items_file.hexdigest()}
    return dict(sorted(files.items()))


def _append_dense(
    stream: NpyStream, pending: dict[int, np.ndarray], t: int, block: np.ndarray, merged: bool
) -> None:
    """Append a partition's dense rows of step t, holding its last row back: with `merged`, the block's
    first row is the continuation of that held row (a first token spanning partitions) and joins it."""
    if merged and t in pending:
        row = block[0]
        pending[t][row >= 0] = row[row >= 0]
        block = block[1:]
    if block.shape[0] == 0:
        return
    if t in pending:
        stream.append(pending.pop(t)[None, :])
    stream.append(block[:-1])
    pending[t] = block[-1].copy()
