"""The fleet's root metadata on the build box's side (metadata.py): the chain of root versions on the store,
a new root (the fleet's first, a renewal, a key rotation: rotate.py).

A root names the keys of every role and how many must sign. Version N+1 counts only when the threshold of
version N's root keys and of its own signed it, so the keys a fleet trusts change only with the consent of
the keys it trusted before; hosts follow the chain from the root their trusted keys anchor (signed_view.py).
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from .keys import SigningKey
from .metadata import (
    ROLES,
    UntrustedVersion,
    get_metadata,
    metadata_name,
    metadata_url,
    next_root_checked,
    now_utc,
    parse_metadata,
    parse_role_file,
    refused_as,
    role_file,
    sign_with,
    to_bytes,
    tuf,
    tuf_key,
)
from .remote import PreconditionFailed, S3Store

#: Life of root, targets and snapshot metadata, and how long before its end a commit renews it.
LONG_EXPIRY_S = 365 * 86400.0
RENEW_BEFORE_S = 30 * 86400.0


def load_root(store: S3Store, listing: dict[str, Any]) -> Any | None:
    """The newest root metadata reachable from 1.root.json in `listing` (the names under tuf/), each
    checked by the one before (None: the fleet has none). A root file that does not verify is deleted with
    a warning, and so are root files numbered past a gap after the chain's end (no writer makes those, and
    hosts refuse a chain with a gap); UntrustedVersion when 1.root.json itself does not verify."""
    current = None
    version = 1
    while role_file(version, "root") in listing:
        name = role_file(version, "root")
        where = metadata_url(store, name)
        got = get_metadata(store, name)
        if got is None:
            break
        try:
            md = parse_metadata(got[0], "root", where)
            if current is None:
                with refused_as(where):
                    md.signed.verify_delegate("root", md.signed_bytes, md.signatures)
            else:
                next_root_checked(current.signed, md, where)
        except UntrustedVersion as exc:
            if current is None:
                raise
            warnings.warn(f"{where}: deleted, it does not verify ({exc})", stacklevel=2)
            store.delete([metadata_name(name)])
            break
        current, version = md, version + 1
    if current is not None and role_file(version, "root") not in listing:
        _delete_stray_roots(store, listing, version)
    return current


def _delete_stray_roots(store: S3Store, listing: dict[str, Any], gap: int) -> None:
    """Delete the root files in `listing` numbered past `gap`, the first root version the store lacks."""
    stray = sorted(name for name in listing if (p := parse_role_file(name)) and p[1] == "root" and p[0] > gap)
    if stray:
        warnings.warn(
            f"{metadata_url(store, stray[0])}: deleted with {len(stray) - 1} more root file(s) past the "
            f"missing {role_file(gap, 'root')}: not part of the fleet's chain of roots",
            stacklevel=3,
        )
        store.delete([metadata_name(name) for name in stray])


def key_ids(keys: Sequence[SigningKey]) -> set[str]:
    """The TUF key ids of `keys`."""
    return {tuf_key(key.private.public_key()).keyid for key in keys}


def check_keys(store: S3Store, root_md: Any, keys: Sequence[SigningKey], roles: Sequence[str]) -> None:
    """InputError (exit 2) unless `keys` meet the threshold of each of `roles` in root metadata `root_md`."""
    root = root_md.signed
    ids = key_ids(keys)
    for role in roles:
        spec = root.roles[role]
        if len(ids & set(spec.keyids)) < spec.threshold:
            names = ", ".join(key.key_id for key in keys)
            raise InputError(
                f"{metadata_url(store, role_file(root.version, 'root'))}: the fleet's root does not let "
                f"{names} sign {role} metadata (threshold {spec.threshold}); sign with the fleet's key, or "
                "move the fleet to this key with zerogr keys rotate"
            )


def first_root(keys: Sequence[SigningKey]) -> Any:
    """Root metadata version 1: `keys` for every role, threshold 1, consistent snapshots."""
    metadata = tuf()
    root = metadata.Root(
        version=1, expires=now_utc() + timedelta(seconds=LONG_EXPIRY_S), consistent_snapshot=True
    )
    for key in keys:
        for role in ROLES:
            root.add_key(tuf_key(key.private.public_key()), role)
    md = metadata.Metadata(root)
    sign_with(md, keys)
    return md


def next_root(
    root_md: Any, new_keys: Sequence[SigningKey], threshold: int, signing: Sequence[SigningKey]
) -> Any:
    """Root metadata version N+1 after `root_md`: `new_keys` for every role (the root role's threshold
    `threshold`, the others' 1), expiring LONG_EXPIRY_S from now, signed by `signing`."""
    metadata = tuf()
    root = metadata.Root.from_dict(copy.deepcopy(root_md.signed.to_dict()))  # to_dict shares lists
    for role in ROLES:
        for keyid in list(root.roles[role].keyids):
            root.revoke_key(keyid, role)
        for key in new_keys:
            root.add_key(tuf_key(key.private.public_key()), role)
        root.roles[role].threshold = threshold if role == "root" else 1
    root.version = root_md.signed.version + 1
    root.expires = now_utc() + timedelta(seconds=LONG_EXPIRY_S)
    md = metadata.Metadata(root)
    sign_with(md, signing)
    return md


def put_root(store: S3Store, md: Any) -> bool:
    """Write root metadata `md` as tuf/<version>.root.json, create-only; False when it exists already."""
    try:
        store.put(metadata_name(role_file(md.signed.version, "root")), to_bytes(md), if_none_match=True)
    except PreconditionFailed:
        return False
    return True


def renewed_root(store: S3Store, root_md: Any, keys: Sequence[SigningKey]) -> Any | None:
    """Root metadata close to its expiry renewed: the next version with the same keys, written create-only,
    when `keys` meet the root threshold (else a warning and `root_md` as it is). None when another writer
    wrote that version first (read the chain again)."""
    root = root_md.signed
    spec = root.roles["root"]
    if len(key_ids(keys) & set(spec.keyids)) < spec.threshold:
        warnings.warn(
            f"{metadata_url(store, role_file(root.version, 'root'))}: expires "
            f"{root.expires:%Y-%m-%dT%H:%M:%SZ}; renew it with zerogr keys rotate (its threshold needs more "
            "keys than this one)",
            stacklevel=3,
        )
        return root_md
    current = [key for key in keys if tuf_key(key.private.public_key()).keyid in spec.keyids]
    renewed = next_root(root_md, current, spec.threshold, keys)
    return renewed if put_root(store, renewed) else None


def write_root_file(path: str | Path, md: Any) -> None:
    """Write root metadata `md` to the local file `path` (replaced atomically, mode 0644): the fleet's
    current root, to hand to every host (zerogr pull --trusted-root). InputError (exit 2) naming the path
    when it cannot be written."""
    from ..bundle.files import atomic_replace_bytes

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_replace_bytes(path, to_bytes(md))
        os.chmod(path, 0o644)
    except OSError as exc:
        raise InputError(f"{path}: cannot write the fleet's root file ({exc.strerror or exc})") from None
