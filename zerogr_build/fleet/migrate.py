"""A fleet signed before it had metadata: each version carried `manifest.json.sig`, an Ed25519 signature of
its manifest's bytes. The first commit of signed metadata on such a fleet (a signed push, a rollback, a
rebuild's renewal) lists every complete version whose old signature checks with the signing key, and
LATEST when it names one of them, so hosts keep the versions they have and a rollback can still reach
them. Nothing else reads the old signatures: hosts check the signed metadata only.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from ..bundle.format import MANIFEST_NAME, SIGNATURE_NAME
from ..bundle.reader import MAX_MANIFEST_BYTES
from .keys import SigningKey
from .metadata import LATEST_TARGET, latest_entry, manifest_entry, manifest_target
from .remote import RefusedRemoteVersion, S3Store, list_versions, version_name

#: What the old signatures signed: this prefix, then the manifest's exact bytes.
OLD_PREFIX = b"zerogr-signed-manifest-v1\x00"
OLD_SIGNATURE_BYTES = 4096


def old_signature_checks(manifest_raw: bytes, signature_raw: bytes, publics: dict[str, Any]) -> bool:
    """True when `signature_raw` (an old manifest.json.sig) is a valid signature of `manifest_raw` by one of
    `publics` ({key id: Ed25519 public key})."""
    from cryptography.exceptions import InvalidSignature

    try:
        body = json.loads(signature_raw)
        signature = base64.b64decode(body["signature"], validate=True)
        public = publics.get(body["key"])
    except (ValueError, TypeError, KeyError, RecursionError, binascii.Error):
        return False
    if body.get("format") != "zerogr-signature" or public is None or len(signature) != 64:
        return False
    try:
        public.verify(signature, OLD_PREFIX + manifest_raw)
    except InvalidSignature:
        return False
    return True


def old_signed_targets(store: S3Store, keys: Sequence[SigningKey]) -> dict[str, Any]:
    """{target path: TargetFile} of the complete remote versions an old signature by one of `keys` vouches
    for, and LATEST when remote LATEST names one of them."""
    publics = {key.key_id: key.private.public_key() for key in keys}
    state = list_versions(store)
    targets: dict[str, Any] = {}
    for number in state.complete():
        if SIGNATURE_NAME not in state.objects[number]:
            continue
        try:
            manifest = store.get_small(version_name(number, MANIFEST_NAME), MAX_MANIFEST_BYTES)
            signature = store.get_small(version_name(number, SIGNATURE_NAME), OLD_SIGNATURE_BYTES)
        except RefusedRemoteVersion:  # oversized: not a version the key signed
            continue
        if manifest and signature and old_signature_checks(manifest[0], signature[0], publics):
            targets[manifest_target(number)] = manifest_entry(number, manifest[0])
    latest = state.latest_number()
    if latest is not None and manifest_target(latest) in targets:
        targets[LATEST_TARGET] = latest_entry(latest)
    return targets
