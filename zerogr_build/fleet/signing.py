"""Whom a host trusts: the build box's public keys (--trusted-keys) and, optionally, the fleet's root
metadata as it was handed to the host (--trusted-root, the file `zerogr keys rotate --root-out` or `zerogr
push --root-out` wrote), or nobody on an unsigned fleet (--allow-unsigned). The checks themselves are the
fleet's signed metadata's (signed_view.py): the trusted keys anchor the fleet's root metadata, which says
which keys sign its versions; a trusted root is the oldest root the host may start from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..base.small_files import read_small_bytes
from .keys import check_trusted_keys_mode, crypto, key_id, load_trusted_keys


@dataclass(frozen=True)
class Trust:
    """Whom a host trusts: Ed25519 public keys by key id (several while keys rotate), or, with no keys,
    nobody: `allow_unsigned` then says the fleet is unsigned and nothing is checked. `root`: the fleet's
    root metadata (python-tuf Metadata[Root]) the host was given, signed by the threshold of `keys`; the
    host never starts from an older root, and refuses a store whose roots stop short of it. `root_file`
    names it in messages."""

    keys: Mapping[str, Any] = field(default_factory=dict)
    allow_unsigned: bool = False
    root: Any = None
    root_file: str | None = None

    @classmethod
    def unsigned(cls) -> Trust:
        """An unsigned fleet: versions are installed without a signature check."""
        return cls({}, allow_unsigned=True)

    @classmethod
    def from_files(cls, paths: Sequence[str | Path]) -> Trust:
        """The keys of the trusted-keys files `paths` (keys.load_trusted_keys)."""
        return cls(load_trusted_keys(tuple(paths)))

    def with_root(self, path: str | Path) -> Trust:
        """This trust pinned to the root metadata file `path` (see load_trusted_root); with no keys yet,
        the keys are the root role's keys that root names."""
        root = load_trusted_root(path, self.keys)
        keys = self.keys or _root_keys(root)
        return Trust(keys, root=root, root_file=str(path))


#: Bytes a trusted root file may have (a root names a few keys: a few KiB).
MAX_ROOT_FILE_BYTES = 1 << 20


def load_trusted_root(path: str | Path, keys: Mapping[str, Any]) -> Any:
    """The root metadata in file `path` (a `N.root.json` of the fleet), checked: root metadata, signed by
    the threshold of its own root keys and, when `keys` are given, by the threshold of those trusted keys
    too. InputError (exit 2) naming the file otherwise, or when other users could change it (the rules
    of a trusted-keys file: check_trusted_keys_mode)."""
    from .metadata import UntrustedVersion, parse_metadata, signed_by_trusted, tuf

    tuf()
    check_trusted_keys_mode(path, "trusted root file")
    try:
        raw = read_small_bytes(path, MAX_ROOT_FILE_BYTES, "trusted root file")
    except FileNotFoundError:
        raise InputError(f"{path}: trusted root file not found") from None
    try:
        md = parse_metadata(raw, "root", str(path))
    except UntrustedVersion as exc:
        raise InputError(f"{exc} (give the N.root.json that zerogr keys rotate --root-out wrote)") from None
    result = md.signed.get_verification_result("root", md.signed_bytes, md.signatures)
    if not result:
        raise InputError(
            f"{path}: root version {md.signed.version} is not signed by its own root keys "
            f"({len(result.signed)} of {result.threshold}): not a root the fleet wrote"
        )
    if keys and not signed_by_trusted(md, keys):
        raise InputError(
            f"{path}: root version {md.signed.version} is not signed by the trusted keys "
            f"({', '.join(sorted(keys))}): give the trusted-keys file of the keys that root names (after "
            "a rotation: the new key's .pub), or only --trusted-root"
        )
    return md


def _root_keys(root_md: Any) -> dict[str, Any]:
    """{key id: Ed25519 public key} of the root role's keys of root metadata `root_md`."""
    ed25519, _ = crypto()
    root = root_md.signed
    keys = {}
    for keyid in root.roles["root"].keyids:
        public = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(root.keys[keyid].keyval["public"]))
        keys[key_id(public)] = public
    return keys


def host_trust(
    trusted_keys: Sequence[str | Path] | None,
    allow_unsigned: bool,
    *,
    required: bool,
    what: str,
    trusted_root: str | Path | None = None,
) -> Trust | None:
    """The Trust of a command's --trusted-keys FILE..., --trusted-root FILE and --allow-unsigned. Giving
    --allow-unsigned with either of the others is a usage error. With none: None where `required` is
    False (a local OUT), else InputError (exit 2) naming `what`: a host must say whom it trusts before it
    reads a remote OUT."""
    trusted_keys = list(trusted_keys or ())
    if (trusted_keys or trusted_root is not None) and allow_unsigned:
        given = "--trusted-keys" if trusted_keys else "--trusted-root"
        raise InputError(f"{given} and --allow-unsigned contradict each other; give one")
    if trusted_keys or trusted_root is not None:
        trust = Trust.from_files(trusted_keys) if trusted_keys else Trust()
        return trust.with_root(trusted_root) if trusted_root is not None else trust
    if allow_unsigned:
        return Trust.unsigned()
    if not required:
        return None
    raise _no_trust(what)


def _no_trust(what: str) -> InputError:
    return InputError(
        f"{what}: no trusted signing keys: give --trusted-keys FILE (the build box's public keys), or "
        "--allow-unsigned for an unsigned fleet (whoever can write the store then decides what is installed)"
    )


def require_trust(trust: Trust | None, what: str) -> Trust:
    """`trust`, or InputError (exit 2) when a remote OUT is read without saying whom to trust."""
    if trust is None:
        raise _no_trust(what)
    return trust
