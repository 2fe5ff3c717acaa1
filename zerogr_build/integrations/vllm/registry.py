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
    request_file_bytes = 67108864                 # a file a request names: on disk, and its ids decoded
    request_file_cache_bytes = 67108864           # the decoded ids of request files kept read, together
    open_versions = 4                             # bundle versions kept open beyond those requests hold
    filters_per_version = 16                      # availability / item-set combinations kept per version

    [catalogs.movies]                             # a request says {"catalog": "movies", ...}
    bundle = "/srv/zerogr/movies"                 # an OUT dir (its LATEST) or a version dir
    sid_map = "/srv/zerogr/movies-sid-map.json"   # the file SidMap.save wrote
    item_sets = "/srv/zerogr/movie-sets.parquet"  # optional: (set, item_id) rows that "include" names
    availability = "/srv/zerogr/in-stock.parquet" # optional: the catalog's availability (re-read on change)
    follow = true                                 # optional: new requests decode the OUT dir's LATEST

    [clients.team-a]                              # optional: a client's scope, by the API key it sends
    api_key_sha256 = "9f86d08...b0f00a08"         # hex SHA-256 of its key (one of vLLM's --api-key)
    catalogs = ["movies"]                         # the catalogs its requests may name

A request names catalogs, never the files behind them. A file in a request is a relative name (at most
MAX_NAME_PARTS plain parts, no "." or "..", MAX_NAME_CHARS characters in all) under one of the roots of
`allow_paths_under`, or the same name after one of the roots; it is opened component by component from the
root with O_NOFOLLOW, so a symlink anywhere below a root is refused (`open_request_file`). Nothing touches
the filesystem before the name passes those caps.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import stat
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ...base.errors import InputError
from ...base.small_files import read_small_toml
from ...runtime.items.files import parquet_footer_rows

ENV_VAR = "ZEROGR_VLLM_CATALOGS"
MAX_REGISTRY_BYTES = 1 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOP_KEYS = ("allow_paths_under", "poll_seconds", "limits", "catalogs", "clients")
_CATALOG_KEYS = ("bundle", "sid_map", "item_sets", "availability", "follow")
_CLIENT_KEYS = ("api_key_sha256", "catalogs")
MAX_NAME_CHARS = 1024  # a request's file name, checked before any filesystem call
MAX_NAME_PARTS = 16  # its "/"-separated parts (each opened with O_NOFOLLOW: one openat per part)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class Limits:
    """Caps on what one request may ask (registry [limits]); every cache of the engine is bounded by them."""

    request_ids: int = 100_000
    request_sets: int = 256
    request_json_chars: int = 4 << 20
    request_file_bytes: int = 64 << 20
    request_file_cache_bytes: int = 64 << 20
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
class Client:
    """A client of the server, known by the SHA-256 of its API key: the catalogs its requests may name."""

    name: str
    key_sha256: bytes
    catalogs: frozenset[str]


@dataclass(frozen=True)
class FileRefusal:
    """Why a request's path was refused (for the server log only; the client gets one fixed line)."""

    reason: str


@dataclass(frozen=True)
class RequestFile:
    """A file a request named, as admission found it: allow_paths_under[root] / name, and its identity
    (st_dev, st_ino, size, mtime_ns) when admission opened it. token() is how admission hands it to the
    engine, which opens the same name and reads it only if the identity is still the same."""

    root: int
    name: str
    identity: tuple[int, int, int, int]

    def token(self) -> str:
        return "/".join(str(v) for v in (self.root, *self.identity)) + "/" + self.name

    @classmethod
    def from_token(cls, token: str) -> RequestFile:
        """The RequestFile of token() (ValueError when it is not one)."""
        parts = token.split("/", 5)
        if len(parts) != 6:
            raise ValueError("not a request file token")
        root, *identity = (int(v) for v in parts[:5])
        return cls(root, parts[5], tuple(identity))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Registry:
    """The parsed registry file: its catalogs by name, the roots request paths may lie under, the caps."""

    path: Path
    catalogs: dict[str, CatalogEntry]
    allow_paths_under: tuple[Path, ...] = ()
    poll_seconds: float = 1.0
    limits: Limits = Limits()
    clients: dict[str, Client] = field(default_factory=dict)

    def client_catalogs(self, api_key: str | None) -> frozenset[str] | None:
        """The catalogs a request with this API key may name: None (every catalog) when the registry has
        no [clients]; else the catalogs of the client whose key it is, none for any other key or none."""
        if not self.clients:
            return None
        if api_key is None:
            return frozenset()
        digest = hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).digest()
        found: frozenset[str] = frozenset()
        for client in self.clients.values():  # every key compared, in constant time
            if hmac.compare_digest(digest, client.key_sha256):
                found = client.catalogs
        return found

    def request_file_name(self, text: str) -> tuple[tuple[int, ...], str] | FileRefusal:
        """(the roots to look under, the relative name) of the file name a request sent, or a FileRefusal;
        only string checks, no filesystem call: at most MAX_NAME_CHARS characters and MAX_NAME_PARTS parts,
        none of them empty, "." or "..". A name after one of the roots names that root only."""
        if not self.allow_paths_under:
            return FileRefusal("the registry allows no request paths (allow_paths_under is empty)")
        if len(text) > MAX_NAME_CHARS:
            return FileRefusal(f"a name of {len(text)} characters, more than {MAX_NAME_CHARS}")
        if "\x00" in text:
            return FileRefusal(f"{text[:200]!r} holds a NUL character")
        roots: tuple[int, ...] = tuple(range(len(self.allow_paths_under)))
        name = text
        if text.startswith("/"):
            under = [i for i, root in enumerate(self.allow_paths_under) if text.startswith(f"{root}/")]
            if not under:
                return FileRefusal(f"{text[:200]!r} is not under allow_paths_under")
            roots, name = (under[0],), text[len(str(self.allow_paths_under[under[0]])) + 1 :]
        parts = name.split("/")
        if len(parts) > MAX_NAME_PARTS:
            return FileRefusal(f"{text[:200]!r}: {len(parts)} parts, more than {MAX_NAME_PARTS}")
        if any(part in ("", ".", "..") or len(part.encode("utf-8", "surrogatepass")) > 255 for part in parts):
            return FileRefusal(f"{text[:200]!r}: not a plain relative name (an empty, '.' or '..' part)")
        return roots, name

    def open_request_file(self, text: str) -> tuple[int, RequestFile] | FileRefusal:
        """(an open fd, the RequestFile) of a file a request names: request_file_name's checks, then the name
        opened part by part from its root with O_NOFOLLOW (a symlink anywhere below the root, a missing
        part or a non-regular file is refused), at most limits.request_file_bytes, and a Parquet file whose
        footer says at most limits.request_ids rows. The caller closes the fd. A FileRefusal holds the
        reason (log it; never tell the client)."""
        found = self.request_file_name(text)
        if isinstance(found, FileRefusal):
            return found
        roots, name = found
        reason = ""
        for root in roots:
            opened = _open_beneath(self.allow_paths_under[root], name)
            if isinstance(opened, int):
                break
            reason = reason or opened
        else:
            return FileRefusal(reason)
        fd = opened
        try:
            where = f"{self.allow_paths_under[root] / name}"
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _Refused(f"{where}: not a regular file")
            limit = self.limits.request_file_bytes
            if info.st_size > limit:
                raise _Refused(
                    f"{where}: {info.st_size} bytes, more than limits.request_file_bytes = {limit}"
                )
            rows = parquet_footer_rows(fd, where)
            if rows > self.limits.request_ids:
                raise _Refused(
                    f"{where}: {rows} rows, more than limits.request_ids = {self.limits.request_ids}"
                )
            return fd, RequestFile(root, name, file_identity(info))
        except _Refused as exc:
            os.close(fd)
            return FileRefusal(str(exc))
        except InputError as exc:
            os.close(fd)
            return FileRefusal(str(exc))
        except BaseException:
            os.close(fd)
            raise

    def reopen_request_file(self, file: RequestFile) -> int:
        """An open fd of a file admission found (RequestFile), if it is still the same file (its identity)
        and still within the caps; InputError saying why not."""
        if not 0 <= file.root < len(self.allow_paths_under):
            raise InputError("a request file token names no root")
        found = self.open_request_file(f"{self.allow_paths_under[file.root]}/{file.name}")
        if isinstance(found, FileRefusal):
            raise InputError(f"request file refused: {found.reason}")
        fd, now = found
        if now.identity != file.identity:
            os.close(fd)
            raise InputError(f"request file {file.name!r} was replaced since the request was admitted")
        return fd


class _Refused(Exception):
    """A request file's reason for refusal, inside open_request_file."""


def _open_beneath(root: Path, name: str) -> int | str:
    """An fd of root/name opened one part at a time, every part with O_NOFOLLOW (a directory part with
    O_DIRECTORY, the last without blocking on a FIFO); else the reason, a string."""
    parts = name.split("/")
    try:
        fd = os.open(root, _OPEN_DIR)
    except OSError as exc:
        return f"{root}: {exc.strerror or exc}"
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                child = os.open(part, _OPEN_FILE if last else _OPEN_DIR, dir_fd=fd)
            except OSError as exc:
                where = root.joinpath(*parts[: i + 1])
                return f"{where}: {exc.strerror or exc} (a symlink, or missing, is refused)"
            os.close(fd)
            fd = child
        opened, fd = fd, -1
        return opened
    finally:
        if fd >= 0:
            os.close(fd)


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
    clients = data.get("clients", {})
    if not isinstance(clients, dict):
        raise InputError(f"{path}: clients must be tables [clients.NAME]")
    return Registry(
        path=path,
        catalogs=entries,
        allow_paths_under=tuple(Path(os.path.realpath(base / r)) for r in roots),
        poll_seconds=float(poll),
        limits=_limits(data.get("limits", {}), f"{path}: [limits]"),
        clients={
            name: _client(name, table, entries, f"{path}: [clients.{name}]")
            for name, table in clients.items()
        },
    )


def _client(name: Any, table: Any, catalogs: dict[str, CatalogEntry], where: str) -> Client:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InputError(f"{where}: a client name is 1 to 64 letters, digits, '.', '_' or '-'")
    if not isinstance(table, dict):
        raise InputError(f"{where}: must be a table")
    _known_keys(table, _CLIENT_KEYS, where)
    key = table.get("api_key_sha256")
    if not isinstance(key, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", key):
        raise InputError(f"{where}: api_key_sha256 must be the 64 hex digits of the SHA-256 of its API key")
    names = table.get("catalogs")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError(f"{where}: catalogs must be a list of catalog names")
    unknown = [n for n in names if n not in catalogs]
    if unknown:
        raise InputError(f"{where}: catalogs names {unknown[0]!r}, which is no [catalogs.NAME]")
    return Client(name, bytes.fromhex(key), frozenset(names))


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
    "MAX_NAME_CHARS",
    "MAX_NAME_PARTS",
    "CatalogEntry",
    "Client",
    "FileRefusal",
    "Limits",
    "Registry",
    "RequestFile",
    "file_identity",
    "load_registry",
    "registry_from_env",
]
