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

from ..errors import InputError

_GLOB_CHARS = frozenset("*?[")


def find_catalog_files(path: str | Path) -> list[str]:
    """Resolve CATALOG (a Parquet file, a directory searched recursively, or a glob) to sorted file paths.

    In a directory, names starting with "_" or "." are skipped (_SUCCESS markers, .crc files), as
    warehouse exports and pyarrow.dataset do.
    """
    text = str(path)
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
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            files.extend(os.path.join(root, n) for n in names if not n.startswith(("_", ".")))
        if not files:
            raise InputError(f"{text}: directory holds no data files")
        for name in files:
            _refuse_special(name)
        return sorted(files)
    _refuse_special(text)
    return [text]


def _refuse_special(name: str) -> None:
    """A catalog file must be a regular file (after symlinks): a FIFO or device would hang the read or
    never end. Dangling symlinks are left to the Parquet reader, which names them."""
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise InputError(f"{name}: not a regular file (a FIFO, device or socket cannot be a catalog file)")


def fingerprint_files(files: Sequence[str], stop: threading.Event | None = None) -> str:
    """sha256 over the files' bytes: one digest per file, then a digest of those digests in file order.

    stop: when set (the read failed), hashing ends at the next 16 MiB chunk and returns "" instead of
    making the error wait for the whole catalog. Files are opened non-blocking and must be regular."""
    outer = hashlib.sha256()
    for name in files:
        inner = hashlib.sha256()
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError(f"{name}: not a regular file")
            while chunk := fh.read(1 << 24):
                if stop is not None and stop.is_set():
                    return ""
                inner.update(chunk)  # hashlib releases the GIL here, so this overlaps the Parquet read
        outer.update(inner.digest())
    return "sha256:" + outer.hexdigest()
