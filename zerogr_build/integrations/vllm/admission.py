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

In vLLM's OpenAI server admission runs on the server's event loop, so it touches no file there: the gate
(gate.py, an ASGI middleware the server is started with) has already, off the loop, opened the file a
request names ("available") and read its Parquet footer, refused a beam search request, and noted the
client's API key; it hands that over as a Ticket (a context variable of the request). A zerogr request that
reaches admission in a server without the gate is refused (NO_GATE), and the log says how to add it.
Outside a server (LLM.generate) there is no gate: admission opens the file itself, within the same caps.
The file admission checked goes to the engine as a RequestFile token (FILE_KEY), so the engine reads that
file, not whatever the name means later.

Admission also refuses the sampling parameters that would make vLLM emit a token the mask forbids
(FORCING): allowed_token_ids, bad_words and structured outputs (their own mask, applied with zerogr's, can
leave no token), thinking_token_budget (it forces a token), min_tokens past the SID (it forbids the EOS
that ends it), and stop_token_ids under min_tokens (they are masked like EOS until then).

What the client hears: one line that quotes only what the request sent. Every path the client may not use
gets the same line, whatever the reason (missing, outside the allowed roots, too large, too many rows, a
symlink, not a file); the reason and the real path go to the server log. An unknown catalog and one the
client's key may not use get the same line, as do an unknown item set and a catalog without item sets. A
registry that cannot be loaded refuses every zerogr request with one fixed line and logs why.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
from vllm.exceptions import VLLMValidationError

from ...base.errors import InputError, ZerogrError, one_line
from ...bundle.reader import load_manifest
from ...runtime.items.files import read_columns
from .announce import FrontBoard
from .live import resolve_entry
from .registry import ENV_VAR, FileRefusal, Registry, RequestFile, load_registry
from .spec import RequestSpec, spec_of

logger = logging.getLogger("vllm.zerogr")
PIN_KEY = "_zerogr_version"  # the version dir name admission chose; the engine decodes exactly that one
FILE_KEY = "_zerogr_file"  # the RequestFile token of the file admission checked (never a client's)
NO_FILE = 'zerogr: "available" names a file this server does not let requests use'
NO_REGISTRY = "zerogr: this server has no usable catalog registry; its log says why"
NO_GATE = "zerogr: this server admits zerogr requests only through its gate; its log says how to add it"
GATE = "zerogr_build.integrations.vllm.gate.ZerogrGate"  # the server's --middleware
SERVER_MODULE = "vllm.entrypoints.serve.middleware.register"  # loaded by a process that built vLLM's server
FORCING = ("allowed_token_ids", "bad_words", "structured_outputs", "thinking_token_budget")
_KINDS = {"int": "integers", "str": "strings", "bytes": "bytes"}


@dataclass
class FrontView:
    """The front end's in-memory view of the registry: everything admit() checks a request against."""

    registry: Registry
    live: FrontBoard  # the versions the engine announced
    set_names: dict[str, frozenset[str] | None]  # catalog -> its item set names (None: no item_sets)
    id_kinds: dict[str, str | None]  # catalog -> the live version's item id kind ("int", "str", "bytes")
    sid_lengths: dict[str, int] = field(default_factory=dict)  # catalog -> the live version's SID length

    @classmethod
    def load(cls, registry: Registry) -> FrontView:
        """Read the engine's versions and every catalog's item set names (once per process)."""
        kinds: dict[str, str | None] = {}
        lengths: dict[str, int] = {}

        def on_change(name: str, version: Path) -> None:
            kinds[name], lengths[name] = id_kind(version), sid_length(version)

        live = FrontBoard(registry, on_change)
        for name, entry in registry.catalogs.items():  # until the engine announces one: LATEST's facts
            if name not in kinds:
                try:
                    version = resolve_entry(entry)
                    kinds[name], lengths[name] = id_kind(version), sid_length(version)
                except (ZerogrError, OSError) as exc:
                    logger.warning("zerogr: catalog %r: %s", name, one_line(exc))
        sets = {
            name: None if entry.item_sets is None else _set_names(entry.item_sets)
            for name, entry in registry.catalogs.items()
        }
        return cls(registry, live, sets, kinds, lengths)


@dataclass
class Ticket:
    """What the server's gate learnt of one HTTP request, for admission: the API key it carried, and per
    file name in its zerogr arguments the RequestFile the gate opened (or why it was refused)."""

    api_key: str | None
    files: dict[str, RequestFile | FileRefusal] = field(default_factory=dict)


TICKET: ContextVar[Ticket | None] = ContextVar("zerogr_ticket", default=None)


def sid_length(version_dir: Path) -> int:
    """L, the tokens of a SID of a version (its manifest's num_steps)."""
    return int(load_manifest(version_dir)["num_steps"])


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
    """validate_params of both processors: refuse a bad zerogr request with one line, else pin its version
    (and the file it names). Requests without extra_args["zerogr"] pass untouched."""
    extra = params.extra_args
    if not extra or "zerogr" not in extra:
        return
    ticket = TICKET.get()
    if ticket is None and SERVER_MODULE in sys.modules:
        logger.error("zerogr: a request reached admission without the gate: start the server with "
                     "--middleware %s", GATE)  # fmt: skip
        raise VLLMValidationError(NO_GATE, parameter="extra_args")
    view = front_view()
    if view is None:
        raise VLLMValidationError(NO_REGISTRY, parameter="extra_args")
    try:
        spec = spec_of(extra, view.registry.limits)
        assert spec is not None
        allowed = None if ticket is None else view.registry.client_catalogs(ticket.api_key)
        _check(spec, view, allowed)
        _check_sampling(params, spec, view)
    except InputError as exc:
        raise VLLMValidationError(f"zerogr: {one_line(exc)}", parameter="extra_args") from None
    pin = view.live.pin(spec.catalog)  # None: the engine has announced none yet; it decodes its own
    pins = {} if pin is None else {PIN_KEY: pin}
    if isinstance(spec.available, str):
        found = _request_file(view.registry, spec.available, ticket)
        if isinstance(found, FileRefusal):
            logger.warning("zerogr: refused a request's available file: %s", found.reason)
            raise VLLMValidationError(NO_FILE, parameter="extra_args")
        pins[FILE_KEY] = found.token()
    kept = {key: value for key, value in extra.items() if key not in (PIN_KEY, FILE_KEY)}
    params.extra_args = kept | pins


def _request_file(registry: Registry, name: str, ticket: Ticket | None) -> RequestFile | FileRefusal:
    """What the gate found for a file name, or (outside a server: no ticket) the file opened here."""
    if ticket is not None:
        return ticket.files.get(name, FileRefusal("the gate saw no such file name in the request"))
    found = registry.open_request_file(name)
    if isinstance(found, FileRefusal):
        return found
    os.close(found[0])
    return found[1]


def _check_sampling(params, spec: RequestSpec, view: FrontView) -> None:
    """InputError unless the request's sampling parameters leave zerogr's mask the last word (FORCING)."""
    for name in FORCING:
        if getattr(params, name, None) not in (None, []):
            how = "narrow the items with include, exclude or available"
            raise InputError(f'"{name}" cannot be combined with a catalog: it could force a token the '
                             f"catalog forbids ({how})")  # fmt: skip
    length = view.sid_lengths.get(spec.catalog)
    min_tokens = int(getattr(params, "min_tokens", 0) or 0)
    if length is not None and min_tokens > length:
        raise InputError(f'"min_tokens" is {min_tokens}, more than the {length} tokens of a SID of catalog '
                         f"{spec.catalog!r} (it would forbid the EOS after the SID)")  # fmt: skip
    if min_tokens and getattr(params, "stop_token_ids", None):
        raise InputError('"stop_token_ids" with "min_tokens" cannot be combined with a catalog: vLLM masks '
                         "them until min_tokens, which could leave no SID token")  # fmt: skip


def _check(spec: RequestSpec, view: FrontView, allowed: frozenset[str] | None) -> None:
    """InputError (quoting only the request) unless the catalog (one of `allowed`, when the client's key
    limits it), its item sets and the ids' kind fit. An unknown catalog and one the client may not use get
    the same line; so do an unknown set and a catalog without item sets."""
    if spec.catalog not in view.registry.catalogs or (allowed is not None and spec.catalog not in allowed):
        raise InputError(f"unknown catalog {spec.catalog!r}")
    if spec.include:
        names = view.set_names[spec.catalog] or frozenset()
        unknown = [n for n in spec.include if n not in names]
        if unknown:
            raise InputError(f"unknown item set {unknown[0][:80]!r} in catalog {spec.catalog!r}")
    kind = view.id_kinds.get(spec.catalog)
    if spec.id_kind is not None and kind is not None and spec.id_kind != kind:
        raise InputError(
            f"item ids are {_KINDS[spec.id_kind]}, catalog {spec.catalog!r} has {_KINDS[kind]} item ids"
        )


__all__ = [
    "FILE_KEY",
    "FORCING",
    "GATE",
    "NO_FILE",
    "NO_GATE",
    "NO_REGISTRY",
    "PIN_KEY",
    "TICKET",
    "FrontView",
    "Ticket",
    "admit",
    "front_view",
    "id_kind",
    "sid_length",
]
