"""Schema checks of a catalog, run on every file's footer before any data is read: where the SID tokens
live, and the one item-id type shared by all files."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ..base.errors import InputError, one_line
from ..base.redact import redact
from .storage import OpenFile


@dataclass(frozen=True)
class SidLayout:
    """Where the SID tokens live: one list column (`list_column`) or L integer columns (`columns`)."""

    list_column: str | None
    columns: tuple[str, ...]
    fixed_length: int | None  # L known from the schema (fixed-size list or separate columns)


def parquet_file(opened: OpenFile, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """A ParquetFile over an already open catalog file (storage.OpenFile): its footer parsed, or, with
    `metadata` (the footer an earlier ParquetFile of the same open file parsed), not read again.
    InputError naming the file when it is not Parquet."""
    try:
        return pq.ParquetFile(opened.handle, metadata=metadata)
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = redact(one_line(exc))
        hint = _convert_hint(opened.name)
        raise InputError(f"{opened.name}: not a readable Parquet file ({reason}){hint}") from None


#: Suffixes of text tables a catalog is sometimes exported as (refused with a one-line conversion hint).
_TEXT_TABLES = (".csv", ".tsv", ".csv.gz", ".tsv.gz", ".txt")


def _convert_hint(name: str) -> str:
    """For a CSV/TSV file: the one-line pyarrow command that converts it to Parquet ("" otherwise)."""
    lower = name.lower()
    if not lower.endswith(_TEXT_TABLES):
        return ""
    options = "" if ".csv" in lower else ", parse_options=c.ParseOptions(delimiter='\\t')"
    out = re.sub(r"\.(csv|tsv|txt)(\.gz)?$", ".parquet", name, flags=re.IGNORECASE)
    return (
        f'; convert it with: python -c "import pyarrow.csv as c, pyarrow.parquet as p; '
        f"p.write_table(c.read_csv('{name}'{options}), '{out}')\" (SID tokens as columns: --sid-columns)"
    )


#: The option that names each kind of catalog column, for a "column not found" error.
COLUMN_OPTIONS = {"sid": "--sid-column (or --sid-columns c0,c1,...)", "sid_columns": "--sid-columns",
                  "item": "--item-column"}  # fmt: skip


def _field(name: str, schema: pa.Schema, column: str, kind: str | None = None) -> pa.Field:
    copies = len(schema.get_all_field_indices(column))
    if copies > 1:
        raise InputError(f"{name}: column {column!r} appears {copies} times")
    index = schema.get_field_index(column)
    if index < 0:
        have = ", ".join(schema.names) or "none"
        hint = f"; name the right one with {COLUMN_OPTIONS[kind]}" if kind else ""
        raise InputError(f"{name}: column {column!r} not found (columns: {have}){hint}")
    return schema.field(index)


def _is_list(tp: pa.DataType) -> bool:
    return pa.types.is_list(tp) or pa.types.is_large_list(tp) or pa.types.is_fixed_size_list(tp)


def check_sid_schema(name: str, schema: pa.Schema, layout: SidLayout) -> None:
    """The SID column(s) of `layout` exist in `schema` with integer (list) types; InputError otherwise."""
    if layout.list_column is not None:
        tp = _field(name, schema, layout.list_column, "sid").type
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
        tp = _field(name, schema, column, "sid_columns").type
        if not pa.types.is_integer(tp):
            raise InputError(f"{name}: column {column!r} has type {tp}; SID token columns must be integers")


def item_id_type(name: str, schema: pa.Schema, column: str) -> pa.DataType:
    """The type of the item-id column (integer or string); InputError for any other."""
    tp = _field(name, schema, column, "item").type
    if pa.types.is_integer(tp) or pa.types.is_string(tp) or pa.types.is_large_string(tp):
        return tp
    raise InputError(f"{name}: column {column!r} has type {tp}; item ids must be integers or strings")


def common_item_type(types: list[tuple[str, pa.DataType]], column: str) -> pa.DataType:
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
