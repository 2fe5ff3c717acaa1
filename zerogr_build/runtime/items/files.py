"""Reading availability and item-set files (ItemMask.from_parquet, ItemSets.from_parquet, `--available`),
as strictly as the catalog reader: a file that is missing, not a regular file, not Parquet, has no rows, or
whose id, flag or set-name column is missing, of the wrong type or holds a null raises InputError naming the
file (and the column and first bad row). Columns are read in their own Arrow type; nothing goes through a
lossy numpy conversion.
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


def _name(path: Any) -> str:
    return os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else str(path)


def read_columns(path: Any, columns: Callable[[pa.Schema], list[str]], what: str) -> pa.Table:
    """The columns that `columns(schema)` names (each must appear exactly once) of the Parquet file `path`,
    refusing anything but a readable regular Parquet file with at least one row. Opened non-blocking, so a
    FIFO cannot hang the read."""
    name = _name(path)
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
            if parquet.metadata.num_rows == 0:
                raise InputError(f"{name}: no rows ({what} must list at least one item)")
            return parquet.read(columns=chosen)
        except InputError:
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(f"{name}: not a readable Parquet file ({one_line(exc)})") from None


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


def read_available_ids(path: Any, item_column: str | None = None,
                       flag_column: str | None = None) -> tuple[pa.Array, str]:  # fmt: skip
    """(ids of the available items, how messages name the id column) of an availability file: item ids in
    `item_column` (default: the first column) and, optionally, a flag column (`flag_column`, default: the
    first boolean column; bool, or integers 0 / 1) saying which of them are available."""
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

    table = read_columns(path, columns, "an availability file")
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


__all__ = ["read_available_ids", "read_columns", "read_set_memberships"]
