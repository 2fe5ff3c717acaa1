"""Amending a published version: `add_bundle_files` adds or replaces files (tune's plans and kernels)
under a journal, and the next writer rolls an interrupted one forward (docs/bundle-format.md, section 9).
Index files and the manifest itself cannot be replaced.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..errors import BundleError
from .files import _crash_point, atomic_replace_bytes, fsync_dir, temp_tag, write_bytes_durable
from .format import (
    JOURNAL_NAME,
    MANIFEST_NAME,
    TEMP_PREFIX,
    check_relpath,
    manifest_bytes,
    validate_manifest,
    version_dir_name,
)
from .lock import out_lock
from .reader import load_manifest
from .versions import list_versions, resolve_bundle


def add_bundle_files(version_dir: str | Path, files: Mapping[str, bytes]) -> dict:
    """Add or replace files of a published version (tune's plans/<device-key>.json, kernels/<arch>/*),
    keeping the manifest's file list and checksums right. Returns the new manifest.

    Under the OUT lock: write each file to a temp name and fsync; record a journal (the new manifest plus
    the renames) atomically; rename the files into place; replace manifest.json atomically; drop the
    journal. A crash after the journal is rolled forward by the next writer (publish or add), so even a
    replaced file and its checksum change together. Index files and the manifest cannot be replaced.
    """
    vdir = resolve_bundle(version_dir)
    if not files:
        return load_manifest(vdir)
    out = vdir.parent
    with out_lock(out):
        recover_journal(vdir)
        _remove_version_temps(vdir)
        manifest = load_manifest(vdir)
        protected = _index_file_names(manifest)
        renames: list[list[str]] = []
        new_entries: dict[str, dict] = {}
        try:
            for rel, data in files.items():
                name = check_relpath(rel, "add_bundle_files")
                if name in protected:
                    raise BundleError(f"{name}: index files of a published bundle cannot be replaced")
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise TypeError(f"{name}: file content must be bytes, got {type(data).__name__}")
                target = _safe_target(vdir, name)
                temp = target.with_name(f"{TEMP_PREFIX}{temp_tag()}-{target.name}")
                size, digest = write_bytes_durable(temp, bytes(data))
                renames.append([temp.relative_to(vdir).as_posix(), name])
                new_entries[name] = {"bytes": size, "sha256": digest}
            manifest["files"] = dict(sorted({**manifest["files"], **new_entries}.items()))
            validate_manifest(manifest, "manifest being written")
            journal = {"renames": renames, "manifest": manifest}
            atomic_replace_bytes(vdir / JOURNAL_NAME, manifest_bytes(journal))
        except BaseException:
            for temp_rel, _ in renames:
                (vdir / temp_rel).unlink(missing_ok=True)
            raise
        _crash_point("journal_written")
        _apply_journal(vdir, journal)
    return manifest


def _index_file_names(manifest: dict) -> set[str]:
    names = {MANIFEST_NAME}
    for entry in manifest["steps"]:
        names.update(entry["files"].values())
    names.update(manifest["leaves"]["files"].values())
    return names


def _safe_target(vdir: Path, name: str) -> Path:
    """vdir/name, with parent dirs created, refusing any path that a symlink would lead out of vdir.

    The deepest existing (or symlinked) ancestor is checked before anything is created, so a symlinked dir
    on the way cannot make mkdir create directories outside the bundle."""
    target = vdir / name
    root = vdir.resolve()
    existing = target.parent
    while not (existing.exists() or existing.is_symlink()):
        existing = existing.parent
    if not existing.resolve().is_relative_to(root):
        raise BundleError(f"{name}: path leads outside the bundle dir {vdir}")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
        raise BundleError(f"{name}: path leads outside the bundle dir {vdir}")
    return target


def _apply_journal(vdir: Path, journal: dict) -> None:
    for temp_rel, name in journal["renames"]:
        temp = vdir / temp_rel
        if temp.exists():
            os.replace(temp, vdir / name)
            fsync_dir(temp.parent)
        _crash_point("add_renamed")
    atomic_replace_bytes(vdir / MANIFEST_NAME, manifest_bytes(journal["manifest"]))
    (vdir / JOURNAL_NAME).unlink(missing_ok=True)
    fsync_dir(vdir)


def recover_journal(vdir: Path) -> None:
    """Roll an interrupted add_bundle_files forward (the journal exists only once all temps are durable)."""
    path = vdir / JOURNAL_NAME
    if not path.exists():
        return
    try:
        journal = json.loads(path.read_text())
        validate_manifest(journal["manifest"], str(path))
        for temp_rel, name in journal["renames"]:
            check_relpath(name, str(path))
            if not Path(temp_rel).name.startswith(TEMP_PREFIX) or ".." in Path(temp_rel).parts:
                raise BundleError(f"{path}: bad temp name {temp_rel!r}")
    except (ValueError, KeyError, TypeError, BundleError):
        path.unlink(missing_ok=True)  # unusable journal: the old manifest still describes the old files
        return
    _apply_journal(vdir, journal)


def recover_journals(out: Path) -> None:
    for number in list_versions(out):
        vdir = out / version_dir_name(number)
        if (vdir / JOURNAL_NAME).exists():
            recover_journal(vdir)
            _remove_version_temps(vdir)


def _remove_version_temps(vdir: Path) -> None:
    """Stray temp files of an interrupted add (only written under the OUT lock, which we hold)."""
    for path in vdir.rglob(f"{TEMP_PREFIX}*"):
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
