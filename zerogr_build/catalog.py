"""Read a SID catalog from Parquet (a file, a directory of files, or a glob) into arrays the build consumes.

The catalog is read record batch by record batch (each Parquet row group is streamed in bounded batches)
and every batch's SIDs are written straight into one preallocated [N, L] array of the smallest unsigned
dtype that holds the tokens, N taken from the files' footers. So a large catalog is held in memory once,
at 1-2 bytes per token, never as an Arrow table plus a numpy copy.

Every rule a catalog can break raises `InputError` with one line naming the file, the column, the row
(0-based, counted within that file) and the item id where one applies.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import InputError, one_line
from .progress import NULL_PROGRESS, Progress

#: Rows per record batch while streaming. Bounds the Arrow-side memory of the read (a few MB per batch).
BATCH_ROWS = 1 << 20

_GLOB_CHARS = frozenset("*?[")

#: Below this many rows (per batch, or ids in all) plain numpy is used: it is fast enough there, and a
#: small catalog (tests, `verify --catalog` on samples) then never pays numba's ~1 s import.
NUMBA_MIN_ROWS = 1 << 16

#: Largest codebook the index supports (tokens are stored as int32 above 65536).
MAX_CODEBOOK_SIZE = 2**31


@dataclass(frozen=True, eq=False)
class Catalog:
    """A catalog in memory, rows in catalog order (files in sorted path order, rows in file order).

    sids            uint8|uint16|uint32|uint64 [N, L]: smallest unsigned dtype that holds every token.
    item_ids        pyarrow Array [N] of the input's type (integer or string).
    codebook_sizes  V_t for t = 0..L-1, as given or inferred (max token + 1).
    codebook_inferred  True when the sizes were inferred from the data (callers should warn loudly).
    files           the Parquet files read, in order.
    fingerprint     "sha256:<hex>" over the files' bytes (content only; renaming a file keeps it).
    rows            N.
    path            the catalog argument as given.
    """

    sids: np.ndarray
    item_ids: pa.Array
    codebook_sizes: tuple[int, ...]
    codebook_inferred: bool
    files: list[str]
    fingerprint: str
    rows: int
    path: str = ""

    @property
    def num_steps(self) -> int:
        return int(self.sids.shape[1])


# --------------------------------------------------------------------------------------------------
# 1. Finding the files
# --------------------------------------------------------------------------------------------------


def find_catalog_files(path: str | Path) -> list[str]:
    """Resolve CATALOG (a Parquet file, a directory searched recursively, or a glob) to sorted file paths.

    In a directory, names starting with "_" or "." are skipped (_SUCCESS markers, .crc files), as
    warehouse exports and pyarrow.dataset do.
    """
    text = str(path)
    if any(ch in _GLOB_CHARS for ch in text) and not os.path.exists(text):
        files = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not files:
            raise InputError(f"{text}: no files match this pattern")
        return files
    if not os.path.exists(text):
        raise InputError(f"{text}: no such file or directory")
    if os.path.isdir(text):
        files = []
        for root, dirs, names in os.walk(text):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            files.extend(os.path.join(root, n) for n in names if not n.startswith(("_", ".")))
        if not files:
            raise InputError(f"{text}: directory holds no data files")
        return sorted(files)
    return [text]


def fingerprint_files(files: Sequence[str]) -> str:
    """sha256 over the files' bytes: one digest per file, then a digest of those digests in file order."""
    outer = hashlib.sha256()
    for name in files:
        inner = hashlib.sha256()
        with open(name, "rb") as fh:
            while chunk := fh.read(1 << 24):
                inner.update(chunk)  # hashlib releases the GIL here, so this overlaps the Parquet read
        outer.update(inner.digest())
    return "sha256:" + outer.hexdigest()


# --------------------------------------------------------------------------------------------------
# 2. Schema checks (all files, before any data is read)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SidLayout:
    """Where the SID tokens live: one list column (`list_column`) or L integer columns (`columns`)."""

    list_column: str | None
    columns: tuple[str, ...]
    fixed_length: int | None  # L known from the schema (fixed-size list or separate columns)


def _open(name: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(name)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{name}: not a readable Parquet file ({one_line(exc)})") from None


def _field(name: str, schema: pa.Schema, column: str) -> pa.Field:
    index = schema.get_field_index(column)
    if index < 0:
        have = ", ".join(schema.names) or "none"
        raise InputError(f"{name}: column {column!r} not found (columns: {have})")
    return schema.field(index)


def _is_list(tp: pa.DataType) -> bool:
    return pa.types.is_list(tp) or pa.types.is_large_list(tp) or pa.types.is_fixed_size_list(tp)


def _check_sid_schema(name: str, schema: pa.Schema, layout: _SidLayout) -> None:
    if layout.list_column is not None:
        tp = _field(name, schema, layout.list_column).type
        if not (_is_list(tp) and pa.types.is_integer(tp.value_type)):
            hint = (
                " (use --sid-columns for SIDs stored as separate columns)" if pa.types.is_integer(tp) else ""
            )
            raise InputError(
                f"{name}: column {layout.list_column!r} has type {tp}; a SID column must be a list or "
                f"fixed-size list of integers{hint}"
            )
        return
    for column in layout.columns:
        tp = _field(name, schema, column).type
        if not pa.types.is_integer(tp):
            raise InputError(f"{name}: column {column!r} has type {tp}; SID token columns must be integers")


def _item_type(name: str, schema: pa.Schema, column: str) -> pa.DataType:
    tp = _field(name, schema, column).type
    if pa.types.is_integer(tp) or pa.types.is_string(tp) or pa.types.is_large_string(tp):
        return tp
    raise InputError(f"{name}: column {column!r} has type {tp}; item ids must be integers or strings")


def _common_item_type(types: list[tuple[str, pa.DataType]], column: str) -> pa.DataType:
    """One item-id type for all files: identical types stay; mixed integer widths widen to int64,
    string/large_string to large_string; integers mixed with strings are refused."""
    first_name, first = types[0]
    if all(tp == first for _, tp in types):
        return first
    for name, tp in types:
        if pa.types.is_integer(tp) != pa.types.is_integer(first):
            raise InputError(
                f"{name}: column {column!r} has type {tp} but {first_name} has {first}; "
                "item ids must have one kind (integer or string) in every file"
            )
    return pa.int64() if pa.types.is_integer(first) else pa.large_string()


# --------------------------------------------------------------------------------------------------
# 3. Reading: batches of SIDs into one preallocated [N, L] array
# --------------------------------------------------------------------------------------------------


def _fresh(shape: int | tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A large output array that batches are copied into.

    np.zeros, not np.empty: numpy marks big np.empty buffers for transparent huge pages, and copying batch
    after batch into such untouched memory measured ~20x slower (0.5 s vs 0.025 s per 160 MB) than into a
    calloc'ed np.zeros buffer, whose pages the kernel hands out zeroed on first write anyway.
    """
    return np.zeros(shape, dtype=dtype)


def _unsigned_dtype_for(max_value: int) -> np.dtype:
    """Smallest unsigned dtype holding 0..max_value."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


class _Reader:
    """State of one read: output arrays, running maxima, and where each file starts (for messages)."""

    def __init__(
        self,
        files: list[str],
        layout: _SidLayout,
        item_column: str,
        item_type: pa.DataType,
        total_rows: int,
        codebook_sizes: tuple[int, ...] | None,
        progress: Progress,
    ) -> None:
        self.files = files
        self.layout = layout
        self.item_column = item_column
        self.item_type = item_type
        self.total_rows = total_rows
        self.codebook_sizes = codebook_sizes
        self.progress = progress
        self.num_steps: int | None = layout.fixed_length
        if codebook_sizes is not None and self.num_steps is not None:
            _check_codebook_count(files[0], layout, codebook_sizes, self.num_steps)
        self.dtype = _unsigned_dtype_for(max(codebook_sizes) - 1 if codebook_sizes else 0)
        self.sids: np.ndarray | None = None
        self.step_max: np.ndarray | None = None  # int64 [L], running max token per step (inference)
        self.int_ids = pa.types.is_integer(item_type)
        self.id_values: np.ndarray | None = (
            _fresh(total_rows, item_type.to_pandas_dtype()) if self.int_ids else None
        )
        self.id_chunks: list[pa.Array] = []
        self.file_starts: list[int] = []  # global row of each file's first row

    # -- per batch -------------------------------------------------------------------------------
    def add_batch(self, name: str, batch: pa.RecordBatch, file_row: int, row: int) -> None:
        """Validate one batch and copy it into the outputs at global rows [row, row + n)."""
        n = batch.num_rows
        items = batch.column(self.item_column)
        if items.null_count:
            bad = int(np.flatnonzero(pc.is_null(items).to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{name}: column {self.item_column!r}, row {file_row + bad}: item id is null")
        if self.layout.list_column is not None:
            block = self._list_tokens(name, batch, items, file_row)
        else:
            block = self._column_tokens(name, batch, items, file_row)
        self._check_range(name, block, items, file_row)
        self._store(block, row, n)
        if self.int_ids:
            assert self.id_values is not None
            if items.type != self.item_type:
                items = self._cast_ids(name, items, file_row)
            self.id_values[row : row + n] = items.to_numpy(zero_copy_only=False)
        else:
            self.id_chunks.append(items.cast(self.item_type) if items.type != self.item_type else items)

    def _list_tokens(self, name: str, batch: pa.RecordBatch, items: pa.Array, file_row: int) -> np.ndarray:
        """List column -> tokens [n, L] (a zero-copy view of the batch's values where possible)."""
        column = self.layout.list_column
        assert column is not None
        arr = batch.column(column)
        n = len(arr)
        if arr.null_count:
            bad = int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])
            raise InputError(f"{name}: column {column!r}, {_where(file_row + bad, items[bad])}: SID is null")
        if not pa.types.is_fixed_size_list(arr.type):
            # Non-null rows have offsets[i+1] - offsets[i] tokens; all must equal L.
            offsets = arr.offsets.to_numpy()
            lengths = offsets[1:] - offsets[:-1]
            if self.num_steps is None and n:
                self.num_steps = int(lengths[0])
                self._first_length_set(name, column)
            if self.num_steps is not None and n:
                wrong = lengths != self.num_steps
                if wrong.any():
                    bad = int(np.flatnonzero(wrong)[0])
                    raise InputError(
                        f"{name}: column {column!r}, {_where(file_row + bad, items[bad])}: SID has "
                        f"{int(lengths[bad])} tokens, expected {self.num_steps} (the length of the first SID)"
                    )
        values = arr.flatten()  # respects slicing; no nulls at list level, so exactly n * L values
        if values.null_count:
            flat = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
            bad = flat // max(self.num_steps or 1, 1)
            raise InputError(
                f"{name}: column {column!r}, {_where(file_row + bad, items[bad])}: "
                f"token {flat % (self.num_steps or 1)} of the SID is null"
            )
        if self.num_steps is None:  # an empty batch before L is known
            return np.zeros((0, 0), dtype=np.uint8)
        return values.to_numpy(zero_copy_only=False).reshape(n, self.num_steps)

    def _first_length_set(self, name: str, column: str) -> None:
        if self.num_steps == 0:
            raise InputError(f"{name}: column {column!r}, row 0: SID is empty (0 tokens)")
        if self.codebook_sizes is not None:
            _check_codebook_count(name, self.layout, self.codebook_sizes, self.num_steps)

    def _column_tokens(self, name: str, batch: pa.RecordBatch, items: pa.Array, file_row: int) -> np.ndarray:
        """L integer columns -> tokens [n, L] (one copy, column by column)."""
        columns = self.layout.columns
        arrays = [batch.column(c) for c in columns]
        for column, arr in zip(columns, arrays, strict=True):
            if arr.null_count:
                bad = int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])
                raise InputError(
                    f"{name}: column {column!r}, {_where(file_row + bad, items[bad])}: SID token is null"
                )
        dtype = np.result_type(*[arr.type.to_pandas_dtype() for arr in arrays])
        block = np.empty((batch.num_rows, len(columns)), dtype=dtype)
        for t, arr in enumerate(arrays):
            block[:, t] = arr.to_numpy(zero_copy_only=False)
        return block

    def _check_range(self, name: str, block: np.ndarray, items: pa.Array, file_row: int) -> None:
        """Tokens must be >= 0 and < V_t: one fused pass for every step's min and max, then a scan for the
        offending row only when a bound is broken. Also keeps the running per-step max (for inference)."""
        if block.size == 0:
            return
        signed = block
        if block.dtype == np.uint64 and int(block.max()) > np.iinfo(np.int64).max:
            # Clipped for the checks only: such a token breaks every codebook bound anyway.
            signed = np.minimum(block, np.uint64(np.iinfo(np.int64).max)).astype(np.int64)
        if block.shape[0] >= NUMBA_MIN_ROWS:
            from ._catalog_kernels import step_min_max  # numba: compiled on first use, cached

            lo, hi = step_min_max(np.ascontiguousarray(signed))
        else:
            lo, hi = signed.min(axis=0).astype(np.int64), signed.max(axis=0).astype(np.int64)
        sizes = self.codebook_sizes or (MAX_CODEBOOK_SIZE,) * block.shape[1]
        limit = np.asarray(sizes, dtype=np.int64)
        if lo.min() < 0 or (hi >= limit).any():
            wide = signed.astype(np.int64, copy=False)
            row, t = (int(i) for i in np.argwhere((wide < 0) | (wide >= limit))[0])  # lowest row, then step
            token = int(block[row, t])  # as written, not clipped
            rule = "is negative" if token < 0 else f"is >= codebook size {sizes[t]}"
            raise InputError(
                f"{name}: {self._column_at(t)}, {_where(file_row + row, items[row])}: "
                f"token {token} at step {t} {rule}"
            )
        if self.step_max is None:
            self.step_max = hi
        else:
            np.maximum(self.step_max, hi, out=self.step_max)

    def _column_at(self, t: int) -> str:
        if self.layout.list_column is not None:
            return f"column {self.layout.list_column!r}"
        return f"column {self.layout.columns[t]!r}"

    def _store(self, block: np.ndarray, row: int, n: int) -> None:
        if n == 0:
            return
        if self.sids is None:
            assert self.num_steps is not None
            self.sids = _fresh((self.total_rows, self.num_steps), self.dtype)
        if self.codebook_sizes is None and self.step_max is not None:
            needed = _unsigned_dtype_for(int(self.step_max.max()))
            if needed.itemsize > self.sids.dtype.itemsize:
                # Inferred sizes only: widen once when a larger token first shows up (rows so far are copied;
                # with real catalogs this happens in the first batch, when nothing has been stored yet).
                wider = _fresh(self.sids.shape, needed)
                wider[:row] = self.sids[:row]
                self.sids = wider
        self.sids[row : row + n] = block

    def _cast_ids(self, name: str, items: pa.Array, file_row: int) -> pa.Array:
        try:
            return items.cast(self.item_type)
        except pa.ArrowInvalid as exc:
            raise InputError(
                f"{name}: column {self.item_column!r}, rows {file_row}..{file_row + len(items) - 1}: "
                f"item ids do not fit {self.item_type} shared with the other files ({one_line(exc)})"
            ) from None

    # -- results ---------------------------------------------------------------------------------
    def item_array(self) -> pa.Array:
        if self.int_ids:
            return pa.array(self.id_values, type=self.item_type)  # zero-copy over the numpy buffer
        try:
            return pa.concat_arrays(self.id_chunks)
        except pa.ArrowInvalid:  # more than 2 GiB of string data: needs 64-bit offsets
            return pa.concat_arrays([c.cast(pa.large_string()) for c in self.id_chunks])

    def locate(self, row: int) -> tuple[str, int]:
        """Global row -> (file, row within file)."""
        k = int(np.searchsorted(np.asarray(self.file_starts), row, side="right")) - 1
        return self.files[k], row - self.file_starts[k]


def _where(row: int, item: pa.Scalar) -> str:
    return f"row {row} (item id {item.as_py()!r})"


def _check_codebook_count(name: str, layout: _SidLayout, sizes: tuple[int, ...], num_steps: int) -> None:
    if len(sizes) != num_steps:
        what = (
            f"column {layout.list_column!r} holds SIDs of {num_steps} tokens"
            if layout.list_column is not None
            else f"{num_steps} SID columns given"
        )
        raise InputError(f"{name}: {len(sizes)} codebook sizes given but {what}")


def _iter_batches(name: str, pf: pq.ParquetFile, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Stream a file's batches; a corrupt page becomes an InputError naming the file."""
    # One reader per row group: a reader over the whole file decodes row groups ahead and holds several
    # hundred MB of Arrow buffers at once; per group, Arrow memory stays at one group's batches.
    for group in range(pf.num_row_groups):
        it = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns, use_threads=True)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(
                    f"{name}: unreadable Parquet data in row group {group} ({one_line(exc)})"
                ) from None
            yield batch


def _prefetched(batches: Iterator[pa.RecordBatch], depth: int = 1) -> Iterator[pa.RecordBatch]:
    """Decode the next batch on a helper thread while the caller validates and copies the current one
    (Arrow releases the GIL while decoding). At most `depth` decoded batches wait, so memory stays bounded.
    Exceptions (InputError for corrupt data) are re-raised in the caller at the batch where they occurred."""
    import queue
    import threading

    slots: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        slots.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            slots.put(exc)

    worker = threading.Thread(target=produce, name="zerogr-parquet-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = slots.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue, then let it finish
            with contextlib.suppress(queue.Empty):
                slots.get(timeout=0.1)
        worker.join()


# --------------------------------------------------------------------------------------------------
# 4. Duplicate item ids (vectorised: numba for integers, Arrow hashing for strings)
# --------------------------------------------------------------------------------------------------


def _earliest_repeat(order: np.ndarray, same: np.ndarray) -> int:
    """First repeated row from a stable sort: order int [n] (stable argsort of the ids), same bool [n-1]
    (sorted ids k and k+1 are equal). A stable sort keeps rows in order within a run of equal ids, so every
    non-first member of a run repeats an earlier row; the first repeated row is the smallest of those."""
    return int(order[1:][same].min()) if same.any() else -1


def _string_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [n+1], data uint8) of a string/binary array (large or not) without nulls, as numpy views."""
    _, offsets_buf, data_buf = ids.buffers()
    large = pa.types.is_large_string(ids.type) or pa.types.is_large_binary(ids.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[ids.offset : ids.offset + len(ids) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def _has_string_buffers(tp: pa.DataType) -> bool:
    """string, large_string, binary, large_binary: an offsets buffer and a data buffer."""
    return (
        pa.types.is_string(tp)
        or pa.types.is_large_string(tp)
        or pa.types.is_binary(tp)
        or pa.types.is_large_binary(tp)
    )


def first_duplicate_row(ids: pa.Array) -> int:
    """Index of the first row whose item id already occurred in an earlier row, or -1 if all are distinct.
    ids: pyarrow Array without nulls (integers and strings take the fast paths; any other type works)."""
    if len(ids) < 2:
        return -1
    if pa.types.is_integer(ids.type):
        values = ids.to_numpy(zero_copy_only=False)
        # Sorted ids (common in exports) are distinct exactly when strictly increasing: one pass, no memory.
        if bool(np.all(values[1:] > values[:-1])):
            return -1
        if len(values) < NUMBA_MIN_ROWS:
            order = np.argsort(values, kind="stable")
            ordered = values[order]
            return _earliest_repeat(order, ordered[1:] == ordered[:-1])
        keys = values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False)
        from ._catalog_kernels import first_repeat_int64  # numba compiles lazily (cached)

        return int(first_repeat_int64(keys))
    if len(ids) >= NUMBA_MIN_ROWS and _has_string_buffers(ids.type):
        from ._catalog_kernels import first_repeat_int64, hash_strings

        if first_repeat_int64(hash_strings(*_string_buffers(ids))) == -1:
            return -1  # distinct hashes: certainly distinct strings
    elif len(pc.unique(ids)) == len(ids):
        return -1
    # Error path only (or a hash collision): the exact first repeated row.
    order = pc.array_sort_indices(ids).to_numpy()  # Arrow's sort_indices is stable
    sorted_ids = ids.take(pa.array(order))
    return _earliest_repeat(order, pc.equal(sorted_ids[1:], sorted_ids[:-1]).to_numpy(zero_copy_only=False))


def first_row_with_id(ids: pa.Array, row: int) -> int:
    """The first row holding the same id as `row` (== row when no earlier row holds it)."""
    return int(np.flatnonzero(pc.equal(ids[: row + 1], ids[row]).to_numpy(zero_copy_only=False))[0])


# --------------------------------------------------------------------------------------------------
# 5. The entry point
# --------------------------------------------------------------------------------------------------


def read_catalog(
    path: str | Path,
    *,
    sid_column: str = "sid",
    sid_columns: Sequence[str] | None = None,
    item_column: str = "item_id",
    codebook_sizes: Sequence[int] | None = None,
    progress: Progress = NULL_PROGRESS,
) -> Catalog:
    """Read and validate a catalog.

    path: a Parquet file, a directory of them (recursive), or a glob. SIDs come from `sid_column` (list or
    fixed-size list of any integer type) or, when `sid_columns` is given, from those L integer columns.
    codebook_sizes: V_t per step; None (or empty) infers max token + 1 per step (Catalog.codebook_inferred).
    Raises InputError naming file, column, row and item id for every broken rule (see module docstring).
    """
    sizes = tuple(int(v) for v in codebook_sizes) if codebook_sizes else None
    if sizes is not None and any(not 1 <= v <= MAX_CODEBOOK_SIZE for v in sizes):
        raise InputError(f"codebook sizes must be 1..{MAX_CODEBOOK_SIZE}, got {','.join(map(str, sizes))}")
    if sid_columns:
        layout = _SidLayout(None, tuple(sid_columns), len(sid_columns))
    else:
        layout = _SidLayout(sid_column, (), None)

    files = find_catalog_files(path)
    hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerogr-fingerprint")
    try:
        fingerprint_future = hasher.submit(fingerprint_files, files)
        # Pass 1, footers only: every file's schema and row count, so a bad file fails before any data is
        # read and N is known. Files are closed again (a directory may hold thousands of parts).
        item_types, file_rows = [], []
        for name in files:
            with _open(name) as pf:
                schema, rows = pf.schema_arrow, pf.metadata.num_rows
            file_rows.append(rows)
            _check_sid_schema(name, schema, layout)
            item_types.append((name, _item_type(name, schema, item_column)))
            if layout.list_column is not None and pa.types.is_fixed_size_list(schema.field(sid_column).type):
                size = schema.field(sid_column).type.list_size
                if layout.fixed_length is None:
                    layout = _SidLayout(layout.list_column, (), size)
                elif size != layout.fixed_length:
                    raise InputError(
                        f"{name}: column {sid_column!r} holds SIDs of {size} tokens, other files "
                        f"{layout.fixed_length}"
                    )
        if layout.fixed_length == 0:
            raise InputError(f"{files[0]}: column {sid_column!r} holds SIDs of 0 tokens")
        item_type = _common_item_type(item_types, item_column)
        total_rows = sum(file_rows)
        if total_rows == 0:
            raise InputError(f"{path}: empty catalog (no rows in {len(files)} file(s))")

        reader = _Reader(files, layout, item_column, item_type, total_rows, sizes, progress)
        columns = [item_column, *([layout.list_column] if layout.list_column else layout.columns)]
        progress.stage("read", total=total_rows)
        row = 0
        for name, rows in zip(files, file_rows, strict=True):
            reader.file_starts.append(row)
            file_row = 0
            # closing(): on an error the prefetch thread is stopped before the file is closed under it
            with (
                _open(name) as pf,
                contextlib.closing(_prefetched(_iter_batches(name, pf, columns))) as batches,
            ):
                for batch in batches:
                    reader.add_batch(name, batch, file_row, row)
                    file_row += batch.num_rows
                    row += batch.num_rows
                    progress.advance(batch.num_rows)
            if file_row != rows:
                raise InputError(f"{name}: footer says {rows} rows but {file_row} were read")
        # Batches are gone; hand the Arrow pool's cached pages back so the build that follows can use them.
        pa.default_memory_pool().release_unused()
        if reader.sids is None or reader.num_steps is None:
            raise InputError(f"{path}: empty catalog (no SIDs)")
        item_ids = reader.item_array()
        dup = first_duplicate_row(item_ids)
        if dup >= 0:
            name, file_row = reader.locate(dup)
            item = item_ids[dup]
            first_name, first_row = reader.locate(first_row_with_id(item_ids, dup))
            raise InputError(
                f"{name}: column {item_column!r}, {_where(file_row, item)}: duplicate item id "
                f"(first seen at row {first_row} of {first_name})"
            )
        inferred = sizes is None
        if inferred:
            assert reader.step_max is not None
            sizes = tuple(int(m) + 1 for m in reader.step_max)
        fingerprint = fingerprint_future.result()
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
    )
