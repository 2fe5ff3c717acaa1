"""The build box's side of the fleet's signed metadata (metadata.py): read what the store holds, check it
with the fleet's keys, and commit a change (a pushed version, a new LATEST, pruned versions, or only a
fresher timestamp) as new targets, snapshot and timestamp metadata.

`commit`:
  1. list tuf/ and read the root chain from 1.root.json up, each root checked by the one before; a root
     file that does not verify is deleted (one warning), so one stray object cannot wedge the fleet.
     Without any root, 1.root.json is created (create-only): the signing key for every role, threshold 1;
     the first targets then list the versions the key signed before the fleet had metadata (migrate.py).
  2. the signing keys must be the root's keys for targets, snapshot and timestamp (InputError otherwise).
  3. the committed state: timestamp -> the snapshot it names (length, sha256) -> the targets it names,
     each signed by the root's keys. When that does not verify (a broken or hostile object), the newest
     snapshot and targets that do are the base instead (one warning).
  4. the change is applied to a copy of the targets. New targets and snapshot files (create-only, the
     next free number) are written when the targets changed or expire within RENEW_BEFORE_S, the
     snapshot alone when it expires soon; a root that expires soon is renewed when the keys may.
  5. the new timestamp (expiring `timestamp_expiry_s` from now) replaces tuf/timestamp.json by
     compare-and-swap on its ETag; a lost race starts again at 1, so concurrent writers lose no change.
Targets, snapshot and timestamp are numbered by the signing time in unix seconds (or one more than the
highest in use): a replay of older metadata never outnumbers what the hosts have seen, so the next commit
after a replay is accepted by every host.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..bundle.format import version_dir_name
from .keys import SigningKey, load_signing_key
from .metadata import (
    LATEST_TARGET,
    ONLINE_ROLES,
    TIMESTAMP_FILE,
    UntrustedVersion,
    expiry_of,
    get_metadata,
    latest_of,
    listed_versions,
    manifest_target,
    metadata_name,
    metadata_url,
    now_utc,
    parse_metadata,
    parse_role_file,
    refused_as,
    role_file,
    sign_with,
    signed_by,
    to_bytes,
    tuf,
)
from .migrate import old_signed_targets
from .remote import PreconditionFailed, RemoteError, RemoteOut, S3Store, read_latest
from .roots import LONG_EXPIRY_S, RENEW_BEFORE_S, check_keys, first_root, load_root, put_root, renewed_root

#: Default life of the timestamp (days): hosts refuse the fleet's metadata once it passes.
TIMESTAMP_EXPIRY_DAYS = 3.0
#: Old targets and snapshot files younger than this are kept (a host may be reading them).
STALE_METADATA_S = 24 * 3600.0
CAS_ATTEMPTS = 50
NAME_ATTEMPTS = 100
#: Snapshot files tried, newest first, when the committed state does not verify.
FALLBACK_TRIES = 20

Change = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Committed:
    """What a commit signed: the remote OUT, the version LATEST names now (and before), the versions the
    targets list, when the metadata expires (the earliest of its files), the key ids that signed, and the
    fleet's root metadata the commit was checked against (the current root: what hosts are given)."""

    url: str
    latest: int | None
    previous_latest: int | None
    versions: list[int]
    expires: float
    signed_by: list[str] = field(default_factory=list)
    root: Any = None


@dataclass
class _Base:
    """The committed state a commit starts from: the timestamp's ETag (for the compare-and-swap) and
    version, and the snapshot and targets it names (None: none that verify)."""

    timestamp_etag: str | None = None
    timestamp_version: int = 0
    snapshot: Any = None
    targets: Any = None


def timestamp_expiry(days: float | None) -> float:
    """Seconds a timestamp lives: `days` (None: the default), which must be positive."""
    days = TIMESTAMP_EXPIRY_DAYS if days is None else float(days)
    if not days > 0:
        raise InputError(f"timestamp_expiry_days must be > 0, got {days}")
    return days * 86400.0


def check_signer(store: S3Store, keys: Sequence[SigningKey]) -> None:
    """InputError (exit 2) unless the fleet's root lets `keys` sign its targets, snapshot and timestamp (a
    fleet with no signed metadata yet: any key, it becomes the fleet's first). Checked before a push
    uploads anything."""
    root_md = load_root(store, store.list_under(metadata_name("")))
    if root_md is not None:
        check_keys(store, root_md, keys, ONLINE_ROLES)


def _read_verified(store: S3Store, root: Any, file: str, meta: Any, role: str) -> Any:
    where = metadata_url(store, file)
    got = get_metadata(store, file)
    if got is None:
        raise UntrustedVersion(f"{where}: missing")
    with refused_as(where):
        meta.verify_length_and_hashes(got[0])
        md = parse_metadata(got[0], role, where)
        signed_by(root, role, md)
    if md.signed.version != meta.version:
        raise UntrustedVersion(f"{where}: version {md.signed.version}, expected {meta.version}")
    return md


def _snapshot_and_targets(store: S3Store, root: Any, snapshot_meta: Any) -> tuple[Any, Any]:
    snapshot = _read_verified(
        store, root, role_file(snapshot_meta.version, "snapshot"), snapshot_meta, "snapshot"
    )
    targets_meta = snapshot.signed.meta.get("targets.json")
    if targets_meta is None:
        raise UntrustedVersion(
            f"{metadata_url(store, role_file(snapshot_meta.version, 'snapshot'))}: no targets"
        )
    return snapshot, _read_verified(
        store, root, role_file(targets_meta.version, "targets"), targets_meta, "targets"
    )


def _read_base(store: S3Store, root_md: Any, listing: dict[str, Any]) -> _Base:
    """The committed state (step 3 of the module docstring)."""
    base = _Base()
    root = root_md.signed
    got = get_metadata(store, TIMESTAMP_FILE)
    if got is not None:
        base.timestamp_etag = got[1]
        where = metadata_url(store, TIMESTAMP_FILE)
        try:
            timestamp = parse_metadata(got[0], "timestamp", where)
            base.timestamp_version = timestamp.signed.version
            with refused_as(where):
                signed_by(root, "timestamp", timestamp)
            base.snapshot, base.targets = _snapshot_and_targets(store, root, timestamp.signed.snapshot_meta)
            return base
        except UntrustedVersion as exc:
            warnings.warn(f"the fleet's committed metadata does not verify ({exc}); re-signed", stacklevel=3)
    metadata = tuf()
    snapshots = sorted(
        (parsed[0] for name in listing if (parsed := parse_role_file(name)) and parsed[1] == "snapshot"),
        reverse=True,
    )
    for version in snapshots[:FALLBACK_TRIES]:
        name = role_file(version, "snapshot")
        try:
            got = get_metadata(store, name)
            snapshot = parse_metadata(got[0], "snapshot", metadata_url(store, name)) if got else None
            if snapshot is not None:
                meta = metadata.MetaFile(version=version, length=len(got[0]))
                base.snapshot, base.targets = _snapshot_and_targets(store, root, meta)
                return base
        except UntrustedVersion:
            continue
    return base


def _next_number(listing: dict[str, Any], role: str, *used: int) -> int:
    """The signing time in unix seconds, or one more than the highest number `role` uses."""
    listed = [parsed[0] for name in listing if (parsed := parse_role_file(name)) and parsed[1] == role]
    return max(int(time.time()), max([*listed, *used], default=0) + 1)


def _put_new(store: S3Store, md: Any, role: str, keys: Sequence[SigningKey], first: int) -> bytes:
    """Write `md` as the first free `<N>.<role>.json` from `first` on (create-only); returns its bytes."""
    for number in range(first, first + NAME_ATTEMPTS):
        md.signed.version = number
        sign_with(md, keys)
        raw = to_bytes(md)
        try:
            store.put(metadata_name(role_file(number, role)), raw, if_none_match=True)
            return raw
        except PreconditionFailed:
            continue
    raise RemoteError(f"{metadata_url(store, role)}: no free {role} number in {NAME_ATTEMPTS} tries")


def _due(md: Any, now: datetime) -> bool:
    return md is None or md.signed.expires - now < timedelta(seconds=RENEW_BEFORE_S)


def commit(
    store: S3Store,
    keys: Sequence[SigningKey],
    change: Change | None = None,
    *,
    timestamp_expiry_s: float | None = None,
    resign: bool = False,
) -> Committed:
    """Sign the fleet's metadata with `keys` after `change(targets)` (a {path: TargetFile} dict, changed in
    place; None: only renew); see the module docstring. `resign`: new targets and snapshot files even when
    nothing changed (a key rotation). Raises InputError (keys the root does not name), UntrustedVersion
    (1.root.json broken, or what `change` refuses), RemoteError (retry)."""
    metadata = tuf()
    expiry = timestamp_expiry(None) if timestamp_expiry_s is None else float(timestamp_expiry_s)
    for _ in range(CAS_ATTEMPTS):
        listing = store.list_under(metadata_name(""))
        root_md = load_root(store, listing)
        fresh = root_md is None
        if fresh:
            root_md = first_root(keys)
            if not put_root(store, root_md):
                continue  # another writer created the fleet's first root: read it
        check_keys(store, root_md, keys, ONLINE_ROLES)
        now = now_utc()
        if not fresh and _due(root_md, now):
            root_md = renewed_root(store, root_md, keys)
            if root_md is None:
                continue
        base = _read_base(store, root_md, listing)
        root = root_md.signed
        if base.targets is not None:
            old = dict(base.targets.signed.targets)
        else:
            old = old_signed_targets(store, keys) if fresh or base.timestamp_etag is None else {}
        where = metadata_url(store, TIMESTAMP_FILE)
        try:
            previous = latest_of(old, where)
        except UntrustedVersion:
            previous = None
        targets = dict(old)
        if change is not None:
            change(targets)
        same = {p: t.to_dict() for p, t in targets.items()} == {p: t.to_dict() for p, t in old.items()}
        targets_md, snapshot_md = base.targets, base.snapshot
        new_targets = resign or base.targets is None or not same or _due(base.targets, now)
        if new_targets or _due(base.snapshot, now):
            long = now + timedelta(seconds=LONG_EXPIRY_S)
            if new_targets:
                targets_md = metadata.Metadata(metadata.Targets(expires=long, targets=targets))
                used = [base.targets.signed.version] if base.targets is not None else []
                raw = _put_new(store, targets_md, "targets", keys, _next_number(listing, "targets", *used))
                targets_file = metadata.MetaFile.from_data(targets_md.signed.version, raw, ["sha256"])
            else:
                targets_file = base.snapshot.signed.meta["targets.json"]
            snapshot_md = metadata.Metadata(
                metadata.Snapshot(expires=long, meta={"targets.json": targets_file})
            )
            used = [base.snapshot.signed.version] if base.snapshot is not None else []
            snapshot_raw = _put_new(
                store, snapshot_md, "snapshot", keys, _next_number(listing, "snapshot", *used)
            )
        else:
            snapshot_raw = to_bytes(snapshot_md)
        timestamp_md = metadata.Metadata(
            metadata.Timestamp(
                version=max(int(time.time()), base.timestamp_version + 1),
                expires=now + timedelta(seconds=expiry),
                snapshot_meta=metadata.MetaFile.from_data(
                    snapshot_md.signed.version, snapshot_raw, ["sha256"]
                ),
            )
        )
        sign_with(timestamp_md, keys)
        signers = signed_by(root, "timestamp", timestamp_md)
        try:
            if base.timestamp_etag is None:
                store.put(metadata_name(TIMESTAMP_FILE), to_bytes(timestamp_md), if_none_match=True)
            else:
                store.put(metadata_name(TIMESTAMP_FILE), to_bytes(timestamp_md), if_match=base.timestamp_etag)
        except PreconditionFailed:
            continue  # another writer committed meanwhile: start again from what it wrote
        expires = min(expiry_of(md) for md in (root_md, targets_md, snapshot_md, timestamp_md))
        return Committed(
            url=store.remote.url,
            latest=latest_of(targets, where),
            previous_latest=previous,
            versions=listed_versions(targets),
            expires=expires,
            signed_by=signers,
            root=root_md,
        )
    raise RemoteError(f"{metadata_url(store, TIMESTAMP_FILE)}: changed {CAS_ATTEMPTS} times while signing")


def sync_latest_object(store: S3Store, latest: int | None) -> None:
    """Point the plain LATEST object at `latest`, the version the signed metadata names, by compare-and-swap
    (for readers of an unsigned fleet and for people; hosts with trusted keys read the signed LATEST).
    LATEST is read first and the signed metadata's choice again after it, so a slower writer never puts
    back an older choice over a newer writer's."""
    for _ in range(CAS_ATTEMPTS):
        current, etag = read_latest(store)
        signed = _signed_latest_now(store)
        target = signed if signed is not None else latest
        if target is None or current == version_dir_name(target):
            return
        body = f"{version_dir_name(target)}\n".encode()
        try:
            if etag is None:
                store.put("LATEST", body, if_none_match=True)
            else:
                store.put("LATEST", body, if_match=etag)
            return
        except PreconditionFailed:
            continue


def _signed_latest_now(store: S3Store) -> int | None:
    """The LATEST the committed targets name, read without checking signatures (it only says which way
    to move the plain LATEST object); None when it cannot be read."""
    try:
        got = get_metadata(store, TIMESTAMP_FILE)
        timestamp = parse_metadata(got[0], "timestamp", TIMESTAMP_FILE) if got else None
        if timestamp is None:
            return None
        got = get_metadata(store, role_file(timestamp.signed.snapshot_meta.version, "snapshot"))
        snapshot = parse_metadata(got[0], "snapshot", "snapshot") if got else None
        meta = snapshot.signed.meta.get("targets.json") if snapshot else None
        got = get_metadata(store, role_file(meta.version, "targets")) if meta else None
        targets = parse_metadata(got[0], "targets", "targets") if got else None
        return latest_of(targets.signed.targets, "targets") if targets else None
    except UntrustedVersion:
        return None


def prune_metadata(store: S3Store, now: float | None = None) -> list[str]:
    """Delete targets and snapshot files numbered below the newest of their role and older than
    STALE_METADATA_S (no host reads them any more). Returns their names."""
    now = time.time() if now is None else now
    listing = store.list_under(metadata_name(""))
    newest: dict[str, int] = {}
    for name in listing:
        parsed = parse_role_file(name)
        if parsed and parsed[1] in ("targets", "snapshot"):
            newest[parsed[1]] = max(newest.get(parsed[1], 0), parsed[0])
    doomed = []
    for name, obj in listing.items():
        parsed = parse_role_file(name)
        old = parsed and parsed[1] in newest and parsed[0] < newest[parsed[1]]
        if old and now - obj.modified.timestamp() > STALE_METADATA_S:
            doomed.append(name)
    if doomed:
        store.delete([metadata_name(name) for name in doomed])
    return sorted(doomed)


def drop_target(targets: dict[str, Any], number: int) -> None:
    """Remove version `number` from `targets` (a change), unless LATEST names it."""
    if LATEST_TARGET in targets and latest_of(targets, "targets") == number:
        return
    targets.pop(manifest_target(number), None)


def renew_metadata(
    url: str,
    signing_key: SigningKey | str | Path,
    *,
    timestamp_expiry_s: float | None = None,
    store: S3Store | None = None,
) -> Committed:
    """Renew the fleet's signed timestamp (and whatever else of its metadata expires soon) with the build
    box's key; on a fleet without signed metadata, create it (the first root; the versions an older
    signature by this key vouches for, migrate.py). What it committed."""
    remote = RemoteOut.parse(url)
    key = load_signing_key(signing_key) if isinstance(signing_key, str | Path) else signing_key
    store = store or S3Store(remote)
    done = commit(store, [key], None, timestamp_expiry_s=timestamp_expiry_s)
    sync_latest_object(store, done.latest)
    return done


def renew_freshness(
    url: str,
    signing_key: SigningKey | str | Path,
    *,
    timestamp_expiry_s: float | None = None,
    progress: Progress = NULL_PROGRESS,
    store: S3Store | None = None,
) -> float:
    """Renew the signed timestamp of the fleet at `url` (s3://bucket/prefix) with `signing_key` (a private
    key file or a loaded key), so hosts keep trusting its metadata for `timestamp_expiry_s` more seconds
    (None: TIMESTAMP_EXPIRY_DAYS). Every rebuild with a signing key calls it, whether or not it built a
    version. Returns when the fleet's metadata expires now (unix seconds). Raises InputError (a key the
    fleet's root does not name), UntrustedVersion (its root does not verify), RemoteError (retry)."""
    progress.stage("renew")
    return renew_metadata(url, signing_key, timestamp_expiry_s=timestamp_expiry_s, store=store).expires
