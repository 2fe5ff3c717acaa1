"""The versions of an OUT dir: which exist (one scan of the vNNNNNN dirs), which one LATEST names, the
next number to allocate, pruning, and which version dir a user means (`resolve_bundle`).

Writers (publish.py, amend.py) call the mutating ones under the OUT lock; readers only resolve.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from ..errors import BundleError, InputError
from .files import _crash_point, atomic_replace_bytes, fsync_dir, temp_tag
from .format import (
    COUNTER_NAME,
    DEFAULT_OUT,
    LATEST_NAME,
    MANIFEST_NAME,
    parse_version_dir,
    version_dir_name,
)
from .lock import DELETE_PREFIX


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
    """The version dir name LATEST holds, or None if there is no LATEST."""
    try:
        return (out / LATEST_NAME).read_text().strip() or None
    except FileNotFoundError:
        return None


def next_version(out: Path) -> int:
    """1 + the largest number ever used here (counter file, version dirs, LATEST). Call under the lock.

    The counter keeps numbers from being reused after versions are deleted by hand."""
    used = list_versions(out)
    with contextlib.suppress(FileNotFoundError, ValueError):
        used.append(int((out / COUNTER_NAME).read_text().strip()))
    latest = read_latest(out)
    if latest and parse_version_dir(latest) is not None:
        used.append(parse_version_dir(latest))
    return max(used, default=0) + 1


def replace_latest(out: Path, version_name: str) -> None:
    """Point OUT/LATEST at version dir `version_name` (temp file + rename). Call under the OUT lock."""
    atomic_replace_bytes(out / LATEST_NAME, f"{version_name}\n".encode())


def prune_versions(out: Path, keep: int) -> list[str]:
    """Delete all but the newest `keep` versions, never the one LATEST names. Call under the OUT lock.

    Each doomed version is first renamed to .tmp-del-* (it vanishes atomically; a crash mid-delete leaves
    only a temp name that the next writer removes), then removed."""
    latest = read_latest(out)
    versions = list_versions(out)
    doomed = [version_dir_name(v) for v in versions[: max(len(versions) - keep, 0)]]
    removed = []
    for name in doomed:
        if name == latest:
            continue
        trash = out / f"{DELETE_PREFIX}{temp_tag()}"
        os.rename(out / name, trash)
        fsync_dir(out)
        _crash_point("pruning")
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(name)
    return removed


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
    if latest_file.exists():
        name = latest_file.read_text().strip()
        if parse_version_dir(name) is None:
            raise BundleError(f"{latest_file}: does not name a version dir (got {name!r})")
        target = root / name
        if not (target / MANIFEST_NAME).is_file():
            raise BundleError(f"{latest_file}: names {name}, which is missing or has no {MANIFEST_NAME}")
        return target
    complete = [path for _, path in version_dirs(root) if (path / MANIFEST_NAME).is_file()]
    if not complete:
        raise InputError(f"{root}: not a bundle (no {MANIFEST_NAME}, no {LATEST_NAME}, no version dirs)")
    return complete[-1]
