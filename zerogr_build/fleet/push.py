"""`push_version`: publish a verified local version to a remote OUT (docs/bundle-format.md, "Remote OUT").

Protocol:
  1. verify the local version completely (checksums and invariants); a bad one is never uploaded.
  2. list the remote OUT (a version-like prefix past MAX_VERSION is ignored, with one warning naming it).
     A complete remote version whose manifest is this one (its `pushed_from` manifest_sha256, or its own
     bytes, equal the sha256 of the local manifest.json) was pushed before: nothing is uploaded, only
     steps 5-6 run.
  3. claim the local version's own number N (a version keeps its number from the build box to the
     fleet): create vN/.claim with If-None-Match: *. Refused (InputError, exit 2) when the push would
     promote and the fleet already holds a higher version (LATEST never moves backwards, so it would never
     name this one), or when vN is claimed by another version. A claim of this same version (a push of it
     that died, or one running now) is taken over.
  4. upload every listed file (multipart, each part's SHA-256 checked by the store on receipt), then read
     each back in a stream and check its size and sha256 against the manifest. Then upload manifest.json
     last (create-only), its `version` N and `pushed_from` recording the local version and the local
     manifest's sha256; read it back. The version is now complete.
  5. with a signing key: commit the fleet's signed metadata (repository.py): the version's manifest as a
     target and, with promote, LATEST when N is above the version it names; then the plain LATEST object
     follows the signed one. Without a key, with promote: move LATEST to vN by compare-and-swap on its
     ETag, never to a lower number than it names. An unsigned version is not promoted on a fleet with
     signed metadata (InputError, exit 2, checked before anything is uploaded and again at the move)
     unless allow_unsigned: hosts that trust keys follow only the signed metadata.
  6. with keep: prune (prune.py); with a signing key the pruned versions then leave the signed targets,
     and metadata files no host reads any more are deleted.
A push killed at any point leaves LATEST, the signed metadata and every complete version as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..base.errors import BundleError, InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..bundle.files import _crash_point, read_small_file
from ..bundle.format import (
    LATEST_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    manifest_bytes,
    oversized_version_dir,
    parse_version_dir,
    validate_manifest,
    version_dir_name,
)
from ..bundle.reader import MAX_MANIFEST_BYTES
from ..bundle.verify import verify_bundle
from ..bundle.versions import resolve_bundle
from .keys import SigningKey, load_signing_key
from .metadata import (
    LATEST_TARGET,
    TIMESTAMP_FILE,
    UntrustedVersion,
    latest_entry,
    latest_of,
    manifest_entry,
    manifest_target,
    metadata_name,
)
from .prune import prune_remote
from .remote import (
    CLAIM_NAME,
    PreconditionFailed,
    RefusedRemoteVersion,
    RemoteError,
    RemoteOut,
    RemoteVersions,
    S3Store,
    list_versions,
    oversized_note,
    read_latest,
    version_name,
)
from .repository import Committed, check_signer, commit, drop_target, prune_metadata, sync_latest_object
from .transfer import TransferResult, for_each_on_threads

PUSH_THREADS = 4
CAS_ATTEMPTS = 50

__all__ = ["PushResult", "promote_remote", "prune_remote", "push_version"]


@dataclass(kw_only=True)
class PushResult(TransferResult):
    """What a push did: the remote version, whether it was uploaded now (False: pushed before), whether
    LATEST names it, what LATEST names after the push, the local version's number, and the versions
    pruned."""

    uploaded: bool
    promoted: bool
    latest: str | None
    local_version: int
    #: The fleet's current root metadata after a signed push (None: unsigned), for `--root-out`.
    root: Any = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict:
        """The JSON form: TransferResult's, with the root's version in place of the root."""
        info = super().as_dict()
        root = info.pop("root")
        return info | {"root_version": root.signed.version if root is not None else None}


def manifest_identity(manifest: dict, raw: bytes) -> set[str]:
    """The sha256s that identify a remote manifest's source: its own bytes' and its pushed_from's."""
    ids = {hashlib.sha256(raw).hexdigest()}
    origin = manifest.get("pushed_from")
    if isinstance(origin, dict) and isinstance(origin.get("manifest_sha256"), str):
        ids.add(origin["manifest_sha256"])
    return ids


def same_content(remote: dict, local: dict) -> bool:
    """True when a remote manifest describes exactly the local version (every field but the version
    number and pushed_from): signing it vouches for the bytes this build box verified."""
    drop = ("version", "pushed_from")
    return {k: v for k, v in remote.items() if k not in drop} == {
        k: v for k, v in local.items() if k not in drop
    }


def push_version(
    version_dir: str | Path,
    url: str,
    *,
    promote: bool = True,
    keep: int | None = None,
    signing_key: SigningKey | str | Path | None = None,
    allow_unsigned: bool = False,
    timestamp_expiry_s: float | None = None,
    progress: Progress = NULL_PROGRESS,
    store: S3Store | None = None,
    timings: dict[str, float] | None = None,
) -> PushResult:
    """Publish the local version `version_dir` (or the one an OUT dir's LATEST names) to the remote OUT
    `url` (s3://bucket/prefix) under its own number, signed with `signing_key` (a key file or a loaded key;
    None: unsigned) into the fleet's metadata, whose timestamp then expires `timestamp_expiry_s` from now
    (None: the default). An unsigned version is promoted on a signed fleet only with `allow_unsigned`.
    Returns a PushResult; see the module docstring for the protocol.

    Raises InputError (bad arguments, the number taken or below the fleet's, an unsigned version over a
    signed fleet, a key the fleet's root does not name), RefusedRemoteVersion (the local version fails
    verification, exit 4), RemoteAccessError / RemoteError (the store refused or failed; nothing complete
    was changed)."""
    if keep is not None and (isinstance(keep, bool) or int(keep) < 1):
        raise InputError(f"--keep must be >= 1, got {keep}")
    remote = RemoteOut.parse(url)
    key = load_signing_key(signing_key) if isinstance(signing_key, str | Path) else signing_key
    timings = timings if timings is not None else {}
    vdir = resolve_bundle(version_dir)
    t0 = time.perf_counter()
    progress.stage("verify")
    try:
        verify_bundle(vdir)
    except BundleError as exc:
        raise RefusedRemoteVersion(f"not pushed: {exc}") from None
    raw_local = read_small_file(vdir / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    local = json.loads(raw_local)
    local_sha = hashlib.sha256(raw_local).hexdigest()
    timings["verify"] = time.perf_counter() - t0

    store = store or S3Store(remote)
    t0 = time.perf_counter()
    state = list_versions(store)
    for name in state.oversized:
        warnings.warn(f"{remote.url}/{oversized_note(name)}: ignored", stacklevel=2)
    if state.latest is not None and oversized_version_dir(state.latest):
        warnings.warn(f"{remote.url}/LATEST: names {oversized_note(state.latest)}: ignored", stacklevel=2)
    before = _pushed_before(store, state, local_sha)
    guard = promote and key is None and not allow_unsigned
    if key is not None:  # before anything is uploaded: a key the fleet does not (or no longer) trust
        check_signer(store, [key])
    if before is None:
        if guard:  # before anything is uploaded; checked again when LATEST moves
            refuse_unsigned_over_signed(store, state.latest)
        number = _claim(store, state, local_sha, int(local["version"]), promote)
        manifest, raw = _upload_version(store, vdir, local, local_sha, number, progress)
    else:
        number, raw = before
        manifest = json.loads(raw)
        if key is not None and not same_content(manifest, local):
            raise RefusedRemoteVersion(
                f"{store.remote.name_url(version_name(number, MANIFEST_NAME))}: records this version as its "
                "source but describes other files (changed on the store?); not signed: delete "
                f"{version_dir_name(number)} on the store and push again"
            )
    timings["upload"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    signed: Committed | None = None
    if key is not None:
        signed = commit(
            store, [key], _add_version(number, raw, promote), timestamp_expiry_s=timestamp_expiry_s
        )
        sync_latest_object(store, signed.latest)
        _crash_point("push_latest_moved")
        latest = version_dir_name(signed.latest) if signed.latest is not None else None
        promoted = signed.latest == number
    elif promote:
        promoted, latest = promote_remote(store, number, over_signed=not guard)
    else:
        promoted, latest = False, read_latest(store)[0]
    timings["promote"] = time.perf_counter() - t0
    pruned: list[str] = []
    if keep is not None:
        t0 = time.perf_counter()
        pruned = prune_remote(store, int(keep))
        if key is not None:
            gone = [n for name in pruned if (n := parse_version_dir(name)) is not None]
            if gone:
                signed = commit(store, [key], _drop_versions(gone), timestamp_expiry_s=timestamp_expiry_s)
            prune_metadata(store)
        timings["prune"] = time.perf_counter() - t0
    files = manifest["files"]
    return PushResult(
        url=remote.url,
        version=number,
        uploaded=before is None,
        promoted=promoted,
        latest=latest,
        local_version=int(local["version"]),
        files=len(files),
        bytes=sum(int(e["bytes"]) for e in files.values()),
        manifest=manifest,
        pruned=pruned,
        signed_by=key.key_id if key is not None else None,
        expires=signed.expires if signed is not None else None,
        fleet_latest=signed.latest if signed is not None else None,
        root=signed.root if signed is not None else None,
    )


def _add_version(number: int, manifest_raw: bytes, promote: bool) -> Any:
    """The change of the signed targets that lists version `number` (and, with promote, moves LATEST to
    it unless it names a higher version)."""

    def change(targets: dict[str, Any]) -> None:
        targets[manifest_target(number)] = manifest_entry(number, manifest_raw)
        if not promote:
            return
        try:
            current = latest_of(targets, "targets")
        except UntrustedVersion:
            current = None
        if current is None or current < number:
            targets[LATEST_TARGET] = latest_entry(number)

    return change


def _drop_versions(numbers: list[int]) -> Any:
    def change(targets: dict[str, Any]) -> None:
        for number in numbers:
            drop_target(targets, number)

    return change


def _pushed_before(store: S3Store, state: RemoteVersions, local_sha: str) -> tuple[int, bytes] | None:
    """(number, manifest bytes) of the complete remote version that holds this local manifest, or None
    (newest first)."""
    for number in reversed(state.complete()):
        got = store.get_small(version_name(number, MANIFEST_NAME), MAX_MANIFEST_BYTES)
        if got is None:
            continue
        try:
            manifest = json.loads(got[0])
        except (ValueError, RecursionError):
            continue
        if isinstance(manifest, dict) and local_sha in manifest_identity(manifest, got[0]):
            return number, got[0]
    return None


def _claim(store: S3Store, state: RemoteVersions, local_sha: str, number: int, promote: bool) -> int:
    """Reserve version `number` (the local version's) with a create-only write of vN/.claim; see step 3
    of the module docstring."""
    name = version_dir_name(number)
    in_use = [n for n in state.objects if n != number]
    if state.latest_number() is not None:
        in_use.append(state.latest_number())
    highest = max(in_use, default=0)
    fix = (
        "versions keep their number from the build box to the fleet: build the next version past it "
        f"(write {max(highest, number)} into the build box's OUT/.last_version, then build), or push with "
        "--no-promote"
    )
    if promote and highest > number:
        raise InputError(
            f"{store.remote.name_url(version_dir_name(highest))}: the fleet already holds a version above "
            f"this one ({name}); {fix}"
        )
    body = json.dumps(
        {
            "claimed_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "manifest_sha256": local_sha,
        }
    ).encode()
    try:
        store.put(version_name(number, CLAIM_NAME), body, if_none_match=True)
        return number
    except PreconditionFailed:
        pass
    got = store.get_small(version_name(number, CLAIM_NAME), 4096)
    try:
        claim = json.loads(got[0]) if got else {}
    except (ValueError, RecursionError):
        claim = {}
    claim = claim if isinstance(claim, dict) else {}
    if claim.get("manifest_sha256") == local_sha:
        return number  # this version's own claim: a push of it that died, or one running now
    by = " ".join(str(claim.get(k, "?"))[:64] for k in ("host", "claimed_at"))
    raise InputError(f"{store.remote.name_url(name)}: holds another version (claimed by {by}); {fix}")


def _upload_version(
    store: S3Store, vdir: Path, local: dict, local_sha: str, number: int, progress: Progress
) -> tuple[dict, bytes]:
    """Upload and check every file of the version as remote vNNNNNN, then its manifest (last). Returns
    the remote manifest and its bytes (a concurrent push of the same version may have written them)."""
    entries = local["files"]
    total = sum(int(e["bytes"]) for e in entries.values())
    progress.stage("upload", total)
    _crash_point("push_claimed")

    def upload(name: str) -> None:
        store.upload_file(str(vdir / name), version_name(number, name), on_bytes=progress.advance)
        _crash_point("push_file_uploaded")

    for_each_on_threads(upload, sorted(entries), PUSH_THREADS)

    progress.stage("check", total)

    def check(name: str) -> None:
        expected = entries[name]
        digest = store.stream_to(
            version_name(number, name), None, int(expected["bytes"]), on_chunk=progress.advance
        )
        if digest != expected["sha256"]:
            raise RemoteError(
                f"{store.remote.name_url(version_name(number, name))}: sha256 after upload differs"
            )

    for_each_on_threads(check, sorted(entries), PUSH_THREADS)

    manifest = dict(local)
    manifest["version"] = number
    manifest["pushed_from"] = {
        "version": int(local["version"]),
        "manifest_sha256": local_sha,
        "pushed_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    validate_manifest(manifest, "manifest being pushed")
    body = manifest_bytes(manifest)
    name = version_name(number, MANIFEST_NAME)
    try:
        store.put(name, body, if_none_match=True)  # last: it makes the version complete
    except PreconditionFailed:
        return _theirs(store, name, local_sha)
    got = store.get_small(name, MAX_MANIFEST_BYTES)
    if got is None or got[0] != body:
        raise RemoteError(f"{store.remote.name_url(name)}: reads back different from what was written")
    _crash_point("push_manifest_uploaded")
    return manifest, body


def _theirs(store: S3Store, name: str, local_sha: str) -> tuple[dict, bytes]:
    """The manifest a concurrent push of this same version wrote first; RefusedRemoteVersion when it is
    another version's."""
    got = store.get_small(name, MAX_MANIFEST_BYTES)
    try:
        theirs = json.loads(got[0]) if got else None
    except (ValueError, RecursionError):
        theirs = None
    if got is None or not isinstance(theirs, dict) or local_sha not in manifest_identity(theirs, got[0]):
        raise RefusedRemoteVersion(f"{store.remote.name_url(name)}: written by someone else meanwhile")
    return theirs, got[0]


def refuse_unsigned_over_signed(store: S3Store, latest: str | None) -> None:
    """InputError (exit 2) when the fleet is signed: it has signed metadata, or remote LATEST (`latest`, as
    read) names a version signed the way fleets were before they had metadata. An unsigned version
    promoted there would be refused by every host that trusts keys."""
    number = parse_version_dir(latest) if latest else None
    if store.head(metadata_name(TIMESTAMP_FILE)) is not None:
        what = f"{store.remote.name_url(metadata_name(TIMESTAMP_FILE))}: the fleet's versions are signed"
    elif number is not None and store.head(version_name(number, SIGNATURE_NAME)) is not None:
        what = f"{store.remote.name_url(LATEST_NAME)}: names {latest}, a signed version"
    else:
        return
    raise InputError(
        f"{what}; an unsigned version is not promoted over it (hosts that trust keys would not install it): "
        "give --signing-key KEY, or --allow-unsigned to move the plain LATEST all the same"
    )


def promote_remote(store: S3Store, number: int, *, over_signed: bool = True) -> tuple[bool, str | None]:
    """Point remote LATEST at vNNNNNN by compare-and-swap; never backwards (an unsigned fleet's promote:
    a signed fleet's LATEST is its metadata's, repository.py). Returns (LATEST names it now, what LATEST
    names). The version must be complete (its manifest is checked first). With over_signed=False the
    version is not promoted on a signed fleet (refuse_unsigned_over_signed)."""
    target = version_dir_name(number)
    if store.head(version_name(number, MANIFEST_NAME)) is None:
        raise RefusedRemoteVersion(f"{store.remote.name_url(target)}: has no {MANIFEST_NAME}; not promoted")
    for _ in range(CAS_ATTEMPTS):
        current, etag = read_latest(store)
        current_number = parse_version_dir(current) if current else None
        if current_number is not None and current_number >= number:
            return current_number == number, current
        if not over_signed:
            refuse_unsigned_over_signed(store, current)
        try:
            if etag is None:
                store.put(LATEST_NAME, f"{target}\n".encode(), if_none_match=True)
            else:
                store.put(LATEST_NAME, f"{target}\n".encode(), if_match=etag)
        except PreconditionFailed:
            continue  # another publisher moved LATEST: read it again
        _crash_point("push_latest_moved")
        return True, target
    raise RemoteError(f"{store.remote.name_url(LATEST_NAME)}: changed {CAS_ATTEMPTS} times while promoting")
