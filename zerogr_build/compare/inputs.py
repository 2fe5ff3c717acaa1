"""compare's inputs: the model function (`module:function`), the requests file, the cutoffs K."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import parse_int_list
from ..errors import InputError

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
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for non-Parquet input
        raise InputError(f"{path}: not a Parquet file ({' '.join(str(exc).split())})") from exc
    if request_column not in schema.names:
        raise InputError(
            f"{path}: missing column {request_column!r} (columns: {', '.join(schema.names) or 'none'})"
        )
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


def parse_ks(text: str | Sequence[int]) -> list[int]:
    """ "1,5,10,20" -> [1, 5, 10, 20] (sorted, distinct, each >= 1)."""
    ks = list(parse_int_list(text, "--k")) if isinstance(text, str) else [int(k) for k in text]
    if not ks or min(ks) < 1:
        raise InputError(f"--k {text!r}: need at least one K >= 1")
    return sorted(set(ks))
