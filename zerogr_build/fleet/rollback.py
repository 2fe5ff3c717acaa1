"""`move_remote_latest`: point a remote OUT's LATEST at a version named on purpose, backwards included: the
fleet's rollback (`zerogr promote s3://bucket/prefix/vNNNNNN`). Push only ever moves LATEST forwards.

On a signed fleet the rollback is signed (`signing_key`, the build box's key): the version must be in the
fleet's signed targets with exactly its manifest bytes (signed when it was pushed), complete on the store
as below; then new signed metadata names it as LATEST (repository.py), the plain LATEST object follows,
and hosts follow on their next pull. A host that trusts keys follows only signed metadata, so a rollback
given trusted keys but no signing key is refused (InputError, exit 2).

On an unsigned fleet (Trust.unsigned()):
  1. the version must be complete on the store: a valid manifest naming its own number, and every file it
     lists present with its declared size (the cheap check of `zerogr status`; pulls still hash every
     byte). No such version: NothingPublished (exit 5); an incomplete or broken one: RefusedRemoteVersion
     (exit 4). LATEST is not touched then.
  2. LATEST is replaced by compare-and-swap on its ETag (If-Match; If-None-Match when there is none),
     re-read on a lost race, so the result names exactly the LATEST that was replaced.
  3. the manifest is checked again: a concurrent `push --keep` may prune a version below the LATEST it
     read (prune re-reads LATEST before deleting each version and restores a manifest that LATEST came
     to name meanwhile, so this is rare). If it is gone, LATEST is put back (compare-and-swap again) and
     the move is refused; when there was no LATEST before, it is left naming the version (deleting it
     could not be made conditional on it being ours), and the error says so.
Serving hosts follow on their next pull (a pull moves LATEST backwards like forwards), except hosts held
at a local promotion. The next push of a new version moves LATEST forwards again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..base.errors import InputError
from ..bundle.format import LATEST_NAME, MANIFEST_NAME, version_dir_name
from .keys import SigningKey, load_signing_key
from .metadata import LATEST_TARGET, check_manifest, latest_entry, manifest_target
from .remote import (
    PreconditionFailed,
    RefusedRemoteVersion,
    RemoteError,
    S3Store,
    parse_version_url,
    read_latest,
    version_name,
)
from .remote_version import check_objects, parse_remote_manifest, read_remote_manifest
from .repository import commit, sync_latest_object
from .signing import Trust, require_trust

CAS_ATTEMPTS = 50


@dataclass(frozen=True)
class LatestMove:
    """What a move of remote LATEST did: the remote OUT, the version LATEST names now, the one it named
    before (None: there was no LATEST), whether it changed, the version's manifest, and the trusted key
    that signed it (None on an unsigned fleet), and when the signed metadata expires (signed fleets)."""

    url: str
    version: int
    previous: str | None
    moved: bool
    manifest: dict
    signed_by: str | None = None
    expires: float | None = None

    def as_dict(self) -> dict:
        """The JSON form (`--json`): every field but the manifest, plus the manifest's model_version."""
        fields = {k: v for k, v in self.__dict__.items() if k != "manifest"}
        return fields | {
            "latest": version_dir_name(self.version),
            "model_version": self.manifest.get("model_version"),
        }


def move_remote_latest(
    url: str,
    *,
    trust: Trust | None = None,
    signing_key: SigningKey | str | Path | None = None,
    timestamp_expiry_s: float | None = None,
    store: S3Store | None = None,
) -> LatestMove:
    """Point the remote LATEST at `url` = s3://bucket/prefix/vNNNNNN, whichever way that moves it: signed
    with `signing_key` on a signed fleet, or as an unsigned fleet's (`trust` = Trust.unsigned()); see the
    module docstring. Raises InputError (the URL, neither a key nor trust, trusted keys without a signing
    key), NothingPublished (no such version), RefusedRemoteVersion (incomplete, broken, not signed when it
    was pushed, or pruned meanwhile), RemoteAccessError / RemoteError (the store refused or failed)."""
    remote, number = parse_version_url(url)
    store = store or S3Store(remote)
    if signing_key is not None:
        key = load_signing_key(signing_key) if isinstance(signing_key, str | Path) else signing_key
        return _signed_rollback(store, number, key, timestamp_expiry_s)
    trust = require_trust(trust, remote.url)
    if trust.keys:
        raise InputError(
            f"{remote.url}: hosts that trust keys follow the fleet's signed metadata: roll it back with "
            f"--signing-key KEY (the build box's key), which signs new metadata naming "
            f"{version_dir_name(number)}"
        )
    raw = read_remote_manifest(store, number, named_by_latest=False)
    manifest = parse_remote_manifest(store, number, raw)
    check_objects(store, number, manifest["files"])
    target = version_dir_name(number)
    body = f"{target}\n".encode()
    for _ in range(CAS_ATTEMPTS):
        previous, etag = read_latest(store)
        if previous == target:
            return LatestMove(remote.url, number, previous, False, manifest)
        try:
            if etag is None:
                new_etag = store.put(LATEST_NAME, body, if_none_match=True)
            else:
                new_etag = store.put(LATEST_NAME, body, if_match=etag)
        except PreconditionFailed:
            continue  # LATEST changed since it was read: read it again
        break
    else:
        raise RemoteError(
            f"{store.remote.name_url(LATEST_NAME)}: changed {CAS_ATTEMPTS} times while moving it"
        )
    if store.head(version_name(number, MANIFEST_NAME)) is None:
        raise RefusedRemoteVersion(
            f"{store.remote.name_url(target)}: pruned while LATEST was moved to it; "
            + _put_back(store, previous, new_etag)
        )
    return LatestMove(remote.url, number, previous, True, manifest)


def _signed_rollback(store: S3Store, number: int, key: SigningKey, expiry: float | None) -> LatestMove:
    """The rollback of a signed fleet (see the module docstring)."""
    raw = read_remote_manifest(store, number, named_by_latest=False)
    manifest = parse_remote_manifest(store, number, raw)
    check_objects(store, number, manifest["files"])
    where = store.remote.name_url(version_name(number, MANIFEST_NAME))

    def name_it(targets: dict) -> None:
        check_manifest(targets, number, raw, where)
        targets[LATEST_TARGET] = latest_entry(number)

    done = commit(store, [key], name_it, timestamp_expiry_s=expiry)
    sync_latest_object(store, done.latest)
    previous = version_dir_name(done.previous_latest) if done.previous_latest is not None else None
    if store.head(version_name(number, MANIFEST_NAME)) is None:
        back = done.previous_latest

        def put_back(targets: dict) -> None:
            if back is not None and manifest_target(back) in targets:
                targets[LATEST_TARGET] = latest_entry(back)

        done = commit(store, [key], put_back, timestamp_expiry_s=expiry)
        sync_latest_object(store, done.latest)
        now = version_dir_name(done.latest) if done.latest is not None else "nothing"
        raise RefusedRemoteVersion(
            f"{store.remote.name_url(version_dir_name(number))}: pruned while LATEST was moved to it; the "
            f"signed LATEST names {now} again"
        )
    moved = done.previous_latest != number
    return LatestMove(store.remote.url, number, previous, moved, manifest, key.key_id, done.expires)


def _put_back(store: S3Store, previous: str | None, etag: str) -> str:
    """Undo a move of LATEST by compare-and-swap on the ETag this move wrote, unless LATEST has changed
    again since (then that change stands). With no LATEST before, it is left as it is: a delete cannot be
    made conditional here, and an unconditional one could remove the LATEST of a concurrent push.
    Returns what happened, for the error message."""
    if previous is None:
        return "LATEST (there was none before) is left as it is: promote or push a complete version"
    try:
        store.put(LATEST_NAME, f"{previous}\n".encode(), if_match=etag)
    except PreconditionFailed:
        return "LATEST was moved again meanwhile and is left as it is"
    return f"LATEST put back to {previous}"
