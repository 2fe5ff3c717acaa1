"""What one vLLM request asks of zerogr: `SamplingParams(extra_args={"zerogr": {...}})`, parsed and checked
for shape (no file is read here; catalogs.py opens what it names).

    {"bundle": "bundles/",                # an OUT dir (its LATEST) or a version dir; required
     "sid_map": "sid_map.json",           # a file SidMap.save wrote; required
     "follow": false,                     # OUT dir only: resolve LATEST for every new request
     "include": ["comedy", "drama"],      # item set names (their union), from "item_sets"
     "item_sets": "categories.parquet",   # (set, item_id) rows, as ItemSets.from_parquet reads them
     "exclude": [17, 42],                 # item ids never to return
     "available": "in_stock.parquet"}     # a Parquet file (ItemMask.from_parquet) or a list of ids

Over vLLM's OpenAI server, whose `vllm_xargs` values cannot be objects, the same object may be given as a
JSON string: {"zerogr": "{\"bundle\": \"bundles/\", \"sid_map\": \"sid_map.json\"}"}.

include / exclude / available mean what they mean for Decoder.search (docs/constraints.md): a SID is allowed
iff one of its items is available, in one of the named sets (when any are named) and not excluded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...base.errors import InputError

EXTRA_ARGS_KEY = "zerogr"
KEYS = ("bundle", "sid_map", "follow", "include", "item_sets", "exclude", "available")
MAX_LIST = 1_000_000  # ids or names in one request's list
MAX_JSON = 64 << 20  # characters of the JSON-string form


@dataclass(frozen=True)
class RequestSpec:
    """One request's zerogr arguments, their shapes checked. Lists are tuples (hashable, shared safely)."""

    bundle: str
    sid_map: str
    follow: bool = False
    include: tuple[str, ...] | None = None
    item_sets: str | None = None
    exclude: tuple[Any, ...] | None = None
    available: str | tuple[Any, ...] | None = None

    @property
    def constrained(self) -> bool:
        """True when the request restricts items beyond the catalog."""
        return bool(self.include) or bool(self.exclude) or self.available is not None


def spec_of(extra_args: Mapping[str, Any] | None) -> RequestSpec | None:
    """The RequestSpec of a request's extra_args, None when it does not name zerogr (InputError if bad)."""
    if not extra_args or EXTRA_ARGS_KEY not in extra_args:
        return None
    raw = extra_args[EXTRA_ARGS_KEY]
    if isinstance(raw, str):
        raw = _json_object(raw)
    if not isinstance(raw, Mapping):
        raise InputError(f'extra_args["zerogr"] must be an object, got {type(raw).__name__}')
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise InputError(f'extra_args["zerogr"]: unknown key {unknown[0]!r} (allowed: {", ".join(KEYS)})')
    for key in ("bundle", "sid_map"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise InputError(f'extra_args["zerogr"]["{key}"] must be a path (a non-empty string)')
    follow = raw.get("follow", False)
    if not isinstance(follow, bool):
        raise InputError(f'extra_args["zerogr"]["follow"] must be true or false, got {follow!r}')
    item_sets = raw.get("item_sets")
    if item_sets is not None and (not isinstance(item_sets, str) or not item_sets):
        raise InputError('extra_args["zerogr"]["item_sets"] must be a path to a Parquet file')
    include = _names(raw.get("include"))
    if include and item_sets is None:
        raise InputError('extra_args["zerogr"]["include"] names item sets: give "item_sets" (a Parquet file)')
    available = raw.get("available")
    if available is not None and not isinstance(available, str):
        available = _ids(available, "available")
    elif isinstance(available, str) and not available:
        raise InputError('extra_args["zerogr"]["available"] must be a Parquet file or a list of item ids')
    return RequestSpec(
        bundle=raw["bundle"],
        sid_map=raw["sid_map"],
        follow=follow,
        include=include,
        item_sets=item_sets,
        exclude=_ids(raw.get("exclude"), "exclude"),
        available=available,
    )


def _json_object(text: str) -> Any:
    """The value of a JSON string (the server form of the arguments); InputError when it is not JSON."""
    if len(text) > MAX_JSON:
        raise InputError(f'extra_args["zerogr"]: a JSON string longer than {MAX_JSON} characters')
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f'extra_args["zerogr"] is a string but not JSON ({exc})') from None


def _names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        what = f'extra_args["zerogr"]["include"] must be a list of item set names, got {value!r}'
        raise InputError(what[:200])
    return tuple(value) or None


def _ids(value: Any, key: str) -> tuple[Any, ...] | None:
    """A list of item ids (all integers or all strings), as a tuple; None stays None."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        what = type(value).__name__
        raise InputError(f'extra_args["zerogr"]["{key}"] must be a list of item ids, got {what}')
    if len(value) > MAX_LIST:
        raise InputError(f'extra_args["zerogr"]["{key}"]: {len(value)} ids, more than {MAX_LIST}')
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ints and not all(isinstance(v, str) for v in value):
        bad = [v for v in value if not isinstance(v, (int, str)) or isinstance(v, bool)]
        what = f"got {bad[0]!r}" if bad else "not a mix of both"
        raise InputError(f'extra_args["zerogr"]["{key}"]: item ids must be integers or strings, {what}')
    return tuple(value)


__all__ = ["EXTRA_ARGS_KEY", "KEYS", "RequestSpec", "spec_of"]
