"""Locks for an OUT dir: the exclusive OUT lock (version counter, renames, LATEST, pruning, cleanup),
per-build claims that mark a temp dir as owned by a live process, and `zerogr rebuild`'s run lock.

All are `fcntl.flock` locks, which the kernel drops when the holder dies (kill -9 included), so a lock
can never be left behind by a crash and a dead build's temp dir is recognisable: its claim is unlocked.

The run lock (OUT/.rebuild.lock) is held for a whole rebuild, so two runs never tune, promote or push at
once; a second run fails at once (RunLockHeld, naming the holder). The file holds the holder's record
(pid, host, start, run id) while it runs and is emptied when the run ends, however it ends short of
kill -9: a record found by the next holder is a run that never finished (`RunLock.unfinished`), whose
unpromoted version that run removes. The record never decides who holds the lock; the flock does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..base.errors import BundleError, ZerogrError
from ..base.printable import safe_text
from .files import temp_tag
from .format import LOCK_NAME, RUN_LOCK_NAME, TEMP_PREFIX

DELETE_PREFIX = TEMP_PREFIX + "del-"
CLAIM_SUFFIX = ".lock"
# A temp dir without a claim file can only come from something other than zerogr (claims are created
# before, and removed after, their dir under the OUT lock); leave it alone until it is clearly abandoned.
UNCLAIMED_TEMP_MAX_AGE_S = 3600.0


def _open_lock_file(path: Path) -> int:
    """Open (creating) a lock file in OUT: a plain file only.

    O_NOFOLLOW: a (dangling) symlink in a copied OUT must not make us create or open a file elsewhere;
    O_NONBLOCK: a FIFO there must not hang the open (it then fails the regular-file check)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BundleError(f"{path}: a symlink (refused: the lock must be a plain file in OUT)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError(f"{path}: not a regular file")
    return fd


@contextlib.contextmanager
def out_lock(out_dir: Path) -> Iterator[None]:
    """Hold the exclusive lock OUT/.lock (blocking until it is free)."""
    fd = _open_lock_file(out_dir / LOCK_NAME)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def replace_out_file(out_dir: Path, path: Path, data: bytes) -> None:
    """Replace the regular file `path` in OUT (or create it) with `data`, atomically, holding OUT's lock
    (whose holders sweep stray temp files). OSError when it cannot be written; anything but a regular file
    at `path` (a symlink, a directory, a FIFO) is never replaced."""
    from .files import atomic_replace_bytes

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(f"{path}: not a regular file; left as it is")
    with out_lock(out_dir):
        atomic_replace_bytes(path, data)


# A holder record is one short JSON line; anything longer is not ours (and is not read).
RUN_RECORD_LIMIT = 4096


@dataclass(frozen=True)
class RunRecord:
    """Who holds (or held) a run lock: pid, host, start (ISO 8601 UTC) and run id, plus `pending`: the run
    ids of earlier runs that never finished and whose unpromoted versions are not removed yet."""

    pid: int
    host: str
    started_at: str
    run_id: str
    pending: tuple[str, ...] = ()

    @classmethod
    def this_process(cls, run_id: str) -> RunRecord:
        from datetime import datetime, timezone

        started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(os.getpid(), socket.gethostname(), started, run_id)

    def describe(self) -> str:
        return safe_text(f"pid {self.pid} on {self.host}, started {self.started_at} (run {self.run_id})")


class RunLockHeld(ZerogrError):
    """Another run holds the run lock: this run did nothing (exit 7)."""

    exit_code = 7


class RunLock:
    """A held run lock. `unfinished`: the record a run that never finished left (None: the last run ended,
    or this is the first); `pending`: the run ids whose unpromoted versions are still to be removed."""

    def __init__(self, fd: int, path: Path, record: RunRecord, unfinished: RunRecord | None) -> None:
        self._fd, self.path, self.record, self.unfinished = fd, path, record, unfinished

    @property
    def pending(self) -> tuple[str, ...]:
        return self.record.pending

    def cleaned(self) -> None:
        """The pending runs' versions are removed: drop them from the record."""
        self.record = replace(self.record, pending=())
        _write_record(self._fd, self.record)

    def release(self) -> None:
        """Empty the record (this run ended) and release the lock."""
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)
            self._fd = -1


def _read_record(fd: int) -> RunRecord | None:
    try:
        data = os.pread(fd, RUN_RECORD_LIMIT + 1, 0)
        if not data.strip() or len(data) > RUN_RECORD_LIMIT:
            return None
        raw = json.loads(data)
        return RunRecord(
            int(raw["pid"]), str(raw["host"]), str(raw["started_at"]), str(raw["run_id"]),
            tuple(str(r) for r in raw.get("pending", ())),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not a record this version wrote: it decides nothing


def _write_record(fd: int, record: RunRecord) -> None:
    data = (json.dumps({**asdict(record), "pending": list(record.pending)}) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def acquire_run_lock(out_dir: Path, run_id: str) -> RunLock:
    """Take OUT/.rebuild.lock for run `run_id` without waiting. RunLockHeld (one line naming the holder's
    pid, host, start and run id) when another process holds it; a holder that died (kill -9 included) has
    lost it already. Call `release()` when the run ends."""
    path = out_dir / RUN_LOCK_NAME
    fd = _open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_record(fd)
        os.close(fd)
        who = holder.describe() if holder is not None else "a process that has not written its record yet"
        raise RunLockHeld(f"another zerogr rebuild holds {path}: {who}; this run did nothing") from None
    except BaseException:
        os.close(fd)
        raise
    unfinished = _read_record(fd)
    pending = (*unfinished.pending, unfinished.run_id) if unfinished is not None else ()
    record = replace(RunRecord.this_process(run_id), pending=tuple(dict.fromkeys(pending)))
    try:
        _write_record(fd, record)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(fd, path, record, unfinished)


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
