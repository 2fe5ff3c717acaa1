"""`move_remote_latest`: point a remote OUT's LATEST at a version named on purpose, backwards included: the
fleet's rollback (`zerogr promote s3://bucket/prefix/vNNNNNN`). Push only ever moves LATEST forwards.

Protocol:
  1. the version must be complete on the store: a valid manifest naming its own number, and every file it
     lists present with its declared size (the cheap check of `zerogr status`; pulls still hash every
     byte). No such version: NothingPublished (exit 5); an incomplete or broken one: RefusedRemoteVersion
     (exit 4). LATEST is not touched then.
  2. LATEST is replaced by compare-and-swap on its ETag (If-Match; If-None-Match when there is none),
     re-read on a lost race, so the result names exactly the LATEST that was replaced.
  3. the manifest is checked again: a concurrent `push --keep` may prune a version below the LATEST it
     read. If it is gone, LATEST is put back (compare-and-swap again) and the move is refused.
Serving hosts follow on their next pull (a pull moves LATEST backwards like forwards), except hosts held
at a local promotion. The next push of a new version moves LATEST forwards again.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..bundle.format import LATEST_NAME, MANIFEST_NAME, version_dir_name
from .pull import _check_objects, _remote_manifest
from .remote import (
    PreconditionFailed,
    RefusedRemoteVersion,
    RemoteError,
    S3Store,
    parse_version_url,
    read_latest,
    version_name,
)

CAS_ATTEMPTS = 50


@dataclass(frozen=True)
class LatestMove:
    """What a move of remote LATEST did: the remote OUT, the version LATEST names now, the one it named
    before (None: there was no LATEST), whether it changed, and the version's manifest."""

    url: str
    version: int
    previous: str | None
    moved: bool
    manifest: dict

    def as_dict(self) -> dict:
        """The JSON form (`--json`): every field but the manifest, plus the manifest's model_version."""
        fields = {k: v for k, v in self.__dict__.items() if k != "manifest"}
        return fields | {
            "latest": version_dir_name(self.version),
            "model_version": self.manifest.get("model_version"),
        }


def move_remote_latest(url: str, *, store: S3Store | None = None) -> LatestMove:
    """Point the remote LATEST at `url` = s3://bucket/prefix/vNNNNNN, a complete version, whichever way
    that moves it; see the module docstring. Raises InputError (the URL), NothingPublished (no such
    version), RefusedRemoteVersion (incomplete or broken, or pruned meanwhile), RemoteAccessError /
    RemoteError (the store refused or failed)."""
    remote, number = parse_version_url(url)
    store = store or S3Store(remote)
    _, manifest = _remote_manifest(store, number, named_by_latest=False)
    _check_objects(store, number, manifest["files"])
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
        _put_back(store, previous, new_etag)
        raise RefusedRemoteVersion(
            f"{store.remote.name_url(target)}: pruned while LATEST was moved to it; LATEST put back to "
            f"{previous or '(none)'}"
        )
    return LatestMove(remote.url, number, previous, True, manifest)


def _put_back(store: S3Store, previous: str | None, etag: str) -> None:
    """Undo a move of LATEST, unless LATEST has changed again since (then that change stands)."""
    try:
        if previous is None:
            store.delete([LATEST_NAME])
        else:
            store.put(LATEST_NAME, f"{previous}\n".encode(), if_match=etag)
    except PreconditionFailed:
        pass
