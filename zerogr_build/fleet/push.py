"""`push_version`: publish a verified local version to a remote OUT (docs/bundle-format.md, "Remote OUT").

Protocol:
  1. verify the local version completely (checksums and invariants); a bad one is never uploaded.
  2. list the remote OUT. A complete remote version whose manifest is this one (its `pushed_from`
     manifest_sha256, or its own bytes, equal the sha256 of the local manifest.json) means it was pushed
     before: nothing is uploaded, only steps 6-7 run.
  3. claim a number: N = 1 + the highest version number in use (listed or named by LATEST); create
     vN/.claim with If-None-Match: * ; when another publisher created it first, try N+1.
  4. upload every listed file (multipart, each part's SHA-256 checked by the store on receipt), then read
     each back in a stream and check its size and sha256 against the manifest.
  5. with a signing key, upload vN/manifest.json.sig (create-only): the signature of the remote manifest's
     exact bytes (signing.py). Then upload manifest.json last (create-only), its `version` set to N and
     `pushed_from` recording the local version and the local manifest's sha256; read both back. The
     version is now complete.
  6. with promote: move LATEST to vN by compare-and-swap on its ETag (If-Match; If-None-Match when there
     is none), re-reading on a lost race; never to a lower number than LATEST already names. An unsigned
     version is not promoted over a LATEST that names a signed one (InputError, exit 2, checked before
     anything is uploaded and again at the move) unless allow_unsigned: hosts that trust keys would
     refuse it and stop following the remote.
  7. with keep: delete every complete version but the `keep` highest and the one LATEST names (manifest
     first, so a half-deleted version is incomplete, never wrong), and claimed-but-incomplete versions
     older than STALE_CLAIM_S below a higher version (pushes that died). LATEST is read again just before
     each version is deleted and once more after its manifest is, so a rollback that moved LATEST to a
     version after the listing keeps it.
A push killed at any point leaves LATEST and every complete version as they were.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..base.errors import BundleError, InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..bundle.files import _crash_point, read_small_file
from ..bundle.format import (
    LATEST_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    manifest_bytes,
    parse_version_dir,
    validate_manifest,
    version_dir_name,
)
from ..bundle.reader import MAX_MANIFEST_BYTES
from ..bundle.verify import verify_bundle
from ..bundle.versions import resolve_bundle
from .keys import SigningKey, load_signing_key
from .remote import (
    CLAIM_NAME,
    PreconditionFailed,
    RefusedRemoteVersion,
    RemoteError,
    RemoteOut,
    RemoteVersions,
    S3Store,
    for_each_on_threads,
    list_versions,
    read_latest,
    version_name,
)
from .signing import Trust, remote_signature, signature_file
from .transfer import TransferResult

PUSH_THREADS = 4
CLAIM_ATTEMPTS = 100
CAS_ATTEMPTS = 50
#: A claimed version with no manifest this long after its claim is a push that died; prune may remove it.
STALE_CLAIM_S = 24 * 3600.0


@dataclass(kw_only=True)
class PushResult(TransferResult):
    """What a push did: the remote version, whether it was uploaded now (False: pushed before), whether
    LATEST names it, what LATEST names after the push, and the versions pruned."""

    uploaded: bool
    promoted: bool
    latest: str | None
    local_version: int


def manifest_identity(manifest: dict, raw: bytes) -> set[str]:
    """The sha256s that identify a remote manifest's source: its own bytes' and its pushed_from's."""
    ids = {hashlib.sha256(raw).hexdigest()}
    origin = manifest.get("pushed_from")
    if isinstance(origin, dict) and isinstance(origin.get("manifest_sha256"), str):
        ids.add(origin["manifest_sha256"])
    return ids


def push_version(
    version_dir: str | Path,
    url: str,
    *,
    promote: bool = True,
    keep: int | None = None,
    signing_key: SigningKey | str | Path | None = None,
    allow_unsigned: bool = False,
    progress: Progress = NULL_PROGRESS,
    store: S3Store | None = None,
    timings: dict[str, float] | None = None,
) -> PushResult:
    """Publish the local version `version_dir` (or the one an OUT dir's LATEST names) to the remote OUT
    `url` (s3://bucket/prefix), signed with `signing_key` (a key file or a loaded key; None: unsigned).
    An unsigned version is promoted over a LATEST that names a signed one only with `allow_unsigned`.
    Returns a PushResult; see the module docstring for the protocol.

    Raises InputError (bad arguments, an unsigned version over a signed LATEST), RefusedRemoteVersion (the
    local version fails verification, exit 4), RemoteAccessError / RemoteError (the store refused or
    failed; nothing complete was changed)."""
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
    number = _pushed_before(store, state, local_sha, key)
    uploaded = number is None
    guard = promote and key is None and not allow_unsigned
    if number is None:
        if guard:  # before anything is uploaded; checked again when LATEST moves
            refuse_unsigned_over_signed(store, state.latest)
        number = _claim(store, state, local_sha)
        manifest = _upload_version(store, vdir, local, local_sha, number, progress, key)
    else:
        got = store.get_small(version_name(number, MANIFEST_NAME), MAX_MANIFEST_BYTES)
        manifest = json.loads(got[0]) if got else local
    timings["upload"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    promoted, latest = False, None
    if promote:
        promoted, latest = promote_remote(store, number, over_signed=not guard)
    else:
        latest = read_latest(store)[0]
    timings["promote"] = time.perf_counter() - t0
    pruned: list[str] = []
    if keep is not None:
        t0 = time.perf_counter()
        pruned = prune_remote(store, int(keep))
        timings["prune"] = time.perf_counter() - t0
    files = manifest["files"]
    return PushResult(
        url=remote.url,
        version=number,
        uploaded=uploaded,
        promoted=promoted,
        latest=latest,
        local_version=int(local["version"]),
        files=len(files),
        bytes=sum(int(e["bytes"]) for e in files.values()),
        manifest=manifest,
        pruned=pruned,
        signed_by=key.key_id if key is not None else None,
    )


def _pushed_before(
    store: S3Store, state: RemoteVersions, local_sha: str, key: SigningKey | None
) -> int | None:
    """The complete remote version that holds this local manifest, or None (newest first). With a signing
    key, only one that this key signed counts: after a key rotation the version is pushed again, signed
    with the new key."""
    for number in reversed(state.complete()):
        got = store.get_small(version_name(number, MANIFEST_NAME), MAX_MANIFEST_BYTES)
        if got is None:
            continue
        try:
            manifest = json.loads(got[0])
        except ValueError:
            continue
        ours = isinstance(manifest, dict) and local_sha in manifest_identity(manifest, got[0])
        if ours and (key is None or _signed_by(store, number, got[0], key)):
            return number
    return None


def _signed_by(store: S3Store, number: int, manifest_raw: bytes, key: SigningKey) -> bool:
    """True when remote version `number` carries a valid signature by `key`."""
    try:
        remote_signature(store, number, manifest_raw, Trust({key.key_id: key.private.public_key()}))
    except RefusedRemoteVersion:  # missing, oversized, malformed, another key's, or not this manifest's
        return False
    return True


def _claim(store: S3Store, state: RemoteVersions, local_sha: str) -> int:
    """Reserve the next free version number with a create-only write of vN/.claim."""
    used = list(state.objects)
    if state.latest_number() is not None:
        used.append(state.latest_number())
    number = max(used, default=0) + 1
    body = json.dumps(
        {
            "claimed_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "manifest_sha256": local_sha,
        }
    ).encode()
    for _ in range(CLAIM_ATTEMPTS):
        try:
            store.put(version_name(number, CLAIM_NAME), body, if_none_match=True)
            return number
        except PreconditionFailed:
            number += 1
    raise RemoteError(f"{store.remote.url}: could not claim a version number in {CLAIM_ATTEMPTS} tries")


def _upload_version(
    store: S3Store,
    vdir: Path,
    local: dict,
    local_sha: str,
    number: int,
    progress: Progress,
    key: SigningKey | None,
) -> dict:
    """Upload and check every file of the version as remote vNNNNNN, then its signature (with a key) and
    its manifest (last)."""
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
    written = {}
    if key is not None:
        written[version_name(number, SIGNATURE_NAME)] = signature_file(key, body)
    written[version_name(number, MANIFEST_NAME)] = body
    for name, data in written.items():  # the manifest last: it makes the version complete
        store.put(name, data, if_none_match=True)
        got = store.get_small(name, MAX_MANIFEST_BYTES)
        if got is None or got[0] != data:
            raise RemoteError(f"{store.remote.name_url(name)}: reads back different from what was written")
    _crash_point("push_manifest_uploaded")
    return manifest


def refuse_unsigned_over_signed(store: S3Store, latest: str | None) -> None:
    """InputError (exit 2) when remote LATEST (`latest`, as read) names a signed version: an unsigned one
    promoted over it would be refused by every host that trusts keys, which then stop following the
    remote (a frozen fleet)."""
    number = parse_version_dir(latest) if latest else None
    if number is None or store.head(version_name(number, SIGNATURE_NAME)) is None:
        return
    raise InputError(
        f"{store.remote.name_url(LATEST_NAME)}: names {latest}, a signed version; an unsigned version is "
        "not promoted over it (hosts that trust keys would refuse it and stop updating): give "
        "--signing-key KEY, or --allow-unsigned to push it unsigned all the same"
    )


def promote_remote(store: S3Store, number: int, *, over_signed: bool = True) -> tuple[bool, str | None]:
    """Point remote LATEST at vNNNNNN by compare-and-swap; never backwards. Returns (LATEST names it
    now, what LATEST names). The version must be complete (its manifest is checked first). With
    over_signed=False an unsigned version is not promoted over a LATEST that names a signed one
    (refuse_unsigned_over_signed)."""
    target = version_dir_name(number)
    if store.head(version_name(number, MANIFEST_NAME)) is None:
        raise RefusedRemoteVersion(f"{store.remote.name_url(target)}: has no {MANIFEST_NAME}; not promoted")
    guard = not over_signed and store.head(version_name(number, SIGNATURE_NAME)) is None
    for _ in range(CAS_ATTEMPTS):
        current, etag = read_latest(store)
        current_number = parse_version_dir(current) if current else None
        if current_number is not None and current_number >= number:
            return current_number == number, current
        if guard:
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


def prune_remote(store: S3Store, keep: int, now: float | None = None) -> list[str]:
    """Delete all but the `keep` highest complete versions, and stale incomplete versions (claimed over
    STALE_CLAIM_S ago, below a higher-numbered version). Returns the names removed.

    Only complete versions numbered below the one LATEST names are ever deleted: a push never moves LATEST
    backwards, while a version above it may be promoted by a concurrent push at any moment (deleting it
    then would leave LATEST naming nothing). With no LATEST, no complete version is deleted. A deliberate
    rollback (rollback.py) may move LATEST back to a version after the listing: LATEST is read again
    before each deletion (_delete_version), and the rollback checks its version after the move."""
    state = list_versions(store)
    latest = state.latest_number()
    complete = state.complete()
    oldest = complete[: max(len(complete) - keep, 0)]
    doomed = [n for n in oldest if latest is not None and n < latest]
    now = time.time() if now is None else now
    highest = max(state.objects, default=0)
    for number, objects in state.objects.items():
        if MANIFEST_NAME in objects or number in (highest, latest):
            continue
        newest = max(obj.modified.timestamp() for obj in objects.values())
        if now - newest > STALE_CLAIM_S:
            doomed.append(number)
    return [version_dir_name(n) for n in sorted(doomed) if _delete_version(store, n, state.objects[n])]


def _delete_version(store: S3Store, number: int, objects: dict) -> bool:
    """Delete the objects `objects` of version `number`. A complete one goes manifest first (from then on
    it is incomplete, so nobody pulls it), and only while remote LATEST names a higher version: LATEST is
    read just before, and again once the manifest is gone; when a rollback moved LATEST to it (or below
    it) in between, the manifest is put back (create-only) and nothing else is deleted. Returns whether
    the version was deleted."""
    names = [version_name(number, n) for n in objects]
    manifest = version_name(number, MANIFEST_NAME)
    if manifest not in names:  # incomplete: it cannot be promoted, nor pulled
        store.delete(names)
        return True
    if not _below_latest(store, number):
        return False
    got = store.get_small(manifest, MAX_MANIFEST_BYTES)
    store.delete([manifest])
    if not _below_latest(store, number):
        if got is not None:
            with contextlib.suppress(PreconditionFailed):  # someone put it back already
                store.put(manifest, got[0], if_none_match=True)
        return False
    store.delete([n for n in names if n != manifest])
    return True


def _below_latest(store: S3Store, number: int) -> bool:
    """True when remote LATEST, read now, names a version numbered above `number`."""
    latest = read_latest(store)[0]
    latest_number = parse_version_dir(latest) if latest else None
    return latest_number is not None and number < latest_number
