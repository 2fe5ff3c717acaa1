"""Locks for an OUT dir: the exclusive OUT lock (version counter, renames, LATEST, pruning, cleanup) and
per-build claims that mark a temp dir as owned by a live process.

Both are `fcntl.flock` locks, which the kernel drops when the holder dies (kill -9 included), so a lock
can never be left behind by a crash and a dead build's temp dir is recognisable: its claim is unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from ..base.errors import BundleError
from .files import temp_tag
from .format import LOCK_NAME, TEMP_PREFIX

DELETE_PREFIX = TEMP_PREFIX + "del-"
CLAIM_SUFFIX = ".lock"
# A temp dir without a claim file can only come from something other than zerogr (claims are created
# before, and removed after, their dir under the OUT lock); leave it alone until it is clearly abandoned.
UNCLAIMED_TEMP_MAX_AGE_S = 3600.0


@contextlib.contextmanager
def out_lock(out_dir: Path) -> Iterator[None]:
    """Hold the exclusive lock OUT/.lock (blocking until it is free).

    O_NOFOLLOW: a (dangling) symlink named .lock in a copied OUT must not make us create or open a file
    elsewhere; O_NONBLOCK: a FIFO there must not hang the open (it then fails the regular-file check)."""
    path = out_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BundleError(f"{path}: a symlink (refused: the lock must be a plain file in OUT)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError(f"{path}: not a regular file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


class BuildClaim:
    """A build's temp dir OUT/.tmp-<tag>/ plus its claim OUT/.tmp-<tag>.lock, flock'd while we live.

    Create and release only while holding the OUT lock, so cleanup (also under it) never races them."""

    def __init__(self, out_dir: Path):
        tag = temp_tag()
        self.dir = out_dir / f"{TEMP_PREFIX}{tag}"
        self.claim_path = out_dir / f"{TEMP_PREFIX}{tag}{CLAIM_SUFFIX}"
        self._fd = os.open(self.claim_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.dir.mkdir()

    def release(self) -> None:
        """Remove the temp dir if it is still there (failed build), then the claim."""
        if self._fd < 0:
            return
        shutil.rmtree(self.dir, ignore_errors=True)
        self.claim_path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def _claim_is_dead(claim_path: Path) -> bool:
    """True when no live process holds this claim (we can lock it ourselves)."""
    try:
        fd = os.open(claim_path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink or socket: no build of ours made it
            return True
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def remove_stale_temps(out_dir: Path) -> list[str]:
    """Delete what crashed or interrupted writers left in OUT. Call only while holding the OUT lock.

    - .tmp-del-*: versions being pruned (already invisible) -> removed.
    - any other .tmp-* plain file (an atomic replacement of LATEST or the counter that never got
      renamed; such files are only written under the OUT lock) -> removed.
    - .tmp-<tag>.lock whose flock we can take: its build died -> the claim and .tmp-<tag>/ are removed.
    - .tmp-<tag>/ without a claim file: removed once older than an hour.
    Returns the names removed.
    """
    removed = []
    entries = {p.name: p for p in out_dir.iterdir() if p.name.startswith(TEMP_PREFIX)}
    claimed = set()
    for name, path in entries.items():
        if name.endswith(CLAIM_SUFFIX):
            dir_name = name[: -len(CLAIM_SUFFIX)]
            claimed.add(dir_name)
            if _claim_is_dead(path):
                if dir_name in entries:
                    _remove(entries[dir_name])
                    removed.append(dir_name)
                path.unlink(missing_ok=True)
                removed.append(name)
        elif name.startswith(DELETE_PREFIX) or (path.is_file() and not path.is_symlink()):
            _remove(path)
            removed.append(name)
    for name, path in entries.items():
        if name in claimed or name in removed or not path.is_dir():
            continue
        with contextlib.suppress(FileNotFoundError):
            if time.time() - path.stat().st_mtime > UNCLAIMED_TEMP_MAX_AGE_S:
                _remove(path)
                removed.append(name)
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
