"""The admission check both processors' validate_params run (in vLLM's front end, when a request arrives).

    admit(sampling_params)   # VLLMValidationError with one line, or the request may run

It checks a request's zerogr arguments against the registry (registry.py) and writes the version the request
will decode into the request (PIN_KEY in its extra_args; any value the client put there is replaced or
removed), so the engine, every one of its workers and a preempted request all decode the version the
request was checked against. The version is one the engine has opened and accepted: the engine announces
those (announce.py), and the front end pins the newest one every engine process holds, or none (the engine
then decodes its own serving version) before the engine has announced any; a version the engine refused is
never pinned.
Nothing is read from disk per request: the front end's view of the registry (catalog names, item set
names, the kind of item ids, the engine's versions, kept current by FrontBoard's thread) is built the
first time a process admits a zerogr request and rebuilt only when ZEROGR_VLLM_CATALOGS names another file.
A path in a request ("available") costs a realpath and a stat, never a read.

What the client hears: one line that quotes only what the request sent. Every path the client may not use
gets the same line, whatever the reason (missing, outside the allowed roots, too large, not a file); the
reason and the real path go to the server log. A registry that cannot be loaded refuses every zerogr
request with one fixed line and logs why.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
from vllm.exceptions import VLLMValidationError

from ...base.errors import InputError, ZerogrError, one_line
from ...bundle.reader import load_manifest
from ...runtime.items.files import read_columns
from .announce import FrontBoard
from .registry import ENV_VAR, FileRefusal, Registry, load_registry
from .spec import RequestSpec, spec_of

logger = logging.getLogger("vllm.zerogr")
PIN_KEY = "_zerogr_version"  # the version dir name admission chose; the engine decodes exactly that one
NO_FILE = 'zerogr: "available" names a file this server does not let requests use'
NO_REGISTRY = "zerogr: this server has no usable catalog registry; its log says why"
_KINDS = {"int": "integers", "str": "strings", "bytes": "bytes"}


@dataclass
class FrontView:
    """The front end's in-memory view of the registry: everything admit() checks a request against."""

    registry: Registry
    live: FrontBoard  # the versions the engine announced
    set_names: dict[str, frozenset[str] | None]  # catalog -> its item set names (None: no item_sets)
    id_kinds: dict[str, str | None]  # catalog -> the live version's item id kind ("int", "str", "bytes")

    @classmethod
    def load(cls, registry: Registry) -> FrontView:
        """Read the engine's versions and every catalog's item set names (once per process)."""
        kinds: dict[str, str | None] = {}

        def on_change(name: str, version: Path) -> None:
            kinds[name] = id_kind(version)

        live = FrontBoard(registry, on_change)
        sets = {
            name: None if entry.item_sets is None else _set_names(entry.item_sets)
            for name, entry in registry.catalogs.items()
        }
        return cls(registry, live, sets, kinds)


def id_kind(version_dir: Path) -> str | None:
    """ "int", "str" or "bytes": the kind of a version's item ids, from its manifest (None if unknown)."""
    name = str(load_manifest(version_dir)["leaves"].get("item_id_type", ""))
    if name.startswith(("int", "uint")):
        return "int"
    if name in ("string", "large_string", "utf8", "large_utf8"):
        return "str"
    if name in ("binary", "large_binary"):
        return "bytes"
    return None


def _set_names(path: Path) -> frozenset[str]:
    """The distinct set names of an item-sets file: its "set" column only (the engine reads the rest)."""
    column = read_columns(path, lambda _schema: ["set"], "an item-sets file").column("set")
    names = pc.unique(column).to_pylist()
    return frozenset(n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names)


_VIEW_LOCK = threading.Lock()
_VIEW: tuple[str, FrontView | None] | None = None  # (the registry path it was built from, the view)


def front_view() -> FrontView | None:
    """This process's FrontView of the registry ZEROGR_VLLM_CATALOGS names (None, logged, when it is unset
    or cannot be loaded; tried again only when the variable changes)."""
    global _VIEW
    path = os.environ.get(ENV_VAR, "").strip()
    with _VIEW_LOCK:
        if _VIEW is not None and _VIEW[0] == path:
            return _VIEW[1]
        if _VIEW is not None and _VIEW[1] is not None:
            _VIEW[1].live.close()
        view = None
        if not path:
            logger.error("zerogr: %s is not set: every zerogr request is refused", ENV_VAR)
        else:
            try:
                view = FrontView.load(load_registry(path))
            except (ZerogrError, OSError) as exc:
                logger.error("zerogr: the catalog registry cannot be loaded: %s", one_line(exc))
        _VIEW = (path, view)
        return view


def admit(params) -> None:
    """validate_params of both processors: refuse a bad zerogr request with one line, else pin its version.
    Requests without extra_args["zerogr"] pass untouched."""
    extra = params.extra_args
    if not extra or "zerogr" not in extra:
        return
    view = front_view()
    if view is None:
        raise VLLMValidationError(NO_REGISTRY, parameter="extra_args")
    try:
        spec = spec_of(extra, view.registry.limits)
        assert spec is not None
        _check(spec, view)
    except InputError as exc:
        raise VLLMValidationError(f"zerogr: {one_line(exc)}", parameter="extra_args") from None
    if isinstance(spec.available, str):
        found = view.registry.request_file(spec.available)
        if isinstance(found, FileRefusal):
            logger.warning("zerogr: refused a request's available file: %s", found.reason)
            raise VLLMValidationError(NO_FILE, parameter="extra_args")
    pin = view.live.pin(spec.catalog)  # None: the engine has announced none yet; it decodes its own
    params.extra_args = {k: v for k, v in extra.items() if k != PIN_KEY} | (
        {} if pin is None else {PIN_KEY: pin}
    )


def _check(spec: RequestSpec, view: FrontView) -> None:
    """InputError (quoting only the request) unless the catalog, its item sets and the ids' kind fit."""
    if spec.catalog not in view.registry.catalogs:
        raise InputError(f"unknown catalog {spec.catalog!r}")
    if spec.include:
        names = view.set_names[spec.catalog]
        if names is None:
            raise InputError(f'catalog {spec.catalog!r} has no item sets to "include"')
        unknown = [n for n in spec.include if n not in names]
        if unknown:
            raise InputError(f"unknown item set {unknown[0][:80]!r} in catalog {spec.catalog!r}")
    kind = view.id_kinds.get(spec.catalog)
    if spec.id_kind is not None and kind is not None and spec.id_kind != kind:
        raise InputError(
            f"item ids are {_KINDS[spec.id_kind]}, catalog {spec.catalog!r} has {_KINDS[kind]} item ids"
        )


__all__ = ["NO_FILE", "NO_REGISTRY", "PIN_KEY", "FrontView", "admit", "front_view", "id_kind"]
