"""`zerogr keys rotate`: move a fleet's signed metadata to new keys (roots.py for root metadata).

The new keys replace the old ones in every role (the root role needs `threshold` of them, the others
one). The targets, snapshot and timestamp are signed again by the old and the new keys together, so they
verify under either root; then root N+1 is written, signed by the old keys (the threshold of root N) and
the new ones. From then on only the new keys sign: anything signed by a retired key alone is refused by
every host that followed the rotation or was given root N+1 (--trusted-root), and by every host whose
trusted keys no longer list a retired key; push, rollback and renewal refuse a retired key (exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from .keys import SigningKey, load_signing_key
from .metadata import expiry_of, metadata_name, metadata_url, next_root_checked, role_file
from .remote import RemoteError, RemoteOut, S3Store
from .repository import commit
from .roots import check_keys, load_root, next_root, put_root


@dataclass(frozen=True)
class Rotation:
    """What a key rotation did: the remote OUT, the new root version, the retired and the new key ids,
    the root threshold, when the re-signed metadata expires, and the new root metadata (`root`, the file
    to hand to every host: zerogr pull --trusted-root)."""

    url: str
    root_version: int
    retired: list[str]
    keys: list[str]
    threshold: int
    expires: float
    latest: int | None
    root: Any = field(default=None, repr=False, compare=False)


def rotate_keys(
    url: str,
    old_keys: Sequence[SigningKey | str | Path],
    new_keys: Sequence[SigningKey | str | Path],
    *,
    threshold: int = 1,
    timestamp_expiry_s: float | None = None,
    store: S3Store | None = None,
) -> Rotation:
    """Move the fleet at `url` from `old_keys` (which must meet its root threshold) to `new_keys` (private
    key files or loaded keys, all of which sign the new root); see the module docstring. Raises InputError
    (keys, threshold, a fleet with no signed metadata), UntrustedVersion (its root does not verify),
    RemoteError (retry: another rotation wrote the next root first)."""
    remote = RemoteOut.parse(url)
    old = [load_signing_key(k) if isinstance(k, str | Path) else k for k in old_keys]
    new = [load_signing_key(k) if isinstance(k, str | Path) else k for k in new_keys]
    if not new or not old:
        raise InputError("a rotation needs the fleet's current key (--signing-key) and a new one (--new-key)")
    if not 1 <= threshold <= len(new):
        raise InputError(f"--threshold must be between 1 and the {len(new)} new keys, got {threshold}")
    store = store or S3Store(remote)
    root_md = load_root(store, store.list_under(metadata_name("")))
    if root_md is None:
        raise InputError(
            f"{metadata_url(store, role_file(1, 'root'))}: missing: the fleet has no signed metadata yet; "
            "push with --signing-key NEW_KEY instead (it creates the fleet's first root)"
        )
    check_keys(store, root_md, old, ("root",))
    rotated = next_root(root_md, new, threshold, [*old, *new])
    next_root_checked(root_md.signed, rotated, metadata_url(store, role_file(rotated.signed.version, "root")))
    done = commit(store, [*new, *old], timestamp_expiry_s=timestamp_expiry_s, resign=True)
    if not put_root(store, rotated):
        raise RemoteError(
            f"{metadata_url(store, role_file(rotated.signed.version, 'root'))}: written by another rotation "
            "meanwhile; check zerogr status and run it again"
        )
    return Rotation(
        url=remote.url,
        root_version=rotated.signed.version,
        retired=sorted({key.key_id for key in old} - {key.key_id for key in new}),
        keys=sorted(key.key_id for key in new),
        threshold=threshold,
        expires=min(done.expires, expiry_of(rotated)),
        latest=done.latest,
        root=rotated,
    )
