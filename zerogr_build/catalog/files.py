"""Finding a catalog's Parquet files (a file, a directory searched recursively, or a glob) and
fingerprinting their bytes."""

from __future__ import annotations

import glob
import hashlib
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..base.errors import InputError, one_line
from ..base.redact import redact
from .storage import (
    HIDDEN_PREFIXES,
    LOCAL,
    RemoteStore,
    Stamp,
    Store,
    changed_error,
    glob_match,
    hidden,
    is_uri,
    local_path,
    remote_store,
)

_GLOB_CHARS = frozenset("*?[")


def find_catalog_files(path: str | Path) -> list[str]:
    """Resolve CATALOG (a Parquet file, a directory searched recursively, or a glob) to sorted file names
    (local paths, or URIs for a catalog on object storage: see locate_catalog).

    In a directory, names starting with "_" or "." are skipped (_SUCCESS markers, .crc files), as
    warehouse exports and pyarrow.dataset do.
    """
    return locate_catalog(path)[1]


def locate_catalog(path: str | Path) -> tuple[Store, list[str]]:
    """The Store CATALOG's files are read through and their sorted names, by the rules of
    find_catalog_files. A URI (s3://bucket/prefix/, gs://..., anything pyarrow.fs.FileSystem.from_uri
    opens) follows the same file / directory / glob rules as a local path and gives the same messages;
    its files are named by URI."""
    text = str(path)
    if is_uri(text):
        store, root = remote_store(text)
        return store, _find_remote(store, text, root)
    return LOCAL, _find_local(local_path(text))


def _find_local(text: str) -> list[str]:
    if any(ch in _GLOB_CHARS for ch in text) and not os.path.exists(text):
        files = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not files:
            raise InputError(f"{text}: no files match this pattern")
        return files
    if not os.path.exists(text):
        raise InputError(f"{text}: no such file or directory")
    if os.path.isdir(text):
        files = []
        for root, dirs, names in os.walk(text):
            dirs[:] = sorted(d for d in dirs if not d.startswith(HIDDEN_PREFIXES))
            files.extend(os.path.join(root, n) for n in names if not n.startswith(HIDDEN_PREFIXES))
        if not files:
            raise InputError(f"{text}: directory holds no data files")
        for name in files:
            _refuse_special(name)
        return sorted(files)
    _refuse_special(text)
    return [text]


def _find_remote(store: RemoteStore, text: str, root: str) -> list[str]:
    """find_catalog_files for a URI: one listing call, the local rules applied to the object paths."""
    from pyarrow import fs as pafs

    shown = redact(text)

    def listing(selector: str | pafs.FileSelector) -> Any:
        try:
            return store.filesystem.get_file_info(selector)
        except FileNotFoundError:
            return [] if isinstance(selector, pafs.FileSelector) else pafs.FileInfo(root)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{shown}: cannot list ({redact(one_line(exc))})") from None

    info = listing(root)
    if info.type == pafs.FileType.NotFound and any(ch in _GLOB_CHARS for ch in root):
        parts = root.split("/")
        fixed = next(i for i, part in enumerate(parts) if any(ch in _GLOB_CHARS for ch in part))
        base = "/".join(parts[:fixed])
        found = listing(pafs.FileSelector(base, recursive=True, allow_not_found=True)) if base else []
        files = sorted(
            store.name(i.path) for i in found if i.type == pafs.FileType.File and glob_match(i.path, root)
        )
        if not files:
            raise InputError(f"{shown}: no files match this pattern")
        return files
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"{shown}: no such file or directory")
    if info.type == pafs.FileType.Directory:
        found = listing(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        files = sorted(
            store.name(i.path)
            for i in found
            if i.type == pafs.FileType.File and not hidden(i.path[len(root) :])
        )
        if not files:
            raise InputError(f"{shown}: directory holds no data files")
        return files
    return [store.name(root)]


def _refuse_special(name: str) -> None:
    """A catalog file must be a regular file (after symlinks): a FIFO or device would hang the read or
    never end. Dangling symlinks are left to the Parquet reader, which names them."""
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise InputError(f"{name}: not a regular file (a FIFO, device or socket cannot be a catalog file)")


def fingerprint_files(
    files: Sequence[str],
    stop: threading.Event | None = None,
    store: Store = LOCAL,
    stamps: list[Stamp] | None = None,
) -> str:
    """sha256 over the files' bytes: one digest per file, then a digest of those digests in file order.
    The same bytes give the same fingerprint wherever they are stored (a local copy, an object store).

    stop: when set (the read failed), hashing ends at the next 16 MiB chunk and returns "" instead of
    making the error wait for the whole catalog. Local files are opened non-blocking and must be regular.
    stamps: when given, each file's Stamp as it was hashed is appended, so the caller can check that the
    bytes hashed are the bytes it read. A file that changes while it is hashed is an InputError
    (storage.changed_error)."""
    outer = hashlib.sha256()
    for name in files:
        digest, stamp = file_digest(name, store, stop)
        if digest is None:
            return ""
        if stamps is not None:
            stamps.append(stamp)
        outer.update(digest)
    return "sha256:" + outer.hexdigest()


def file_digest(
    name: str, store: Store = LOCAL, stop: threading.Event | None = None
) -> tuple[bytes | None, Stamp]:
    """sha256 digest of one file's bytes and its Stamp as hashed (fingerprint_files' per-file digest);
    digest None when `stop` was set. A file that changes while it is hashed is an InputError."""
    inner = hashlib.sha256()
    stream, stamp = store.open_stream(name)
    hashed = 0
    with stream:
        while chunk := stream.read(1 << 24):
            if stop is not None and stop.is_set():
                return None, stamp
            inner.update(chunk)  # hashlib releases the GIL here, so this overlaps the Parquet read
            hashed += len(chunk)
        if hashed != stamp.size or store.stream_stamp(name, stream) != stamp:
            raise changed_error(name)
    return inner.digest(), stamp
