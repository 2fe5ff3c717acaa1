"""The footer pass of a catalog read: every file's schema, row count and row-group row counts, checked
before any data is read, so a bad file fails first and N is known. Shared by the in-process read
(`read_catalog`) and the partitioned build, whose tasks read the row groups this pass lists."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ..base.errors import InputError
from .reader import MAX_CODEBOOK_SIZE
from .row_groups import read_workers
from .schema import SidLayout, check_sid_schema, common_item_type, item_id_type, parquet_file
from .storage import Stamp, Store


@dataclass(frozen=True, eq=False)
class FooterFacts:
    """What the footers of a catalog's files say, in catalog order.

    layout      where the SID tokens live (fixed_length set when the schema fixes L).
    item_type   the one item-id type of all files.
    stamps      each file's storage.Stamp when its footer was read.
    footers     each file's parsed footer.
    file_rows   rows per file; group_rows: rows per row group of each file.
    """

    layout: SidLayout
    item_type: pa.DataType
    stamps: list[Stamp]
    footers: list[pq.FileMetaData]
    file_rows: list[int]
    group_rows: list[list[int]]

    @property
    def total_rows(self) -> int:
        return sum(self.file_rows)


def check_codebook_sizes(codebook_sizes: Sequence[int] | None) -> tuple[int, ...] | None:
    """The sizes as a tuple (None or empty: inferred); InputError when one is outside 1..MAX_CODEBOOK_SIZE."""
    sizes = tuple(int(v) for v in codebook_sizes) if codebook_sizes else None
    if sizes is not None and any(not 1 <= v <= MAX_CODEBOOK_SIZE for v in sizes):
        raise InputError(f"codebook sizes must be 1..{MAX_CODEBOOK_SIZE}, got {','.join(map(str, sizes))}")
    return sizes


def sid_layout(sid_column: str, sid_columns: Sequence[str] | None) -> SidLayout:
    """The SID layout the settings name: L integer columns when `sid_columns` is given, else one list."""
    if sid_columns:
        return SidLayout(None, tuple(sid_columns), len(sid_columns))
    return SidLayout(sid_column, (), None)


def read_footers(
    store: Store,
    files: list[str],
    layout: SidLayout,
    sid_column: str,
    item_column: str,
    workers: int | None,
) -> FooterFacts:
    """Read and check every file's footer (schema, SID layout, item-id type); files are closed again.
    Raises InputError naming the first bad file in catalog order."""
    item_types, file_rows, group_rows, stamps, footers = [], [], [], [], []
    for name, (stamp, schema, meta) in zip(files, _footers(store, files, workers), strict=True):
        stamps.append(stamp)
        footers.append(meta)
        file_rows.append(meta.num_rows)
        group_rows.append([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        check_sid_schema(name, schema, layout)
        item_types.append((name, item_id_type(name, schema, item_column)))
        if layout.list_column is not None and pa.types.is_fixed_size_list(schema.field(sid_column).type):
            size = schema.field(sid_column).type.list_size
            if layout.fixed_length is None:
                layout = SidLayout(layout.list_column, (), size)
            elif size != layout.fixed_length:
                raise InputError(
                    f"{name}: column {sid_column!r} holds SIDs of {size} tokens, other files "
                    f"{layout.fixed_length}"
                )
    if layout.fixed_length == 0:
        raise InputError(f"{files[0]}: column {sid_column!r} holds SIDs of 0 tokens")
    item_type = common_item_type(item_types, item_column)
    return FooterFacts(layout, item_type, stamps, footers, file_rows, group_rows)


def _footer(store: Store, name: str) -> tuple[Stamp, pa.Schema, pq.FileMetaData]:
    """One file's stamp, Arrow schema and parsed footer (the file is closed again)."""
    with store.open(name) as opened:
        pf = parquet_file(opened)
        return opened.stamp, pf.schema_arrow, pf.metadata


def _footers(
    store: Store, files: list[str], workers: int | None
) -> Iterator[tuple[Stamp, pa.Schema, pq.FileMetaData]]:
    """_footer of every file, in catalog order. On object storage each footer costs round trips, so up to
    MAX_READ_THREADS are fetched at once (still yielded in order: the first bad file in catalog order is
    the one reported); a local footer is a few reads, fetched in order on this thread."""
    if not store.remote or len(files) == 1:
        for name in files:
            yield _footer(store, name)
        return
    threads = min(len(files), read_workers(workers))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="zerogr-footers") as pool:
        futures = [pool.submit(_footer, store, name) for name in files]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()
