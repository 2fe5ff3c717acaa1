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
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa

from ..base.errors import InputError, one_line

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

#: Query keys of a URI that would carry a secret (pyarrow's URI options allow some of them).
_SECRET_KEYS = re.compile(r"key|secret|token|passw|credential|signature|auth", re.IGNORECASE)

#: Environment variables whose values are never shown (replaced by *** in any message built here).
_SECRET_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)

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
    """A local catalog argument as a path: file:///x -> /x, anything else unchanged."""
    match = _URI.match(text)
    if match is not None and match.group(1).lower() == "file":
        return urlsplit(text).path or "/"
    return text


def redact(text: str) -> str:
    """`text` with URI credentials (user:password@, secret-looking query values) and the values of the
    standard credential variables replaced by ***."""
    text = re.sub(r"(?<=://)[^/@\s]*@", "***@", text)
    text = re.sub(
        r"([?&][^=&\s]*(?:key|secret|token|passw|credential|signature|auth)[^=&\s]*=)[^&\s]*",
        r"\1***",
        text,
        flags=re.IGNORECASE,
    )
    for name in _SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 4:
            text = text.replace(value, "***")
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


def remote_store(uri: str) -> tuple[RemoteStore, str]:
    """The pyarrow filesystem of `uri` and the path in it; InputError (credentials redacted) for a URI
    that carries credentials or that pyarrow cannot open."""
    parts = urlsplit(uri)
    if "@" in parts.netloc:
        raise InputError(
            f"{redact(uri)}: credentials in a catalog URI are refused (the URI is recorded in the manifest "
            "and shown in messages); give them through the standard environment (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, a profile, or the instance's role)"
        )
    if any(_SECRET_KEYS.search(key) for key, _ in parse_qsl(parts.query, keep_blank_values=True)):
        raise InputError(
            f"{redact(uri)}: credentials in a catalog URI are refused; give them through the standard "
            "environment"
        )
    from pyarrow import fs as pafs

    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise InputError(f"{redact(uri)}: cannot open this URI ({redact(one_line(exc))})") from None
    base = uri.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    tail = path.rstrip("/")
    prefix = base[: len(base) - len(tail)] if tail and base.endswith(tail) else f"{parts.scheme}://"
    return RemoteStore(filesystem, prefix), path.rstrip("/") or path


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
