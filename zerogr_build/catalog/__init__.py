"""Read a SID catalog from Parquet (a file, a directory of files, or a glob) into arrays the build consumes.

The catalog is read record batch by record batch (each Parquet row group is streamed in bounded batches)
and every batch's SIDs are written straight into one preallocated [N, L] array of the smallest unsigned
dtype that holds the tokens, N taken from the files' footers. So a large catalog is held in memory once,
at 1-2 bytes per token, never as an Arrow table plus a numpy copy. A build (`read_catalog(pack=True)`)
goes one step further: each batch is packed into the sort's keys as it arrives (index.pack.PackedSids,
first token + one 64-bit word per item), so not even the [N, L] array exists.

Every rule a catalog can break raises `InputError` with one line naming the file, the column, the row
(0-based, counted within that file) and the item id where one applies. A catalog may live on object storage
(a URI: storage.py); each file is opened once for its data, and a file that changes while it is read is
refused (storage.Stamp).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..index.pack import PackedSids, packable
from .files import find_catalog_files, fingerprint_files, locate_catalog
from .ids import NUMBA_MIN_ROWS, first_duplicate_row, first_row_with_id
from .plan import check_codebook_sizes, read_footers, sid_layout
from .reader import BATCH_ROWS, MAX_CODEBOOK_SIZE, BatchReader, describe_row, unsigned_dtype_for
from .row_groups import FileFacts, read_in_order, read_on_pool, read_workers
from .storage import Stamp, changed_error


@dataclass(frozen=True, eq=False)
class Catalog:
    """A catalog in memory, rows in catalog order (files in sorted path order, rows in file order).

    sids            uint8|uint16|uint32|uint64 [N, L]: smallest unsigned dtype that holds every token; None
                    when the catalog was read packed (then `packed` holds the SIDs).
    item_ids        pyarrow Array [N] of the input's type (integer or string).
    codebook_sizes  V_t for t = 0..L-1, as given or inferred (max token + 1).
    codebook_inferred  True when the sizes were inferred from the data (callers should warn loudly).
    files           the Parquet files read, in order.
    fingerprint     "sha256:<hex>" over the files' bytes (content only: a renamed or uploaded copy
                    keeps it), checked to be the bytes the read decoded (a file changed mid-read is
                    refused).
    rows            N.
    path            the catalog argument as given.
    packed          index.pack.PackedSids of the SIDs (read_catalog(pack=True)), else None.
    """

    sids: np.ndarray | None
    item_ids: pa.Array
    codebook_sizes: tuple[int, ...]
    codebook_inferred: bool
    files: list[str]
    fingerprint: str
    rows: int
    path: str = ""
    packed: PackedSids | None = None

    @property
    def num_steps(self) -> int:
        if self.sids is None:
            assert self.packed is not None
            return self.packed.num_steps
        return int(self.sids.shape[1])


def read_catalog(
    path: str | Path,
    *,
    sid_column: str = "sid",
    sid_columns: Sequence[str] | None = None,
    item_column: str = "item_id",
    codebook_sizes: Sequence[int] | None = None,
    progress: Progress = NULL_PROGRESS,
    pack: bool = False,
    workers: int | None = None,
) -> Catalog:
    """Read and validate a catalog.

    path: a Parquet file, a directory of them (recursive), or a glob; local, or a URI of any filesystem
        pyarrow opens (s3://bucket/prefix/, gs://...; credentials from the environment, never the URI).
    SIDs come from `sid_column` (list or fixed-size list of any integer type) or, when `sid_columns` is
    given, from those L integer columns.
    codebook_sizes: V_t per step; None (or empty) infers max token + 1 per step (Catalog.codebook_inferred).
    pack: hold the SIDs as sort keys (Catalog.packed, sids None) when codebook_sizes are given and
        index.pack.packable says they fit one word; otherwise (and by default) as Catalog.sids.
    workers: threads a packed read decodes, validates and packs row groups on (None: every core; 1 reads
        in order on this thread). An unpacked read is always in order.
    Raises InputError naming file, column, row and item id for every broken rule (see module docstring).
    """
    sizes = check_codebook_sizes(codebook_sizes)
    layout = sid_layout(sid_column, sid_columns)

    store, files = locate_catalog(path)
    hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerogr-fingerprint")
    stop_hashing = threading.Event()  # set on any error, so a refusal does not wait for the hashes
    hashed: list[Stamp] = []  # each file's stamp as it was hashed
    try:
        fingerprint_future = hasher.submit(fingerprint_files, files, stop_hashing, store, hashed)
        # Pass 1, footers only (plan.read_footers). Files are closed again (a directory may hold thousands
        # of parts); the data pass reads each file through the footer parsed here, after checking (its
        # Stamp) that the file it opens is the one this pass read.
        facts = read_footers(store, files, layout, sid_column, item_column, workers)
        layout, item_type, stamps, footers = facts.layout, facts.item_type, facts.stamps, facts.footers
        file_rows, group_rows = facts.file_rows, facts.group_rows
        total_rows = sum(file_rows)
        if total_rows == 0:
            raise InputError(f"{path}: empty catalog (no rows in {len(files)} file(s))")

        pack = pack and sizes is not None and packable(total_rows, sizes)
        reader = BatchReader(files, layout, item_column, item_type, total_rows, sizes, progress, pack=pack)
        columns = [item_column, *([layout.list_column] if layout.list_column else layout.columns)]
        progress.stage("read", total=total_rows)
        threads = read_workers(workers)
        file_facts = FileFacts(store, files, stamps, footers, file_rows)
        if reader.pack and threads > 1:
            read_on_pool(reader, file_facts, group_rows, columns, progress, threads)
        else:
            read_in_order(reader, file_facts, columns, progress)
        del facts, file_facts, footers
        # Batches are gone; hand the Arrow pool's cached pages back so the build that follows can use them.
        pa.default_memory_pool().release_unused()
        if (reader.sids is None and reader.packed is None) or reader.num_steps is None:
            raise InputError(f"{path}: empty catalog (no SIDs)")
        item_ids = reader.item_array()
        dup = first_duplicate_row(item_ids, threads)
        if dup >= 0:
            name, file_row = reader.locate(dup)
            item = item_ids[dup]
            first_name, first_row = reader.locate(first_row_with_id(item_ids, dup))
            raise InputError(
                f"{name}: column {item_column!r}, {describe_row(file_row, item)}: duplicate item id "
                f"(first seen at row {first_row} of {first_name})"
            )
        inferred = sizes is None
        if inferred:
            assert reader.step_max is not None
            sizes = tuple(int(m) + 1 for m in reader.step_max)
        fingerprint = fingerprint_future.result()
        for name, read, seen in zip(files, stamps, hashed, strict=True):
            if read != seen:  # the bytes hashed are not the bytes read
                raise changed_error(name)
    except BaseException:
        stop_hashing.set()
        raise
    finally:
        hasher.shutdown(wait=True, cancel_futures=True)
    return Catalog(
        sids=reader.sids,
        item_ids=item_ids,
        codebook_sizes=sizes,
        codebook_inferred=inferred,
        files=files,
        fingerprint=fingerprint,
        rows=total_rows,
        path=str(path),
        packed=reader.packed,
    )


__all__ = [
    "BATCH_ROWS",
    "MAX_CODEBOOK_SIZE",
    "NUMBA_MIN_ROWS",
    "Catalog",
    "find_catalog_files",
    "fingerprint_files",
    "first_duplicate_row",
    "first_row_with_id",
    "read_catalog",
    "unsigned_dtype_for",
]
