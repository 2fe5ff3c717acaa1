"""Amending a published version: `add_bundle_files` adds or replaces files (tune's plans and kernels)
under a journal, and the next writer rolls an interrupted one forward (docs/bundle-format.md, section 9).
Index files and the manifest itself cannot be replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from ..base.errors import BundleError
from .files import (
    _crash_point,
    atomic_replace_bytes,
    fsync_dir,
    read_small_file,
    temp_tag,
    write_bytes_durable,
)
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
from .reader import MAX_MANIFEST_BYTES, load_manifest
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


#: Top-level manifest fields a published version may gain later (informational; every other field is the
#: writer's, fixed at publish or kept right by add_bundle_files).
AMENDABLE_FIELDS = frozenset({"guards", "accept_change", "changes"})


def set_manifest_fields(version_dir: str | Path, fields: Mapping[str, object]) -> dict:
    """Set informational top-level fields (AMENDABLE_FIELDS: the guards' `guards`, `changes` and
    `accept_change`) of a published version's manifest, atomically under the OUT lock (after rolling an
    interrupted add forward). Returns the new manifest; ValueError for a field that is not amendable."""
    unknown = sorted(set(fields) - AMENDABLE_FIELDS)
    if unknown:
        raise ValueError(f"manifest fields {unknown} cannot be amended (only {sorted(AMENDABLE_FIELDS)})")
    vdir = resolve_bundle(version_dir)
    with out_lock(vdir.parent):
        recover_journal(vdir)
        _remove_version_temps(vdir)
        manifest = {**load_manifest(vdir), **fields}
        validate_manifest(manifest, "manifest being written")
        atomic_replace_bytes(vdir / MANIFEST_NAME, manifest_bytes(manifest))
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


def _real_dir_inside(vdir: Path, rel_dir: PurePosixPath) -> bool:
    """True when every component of vdir/rel_dir is a real dir (no symlink) or missing: a rename into it
    then cannot land outside vdir."""
    current = vdir
    for part in rel_dir.parts:
        current = current / part
        try:
            mode = current.lstat().st_mode
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(mode):
            return False
    return True


def _check_journal_renames(vdir: Path, journal: dict, where: str) -> None:
    """A journal is untrusted input (a copied OUT dir may hold one): each rename must be exactly what
    add_bundle_files writes, a .tmp- file beside its target, both relative names inside vdir, no symlink
    on the way, the temp a regular file or absent, the target not a symlink. BundleError otherwise."""
    renames = journal["renames"]
    if not isinstance(renames, list):
        raise BundleError(f"{where}: renames must be a list")
    for pair in renames:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise BundleError(f"{where}: bad rename entry {pair!r}")
        name = check_relpath(pair[1], where)
        temp_rel = pair[0]
        plain = (
            isinstance(temp_rel, str) and not temp_rel.startswith("/") and not set(temp_rel) & {"\\", "\x00"}
        )
        if not plain or any(part in ("", ".", "..") for part in temp_rel.split("/")):
            raise BundleError(f"{where}: bad temp name {temp_rel!r}")
        temp_path, name_path = PurePosixPath(temp_rel), PurePosixPath(name)
        if not temp_path.name.startswith(TEMP_PREFIX) or temp_path.parent != name_path.parent:
            raise BundleError(f"{where}: bad temp name {temp_rel!r} for {name!r}")
        if not _real_dir_inside(vdir, name_path.parent):
            raise BundleError(f"{where}: {name!r} leads through a symlink or a file")
        for rel in (temp_rel, name):
            with contextlib.suppress(FileNotFoundError):
                mode = (vdir / rel).lstat().st_mode
                if not stat.S_ISREG(mode):
                    raise BundleError(f"{where}: {rel!r} is not a regular file")


def recover_journal(vdir: Path) -> None:
    """Roll an interrupted add_bundle_files forward (the journal exists only once all temps are durable).

    A journal that is unusable, or that would rename anything outside vdir or through a symlink, is
    dropped: the old manifest still describes the old files, and nothing outside vdir is touched."""
    path = vdir / JOURNAL_NAME
    if not (path.exists() or path.is_symlink()):
        return
    try:
        if path.is_symlink():
            raise BundleError(f"{path}: a symlink")
        journal = json.loads(read_small_file(path, MAX_MANIFEST_BYTES))
        validate_manifest(journal["manifest"], str(path))
        _check_journal_renames(vdir, journal, str(path))
    except (ValueError, KeyError, TypeError, RecursionError, BundleError):
        path.unlink(missing_ok=True)
        return
    _apply_journal(vdir, journal)


def recover_journals(out: Path) -> None:
    """recover_journal in every version dir of OUT (a symlinked version dir is not ours to write in)."""
    for number in list_versions(out):
        vdir = out / version_dir_name(number)
        if vdir.is_symlink():
            continue
        if (vdir / JOURNAL_NAME).exists() or (vdir / JOURNAL_NAME).is_symlink():
            recover_journal(vdir)
            _remove_version_temps(vdir)


def _remove_version_temps(vdir: Path) -> None:
    """Stray temp files of an interrupted add (only written under the OUT lock, which we hold)."""
    for path in vdir.rglob(f"{TEMP_PREFIX}*"):
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
