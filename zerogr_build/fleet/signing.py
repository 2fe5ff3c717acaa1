"""Signed versions (docs/bundle-format.md 13.4): push signs each remote manifest with the build box's
Ed25519 key; pull, `status` and `verify` check the signature against the public keys a host trusts.

The signed message is SIGNED_PREFIX followed by the exact bytes of the version's manifest.json, which
lists every file's size and sha256: a valid signature vouches for every byte of the version. The
signature is the small JSON file `manifest.json.sig` beside the manifest, remote and local alike.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import BundleError, InputError, one_line
from ..bundle.files import read_small_file
from ..bundle.format import MANIFEST_NAME, SIGNATURE_NAME
from ..bundle.reader import MAX_MANIFEST_BYTES
from .keys import KEY_ID_RE, SigningKey, load_trusted_keys
from .remote import RefusedRemoteVersion, S3Store, version_name

#: What precedes the manifest's bytes in the signed message: a signature for anything else never
#: verifies as a manifest signature.
SIGNED_PREFIX = b"zerogr-signed-manifest-v1\x00"
SIGNATURE_FORMAT = "zerogr-signature"
ALGORITHM = "ed25519"
MAX_SIGNATURE_BYTES = 4096


class UntrustedVersion(RefusedRemoteVersion):
    """A version that is unsigned, signed by a key this host does not trust, or changed after signing."""


def signature_file(key: SigningKey, manifest_raw: bytes) -> bytes:
    """The bytes of `manifest.json.sig` for the manifest bytes `manifest_raw`, signed with `key`."""
    signature = key.sign(SIGNED_PREFIX + manifest_raw)
    body = {
        "format": SIGNATURE_FORMAT,
        "algorithm": ALGORITHM,
        "key": key.key_id,
        "signature": base64.b64encode(signature).decode("ascii"),
    }
    return (json.dumps(body, indent=2) + "\n").encode("ascii")


def parse_signature(raw: bytes, where: str) -> tuple[str, bytes]:
    """(key id, 64-byte signature) of a `manifest.json.sig`; UntrustedVersion naming `where` otherwise."""
    if len(raw) > MAX_SIGNATURE_BYTES:
        raise UntrustedVersion(f"{where}: more than {MAX_SIGNATURE_BYTES} bytes; not a signature")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise UntrustedVersion(f"{where}: not a signature (not JSON)") from None
    if not isinstance(body, dict) or body.get("format") != SIGNATURE_FORMAT:
        raise UntrustedVersion(f"{where}: not a signature (format is not {SIGNATURE_FORMAT!r})")
    if body.get("algorithm") != ALGORITHM:
        raise UntrustedVersion(f"{where}: not an {ALGORITHM} signature")
    ident, encoded = body.get("key"), body.get("signature")
    if not isinstance(ident, str) or not KEY_ID_RE.match(ident):
        raise UntrustedVersion(f"{where}: its key id is not SHA256:<43 base64 characters>")
    try:
        signature = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else b""
    except (binascii.Error, ValueError):
        signature = b""
    if len(signature) != 64:
        raise UntrustedVersion(f"{where}: its signature is not 64 base64-encoded bytes")
    return ident, signature


@dataclass(frozen=True)
class Trust:
    """Whom a host trusts: Ed25519 public keys by key id (several while keys rotate), or, with no keys,
    nobody: `allow_unsigned` then says the fleet is unsigned and nothing is checked."""

    keys: Mapping[str, Any] = field(default_factory=dict)
    allow_unsigned: bool = False

    @classmethod
    def unsigned(cls) -> Trust:
        """An unsigned fleet: versions are installed without a signature check."""
        return cls({}, allow_unsigned=True)

    @classmethod
    def from_files(cls, paths: Sequence[str | Path]) -> Trust:
        """The keys of the trusted-keys files `paths` (keys.load_trusted_keys)."""
        return cls(load_trusted_keys(tuple(paths)))

    def check(self, manifest_raw: bytes, signature_raw: bytes | None, where: str) -> str | None:
        """The id of the trusted key that signed `manifest_raw`; None for an unsigned fleet (nothing is
        checked). UntrustedVersion naming `where` (the signature's URL or path) when the signature is
        missing, by an unknown key, or does not match the manifest."""
        if not self.keys:
            if self.allow_unsigned:
                return None
            raise InputError(f"{where}: no trusted keys to check it against")
        if signature_raw is None:
            raise UntrustedVersion(
                f"{where}: missing: the version is unsigned, and this host trusts only signed ones"
            )
        ident, signature = parse_signature(signature_raw, where)
        public = self.keys.get(ident)
        if public is None:
            raise UntrustedVersion(f"{where}: signed by {ident}, a key this host does not trust")
        from cryptography.exceptions import InvalidSignature

        try:
            public.verify(signature, SIGNED_PREFIX + manifest_raw)
        except InvalidSignature:
            raise UntrustedVersion(
                f"{where}: does not match the manifest (the version was changed after it was signed)"
            ) from None
        return ident


def host_trust(
    trusted_keys: Sequence[str | Path] | None, allow_unsigned: bool, *, required: bool, what: str
) -> Trust | None:
    """The Trust of a command's --trusted-keys FILE... and --allow-unsigned. Giving both is a usage error.
    With neither: None where `required` is False (a local OUT), else InputError (exit 2) naming `what`:
    a host must say whom it trusts before it reads a remote OUT."""
    trusted_keys = list(trusted_keys or ())
    if trusted_keys and allow_unsigned:
        raise InputError("--trusted-keys and --allow-unsigned contradict each other; give one")
    if trusted_keys:
        return Trust.from_files(trusted_keys)
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


def remote_signature(
    store: S3Store, number: int, manifest_raw: bytes, trust: Trust
) -> tuple[bytes | None, str | None]:
    """(the signature object's bytes, the trusted key id that signed) of remote version `number`, checked
    against its manifest bytes. On an unsigned fleet nothing is checked: (the bytes of a well-formed
    signature object, None), so that a pull stores it beside the manifest for a later check with keys,
    or (None, None) when there is none, or it is not a signature file."""
    name = version_name(number, SIGNATURE_NAME)
    where = store.remote.name_url(name)
    if not trust.keys:
        trust.check(manifest_raw, None, where)  # InputError unless the fleet is unsigned on purpose
        try:
            got = store.get_small(name, MAX_SIGNATURE_BYTES)
            if got is None:
                return None, None
            parse_signature(got[0], where)
        except RefusedRemoteVersion:  # oversized or malformed (UntrustedVersion): not stored
            return None, None
        return got[0], None
    got = store.get_small(name, MAX_SIGNATURE_BYTES)
    raw = got[0] if got is not None else None
    return raw, trust.check(manifest_raw, raw, where)


def check_local_signature(version_dir: Path, trust: Trust) -> str | None:
    """The trusted key id that signed the local version `version_dir` (its manifest.json.sig, written by
    pull); UntrustedVersion naming the file otherwise. None for an unsigned fleet."""
    manifest_raw = read_small_file(version_dir / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    try:
        raw: bytes | None = read_small_file(version_dir / SIGNATURE_NAME, MAX_SIGNATURE_BYTES)
    except FileNotFoundError:
        raw = None
    except BundleError as exc:  # a special or oversized file: refused like a bad signature
        raise UntrustedVersion(one_line(exc)) from None
    return trust.check(manifest_raw, raw, str(version_dir / SIGNATURE_NAME))
