"""The catalog registry the server operator owns: which catalogs requests may name, and what a request may do.

    ZEROGR_VLLM_CATALOGS=/etc/zerogr/catalogs.toml      # read when the engine starts, in every process
    registry = registry_from_env()                      # None when the variable is not set

The file (TOML; paths relative to the file's own directory; every key checked, a misspelt one refused):

    allow_paths_under = ["/srv/zerogr/requests"]  # optional: requests may name files ("available") here
    poll_seconds = 1.0                            # optional: how often a follow catalog's LATEST is read

    [limits]                                      # optional, these are the defaults
    request_ids = 100000                          # ids in one request's "exclude" or "available" list
    request_sets = 256                            # set names in one request's "include"
    request_json_chars = 4194304                  # the JSON-string form of a request's arguments
    request_file_bytes = 67108864                 # a file a request names (under allow_paths_under)
    open_versions = 4                             # bundle versions kept open beyond those requests hold
    filters_per_version = 16                      # availability / item-set combinations kept per version

    [catalogs.movies]                             # a request says {"catalog": "movies", ...}
    bundle = "/srv/zerogr/movies"                 # an OUT dir (its LATEST) or a version dir
    sid_map = "/srv/zerogr/movies-sid-map.json"   # the file SidMap.save wrote
    item_sets = "/srv/zerogr/movie-sets.parquet"  # optional: (set, item_id) rows that "include" names
    availability = "/srv/zerogr/in-stock.parquet" # optional: the catalog's availability (re-read on change)
    follow = true                                 # optional: new requests decode the OUT dir's LATEST

A request names catalogs, never the files behind them. A path in a request is honoured only under
`allow_paths_under`, checked after the path's symlinks and `..` are resolved (`request_file`).
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ...base.errors import InputError
from ...base.small_files import read_small_toml

ENV_VAR = "ZEROGR_VLLM_CATALOGS"
MAX_REGISTRY_BYTES = 1 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOP_KEYS = ("allow_paths_under", "poll_seconds", "limits", "catalogs")
_CATALOG_KEYS = ("bundle", "sid_map", "item_sets", "availability", "follow")


@dataclass(frozen=True)
class Limits:
    """Caps on what one request may ask (registry [limits]); every cache of the engine is bounded by them."""

    request_ids: int = 100_000
    request_sets: int = 256
    request_json_chars: int = 4 << 20
    request_file_bytes: int = 64 << 20
    open_versions: int = 4
    filters_per_version: int = 16


@dataclass(frozen=True)
class CatalogEntry:
    """One registered catalog: real (absolute) paths of its bundle (OUT or version dir) and files."""

    name: str
    bundle: Path
    sid_map: Path
    item_sets: Path | None = None
    availability: Path | None = None
    follow: bool = False


@dataclass(frozen=True)
class FileRefusal:
    """Why a request's path was refused (for the server log only; the client gets one fixed line)."""

    reason: str


@dataclass(frozen=True)
class Registry:
    """The parsed registry file: its catalogs by name, the roots request paths may lie under, the caps."""

    path: Path
    catalogs: dict[str, CatalogEntry]
    allow_paths_under: tuple[Path, ...] = ()
    poll_seconds: float = 1.0
    limits: Limits = Limits()

    def request_file(self, text: str) -> tuple[Path, tuple[int, int, int, int]] | FileRefusal:
        """(real path, identity (st_dev, st_ino, size, mtime_ns)) of a file a request names, when it is an
        absolute path whose real path lies under an allowed root and is a regular file of at most
        limits.request_file_bytes; else a FileRefusal with the reason (log it; never tell the client)."""
        if not self.allow_paths_under:
            return FileRefusal("the registry allows no request paths (allow_paths_under is empty)")
        if "\x00" in text or not os.path.isabs(text):
            return FileRefusal(f"{text[:200]!r} is not an absolute path")
        real = Path(os.path.realpath(text))
        if not any(real.is_relative_to(root) for root in self.allow_paths_under):
            return FileRefusal(f"{text[:200]!r} resolves to {real}, outside allow_paths_under")
        try:
            info = os.stat(real)
        except OSError as exc:
            return FileRefusal(f"{real}: {exc.strerror or exc}")
        if not stat.S_ISREG(info.st_mode):
            return FileRefusal(f"{real}: not a regular file")
        if info.st_size > self.limits.request_file_bytes:
            limit = self.limits.request_file_bytes
            return FileRefusal(f"{real}: {info.st_size} bytes, more than limits.request_file_bytes = {limit}")
        return real, file_identity(info)


def file_identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What a cache keys a file's contents by: (st_dev, st_ino, size, mtime_ns). Another spelling of the
    same path has the same identity; a rewritten file has a new one."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def registry_from_env() -> Registry | None:
    """The registry ZEROGR_VLLM_CATALOGS names (None when unset); InputError naming the file and key."""
    path = os.environ.get(ENV_VAR, "").strip()
    return load_registry(path) if path else None


def load_registry(path: str | Path) -> Registry:
    """Parse and check a registry file (module docstring). Paths are made absolute and real; nothing else
    is opened here (the engine opens the catalogs)."""
    path = Path(path).absolute()
    data = read_small_toml(path, MAX_REGISTRY_BYTES, "catalog registry")
    _known_keys(data, _TOP_KEYS, f"{path}")
    base = path.parent
    roots = data.get("allow_paths_under", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) and r for r in roots):
        raise InputError(f"{path}: allow_paths_under must be a list of directories")
    poll = data.get("poll_seconds", 1.0)
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not math.isfinite(poll) or poll <= 0:
        raise InputError(f"{path}: poll_seconds must be a positive number of seconds, got {poll!r}")
    catalogs = data.get("catalogs", {})
    if not isinstance(catalogs, dict) or not catalogs:
        raise InputError(f"{path}: no [catalogs.NAME] table (a request names one of them)")
    entries = {
        name: _entry(name, table, base, f"{path}: [catalogs.{name}]") for name, table in catalogs.items()
    }
    return Registry(
        path=path,
        catalogs=entries,
        allow_paths_under=tuple(Path(os.path.realpath(base / r)) for r in roots),
        poll_seconds=float(poll),
        limits=_limits(data.get("limits", {}), f"{path}: [limits]"),
    )


def _entry(name: Any, table: Any, base: Path, where: str) -> CatalogEntry:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InputError(f"{where}: a catalog name is 1 to 64 letters, digits, '.', '_' or '-'")
    if not isinstance(table, dict):
        raise InputError(f"{where}: must be a table")
    _known_keys(table, _CATALOG_KEYS, where)
    paths: dict[str, Path | None] = {}
    for key in ("bundle", "sid_map", "item_sets", "availability"):
        value = table.get(key)
        if value is None and key in ("bundle", "sid_map"):
            raise InputError(f"{where}: {key} is required")
        if value is not None and (not isinstance(value, str) or not value):
            raise InputError(f"{where}: {key} must be a path")
        paths[key] = None if value is None else Path(os.path.realpath(base / value))
    follow = table.get("follow", False)
    if not isinstance(follow, bool):
        raise InputError(f"{where}: follow must be true or false, got {follow!r}")
    return CatalogEntry(name=name, follow=follow, **paths)  # type: ignore[arg-type]


def _limits(table: Any, where: str) -> Limits:
    if not isinstance(table, dict):
        raise InputError(f"{where}: must be a table")
    names = tuple(f.name for f in fields(Limits))
    _known_keys(table, names, where)
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{where}: {key} must be a positive integer, got {value!r}")
    return Limits(**table)


def _known_keys(table: dict, known: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in table if k not in known)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(known)})")


__all__ = [
    "ENV_VAR",
    "CatalogEntry",
    "FileRefusal",
    "Limits",
    "Registry",
    "file_identity",
    "load_registry",
    "registry_from_env",
]
