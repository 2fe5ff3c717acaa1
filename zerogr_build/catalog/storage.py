"""Where a catalog's files live, and how each is opened once and checked for change while it is read.

Local paths are read through the OS (Arrow's own file for UTF-8 names, a Python file otherwise), as fast
as ever. A URI (`s3://bucket/prefix/`, `gs://...`, anything `pyarrow.fs.FileSystem.from_uri` opens) is
read through that pyarrow filesystem; credentials and the endpoint come from the provider's standard
environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...), never from the URI: a URI
with credentials in it is refused, because the catalog argument is recorded in the manifest and shown in
messages. `file://` URIs are local paths.

A file's Stamp says which bytes an open file holds: (size, device, inode, mtime in ns) locally, (size,
mtime) for an object store. Every open of a catalog file during one read (footer, data, fingerprint) must
show the stamp of the first; a file replaced (by rename or by a new upload) or rewritten in place between
them is refused with `changed_error`, naming it.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import IO, Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from ..base.errors import InputError, one_line
from ..base.redact import has_credentials, redact, redact_url

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: Wildcards of a catalog glob (Python's glob rules).
_WILDCARDS = frozenset("*?[")
#: URI options at the end of a catalog URI: `?name=value&name=value`, nothing after them holding a `/`.
_OPTION = r"[A-Za-z_][A-Za-z0-9_.-]*=[^&/?#]*"
_URI_OPTIONS = re.compile(rf"\?{_OPTION}(?:&{_OPTION})*$")

#: Skipped names in a catalog directory (_SUCCESS markers, .crc files), as warehouse exports and
#: pyarrow.dataset skip them.
HIDDEN_PREFIXES = ("_", ".")


@dataclass(frozen=True)
class Stamp:
    """Which bytes an open file holds: its size and the rest of its identity (local: st_dev, st_ino,
    st_mtime_ns; object store: mtime in ns)."""

    size: int
    identity: tuple[int, ...]


def is_uri(text: str) -> bool:
    """True for `scheme://...` other than file:// (those are local paths)."""
    match = _URI.match(text)
    return match is not None and match.group(1).lower() != "file"


def local_path(text: str) -> str:
    """A local catalog argument as a path: file:///x -> /x (the host, if any, dropped; `?` and `[` kept as
    the glob characters they are in a path), anything else unchanged."""
    match = _URI.match(text)
    if match is not None and match.group(1).lower() == "file":
        rest = text[match.end() :]
        return rest[rest.index("/") :] if "/" in rest else "/"
    return text


def changed_error(name: str) -> InputError:
    """The refusal of a file that changed while one read was under way."""
    return InputError(
        f"{name}: the file changed while it was being read (replaced or rewritten during the build); run "
        "again once its writer is done"
    )


class OpenFile:
    """One open catalog file: `handle` (what pq.ParquetFile reads; ReadAt on it is thread-safe) and the
    Stamp it had when opened. `check` compares the file as it is now with that stamp."""

    def __init__(self, store: Store, name: str, handle: Any, stamp: Stamp, fd: int = -1) -> None:
        """fd: the OS file descriptor of a local file (for fstat), -1 for an object."""
        self.store, self.name, self.handle, self.stamp, self.fd = store, name, handle, stamp, fd

    def check(self, expected: Stamp | None = None) -> None:
        """InputError (changed_error) unless the file still shows `expected` (default: its opening stamp)."""
        now = self.store.current_stamp(self)
        if now != (expected or self.stamp):
            raise changed_error(self.name)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store:
    """The local disk. Names are paths (str, possibly surrogate-escaped when not UTF-8)."""

    remote = False

    def open(self, name: str) -> OpenFile:
        """Open `name` for random access; InputError naming it when it cannot be opened or is not a
        regular file."""
        try:
            try:
                name.encode("utf-8")
                handle: Any = pa.OSFile(name, "r")
                fd = handle.fileno()
            except UnicodeEncodeError:  # Arrow takes UTF-8 paths only: one Python file, one Arrow wrapper
                raw = open(name, "rb")  # noqa: SIM115 - closed with the wrapper
                handle, fd = pa.PythonFile(raw, mode="r"), raw.fileno()
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{name}: cannot open ({one_line(exc)})") from None
        opened = OpenFile(self, name, handle, Stamp(0, ()), fd)
        try:
            opened.stamp = self.current_stamp(opened)
        except BaseException:
            handle.close()
            raise
        return opened

    def current_stamp(self, opened: OpenFile) -> Stamp:
        info = os.fstat(opened.fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{opened.name}: not a regular file")
        return Stamp(info.st_size, (info.st_dev, info.st_ino, info.st_mtime_ns))

    def open_stream(self, name: str) -> tuple[IO[bytes], Stamp]:
        """`name` for one sequential read (non-blocking open: a FIFO swapped in cannot hang it) and its
        stamp."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise InputError(f"{name}: cannot open ({one_line(exc)})") from None
        fh = open(fd, "rb")  # noqa: SIM115 - the caller closes it
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            fh.close()
            raise InputError(f"{name}: not a regular file")
        return fh, Stamp(info.st_size, (info.st_dev, info.st_ino, info.st_mtime_ns))

    def stream_stamp(self, name: str, stream: IO[bytes]) -> Stamp:
        info = os.fstat(stream.fileno())
        return Stamp(info.st_size, (info.st_dev, info.st_ino, info.st_mtime_ns))


class RemoteStore(Store):
    """A pyarrow filesystem. Names are URIs (`prefix` + the filesystem's path), never with credentials."""

    remote = True

    def __init__(self, filesystem: Any, prefix: str) -> None:
        self.filesystem, self.prefix = filesystem, prefix

    def path(self, name: str) -> str:
        return name[len(self.prefix) :]

    def name(self, path: str) -> str:
        return self.prefix + path

    def info_stamp(self, name: str) -> Stamp:
        from pyarrow import fs as pafs

        try:
            info = self.filesystem.get_file_info(self.path(name))
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{name}: cannot read ({redact(one_line(exc))})") from None
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"{name}: no such object")
        if info.type != pafs.FileType.File:
            raise InputError(f"{name}: not a file")
        return Stamp(int(info.size), (int(info.mtime_ns or 0),))

    def open(self, name: str) -> OpenFile:
        stamp = self.info_stamp(name)
        try:
            handle = self.filesystem.open_input_file(self.path(name))
        except FileNotFoundError:
            raise InputError(f"{name}: no such object") from None
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{name}: cannot open ({redact(one_line(exc))})") from None
        opened = OpenFile(self, name, handle, stamp)
        if handle.size() != stamp.size:
            handle.close()
            raise changed_error(name)
        return opened

    def current_stamp(self, opened: OpenFile) -> Stamp:
        return self.info_stamp(opened.name)

    def open_stream(self, name: str) -> tuple[IO[bytes], Stamp]:
        stamp = self.info_stamp(name)
        try:
            return self.filesystem.open_input_stream(self.path(name)), stamp
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{name}: cannot read ({redact(one_line(exc))})") from None

    def stream_stamp(self, name: str, stream: IO[bytes]) -> Stamp:
        return self.info_stamp(name)


LOCAL = Store()


def split_glob_uri(uri: str) -> tuple[str, str, str]:
    """(fixed, pattern, options) of a catalog URI `scheme://bucket/path[?options]`.

    fixed: the URI up to the first path component holding a wildcard (`*`, `?`, `[`), the whole URI
    without one; pattern: the rest ("" without a wildcard); options: a trailing query of `name=value`
    pairs joined by `&` with no `/` after its `?` ("" without one; any other `?` is a wildcard). Only
    fixed + options reach the URI parser, so a glob's `?` is never read as a query nor its `[` as URI
    syntax. InputError for a wildcard in the bucket (authority)."""
    options = _URI_OPTIONS.search(uri)
    if options is not None:
        uri = uri[: options.start()]
    scheme = _URI.match(uri)
    head = uri[: scheme.end()] if scheme else ""
    parts = uri[len(head) :].split("/")
    if any(ch in _WILDCARDS for ch in parts[0]):
        raise InputError(f"{redact(uri)}: a wildcard in the bucket name is not supported; only in the path")
    wild = next((i for i, part in enumerate(parts) if i and any(ch in _WILDCARDS for ch in part)), None)
    tail = options.group(0) if options is not None else ""
    if wild is None:
        return uri, "", tail
    return head + "/".join(parts[:wild]), "/".join(parts[wild:]), tail


def remote_store(uri: str) -> tuple[RemoteStore, str]:
    """The pyarrow filesystem of `uri` and the path in it (a glob's wildcards kept: split_glob_uri);
    InputError (credentials redacted) for a URI that carries credentials or that pyarrow cannot open."""
    if has_credentials(uri):
        raise InputError(
            f"{redact_url(uri)}: credentials in a catalog URI are refused (the URI is recorded in the "
            "manifest and shown in messages); give them through the standard environment "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or the instance's role)"
        )
    from pyarrow import fs as pafs

    fixed, pattern, options = split_glob_uri(uri)
    try:
        filesystem, path = pafs.FileSystem.from_uri(fixed + options)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise InputError(f"{redact(uri)}: cannot open this URI ({redact(one_line(exc))})") from None
    base = fixed.split("#", 1)[0].rstrip("/")
    tail = path.rstrip("/")
    if not tail:
        prefix = base
    else:
        prefix = base[: len(base) - len(tail)] if base.endswith(tail) else f"{urlsplit(base).scheme}://"
    if pattern:  # decoded as the parser decodes the fixed part (%20 -> space)
        return RemoteStore(filesystem, prefix), f"{tail}/{unquote(pattern)}"
    return RemoteStore(filesystem, prefix), tail or path


def hidden(relative: str) -> bool:
    """True when a component of `relative` (a path inside a catalog directory) starts with _ or ."""
    return any(part.startswith(HIDDEN_PREFIXES) for part in relative.split("/") if part)


def glob_match(path: str, pattern: str) -> bool:
    """Python's glob(recursive=True) rule for one path: `**` spans whole components (zero or more), `*`,
    `?` and `[...]` stay inside one, and no wildcard matches a component that starts with '.'."""
    parts, pats = tuple(p for p in path.split("/") if p), tuple(p for p in pattern.split("/") if p)

    @functools.cache
    def match(i: int, j: int) -> bool:
        if j == len(pats):
            return i == len(parts)
        if pats[j] == "**":
            if match(i, j + 1):
                return True
            return i < len(parts) and not parts[i].startswith(".") and match(i + 1, j)
        if i == len(parts):
            return False
        if parts[i].startswith(".") and not pats[j].startswith("."):
            return False
        return fnmatchcase(parts[i], pats[j]) and match(i + 1, j + 1)

    return match(0, 0)
