"""Reading a catalog's record batches into one preallocated [N, L] SID array (smallest unsigned dtype), or
packed straight into sort keys (index.pack.PackedSids) when the build asks for that, and one item-id array,
validating every batch on the way (nulls, SID lengths, token ranges)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..base.errors import InputError, one_line
from ..base.memory import fresh_zeros, populate_rows
from ..base.progress import Progress
from ..base.redact import redact
from ..index.pack import PackedSids
from .ids import NUMBA_MIN_ROWS
from .schema import SidLayout

#: Rows per record batch while streaming. Bounds the Arrow-side memory of the read (a few MB per batch).
BATCH_ROWS = 1 << 20

#: Largest codebook the index and bundle format support (tokens are stored as int32 above 65536).
MAX_CODEBOOK_SIZE = 2**31 - 1

#: Item ids longer than this are cut in messages.
MAX_ID_CHARS = 200


def _fresh(shape: int | tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A large zeroed output array that batches are copied into; each batch maps its rows' pages first
    (base.memory.populate_rows: neither a page fault per 4 KiB nor a huge-page compaction stall, and memory is
    committed only for rows that arrive, whatever the footers claim)."""
    return fresh_zeros(shape, dtype)


def unsigned_dtype_for(max_value: int) -> np.dtype:
    """Smallest unsigned dtype holding 0..max_value."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


class BatchReader:
    """State of one read: output arrays, running maxima, and where each file starts (for messages)."""

    def __init__(
        self,
        files: list[str],
        layout: SidLayout,
        item_column: str,
        item_type: pa.DataType,
        total_rows: int,
        codebook_sizes: tuple[int, ...] | None,
        progress: Progress,
        pack: bool = False,
    ) -> None:
        """pack: pack each batch's SIDs into sort keys (self.packed) instead of keeping tokens (self.sids);
        needs codebook_sizes (the caller checks index.pack.packable)."""
        self.files = files
        self.layout = layout
        self.item_column = item_column
        self.item_type = item_type
        self.total_rows = total_rows
        self.codebook_sizes = codebook_sizes
        self.progress = progress
        self.num_steps: int | None = layout.fixed_length
        if codebook_sizes is not None and self.num_steps is not None:
            check_codebook_count(files[0], layout, codebook_sizes, self.num_steps)
        self.dtype = unsigned_dtype_for(max(codebook_sizes) - 1 if codebook_sizes else 0)
        self.sids: np.ndarray | None = None
        self.pack = pack and codebook_sizes is not None
        # Packed: allocated now (L = len(codebook_sizes)), so row groups read on several threads never race
        # to create it.
        self.packed: PackedSids | None = (
            PackedSids.empty(total_rows, codebook_sizes) if self.pack and codebook_sizes else None
        )
        self.step_max: np.ndarray | None = None  # int64 [L], running max token per step (inference)
        self._step_max_lock = threading.Lock()
        self.int_ids = pa.types.is_integer(item_type)
        self.id_values: np.ndarray | None = (
            _fresh(total_rows, item_type.to_pandas_dtype()) if self.int_ids else None
        )
        self.id_chunks: list[tuple[int, pa.Array]] = []  # (first row, ids) of each batch, any arrival order
        self.file_starts: list[int] = []  # global row of each file's first row

    # -- per batch -------------------------------------------------------------------------------
    def add_batch(self, name: str, batch: pa.RecordBatch, file_row: int, row: int) -> None:
        """Validate one batch and copy it into the outputs at global rows [row, row + n).

        Packed reads may call this from several threads at once for disjoint row ranges (row_groups.py):
        every output is written at its own rows, and the one shared running value (step_max) is locked."""
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
            populate_rows(self.id_values, row, row + n)
            self.id_values[row : row + n] = items.to_numpy(zero_copy_only=False)
        else:
            same_type = items.type == self.item_type
            self.id_chunks.append((row, items if same_type else items.cast(self.item_type)))

    def _list_tokens(self, name: str, batch: pa.RecordBatch, items: pa.Array, file_row: int) -> np.ndarray:
        """List column -> tokens [n, L] (a zero-copy view of the batch's values where possible)."""
        column = self.layout.list_column
        assert column is not None
        arr = batch.column(column)
        n = len(arr)
        if arr.null_count:
            bad = int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])
            raise InputError(
                f"{name}: column {column!r}, {describe_row(file_row + bad, items[bad])}: SID is null"
            )
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
                        f"{name}: column {column!r}, {describe_row(file_row + bad, items[bad])}: SID has "
                        f"{int(lengths[bad])} tokens, expected {self.num_steps} (the length of the first SID)"
                    )
        values = arr.flatten()  # respects slicing; no nulls at list level, so exactly n * L values
        if values.null_count:
            flat = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
            bad = flat // max(self.num_steps or 1, 1)
            raise InputError(
                f"{name}: column {column!r}, {describe_row(file_row + bad, items[bad])}: "
                f"token {flat % (self.num_steps or 1)} of the SID is null"
            )
        if self.num_steps is None:  # an empty batch before L is known
            return np.zeros((0, 0), dtype=np.uint8)
        return values.to_numpy(zero_copy_only=False).reshape(n, self.num_steps)

    def _first_length_set(self, name: str, column: str) -> None:
        if self.num_steps == 0:
            raise InputError(f"{name}: column {column!r}, row 0: SID is empty (0 tokens)")
        if self.codebook_sizes is not None:
            check_codebook_count(name, self.layout, self.codebook_sizes, self.num_steps)

    def _column_tokens(self, name: str, batch: pa.RecordBatch, items: pa.Array, file_row: int) -> np.ndarray:
        """L integer columns -> tokens [n, L] (one copy, column by column)."""
        columns = self.layout.columns
        arrays = [batch.column(c) for c in columns]
        for column, arr in zip(columns, arrays, strict=True):
            if arr.null_count:
                bad = int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])
                where = describe_row(file_row + bad, items[bad])
                raise InputError(f"{name}: column {column!r}, {where}: SID token is null")
        dtype = np.result_type(*[arr.type.to_pandas_dtype() for arr in arrays])
        if dtype.kind == "f":
            # uint64 next to signed columns: numpy's common type is float64, which would round tokens and
            # turn 2^64-1 into another token. int64 holds every valid token; larger ones are refused here.
            dtype = np.dtype(np.int64)
            self._refuse_huge_uint64(name, columns, arrays, items, file_row)
        block = np.empty((batch.num_rows, len(columns)), dtype=dtype)
        for t, arr in enumerate(arrays):
            block[:, t] = arr.to_numpy(zero_copy_only=False)
        return block

    def _refuse_huge_uint64(
        self, name: str, columns: tuple[str, ...], arrays: list[pa.Array], items: pa.Array, file_row: int
    ) -> None:
        """The first token above int64's range in a uint64 column: InputError, as _check_range words it."""
        int64_max = np.uint64(np.iinfo(np.int64).max)
        for t, (column, arr) in enumerate(zip(columns, arrays, strict=True)):
            if arr.type != pa.uint64():
                continue
            values = arr.to_numpy(zero_copy_only=False)
            over = np.flatnonzero(values > int64_max)
            if over.size:
                row = int(over[0])
                size = (self.codebook_sizes or (MAX_CODEBOOK_SIZE,) * len(columns))[t]
                raise InputError(
                    f"{name}: column {column!r}, {describe_row(file_row + row, items[row])}: "
                    f"token {int(values[row])} at step {t} is >= codebook size {size}"
                )

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
            from ._kernels import step_min_max  # numba: compiled on first use, cached

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
                f"{name}: {self._column_at(t)}, {describe_row(file_row + row, items[row])}: "
                f"token {token} at step {t} {rule}"
            )
        with self._step_max_lock:
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
        if self.pack:
            assert self.packed is not None
            self.packed.pack_into(block, row)
            return
        if self.sids is None:
            assert self.num_steps is not None
            self.sids = _fresh((self.total_rows, self.num_steps), self.dtype)
        if self.codebook_sizes is None and self.step_max is not None:
            needed = unsigned_dtype_for(int(self.step_max.max()))
            if needed.itemsize > self.sids.dtype.itemsize:
                # Inferred sizes only: widen once when a larger token first shows up (rows so far are copied;
                # with real catalogs this happens in the first batch, when nothing has been stored yet).
                wider = _fresh(self.sids.shape, needed)
                populate_rows(wider, 0, row)
                wider[:row] = self.sids[:row]
                self.sids = wider
        populate_rows(self.sids, row, row + n)
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
        chunks = [ids for _, ids in sorted(self.id_chunks, key=lambda chunk: chunk[0])]
        try:
            return pa.concat_arrays(chunks)
        except pa.ArrowInvalid:  # more than 2 GiB of string data: needs 64-bit offsets
            return pa.concat_arrays([c.cast(pa.large_string()) for c in chunks])

    def locate(self, row: int) -> tuple[str, int]:
        """Global row -> (file, row within file)."""
        k = int(np.searchsorted(np.asarray(self.file_starts), row, side="right")) - 1
        return self.files[k], row - self.file_starts[k]


def describe_row(row: int, item: pa.Scalar) -> str:
    """ "row R (item id X)", the locator every per-row message of the reader uses."""
    text = repr(item.as_py())
    if len(text) > MAX_ID_CHARS:  # a 2 MB id must not make a 2 MB error line
        text = f"{text[:MAX_ID_CHARS]}... ({len(text)} chars)"
    return f"row {row} (item id {text})"


def check_codebook_count(name: str, layout: SidLayout, sizes: tuple[int, ...], num_steps: int) -> None:
    """One codebook size per SID token; InputError naming the file otherwise."""
    if len(sizes) != num_steps:
        what = (
            f"column {layout.list_column!r} holds SIDs of {num_steps} tokens"
            if layout.list_column is not None
            else f"{num_steps} SID columns given"
        )
        raise InputError(f"{name}: {len(sizes)} codebook sizes given but {what}")


def iter_batches(
    name: str,
    pf: pq.ParquetFile,
    columns: list[str],
    groups: Sequence[int] | None = None,
    use_threads: bool = True,
) -> Iterator[pa.RecordBatch]:
    """Stream the batches of a file's row groups (`groups`, default all, in order); a corrupt page becomes
    an InputError naming the file. use_threads: let Arrow decode columns on its own threads."""
    # One reader per row group: a reader over the whole file decodes row groups ahead and holds several
    # hundred MB of Arrow buffers at once; per group, Arrow memory stays at one group's batches.
    for group in range(pf.num_row_groups) if groups is None else groups:
        it = pf.iter_batches(
            batch_size=BATCH_ROWS, row_groups=[group], columns=columns, use_threads=use_threads
        )
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(
                    f"{name}: unreadable Parquet data in row group {group} ({redact(one_line(exc))})"
                ) from None
            yield batch
