"""Which versions the engine has opened and accepted, told to the front end: the one channel from vLLM's
engine processes back to its front end that zerogr needs.

    # the engine (each worker's processor), after opening and checking a version on its watcher thread:
    board = EngineBoard(registry)
    board.write({"movies": Announced(serving=v2_dir, held=(v1_dir, v2_dir))})
    # the front end (admission), reading what every engine process of this server wrote:
    view = FrontBoard(registry, on_change=lambda name, version_dir: ...)
    view.pin("movies")        # "v000002": the newest version every engine process holds; None: none known

vLLM runs its front end (the API server, or LLM's process) and its engine core and workers in separate
processes, all started from one process and sharing its process group (a DP supervisor gives each server
its own group). So the record lives in a directory named by the process group and the registry's real
path: `$ZEROGR_VLLM_STATE_DIR` (default /dev/shm, else the temp dir, in `zerogr-vllm-<uid>/`), one JSON
file per engine process (named by its pid, written atomically, removed when it ends; records of processes
that no longer exist are swept when an engine process starts). The front end reads
them every poll_seconds on its own thread and pins, per catalog, the newest version that every live
writer holds: under tensor or data parallelism a version is pinned once all workers have it.

A record is a hint, never trusted: the engine decodes a pinned version only if it holds it open itself,
and fails that one request otherwise. A directory another user owns, or a symlink, is not used (logged).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...base.errors import ZerogrError, one_line
from ...bundle.format import parse_version_dir
from .registry import Registry

logger = logging.getLogger("vllm.zerogr")
STATE_ENV = "ZEROGR_VLLM_STATE_DIR"
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class Announced:
    """One catalog in one engine process: the version it serves now and every version it holds open and
    accepted (the serving one included), as real paths of version dirs."""

    serving: Path
    held: tuple[Path, ...]


def board_dir(registry: Registry) -> Path:
    """The directory the processes of this server (its process group) and registry share."""
    root = os.environ.get(STATE_ENV, "").strip()
    if not root:
        shm = Path("/dev/shm")
        root = str(shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir()))
        root = os.path.join(root, f"zerogr-vllm-{os.getuid()}")
    digest = hashlib.sha256(str(registry.path).encode()).hexdigest()[:16]
    return Path(root) / f"pg{os.getpgid(0)}-{digest}"


def _own_dir(path: Path, create: bool) -> bool:
    """True when `path` is a real directory of this user, mode 0700 (made so when `create`); logged when
    not (someone else's directory could plant records)."""
    if create:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    try:
        for part in (path.parent, path):
            info = os.lstat(part)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
                logger.error("zerogr: %s is not a private directory of this user: not used", part)
                return False
    except FileNotFoundError:
        return False
    return True


class EngineBoard:
    """The engine process's record (module docstring); write() replaces it whole."""

    def __init__(self, registry: Registry) -> None:
        self.dir = board_dir(registry)
        self.path = self.dir / f"{os.getpid()}.json"
        self._lock = threading.Lock()
        self._usable = _own_dir(self.dir, create=True)
        if self._usable:
            _sweep(self.dir.parent, keep=self.dir)

    def write(self, catalogs: dict[str, Announced]) -> None:
        """Publish what this process holds now (atomically; a failure is logged: the front end then keeps
        pinning what it read before, which this process still holds or refuses request by request)."""
        if not self._usable:
            return
        body = {
            "pid": os.getpid(),
            "catalogs": {
                name: {"serving": str(a.serving), "held": [str(p) for p in a.held]}
                for name, a in catalogs.items()
            },
        }
        with self._lock:
            try:
                if not _own_dir(self.dir, create=True):  # (another server's sweep may have removed it)
                    return
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
                with os.fdopen(fd, "w") as f:
                    json.dump(body, f)
                os.replace(tmp, self.path)
            except OSError as exc:
                logger.error("zerogr: cannot write the engine's version record %s: %s", self.path, exc)

    def close(self) -> None:
        """Remove the record, and the directory once no process of this server has one (the front end
        ignores a dead writer's record anyway)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self.dir.rmdir()  # fails while another record is there


def _sweep(root: Path, keep: Path) -> None:
    """Remove the records of processes that no longer exist (a server stopped by SIGKILL leaves its own),
    and the directories that leaves empty, but `keep`."""
    for directory in root.glob("pg*-*"):
        for record in directory.glob("*.json"):
            stem = record.name.removesuffix(".json")
            if stem.isdigit() and not _exists(int(stem)):
                with contextlib.suppress(OSError):
                    record.unlink()
        if directory != keep:
            with contextlib.suppress(OSError):
                directory.rmdir()  # fails while a record is there


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _alive(pid: int) -> bool:
    """Whether `pid` runs in this process group (a record of a process that ended, whose pid another
    process now has, does not count)."""
    try:
        return os.getpgid(pid) == os.getpgid(0)
    except OSError:
        return False


def read_board(directory: Path) -> list[dict[str, Announced]]:
    """Every live engine process's record in `directory` (unreadable or malformed records are skipped)."""
    records = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        stem = name.removesuffix(".json")
        if not name.endswith(".json") or not stem.isdigit() or not _alive(int(stem)):
            continue
        try:
            with open(directory / name, "rb") as f:
                data = json.loads(f.read(MAX_RECORD_BYTES))
            records.append(
                {
                    str(cat): Announced(Path(entry["serving"]), tuple(Path(p) for p in entry["held"]))
                    for cat, entry in data["catalogs"].items()
                }
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return records


def agreed(records: list[dict[str, Announced]], name: str) -> Path | None:
    """The version dir of catalog `name` to pin: the one every record serves, else the newest one every
    record holds (by version number); None when no record knows the catalog or they share none."""
    entries = [r.get(name) for r in records]
    if not entries or any(e is None for e in entries):
        return None
    serving = {e.serving for e in entries}  # type: ignore[union-attr]
    if len(serving) == 1:
        return serving.pop()
    common = set.intersection(*(set(e.held) for e in entries))  # type: ignore[union-attr]
    numbered = [(parse_version_dir(p.name) or 0, str(p), p) for p in common]
    return max(numbered)[2] if numbered else None


class FrontBoard:
    """The front end's view of the engine's records, read now and then every poll_seconds on a daemon
    thread; on_change(name, version_dir) runs (on that thread) before a new version is pinned."""

    def __init__(self, registry: Registry, on_change: Callable[[str, Path], None] | None = None) -> None:
        self._names = tuple(registry.catalogs)
        self._dir = board_dir(registry)
        self._poll_seconds = registry.poll_seconds
        self._on_change = on_change
        self._pins: dict[str, Path] = {}
        self._stop = threading.Event()
        self.read()
        self._thread = threading.Thread(target=self._watch, name="zerogr-engine-versions", daemon=True)
        self._thread.start()

    def pin(self, name: str) -> str | None:
        """The version dir name new requests of catalog `name` decode (None: the engine picks its own)."""
        version = self._pins.get(name)
        return None if version is None else version.name

    def read(self) -> None:
        """Read the records once (what the thread does every poll_seconds)."""
        if not _own_dir(self._dir, create=False):
            return
        records = read_board(self._dir)
        for name in self._names:
            version = agreed(records, name)
            if version is None or version == self._pins.get(name):
                continue
            if self._on_change is not None:
                try:
                    self._on_change(name, version)
                except (ZerogrError, OSError) as exc:  # the engine holds it: pin it all the same
                    logger.warning("zerogr: catalog %r, %s: %s", name, version.name, one_line(exc))
            self._pins[name] = version
            logger.info("zerogr: catalog %r: new requests decode %s", name, version.name)

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            try:
                self.read()
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad record
                logger.exception("zerogr: reading the engine's version records failed")


__all__ = ["STATE_ENV", "Announced", "EngineBoard", "FrontBoard", "agreed", "board_dir", "read_board"]
