"""Pruning a remote OUT (`push --keep N`): every complete version but the N highest, and claims of pushes
that died, never the version LATEST names nor one above it (docs/bundle-format.md 13.2, step 7).

Only complete versions numbered below the one LATEST names are ever deleted: a push never moves LATEST
backwards, while a version above it may be promoted by a concurrent push at any moment (deleting it then
would leave LATEST naming nothing). With no LATEST, no complete version is deleted. A deliberate rollback
(rollback.py) may move LATEST back to a version after the listing: LATEST is read again before each
deletion, and the rollback checks its version after the move.
"""

from __future__ import annotations

import contextlib
import time

from ..bundle.format import MANIFEST_NAME, parse_version_dir, version_dir_name
from ..bundle.reader import MAX_MANIFEST_BYTES
from .remote import PreconditionFailed, S3Store, list_versions, read_latest, version_name

#: A claimed version with no manifest this long after its claim is a push that died; prune may remove it.
STALE_CLAIM_S = 24 * 3600.0


def prune_remote(store: S3Store, keep: int, now: float | None = None) -> list[str]:
    """Delete all but the `keep` highest complete versions, and stale incomplete versions (claimed over
    STALE_CLAIM_S ago, below a higher-numbered version); see the module docstring. Returns the names
    removed."""
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
