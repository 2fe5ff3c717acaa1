"""What one vLLM request asks of zerogr: `SamplingParams(extra_args={"zerogr": {...}})`, parsed and checked
for shape and size (no file is read here).

    {"catalog": "movies",                 # a catalog of the server's registry (registry.py); required
     "include": ["comedy", "drama"],      # item set names (their union), from the catalog's item_sets
     "exclude": [17, 42],                 # item ids never to return (ids the version lacks are ignored)
     "available": [3, 17, 99]}            # the ids that may be returned (within the catalog's availability),
                                          # or a Parquet file under the registry's allow_paths_under

Over vLLM's OpenAI server, whose `vllm_xargs` values cannot be objects, the same object may be given as a
JSON string: {"zerogr": "{\"catalog\": \"movies\"}"}.

include / exclude / available mean what they mean for Decoder.search (docs/constraints.md): a SID is allowed
iff one of its items is available, in one of the named sets (when any are named) and not excluded. Every
message here quotes only what the request itself sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...base.errors import InputError
from .registry import NAME, Limits

EXTRA_ARGS_KEY = "zerogr"
KEYS = ("catalog", "include", "exclude", "available")
SERVER_KEYS = ("bundle", "sid_map", "item_sets", "follow")  # the registry's, never a request's


@dataclass(frozen=True)
class RequestSpec:
    """One request's zerogr arguments, their shapes checked. Lists are tuples (hashable, shared safely);
    id_kind is "int" or "str" when the request lists ids, else None."""

    catalog: str
    include: tuple[str, ...] | None = None
    exclude: tuple[Any, ...] | None = None
    available: str | tuple[Any, ...] | None = None
    id_kind: str | None = None

    @property
    def constrained(self) -> bool:
        """True when the request restricts items beyond the catalog's own availability."""
        return bool(self.include) or bool(self.exclude) or self.available is not None


def spec_of(extra_args: Mapping[str, Any] | None, limits: Limits) -> RequestSpec | None:
    """The RequestSpec of a request's extra_args, None when it does not name zerogr (InputError if bad)."""
    if not extra_args or EXTRA_ARGS_KEY not in extra_args:
        return None
    raw = extra_args[EXTRA_ARGS_KEY]
    if isinstance(raw, str):
        raw = _json_object(raw, limits.request_json_chars)
    if not isinstance(raw, Mapping):
        raise InputError(f'extra_args["zerogr"] must be an object, got {type(raw).__name__}')
    for key in raw:
        if key in SERVER_KEYS:
            raise InputError(f'extra_args["zerogr"]: {key!r} is set by the server; name a "catalog"')
        if key not in KEYS:
            shown = repr(key)[:60] if isinstance(key, str) else type(key).__name__
            raise InputError(f'extra_args["zerogr"]: unknown key {shown} (allowed: {", ".join(KEYS)})')
    catalog = raw.get("catalog")
    if not isinstance(catalog, str) or not NAME.fullmatch(catalog):
        raise InputError('extra_args["zerogr"]["catalog"] must name a catalog of this server')
    include = _names(raw.get("include"), limits.request_sets)
    exclude, kinds = _ids(raw.get("exclude"), "exclude", limits.request_ids)
    available = raw.get("available")
    if isinstance(available, str):
        if not available:
            raise InputError('extra_args["zerogr"]["available"] must be a list of item ids or a file')
    else:
        available, more = _ids(available, "available", limits.request_ids)
        kinds |= more
    if len(kinds) > 1:
        raise InputError('extra_args["zerogr"]: "exclude" and "available" list ids of different kinds')
    return RequestSpec(catalog, include, exclude, available, next(iter(kinds), None))


def _json_object(text: str, limit: int) -> Any:
    """The value of a JSON string (the server form of the arguments); InputError when it is not JSON."""
    if len(text) > limit:
        raise InputError(f'extra_args["zerogr"]: a JSON string longer than {limit} characters')
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f'extra_args["zerogr"] is a string but not JSON ({str(exc)[:100]})') from None


def _names(value: Any, limit: int) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InputError('extra_args["zerogr"]["include"] must be a list of item set names')
    if len(value) > limit:
        raise InputError(f'extra_args["zerogr"]["include"]: {len(value)} set names, more than {limit}')
    return tuple(value) or None


def _ids(value: Any, key: str, limit: int) -> tuple[tuple[Any, ...] | None, set[str]]:
    """(a list of item ids as a tuple, {its kind}) - all integers or all strings; None stays None."""
    if value is None:
        return None, set()
    if not isinstance(value, (list, tuple)):
        what = type(value).__name__
        raise InputError(f'extra_args["zerogr"]["{key}"] must be a list of item ids, got {what}')
    if len(value) > limit:
        raise InputError(f'extra_args["zerogr"]["{key}"]: {len(value)} ids, more than {limit}')
    if not value:
        return (None if key == "exclude" else ()), set()  # nothing available is a real answer
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value), {"int"}
    if all(isinstance(v, str) for v in value):
        return tuple(value), {"str"}
    bad = [v for v in value if not isinstance(v, (int, str)) or isinstance(v, bool)]
    what = f"got {repr(bad[0])[:40]}" if bad else "not a mix of both"
    raise InputError(f'extra_args["zerogr"]["{key}"]: item ids must be integers or strings, {what}')


__all__ = ["EXTRA_ARGS_KEY", "KEYS", "RequestSpec", "spec_of"]
