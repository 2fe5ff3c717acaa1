"""Reading availability and item-set files (ItemMask.from_parquet, ItemSets.from_parquet, `--available`),
as strictly as the catalog reader: a file that is missing, not a regular file, not Parquet, has no rows, or
whose id, flag or set-name column is missing, of the wrong type or holds a null raises InputError naming the
file (and the column and first bad row). Columns are read in their own Arrow type; nothing goes through a
lossy numpy conversion.

A file someone else chose (a vLLM request's availability file) is read with caps: `parquet_footer_rows`
reads only the footer (bounded) before any data page, and `max_rows` / `max_bytes` refuse a file whose
footer promises more rows, or whose pages or decoded values would take more bytes, than the caller allows
(Parquet's dictionary and run-length encodings let a small file decode to gigabytes).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...base.errors import InputError, one_line

MAX_FOOTER_BYTES = 1 << 20  # a capped read's Parquet footer (thrift metadata), checked before it is parsed


def _name(path: Any) -> str:
    return os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else str(path)


def parquet_footer_rows(fd: int, name: str) -> int:
    """The row count a Parquet file's footer states, the file given as an open fd (left open). Reads the
    last 8 bytes, then the footer only if it is at most MAX_FOOTER_BYTES; no data page is read. InputError
    when it is not a plain (unencrypted) Parquet file."""
    size = os.fstat(fd).st_size
    tail = os.pread(fd, 8, size - 8) if size >= 12 else b""
    if len(tail) != 8 or tail[4:] != b"PAR1" or os.pread(fd, 4, 0) != b"PAR1":
        raise InputError(f"{name}: not a Parquet file")
    footer = int.from_bytes(tail[:4], "little")
    if footer > min(MAX_FOOTER_BYTES, size - 12):
        raise InputError(f"{name}: a footer of {footer} bytes (at most {MAX_FOOTER_BYTES} are read)")
    try:
        with os.fdopen(os.dup(fd), "rb") as fh:
            return int(pq.read_metadata(fh).num_rows)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{name}: not a readable Parquet file ({one_line(exc)})") from None


def read_columns(path: Any, columns: Callable[[pa.Schema], list[str]], what: str, *, fd: int | None = None,
                 max_rows: int | None = None, max_bytes: int | None = None) -> pa.Table:  # fmt: skip
    """The columns that `columns(schema)` names (each must appear exactly once) of the Parquet file `path`,
    refusing anything but a readable regular Parquet file with at least one row. Opened non-blocking, so a
    FIFO cannot hang the read; or read from `fd`, an fd the caller opened (left open; `path` names it in
    messages). With max_rows / max_bytes, a file whose footer states more rows, whose chosen columns' pages
    take more bytes uncompressed, or whose values decode to more bytes, is refused before it is decoded."""
    name = _name(path)
    if fd is not None:
        fd = os.dup(fd)
    else:
        try:
            fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise InputError(f"{name}: no such file ({what})") from None
        except IsADirectoryError:
            raise InputError(f"{name}: is a directory, not a Parquet file ({what})") from None
        except OSError as exc:
            raise InputError(f"{name}: cannot open ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise InputError(f"{name}: is a directory, not a Parquet file ({what})")
        raise InputError(f"{name}: not a regular file (a FIFO, device or socket cannot be {what})")
    with open(fd, "rb") as fh:
        try:
            if max_bytes is not None:
                parquet_footer_rows(fh.fileno(), name)  # the footer's size checked before it is parsed
            parquet = pq.ParquetFile(fh)
            schema = parquet.schema_arrow
            if not schema.names:
                raise InputError(f"{name}: no columns ({what})")
            chosen = columns(schema)
            for column in chosen:
                copies = len(schema.get_all_field_indices(column))
                if copies != 1:
                    have = ", ".join(schema.names) or "none"
                    problem = "not found" if copies == 0 else f"appears {copies} times"
                    raise InputError(f"{name}: column {column!r} {problem} (columns: {have})")
            rows = parquet.metadata.num_rows
            if rows == 0:
                raise InputError(f"{name}: no rows ({what} must list at least one item)")
            if max_rows is not None and rows > max_rows:
                raise InputError(f"{name}: {rows} rows, more than {max_rows} ({what})")
            if max_bytes is None:
                return parquet.read(columns=chosen)
            return _read_capped(parquet, fh, schema, chosen, max_bytes, f"{name} ({what})")
        except InputError:
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(f"{name}: not a readable Parquet file ({one_line(exc)})") from None


def _read_capped(parquet: pq.ParquetFile, fh, schema: pa.Schema, chosen: list[str], max_bytes: int,
                 where: str) -> pa.Table:  # fmt: skip
    """parquet.read(columns=chosen), refused (InputError) when the chosen columns' pages take more than
    max_bytes uncompressed (from the footer) or their values decode to more (text columns read as
    dictionaries first, their decoded size summed from the dictionary's lengths)."""
    meta = parquet.metadata
    packed = 0
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for i in range(row_group.num_columns):
            chunk = row_group.column(i)
            if chunk.path_in_schema.split(".")[0] in chosen:
                packed += chunk.total_uncompressed_size
    if packed > max_bytes:
        raise InputError(f"{where}: {packed} bytes of pages uncompressed, more than {max_bytes}")
    text = [c for c in chosen if _is_text(schema.field(c).type) or _is_binary(schema.field(c).type)]
    if text:
        fh.seek(0)
        parquet = pq.ParquetFile(fh, metadata=meta, read_dictionary=text)
    table = parquet.read(columns=chosen)
    decoded = 0
    for column in table.columns:
        for chunk in column.chunks:
            if pa.types.is_dictionary(chunk.type):
                lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
                decoded += (pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + 8 * len(chunk)
            else:
                decoded += chunk.nbytes
    if decoded > max_bytes:
        raise InputError(f"{where}: its values decode to {decoded} bytes, more than {max_bytes}")
    return table


def _column(table: pa.Table, column: str) -> pa.Array:
    """One column as a single Array, dictionary-encoded values decoded."""
    array = table.column(column).combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _no_nulls(name: str, column: str, array: pa.Array, what: str) -> None:
    if array.null_count:
        row = int(pc.index(pc.is_null(array), True).as_py())
        raise InputError(f"{name}: column {column!r} row {row} is null ({array.null_count} null rows; "
                         f"{what} cannot be null)")  # fmt: skip


def _is_text(tp: pa.DataType) -> bool:
    return pa.types.is_string(tp) or pa.types.is_large_string(tp)


def _is_binary(tp: pa.DataType) -> bool:
    return pa.types.is_binary(tp) or pa.types.is_large_binary(tp)


def _id_column(name: str, table: pa.Table, column: str) -> pa.Array:
    """The item-id column: integers, strings, binary, or floats (checked to be integral later)."""
    array = _column(table, column)
    tp = array.type
    if not (pa.types.is_integer(tp) or pa.types.is_floating(tp) or _is_text(tp) or _is_binary(tp)):
        raise InputError(f"{name}: column {column!r} has type {tp}; item ids are integers or strings")
    _no_nulls(name, column, array, "an item id")
    return array


def read_available_ids(path: Any, item_column: str | None = None, flag_column: str | None = None, *,
                       fd: int | None = None, max_rows: int | None = None,
                       max_bytes: int | None = None) -> tuple[pa.Array, str]:  # fmt: skip
    """(ids of the available items, how messages name the id column) of an availability file: item ids in
    `item_column` (default: the first column) and, optionally, a flag column (`flag_column`, default: the
    first boolean column; bool, or integers 0 / 1) saying which of them are available. fd, max_rows and
    max_bytes as for read_columns (a file someone else chose)."""
    name = _name(path)
    chosen: list[str] = []

    def columns(schema: pa.Schema) -> list[str]:
        item = item_column or schema.names[0]
        flag = flag_column
        if flag is None:
            flags = [f.name for f in schema if f.name != item and pa.types.is_boolean(f.type)]
            flag = flags[0] if flags else None
        if flag == item:
            raise InputError(f"{name}: the flag column and the item column are both {item!r}")
        chosen[:] = [item] if flag is None else [item, flag]
        return chosen

    table = read_columns(path, columns, "an availability file", fd=fd, max_rows=max_rows, max_bytes=max_bytes)
    item_column = chosen[0]
    flag_column = chosen[1] if len(chosen) > 1 else None
    ids = _id_column(name, table, item_column)
    if flag_column is not None:
        flag = _column(table, flag_column)
        if pa.types.is_integer(flag.type):
            bad = pc.and_(pc.not_equal(flag, 0), pc.not_equal(flag, 1))
            if pc.any(bad).as_py():
                row = int(pc.index(bad, True).as_py())
                raise InputError(f"{name}: flag column {flag_column!r} row {row} is {flag[row].as_py()}, "
                                 "not 0 or 1")  # fmt: skip
            flag = pc.equal(flag, 1)
        elif not pa.types.is_boolean(flag.type):
            raise InputError(f"{name}: flag column {flag_column!r} has type {flag.type}; it must be bool "
                             "(or integers 0 / 1)")  # fmt: skip
        _no_nulls(name, flag_column, flag, "an availability flag")
        ids = ids.filter(flag)
    return ids, f"{name}: column {item_column!r}"


def read_set_memberships(path: Any, set_column: str, item_column: str) -> tuple[np.ndarray, pa.Array, str]:
    """(set name per row: object [n] of str, item ids per row, how messages name the id column) of an
    item-sets file with one (set name, item id) row per membership. Set names: strings (binary must be
    UTF-8) or integers."""
    name = _name(path)
    if set_column == item_column:
        raise InputError(f"{name}: the set column and the item column are both {set_column!r}")
    table = read_columns(path, lambda _: [set_column, item_column], "an item-sets file")
    ids = _id_column(name, table, item_column)
    sets = _column(table, set_column)
    tp = sets.type
    if not (_is_text(tp) or _is_binary(tp) or pa.types.is_integer(tp)):
        raise InputError(f"{name}: column {set_column!r} has type {tp}; set names are strings or integers")
    _no_nulls(name, set_column, sets, "a set name")
    if _is_binary(tp):
        values = sets.to_pylist()
        for row, v in enumerate(values):
            try:
                values[row] = v.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{name}: column {set_column!r} row {row} is not UTF-8 text") from None
    else:
        values = [str(v) for v in sets.to_pylist()] if pa.types.is_integer(tp) else sets.to_pylist()
    names = np.empty(len(values), dtype=object)
    names[:] = values
    return names, ids, f"{name}: column {item_column!r}"


__all__ = [
    "MAX_FOOTER_BYTES",
    "parquet_footer_rows",
    "read_available_ids",
    "read_columns",
    "read_set_memberships",
]
