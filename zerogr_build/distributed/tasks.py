"""The task bodies of a partitioned build: plain functions on arrays and catalog files, with no engine in
them, so any engine that runs Python functions and moves their results between machines (Ray here; Spark's
mapInArrow or Dask would do) can run the build. `distributed.driver` says in which order.

    read_block      map: one row group -> validated tokens, item ids, first-token counts (BatchReader)
    second_counts   for first tokens heavier than a partition: item counts per second token
    split_block     route a block's rows to their partitions (packed with partition-local rows) and its
                    item ids to duplicate-check buckets
    build_partition one partition's sorted layout (the local builder on its rows) and its items in leaf
                    order, as separate arrays the driver fetches one at a time
    find_repeat     the lowest row of one bucket whose item id occurred at a lower row
    file_digest     one catalog file's sha256 (catalog.files; the fingerprint is a digest of these)
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS
from ..catalog.ids import first_duplicate_row, first_row_with_id
from ..catalog.reader import BatchReader, iter_batches
from ..catalog.row_groups import RowGroup
from ..catalog.schema import SidLayout, parquet_file
from ..catalog.storage import Stamp, Store, changed_error
from ..index.pack import first_token_dtype
from ..index.partition import (
    pack_piece,
    partition_layout_packed,
    partition_layout_tokens,
    partition_of,
)

#: Test-only: the path of a marker file; the first partition build that finds it absent creates it and
#: kills its own worker process (SIGKILL), so the tests can check that the engine retries the task.
KILL_WORKER_ENV = "ZEROGR_TEST_KILL_PARTITION_WORKER"


@dataclass(frozen=True)
class ReadSpec:
    """What every map task needs to read its row group the way read_catalog reads it."""

    store: Store
    layout: SidLayout
    item_column: str
    item_type: pa.DataType
    codebook_sizes: tuple[int, ...] | None


@dataclass(frozen=True)
class BlockSummary:
    """A map task's small result: rows, the first tokens present (int64 [U], ascending) with their counts,
    the max token per step (int64 [L]), the SID length it read (None: no rows yet), the bytes of its item
    ids, and the one-line InputError of its lowest bad row (None when valid)."""

    rows: int
    first_tokens: np.ndarray
    first_counts: np.ndarray
    step_max: np.ndarray | None
    num_steps: int | None
    id_bytes: int
    error: str | None = None


def read_block(
    spec: ReadSpec, group: RowGroup, stamp: Stamp, num_steps: int | None
) -> tuple[BlockSummary, tuple[np.ndarray, pa.Array] | None]:
    """Read, validate and count one row group (catalog rows [group.row, group.row + group.rows)).

    num_steps: the SID length fixed by the catalog's first rows (None for the first row group read).
    Returns (summary, (tokens uint [n, L], item ids [n]) or None when the group is bad: summary.error)."""
    reader = BatchReader(
        [group.name],
        spec.layout,
        spec.item_column,
        spec.item_type,
        group.rows,
        spec.codebook_sizes,
        NULL_PROGRESS,
    )
    if num_steps is not None:
        reader.num_steps = num_steps
    columns = [
        spec.item_column,
        *([spec.layout.list_column] if spec.layout.list_column else spec.layout.columns),
    ]
    try:
        where = f"{group.name}: footer says {group.rows} rows in row group {group.group}"
        opened = spec.store.open(group.name)
        with opened:
            if opened.stamp != stamp:
                raise changed_error(group.name)
            pf = parquet_file(opened)
            read = 0
            for batch in iter_batches(group.name, pf, columns, groups=[group.group], use_threads=False):
                if read + batch.num_rows > group.rows:
                    raise InputError(f"{where}, it holds more")
                reader.add_batch(group.name, batch, group.file_row + read, read)
                read += batch.num_rows
            if read != group.rows:
                raise InputError(f"{where}, {read} were read")
            opened.check()
    except InputError as exc:
        empty = np.zeros(0, np.int64)
        return BlockSummary(group.rows, empty, empty, None, reader.num_steps, 0, str(exc)), None
    ids = reader.item_array()
    width = reader.num_steps or 0
    tokens = reader.sids if reader.sids is not None else np.zeros((0, width), dtype=np.uint8)
    first_tokens, first_counts = (
        np.unique(tokens[:, 0], return_counts=True) if width else (np.zeros(0), np.zeros(0))
    )
    summary = BlockSummary(
        rows=group.rows,
        first_tokens=first_tokens.astype(np.int64),
        first_counts=first_counts.astype(np.int64),
        step_max=reader.step_max,
        num_steps=reader.num_steps,
        id_bytes=_string_data_bytes(ids),
    )
    return summary, (tokens, ids)


def _string_data_bytes(ids: pa.Array) -> int:
    """Bytes of string data in ids (0 for integer ids): what a 32-bit-offset string array must hold."""
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)) or len(ids) == 0:
        return 0
    return int(pc.sum(pc.binary_length(ids)).as_py() or 0)


def second_counts(block: tuple[np.ndarray, pa.Array], heavy: np.ndarray, v1: int) -> np.ndarray:
    """int64 [k, V1]: items per second token of each heavy first token (heavy int64 [k], ascending)."""
    tokens = block[0]
    out = np.zeros((heavy.shape[0], v1), dtype=np.int64)
    if tokens.shape[0] == 0 or tokens.shape[1] < 2:
        return out
    first = tokens[:, 0].astype(np.int64)
    at = np.searchsorted(heavy, first)
    hit = (at < heavy.shape[0]) & (heavy[np.minimum(at, heavy.shape[0] - 1)] == first)
    np.add.at(out, (at[hit], tokens[hit, 1].astype(np.int64)), 1)
    return out


def split_block(
    block: tuple[np.ndarray, pa.Array],
    row0: int,
    bounds: np.ndarray,
    codebook_sizes: tuple[int, ...],
    shifts: np.ndarray | None,
    buckets: int,
) -> list[Any]:
    """One block's rows routed to the P partitions, then its item ids to `buckets` duplicate-check buckets.

    row0: the catalog row of the block's first row. shifts: int64 [P, L] word shifts per partition
    (index.partition.partition_shifts), or None to ship tokens (keys too wide for one word).
    Returns P + buckets pieces: per partition (first, words, ids) or (tokens, None, ids), rows in catalog
    order; per bucket (ids, catalog rows int64)."""
    tokens, ids = block
    parts = bounds.shape[0] - 1
    owner = partition_of(tokens, bounds, codebook_sizes) if tokens.shape[0] else np.zeros(0, np.int64)
    order = np.argsort(owner, kind="stable")
    ends = np.cumsum(np.bincount(owner, minlength=parts))
    pieces: list[Any] = []
    first_dtype = first_token_dtype(codebook_sizes[0])
    for p in range(parts):
        rows = order[(ends[p - 1] if p else 0) : ends[p]]
        part_tokens = tokens[rows]
        part_ids = ids.take(pa.array(rows))
        if shifts is None:
            pieces.append((part_tokens, None, part_ids))
        else:
            packed = pack_piece(part_tokens, shifts[p], first_dtype)
            pieces.append((packed.first, packed.words, part_ids))
    bucket = id_buckets(ids, buckets)
    order = np.argsort(bucket, kind="stable")
    ends = np.cumsum(np.bincount(bucket, minlength=buckets))
    for d in range(buckets):
        rows = order[(ends[d - 1] if d else 0) : ends[d]]
        pieces.append((ids.take(pa.array(rows)), rows.astype(np.int64) + row0))
    return pieces


def id_buckets(ids: pa.Array, buckets: int) -> np.ndarray:
    """int64 [n]: a bucket 0..buckets-1 per item id, equal ids in equal buckets on every machine."""
    if buckets == 1 or len(ids) == 0:
        return np.zeros(len(ids), dtype=np.int64)
    if pa.types.is_integer(ids.type):
        values = ids.to_numpy(zero_copy_only=False).astype(np.uint64)
        mixed = values * np.uint64(0x9E3779B97F4A7C15)
        return ((mixed >> np.uint64(33)) % np.uint64(buckets)).astype(np.int64)
    from ..catalog._kernels import hash_strings
    from ..catalog.ids import _string_buffers

    text = (
        ids
        if pa.types.is_large_string(ids.type) or pa.types.is_string(ids.type)
        else ids.cast(pa.large_binary())
    )
    hashes = hash_strings(*_string_buffers(text)).view(np.uint64)
    return ((hashes >> np.uint64(7)) % np.uint64(buckets)).astype(np.int64)


@dataclass(frozen=True)
class PartitionSummary:
    """One built partition: rows, prefix_counts int64 [L], its first and last first token, and per step
    t >= 1 the children of its widest row, of its first row and of its last row (int64 [L], entry 0
    unused), for the driver's global max_slots and merges; and its SIDs shared by several items, with
    the items on them (a SID never spans two partitions); the bytes of the pieces it received."""

    rows: int
    counts: np.ndarray
    first_token: int
    last_token: int
    max_slots: np.ndarray
    first_row_slots: np.ndarray
    last_row_slots: np.ndarray
    shared_sids: int
    items_in_shared_sids: int
    received_bytes: int


def build_partition(
    codebook_sizes: tuple[int, ...], item_type: pa.DataType, kill_marker: str, *pieces: Any
) -> list[Any]:
    """Build one partition from its pieces (split_block's, in catalog order).

    Returns [PartitionSummary, prefix_tokens[0..L-1], prefix_starts[1..L-1] (local child numbers),
    leaf_offsets (local positions), items in leaf order]: 2L + 2 results the driver fetches one by one.
    kill_marker: test-only (KILL_WORKER_ENV), "" otherwise."""
    if kill_marker and not os.path.exists(kill_marker):
        with open(kill_marker, "w") as marker:
            marker.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    received = sum(
        int(p[0].nbytes) + (int(p[1].nbytes) if p[1] is not None else 0) + p[2].nbytes for p in pieces
    )
    ids = pa.concat_arrays([piece[2].cast(item_type) for piece in pieces])
    if pieces and pieces[0][1] is None:
        layout = partition_layout_tokens([piece[0] for piece in pieces], codebook_sizes)
    else:
        layout = partition_layout_packed([p[0] for p in pieces], [p[1] for p in pieces], codebook_sizes)
    del pieces
    items = ids.take(pa.array(layout.item_order))
    del ids
    num_steps = len(codebook_sizes)
    widest, first_slots, last_slots = (np.zeros(num_steps, np.int64) for _ in range(3))
    for t in range(1, num_steps):
        per_row = np.diff(layout.prefix_starts[t].astype(np.int64))
        widest[t], first_slots[t], last_slots[t] = per_row.max(), per_row[0], per_row[-1]
    per_leaf = np.diff(layout.leaf_offsets.astype(np.int64))
    shared = per_leaf > 1
    summary = PartitionSummary(
        rows=len(items),
        counts=layout.prefix_counts,
        first_token=int(layout.prefix_tokens[0][0]),
        last_token=int(layout.prefix_tokens[0][-1]),
        max_slots=widest,
        first_row_slots=first_slots,
        last_row_slots=last_slots,
        shared_sids=int(shared.sum()),
        items_in_shared_sids=int(per_leaf[shared].sum()),
        received_bytes=received,
    )
    return [summary, *layout.prefix_tokens, *layout.prefix_starts[1:], layout.leaf_offsets, items]


def _as_large(ids: pa.Array) -> pa.Array:
    """String ids with 64-bit offsets, so a bucket past 2 GiB of string data concatenates (integers as
    they are). Only the duplicate check sees these: the ids written go through build_partition's cast."""
    return ids.cast(pa.large_string()) if pa.types.is_string(ids.type) else ids


def find_repeat(*pieces: tuple[pa.Array, np.ndarray]) -> tuple[tuple[int, int, Any] | None, int]:
    """(the lowest catalog row of one bucket whose item id occurred at a lower row as (row, first row with
    that id, the id as a pyarrow scalar) or None, the bytes of the pieces received).
    pieces: (ids, catalog rows ascending) in catalog order."""
    if not pieces:
        return None, 0
    received = sum(piece[0].nbytes + int(piece[1].nbytes) for piece in pieces)
    ids = pa.concat_arrays([_as_large(piece[0]) for piece in pieces])
    rows = np.concatenate([piece[1] for piece in pieces])
    dup = first_duplicate_row(ids, 1)
    if dup < 0:
        return None, received
    return (int(rows[dup]), int(rows[first_row_with_id(ids, dup)]), ids[dup]), received


def fingerprint_from_digests(digests: Sequence[bytes]) -> str:
    """The catalog fingerprint from its files' digests in catalog order (as fingerprint_files makes it)."""
    outer = hashlib.sha256()
    for digest in digests:
        outer.update(digest)
    return "sha256:" + outer.hexdigest()
