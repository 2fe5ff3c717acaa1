"""`move_remote_latest`: point a remote OUT's LATEST at a version named on purpose, backwards included: the
fleet's rollback (`zerogr promote s3://bucket/prefix/vNNNNNN`). Push only ever moves LATEST forwards.

Protocol:
  1. the version must be complete on the store: a valid manifest naming its own number, and every file it
     lists present with its declared size (the cheap check of `zerogr status`; pulls still hash every
     byte). No such version: NothingPublished (exit 5); an incomplete or broken one: RefusedRemoteVersion
     (exit 4). Its signature is checked against the trusted keys, as a pull would (UntrustedVersion, exit
     4), unless the fleet is unsigned (Trust.unsigned()). LATEST is not touched then.
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

from ..bundle.format import LATEST_NAME, MANIFEST_NAME, version_dir_name
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
from .signing import Trust, remote_signature, require_trust

CAS_ATTEMPTS = 50


@dataclass(frozen=True)
class LatestMove:
    """What a move of remote LATEST did: the remote OUT, the version LATEST names now, the one it named
    before (None: there was no LATEST), whether it changed, the version's manifest, and the trusted key
    that signed it (None on an unsigned fleet)."""

    url: str
    version: int
    previous: str | None
    moved: bool
    manifest: dict
    signed_by: str | None = None

    def as_dict(self) -> dict:
        """The JSON form (`--json`): every field but the manifest, plus the manifest's model_version."""
        fields = {k: v for k, v in self.__dict__.items() if k != "manifest"}
        return fields | {
            "latest": version_dir_name(self.version),
            "model_version": self.manifest.get("model_version"),
        }


def move_remote_latest(url: str, *, trust: Trust | None, store: S3Store | None = None) -> LatestMove:
    """Point the remote LATEST at `url` = s3://bucket/prefix/vNNNNNN, a complete version whose signature
    checks against `trust` (or Trust.unsigned() for an unsigned fleet; None is refused, InputError),
    whichever way that moves it; see the module docstring. Raises InputError (the URL, no trust),
    NothingPublished (no such version), RefusedRemoteVersion (incomplete, broken or not signed by a
    trusted key, or pruned meanwhile), RemoteAccessError / RemoteError (the store refused or failed)."""
    remote, number = parse_version_url(url)
    trust = require_trust(trust, remote.url)
    store = store or S3Store(remote)
    raw = read_remote_manifest(store, number, named_by_latest=False)
    _, signed_by = remote_signature(store, number, raw, trust)
    manifest = parse_remote_manifest(store, number, raw)
    check_objects(store, number, manifest["files"])
    target = version_dir_name(number)
    body = f"{target}\n".encode()
    for _ in range(CAS_ATTEMPTS):
        previous, etag = read_latest(store)
        if previous == target:
            return LatestMove(remote.url, number, previous, False, manifest, signed_by)
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
    return LatestMove(remote.url, number, previous, True, manifest, signed_by)


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
