"""compare's inputs: the model function (`module:function`), the requests files (request ids, or token ids
for a Hugging Face model), the cutoffs K."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..config import parse_int_list

DEFAULT_KS = (1, 5, 10, 20)

ModelFn = Callable[[Any, list], tuple[Sequence[Any], Callable[..., Any]]]


@dataclass(frozen=True)
class Requests:
    """Requests to decode: ids (list, file order) and optional ground-truth next items (same length)."""

    ids: list
    targets: list | None
    source: str = "<memory>"


# ---------------------------------------------------------------------------------------------- inputs


def load_model_fn(spec: str) -> ModelFn:
    """Resolve "package.module:function" (the current directory is importable, like `python -m`)."""
    if ":" not in spec:
        raise InputError(f"--model {spec!r}: expected module:function (e.g. mypkg.recsys:zerogr_model)")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"--model {spec!r}: expected module:function (e.g. mypkg.recsys:zerogr_model)")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"--model {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InputError(f"--model {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"--model {spec!r}: {attr!r} is not callable")
    return target


def read_requests(
    path: str | Path, *, request_column: str = "request_id", target_column: str = "target_item"
) -> Requests:
    """Read a requests Parquet file: `request_column` required, `target_column` optional (may hold nulls).

    Raises InputError naming the file and the missing column.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: requests file not found")
    schema = _requests_schema(path, request_column)
    columns = [request_column] + ([target_column] if target_column in schema.names else [])
    table = pq.read_table(path, columns=columns)
    ids = table.column(request_column).to_pylist()
    if table.num_rows == 0:
        raise InputError(f"{path}: no requests (0 rows)")
    nulls = [i for i, v in enumerate(ids) if v is None]
    if nulls:
        raise InputError(f"{path}: column {request_column!r} row {nulls[0]} is null")
    targets = table.column(target_column).to_pylist() if target_column in schema.names else None
    return Requests(ids=ids, targets=targets, source=str(path))


@dataclass(frozen=True)
class TokenRequests:
    """Requests as model inputs (`zerogr compare --hf-model`): row i of the file is request i.

    requests: Requests with ids 0..n-1 (file rows) and the optional targets; input_ids: n lists of token
    ids (lengths may differ); attention_mask: n lists of 0/1 of the same lengths, or None (all ones).
    """

    requests: Requests
    input_ids: list[list[int]]
    attention_mask: list[list[int]] | None


def read_token_requests(
    path: str | Path,
    *,
    input_column: str = "input_ids",
    mask_column: str = "attention_mask",
    target_column: str = "target_item",
    vocab_size: int | None = None,
    max_length: int | None = None,
) -> TokenRequests:
    """Read a Parquet file of model inputs: `input_column` (list of integers) required, `mask_column`
    (list of 0/1, same length per row) and `target_column` (ground-truth next item, nulls allowed) optional.

    Every row needs at least one token and, with a mask, at least one 1; with vocab_size every token id
    must be in 0..vocab_size-1; with max_length no row may hold more tokens (the model's limit for a
    prompt). InputError naming the file, column and row otherwise.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: requests file not found")
    schema = _requests_schema(path, input_column)
    columns = [c for c in (input_column, mask_column, target_column) if c in schema.names]
    for name in columns[: 2 if mask_column in schema.names else 1]:
        kind = schema.field(name).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
            kind.value_type
        ):
            raise InputError(f"{path}: column {name!r} must be a list of integers, got {kind}")
    try:
        table = pq.read_table(path, columns=columns)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: cannot read ({' '.join(str(exc).split())})") from exc
    if table.num_rows == 0:
        raise InputError(f"{path}: no requests (0 rows)")
    input_ids = table.column(input_column).to_pylist()
    masks = table.column(mask_column).to_pylist() if mask_column in table.column_names else None
    for i, ids in enumerate(input_ids):
        where = f"{path}: column {input_column!r} row {i}"
        if ids is None or not ids:
            raise InputError(f"{where} is {'null' if ids is None else 'empty'}")
        if any(v is None for v in ids):
            raise InputError(f"{where} holds a null token")
        if max_length is not None and len(ids) > max_length:
            raise InputError(f"{where}: {len(ids)} tokens, more than the model takes ({max_length} at most)")
        low, high = min(ids), max(ids)
        if low < 0 or (vocab_size is not None and high >= vocab_size):
            bad = low if low < 0 else high
            limit = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
            raise InputError(f"{where}: token id {bad} outside the model's vocabulary ({limit})")
        if masks is not None:
            mask = masks[i]
            where = f"{path}: column {mask_column!r} row {i}"
            if mask is None or len(mask) != len(ids):
                got = "null" if mask is None else f"{len(mask)} values"
                raise InputError(f"{where}: {got}, {input_column!r} has {len(ids)} tokens")
            if any(v not in (0, 1) for v in mask) or 1 not in mask:
                raise InputError(f"{where}: values must be 0 or 1 with at least one 1")
    targets = table.column(target_column).to_pylist() if target_column in table.column_names else None
    requests = Requests(ids=list(range(table.num_rows)), targets=targets, source=str(path))
    return TokenRequests(requests=requests, input_ids=input_ids, attention_mask=masks)


def parse_ks(text: str | Sequence[int]) -> list[int]:
    """ "1,5,10,20" -> [1, 5, 10, 20] (sorted, distinct, each >= 1)."""
    ks = list(parse_int_list(text, "--k")) if isinstance(text, str) else [int(k) for k in text]
    if not ks or min(ks) < 1:
        raise InputError(f"--k {text!r}: need at least one K >= 1")
    return sorted(set(ks))


def beam_width_for(ks: Sequence[int], beam_width: int | None) -> int:
    """The beam width M of a comparison: beam_width, default max(ks). InputError when M < 1 or some K > M
    (a search keeps M beams per request, so a top-K list with K > M would compare fewer than K items)."""
    m = int(beam_width) if beam_width is not None else max(ks)
    if m < 1:
        raise InputError(f"--beam-width must be >= 1, got {m}")
    if max(ks) > m:
        raise InputError(
            f"--k {max(ks)} is larger than the beam width {m}: a search keeps only {m} beams per request "
            "(raise --beam-width or lower --k)"
        )
    return m


def _requests_schema(path: Path, column: str) -> Any:
    """The Parquet schema of a requests file that must hold `column`; InputError naming the file when it is
    not Parquet or lacks the column."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for non-Parquet input
        raise InputError(f"{path}: not a Parquet file ({' '.join(str(exc).split())})") from exc
    if column not in schema.names:
        raise InputError(f"{path}: missing column {column!r} (columns: {', '.join(schema.names) or 'none'})")
    return schema
