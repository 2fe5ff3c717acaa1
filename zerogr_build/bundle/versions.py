"""The versions of an OUT dir: which exist (one scan of the vNNNNNN dirs), which one LATEST names, the
next number to allocate, pruning, and which version dir a user means (`resolve_bundle`).

Writers (publish.py, amend.py) call the mutating ones under the OUT lock; readers only resolve.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from pathlib import Path

from ..base.errors import BundleError, InputError
from .files import _crash_point, atomic_replace_bytes, fsync_dir, read_small_file, temp_tag
from .format import (
    COUNTER_NAME,
    DEFAULT_OUT,
    LATEST_NAME,
    MANIFEST_NAME,
    MAX_VERSION,
    parse_version_dir,
    version_dir_name,
)
from .lock import DELETE_PREFIX

# LATEST and the counter hold one short line; anything longer is not ours (and is not read).
SMALL_FILE_LIMIT = 4096


class VersionGoneError(BundleError):
    """LATEST names a version dir that is missing or has no manifest (typically pruned under a reader that
    had just read LATEST). `name` is the version dir name LATEST held."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


def version_dirs(out: Path) -> list[tuple[int, Path]]:
    """(number, path) of every dir in OUT named like a version (vNNNNNN), ascending: the one scan of OUT.
    A dir without a manifest counts (its number is used); readers filter on the manifest themselves."""
    found = []
    for entry in out.iterdir():
        number = parse_version_dir(entry.name)
        if number is not None and entry.is_dir():
            found.append((number, entry))
    return sorted(found)


def list_versions(out: Path) -> list[int]:
    """Version numbers of the version dirs in OUT, ascending (complete ones: only a rename makes one)."""
    return [number for number, _ in version_dirs(out)]


def read_latest(out: Path) -> str | None:
    """The version dir name LATEST holds, or None if there is no LATEST. A special file, an oversized or
    non-UTF-8 LATEST is refused with a BundleError naming it (never read without bound)."""
    path = out / LATEST_NAME
    try:
        data = read_small_file(path, SMALL_FILE_LIMIT)
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8").strip() or None
    except UnicodeDecodeError:
        raise BundleError(f"{path}: not UTF-8 text (expected a version dir name)") from None


def _used_numbers(out: Path) -> list[int]:
    """Numbers of every entry in OUT named like a version, whatever it is (dir, file, dangling symlink):
    a stray file named v000002 must not make the next publish rename onto it forever."""
    return [n for n in (parse_version_dir(entry.name) for entry in out.iterdir()) if n is not None]


def next_version(out: Path) -> int:
    """1 + the largest number ever used here (counter file, names in OUT, LATEST). Call under the lock.

    The counter keeps numbers from being reused after versions are deleted by hand, so an unreadable one
    is refused (BundleError naming it) rather than ignored."""
    used = _used_numbers(out)
    counter = out / COUNTER_NAME
    with contextlib.suppress(FileNotFoundError):
        text = read_small_file(counter, SMALL_FILE_LIMIT).decode("ascii", errors="replace").strip()
        if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_VERSION)):
            raise BundleError(
                f"{counter}: not a version number (got {text[:40]!r}); write the highest version ever "
                "published in this OUT dir into it"
            )
        used.append(int(text))
    with contextlib.suppress(BundleError):  # a broken LATEST is replaced by this publish anyway
        latest = read_latest(out)
        if latest and parse_version_dir(latest) is not None:
            used.append(parse_version_dir(latest))
    number = max(used, default=0) + 1
    if number > MAX_VERSION:
        raise BundleError(f"{out}: version numbers end at {MAX_VERSION}; publish into a new OUT dir")
    return number


def replace_latest(out: Path, version_name: str) -> None:
    """Point OUT/LATEST at version dir `version_name` (temp file + rename). Call under the OUT lock."""
    atomic_replace_bytes(out / LATEST_NAME, f"{version_name}\n".encode())


def prune_versions(out: Path, keep: int) -> list[str]:
    """Delete all but the newest `keep` versions, never the one LATEST names. Call under the OUT lock.

    Each doomed version is first renamed to .tmp-del-* (it vanishes atomically; a crash mid-delete leaves
    only a temp name that the next writer removes), then removed. Pruning runs after a publish, so a
    version that cannot be removed (or an unreadable LATEST) is a warning, never an error: the publish
    has happened and must not be reported as failed."""
    try:
        latest = read_latest(out)
    except BundleError as exc:
        warnings.warn(f"not pruning: {exc}", stacklevel=2)
        return []
    versions = list_versions(out)
    doomed = [version_dir_name(v) for v in versions[: max(len(versions) - keep, 0)]]
    removed = []
    for name in doomed:
        if name == latest:
            continue
        try:
            discard_version(out, name)
        except OSError as exc:
            warnings.warn(f"{out / name}: could not prune ({exc.strerror or exc})", stacklevel=2)
            continue
        removed.append(name)
    return removed


def discard_version(out: Path, name: str) -> None:
    """Remove the version dir OUT/name: renamed to .tmp-del-* first (it vanishes atomically; a crash
    mid-delete leaves only a temp name that the next writer removes), then deleted. Call under the OUT
    lock, never for the version LATEST names. Raises OSError when the rename fails."""
    trash = out / f"{DELETE_PREFIX}{temp_tag()}"
    os.rename(out / name, trash)
    fsync_dir(out)
    _crash_point("pruning")
    shutil.rmtree(trash, ignore_errors=True)


def check_out_dir(out: str | Path) -> Path:
    """Refuse, before any work, an OUT that cannot hold versions: a file or a path under one, a dir we
    cannot write, or a published version dir itself (its files are immutable). InputError naming it."""
    path = Path(out)
    probe = path
    while not (probe.exists() or probe.is_symlink()):
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{out}: cannot be an OUT dir ({probe} is not a directory)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot be an OUT dir ({probe} is not writable)")
    if probe == path and (path / MANIFEST_NAME).exists():
        raise InputError(f"{out}: is a published version dir (has {MANIFEST_NAME}); pass its OUT dir")
    return path


def resolve_bundle(path: str | Path | None = None) -> Path:
    """The version dir a user means: a version dir itself (has manifest.json), or an OUT dir, whose LATEST
    names the version (the newest complete version dir if LATEST is absent). None means "bundles"."""
    root = Path(DEFAULT_OUT if path is None else path)
    if not root.exists():
        raise InputError(f"{root}: no such bundle or bundle directory")
    if not root.is_dir():
        raise InputError(f"{root}: not a directory (expected a bundle version dir or an OUT dir)")
    if (root / MANIFEST_NAME).exists():
        return root
    latest_file = root / LATEST_NAME
    if latest_file.exists() or latest_file.is_symlink():
        name = read_latest(root) or ""
        if parse_version_dir(name) is None:
            raise BundleError(f"{latest_file}: does not name a version dir (got {name[:80]!r})")
        target = root / name
        if not (target / MANIFEST_NAME).is_file():
            raise VersionGoneError(
                f"{latest_file}: names {name}, which is missing or has no {MANIFEST_NAME}", name
            )
        return target
    complete = [path for _, path in version_dirs(root) if (path / MANIFEST_NAME).is_file()]
    if not complete:
        raise InputError(f"{root}: not a bundle (no {MANIFEST_NAME}, no {LATEST_NAME}, no version dirs)")
    return complete[-1]
