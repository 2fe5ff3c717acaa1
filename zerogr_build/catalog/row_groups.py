"""Feeding a catalog's row groups to a BatchReader: in catalog order on the calling thread (the next batch
decoded by a prefetch thread), or, for a build's packed read, on a thread pool.

Why a pool is exact: every row group's global rows are known from the footers before any data is read
(RowGroup.row), and BatchReader writes each batch only at its own rows (packed keys, item ids), so row
groups can be decoded, validated and packed in any order on any thread. Errors are those of the in-order
reader: each task stops at its own first bad row, and the caller collects the tasks in catalog order and
raises the first failure it meets, which is the failure at the lowest row. One difference: a file whose
footer row count disagrees with its row groups' counts is refused from those counts, after the rows of
the files before it are read but before its own data is decoded.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.parquet as pq

from ..base.errors import InputError
from ..base.progress import Progress
from ..base.threads import prefetched
from .reader import BatchReader, iter_batches
from .schema import parquet_file
from .storage import OpenFile, Stamp, Store, changed_error

#: Most threads a pooled read starts without --workers (each holds one row group's decoded batches).
MAX_READ_THREADS = 16


@dataclass(frozen=True)
class RowGroup:
    """One row group of one file: its rows are the file's rows [file_row, file_row + rows) and the
    catalog's rows [row, row + rows)."""

    name: str
    group: int
    file_row: int
    row: int
    rows: int


def plan_row_groups(
    files: list[str], file_rows: list[int], group_rows: list[list[int]]
) -> tuple[list[RowGroup], InputError | None]:
    """Every row group of `files`, in catalog order, from their footers (file_rows: each file's row count;
    group_rows: each file's row count per row group), up to the first file whose row groups hold more or
    fewer rows than its footer says; that file's InputError is returned beside the groups before it (None
    when every footer agrees)."""
    groups: list[RowGroup] = []
    row = 0
    for name, rows, counts in zip(files, file_rows, group_rows, strict=True):
        if sum(counts) > rows:
            return groups, InputError(f"{name}: footer says {rows} rows but its row groups hold more")
        if sum(counts) < rows:
            held = sum(counts)
            return groups, InputError(f"{name}: footer says {rows} rows but its row groups hold {held}")
        file_row = 0
        for group, count in enumerate(counts):
            groups.append(RowGroup(name, group, file_row, row, count))
            file_row += count
            row += count
    return groups, None


@dataclass(frozen=True)
class FileFacts:
    """What the footer pass learnt of each catalog file, in catalog order: the Store they are read
    through, their names, their Stamp when the footer was read (storage.Stamp), their parsed footers
    (pq.FileMetaData) and row counts. The data pass opens each file once, checks it still has that stamp
    and reads every row group through that one open file with that footer (never parsed again)."""

    store: Store
    files: list[str]
    stamps: list[Stamp]
    footers: list[pq.FileMetaData]
    file_rows: list[int]


def read_in_order(reader: BatchReader, facts: FileFacts, columns: list[str], progress: Progress) -> None:
    """Every batch of every file into `reader`, in catalog order, the next batch prefetched."""
    row = 0
    for k, (name, rows) in enumerate(zip(facts.files, facts.file_rows, strict=True)):
        reader.file_starts.append(row)
        file_row = 0
        # closing(): on an error the prefetch thread is stopped before the file is closed under it
        with _open_checked(facts, k) as opened, _changed_first(opened):
            pf = parquet_file(opened, facts.footers[k])
            with contextlib.closing(
                prefetched(iter_batches(name, pf, columns), name="zerogr-parquet-prefetch")
            ) as batches:
                for batch in batches:
                    if file_row + batch.num_rows > rows:  # the footer's count sized the output arrays
                        raise InputError(f"{name}: footer says {rows} rows but its row groups hold more")
                    reader.add_batch(name, batch, file_row, row)
                    file_row += batch.num_rows
                    row += batch.num_rows
                    progress.advance(batch.num_rows)
            opened.check()  # rewritten in place while it was read: refused
        if file_row != rows:
            raise InputError(f"{name}: footer says {rows} rows but {file_row} were read")


@contextlib.contextmanager
def _changed_first(opened: OpenFile) -> Iterator[None]:
    """An InputError raised while `opened` is read becomes storage.changed_error when the file no longer
    shows its opening stamp: bytes rewritten under the reader explain a "corrupt" page or a bad row."""
    try:
        yield
    except InputError:
        try:
            opened.check()
        except InputError as changed:
            raise changed from None
        raise


def _open_checked(facts: FileFacts, k: int) -> OpenFile:
    """File k opened for its data; InputError (storage.changed_error) unless it is the file whose footer
    the first pass read."""
    opened = facts.store.open(facts.files[k])
    if opened.stamp != facts.stamps[k]:
        opened.close()
        raise changed_error(facts.files[k])
    return opened


class _SharedFiles:
    """The pool's open files: file k is opened by the first of its row groups to run, shared by the others
    (ReadAt on it is thread-safe), checked for change and closed when the last one is done. So each file
    is opened once, and at most about `workers` files are open at a time, however many parts the catalog
    has."""

    def __init__(self, facts: FileFacts, groups: list[RowGroup]) -> None:
        self.facts = facts
        self.left = [0] * len(facts.files)
        index = {name: k for k, name in enumerate(facts.files)}
        self.file_of = [index[g.name] for g in groups]
        for k in self.file_of:
            self.left[k] += 1
        self.open: list[OpenFile | None] = [None] * len(facts.files)
        self.locks = [threading.Lock() for _ in facts.files]

    def acquire(self, k: int) -> OpenFile:
        with self.locks[k]:
            opened = self.open[k]
            if opened is None:
                opened = self.open[k] = _open_checked(self.facts, k)
            return opened

    def release(self, k: int) -> None:
        """One row group of file k is read; after its last one the file is checked and closed."""
        with self.locks[k]:
            self.left[k] -= 1
            if self.left[k] or self.open[k] is None:
                return
            opened, self.open[k] = self.open[k], None
        assert opened is not None
        try:
            opened.check()
        finally:
            opened.close()

    def close_all(self) -> None:
        for k, opened in enumerate(self.open):
            if opened is not None:
                self.open[k] = None
                opened.close()


def read_on_pool(
    reader: BatchReader,
    facts: FileFacts,
    group_rows: list[list[int]],
    columns: list[str],
    progress: Progress,
    workers: int,
) -> None:
    """Every row group into `reader` (a packed BatchReader), `workers` row groups at a time (group_rows:
    the footers' row counts per row group of each file, as plan_row_groups takes them).

    Leading row groups are read on the calling thread until one holds rows: that fixes the SID length the
    others are checked against, with the in-order reader's messages. Every task reads through its file's
    one open handle and the footer parsed in the first pass (_SharedFiles), so a task costs its own row
    group, not the whole footer again."""
    row = 0
    for rows in facts.file_rows:
        reader.file_starts.append(row)
        row += rows
    groups, footer_error = plan_row_groups(facts.files, facts.file_rows, group_rows)
    shared = _SharedFiles(facts, groups)

    def read_group(i: int) -> int:
        g, k = groups[i], shared.file_of[i]
        read = 0
        where = f"{g.name}: footer says {g.rows} rows in row group {g.group}"
        opened = shared.acquire(k)
        with _changed_first(opened):
            pf = parquet_file(opened, facts.footers[k])
            for batch in iter_batches(g.name, pf, columns, groups=[g.group], use_threads=False):
                if read + batch.num_rows > g.rows:
                    raise InputError(f"{where}, it holds more")
                reader.add_batch(g.name, batch, g.file_row + read, g.row + read)
                read += batch.num_rows
            if read != g.rows:
                raise InputError(f"{where}, {read} were read")
        shared.release(k)
        return read

    try:
        first = 0
        while first < len(groups) and reader.num_steps is None:
            progress.advance(read_group(first))
            first += 1
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zerogr-read") as pool:
            futures: list[Future[int]] = [pool.submit(read_group, i) for i in range(first, len(groups))]
            try:
                for future in futures:  # catalog order: the first failure met is the one at the lowest row
                    progress.advance(future.result())
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    finally:
        shared.close_all()
    if footer_error is not None:
        raise footer_error


def read_workers(workers: int | None) -> int:
    """Threads for a pooled read: `workers` when given, else the CPUs this process may run on (at most
    MAX_READ_THREADS: each holds one row group's decoded batches)."""
    if workers:
        return max(1, int(workers))
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_READ_THREADS))
