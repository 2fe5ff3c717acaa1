"""Reading one version of a remote OUT as untrusted input, shared by pull (pull.py), the fleet rollback
(rollback.py) and remote status (status.py): the version remote LATEST names, a version's manifest (its
bytes, bounded, then parsed and validated, naming its own number: a signed fleet checks the bytes in
between), and the check that every file it lists is on the
store with its declared size (one listing, nothing downloaded).

Every refusal is one line naming the remote object: RefusedRemoteVersion (exit 4), or NothingPublished
(exit 5) for a LATEST or a version that does not exist.
"""

from __future__ import annotations

import json

from ..base.errors import BundleError
from ..bundle.format import (
    MANIFEST_NAME,
    oversized_version_dir,
    parse_version_dir,
    validate_manifest,
    version_dir_name,
)
from ..bundle.reader import MAX_MANIFEST_BYTES
from .remote import NothingPublished, RefusedRemoteVersion, S3Store, oversized_note, read_latest, version_name

#: Files one manifest may list (a bundle has a few dozen: steps, leaves, items, plans, kernels).
MAX_FILES = 10_000


def remote_latest_number(store: S3Store) -> int:
    """The version number remote LATEST names. NothingPublished without a LATEST; RefusedRemoteVersion
    when it does not name a version dir."""
    name, _ = read_latest(store)
    if name is None:
        raise NothingPublished(f"{store.remote.name_url('LATEST')}: missing (nothing promoted yet)")
    number = parse_version_dir(name)
    if oversized_version_dir(name):
        raise RefusedRemoteVersion(f"{store.remote.name_url('LATEST')}: names {oversized_note(name)}")
    if number is None:
        raise RefusedRemoteVersion(
            f"{store.remote.name_url('LATEST')}: does not name a version dir (got {name[:80]!r})"
        )
    return number


def read_remote_manifest(store: S3Store, number: int, *, named_by_latest: bool) -> bytes:
    """The exact bytes of remote version `number`'s manifest (at most MAX_MANIFEST_BYTES), unparsed: a
    signed fleet checks them (signing.remote_signature) before parse_remote_manifest reads them.

    A missing manifest is NothingPublished when the version has no object at all and was asked for by
    number (`named_by_latest` False), RefusedRemoteVersion (an incomplete version) otherwise."""
    name = version_name(number, MANIFEST_NAME)
    got = store.get_small(name, MAX_MANIFEST_BYTES)
    if got is None:
        if not named_by_latest and not store.list_under(version_dir_name(number) + "/"):
            raise NothingPublished(f"{store.remote.name_url(version_dir_name(number))}: no such version")
        raise RefusedRemoteVersion(
            f"{store.remote.name_url(name)}: missing (the version is incomplete: an upload in progress or "
            "killed)"
        )
    return got[0]


def parse_remote_manifest(store: S3Store, number: int, raw: bytes) -> dict:
    """The manifest bytes `raw` of remote version `number` parsed and validated: a manifest naming its own
    number and at most MAX_FILES files; RefusedRemoteVersion naming the remote manifest otherwise."""
    where = store.remote.name_url(version_name(number, MANIFEST_NAME))
    try:
        manifest = json.loads(raw)
    except RecursionError:
        raise RefusedRemoteVersion(f"{where}: not readable JSON (nested too deep)") from None
    except ValueError as exc:
        raise RefusedRemoteVersion(f"{where}: not readable JSON ({exc})") from None
    try:
        validate_manifest(manifest, where)
    except BundleError as exc:
        raise RefusedRemoteVersion(str(exc)) from None
    if manifest["version"] != number:
        raise RefusedRemoteVersion(
            f"{where}: version {manifest['version']} does not match {version_dir_name(number)}"
        )
    if len(manifest["files"]) > MAX_FILES:
        raise RefusedRemoteVersion(f"{where}: lists {len(manifest['files'])} files, more than {MAX_FILES}")
    return manifest


def check_objects(store: S3Store, number: int, entries: dict) -> None:
    """Every file of `entries` (a manifest's "files") exists remotely with exactly its declared size (one
    listing of the version); RefusedRemoteVersion naming the first one that does not."""
    listed = store.list_under(version_dir_name(number) + "/")
    for name, entry in sorted(entries.items()):
        obj = listed.get(name)
        where = store.remote.name_url(version_name(number, name))
        if obj is None:
            raise RefusedRemoteVersion(f"{where}: missing (listed in the manifest)")
        if obj.size != int(entry["bytes"]):
            raise RefusedRemoteVersion(f"{where}: {obj.size} bytes, the manifest says {entry['bytes']}")
