"""The fleet's signed metadata (The Update Framework, through python-tuf): what the build box that writes it
(repository.py) and the hosts that read it (signed_view.py) share.

Layout under the remote OUT (docs/bundle-format.md 13.4), TUF's four roles with consistent snapshots:

    tuf/1.root.json, tuf/2.root.json ...   root: which keys sign each role, and how many must (create-only)
    tuf/<N>.targets.json                   targets: each live version's manifest.json (length, sha256) and
                                           LATEST, the version to serve (create-only)
    tuf/<N>.snapshot.json                  snapshot: the one targets file that goes with it (create-only)
    tuf/timestamp.json                     timestamp: the one snapshot file, expiring within days; replaced
                                           by compare-and-swap at every push, rollback and rebuild

The keys are the build box's Ed25519 keys (keys.py) as TUF keys; messages name them by their OpenSSH
fingerprint (SHA256:...). A manifest lists every file's size and sha256, so a signed manifest entry vouches
for every byte of its version.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..bundle.format import (
    MANIFEST_NAME,
    oversized_version_dir,
    parse_version_dir,
    version_dir_name,
)
from .keys import SigningKey, crypto, key_id
from .remote import RefusedRemoteVersion, S3Store, oversized_note

METADATA_DIR = "tuf"
TIMESTAMP_FILE = "timestamp.json"
LATEST_TARGET = "LATEST"
ONLINE_ROLES = ("targets", "snapshot", "timestamp")
ROLES = ("root", *ONLINE_ROLES)
#: Bytes one metadata file may have (python-tuf's own bound for targets metadata; a few KiB in practice).
MAX_METADATA_BYTES = 5_000_000


class UntrustedVersion(RefusedRemoteVersion):
    """A version or metadata the fleet's keys did not sign, or that changed after it was signed (exit 4)."""


class ExpiredFleetMetadata(UntrustedVersion):
    """The fleet's signed metadata expired: nothing newer has been signed since (exit 4). `expires`: when
    (unix seconds)."""

    def __init__(self, message: str, expires: float | None):
        super().__init__(message)
        self.expires = expires


def tuf() -> Any:
    """python-tuf's metadata module; InputError (exit 2) naming the extra without it."""
    crypto()  # the same extra: a clear line when cryptography is missing
    try:
        from tuf.api import metadata
    except ImportError:
        from ..base.errors import InputError

        raise InputError(
            "signed fleets need python-tuf: pip install 'zerogr[s3]' (or pip install tuf)"
        ) from None
    return metadata


def metadata_name(file: str) -> str:
    """The remote OUT-relative object name of metadata file `file` ("timestamp.json" -> "tuf/...")."""
    return f"{METADATA_DIR}/{file}"


def role_file(version: int, role: str) -> str:
    """`<version>.<role>.json`, the name of a versioned metadata file."""
    return f"{version}.{role}.json"


def parse_role_file(name: str) -> tuple[int, str] | None:
    """(version, role) of `<version>.<role>.json` (a bounded ASCII number); None for any other name."""
    head, _, rest = name.partition(".")
    role = rest.removesuffix(".json")
    if not (head.isascii() and head.isdigit()) or len(head) > 18 or role not in ROLES:
        return None
    return (int(head), role) if rest == f"{role}.json" and int(head) > 0 else None


def manifest_target(number: int) -> str:
    """The target path of version `number`'s manifest: "v000007/manifest.json"."""
    return f"{version_dir_name(number)}/{MANIFEST_NAME}"


def tuf_key(public: Any) -> Any:
    """The TUF key (securesystemslib SSlibKey, ed25519) of an Ed25519 public key."""
    tuf()
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(public)


def tuf_signer(key: SigningKey) -> Any:
    """A securesystemslib signer for the build box's key."""
    from securesystemslib.signer import CryptoSigner

    return CryptoSigner(key.private, tuf_key(key.private.public_key()))


def fingerprint(key: Any) -> str:
    """The OpenSSH fingerprint (SHA256:...) of a TUF ed25519 key, as `zerogr keys new` prints it."""
    ed25519, _ = crypto()
    try:
        public = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(key.keyval["public"]))
    except (KeyError, ValueError, TypeError):
        return f"tuf:{key.keyid}"
    return key_id(public)


def unix(moment: datetime) -> float:
    """A metadata expiry as unix seconds."""
    return moment.replace(tzinfo=moment.tzinfo or timezone.utc).timestamp()


def iso(seconds: float) -> str:
    """Unix seconds as ISO 8601 UTC, for messages."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_metadata(raw: bytes, role: str, where: str) -> Any:
    """`raw` parsed as TUF metadata of `role`; UntrustedVersion naming `where` otherwise."""
    metadata = tuf()
    from tuf.api.exceptions import RepositoryError
    from tuf.api.serialization import DeserializationError

    try:
        parsed = metadata.Metadata.from_bytes(raw)
    except (DeserializationError, RepositoryError, ValueError, RecursionError) as exc:
        raise UntrustedVersion(f"{where}: not TUF metadata ({type(exc).__name__})") from None
    if parsed.signed.type != role:
        raise UntrustedVersion(f"{where}: {parsed.signed.type} metadata where {role} metadata belongs")
    return parsed


def signed_by(delegator: Any, role: str, md: Any) -> list[str]:
    """Fingerprints of the keys of `role` (as `delegator`, a Root, lists them) whose signatures on `md`
    verify; UntrustedVersion when they do not reach the role's threshold."""
    result = delegator.get_verification_result(role, md.signed_bytes, md.signatures)
    if not result:
        raise UntrustedVersion(
            f"not signed by the fleet's {role} keys ({len(result.signed)} of the {result.threshold} "
            "signatures needed)"
        )
    return sorted(fingerprint(key) for key in result.signed.values())


def signed_by_trusted(root_md: Any, trusted: Iterable[str]) -> bool:
    """True when root metadata `root_md` carries the signatures of its own root role's threshold from keys
    whose fingerprints are in `trusted` (a host's trusted keys): the root a host may start from."""
    result = root_md.signed.get_verification_result("root", root_md.signed_bytes, root_md.signatures)
    ids = set(trusted)
    return sum(fingerprint(key) in ids for key in result.signed.values()) >= result.threshold


def next_root_checked(current: Any, new_md: Any, where: str) -> None:
    """UntrustedVersion naming `where` unless `new_md` (root metadata) is the next version after
    `current` (a Root), signed by the threshold of both the current root keys and its own."""
    if new_md.signed.version != current.version + 1:
        raise UntrustedVersion(
            f"{where}: root version {new_md.signed.version}, expected {current.version + 1}"
        )
    for delegator, whose in ((current, "the current"), (new_md.signed, "its own")):
        result = delegator.get_verification_result("root", new_md.signed_bytes, new_md.signatures)
        if not result:
            raise UntrustedVersion(
                f"{where}: not signed by {whose} root keys ({len(result.signed)} of {result.threshold})"
            )


@contextlib.contextmanager
def refused_as(where: str) -> Iterator[None]:
    """Turn python-tuf's verification errors (and UntrustedVersion without a name) into one line naming
    `where`."""
    from tuf.api.exceptions import LengthOrHashMismatchError, RepositoryError

    try:
        yield
    except LengthOrHashMismatchError:
        raise UntrustedVersion(f"{where}: does not match its signed length and sha256 (changed)") from None
    except RepositoryError as exc:
        raise UntrustedVersion(f"{where}: {exc}") from None
    except UntrustedVersion as exc:
        if str(exc).startswith("not signed"):
            raise UntrustedVersion(f"{where}: {exc}") from None
        raise


def latest_entry(number: int) -> Any:
    """The LATEST target naming version `number`: the bytes remote LATEST holds ("v000007\\n"), with the
    version dir name in its custom field."""
    name = version_dir_name(number)
    entry = tuf().TargetFile.from_data(LATEST_TARGET, f"{name}\n".encode(), ["sha256"])
    entry.unrecognized_fields["custom"] = {"version": name}
    return entry


def manifest_entry(number: int, manifest_raw: bytes) -> Any:
    """The target of version `number`'s manifest bytes: its length and sha256."""
    return tuf().TargetFile.from_data(manifest_target(number), manifest_raw, ["sha256"])


def latest_of(targets: Mapping[str, Any], where: str) -> int | None:
    """The version a targets metadata's LATEST names (None: no LATEST yet). UntrustedVersion naming
    `where` when it is not a version dir, a number past MAX_VERSION, not the bytes it claims, or a version
    the metadata does not list."""
    entry = targets.get(LATEST_TARGET)
    if entry is None:
        return None
    custom = entry.custom if isinstance(entry.custom, dict) else {}
    name = custom.get("version")
    if isinstance(name, str) and oversized_version_dir(name):
        raise UntrustedVersion(f"{where}: LATEST names {oversized_note(name)}")
    number = parse_version_dir(name) if isinstance(name, str) else None
    if number is None:
        raise UntrustedVersion(f"{where}: its LATEST does not name a version dir")
    with refused_as(where):
        entry.verify_length_and_hashes(f"{name}\n".encode())
    if manifest_target(number) not in targets:
        raise UntrustedVersion(f"{where}: LATEST names {name}, which it does not list")
    return number


def check_manifest(targets: Mapping[str, Any], number: int, manifest_raw: bytes, where: str) -> None:
    """UntrustedVersion naming `where` (the manifest's URL or path) unless targets list version `number`
    with exactly these manifest bytes."""
    entry = targets.get(manifest_target(number))
    if entry is None:
        raise UntrustedVersion(
            f"{where}: not in the fleet's signed metadata (pushed without --signing-key, or not signed by "
            "the fleet's keys)"
        )
    try:
        entry.verify_length_and_hashes(manifest_raw)
    except Exception:  # noqa: BLE001 - python-tuf's LengthOrHashMismatchError
        raise UntrustedVersion(
            f"{where}: does not match the fleet's signed metadata (the version was changed after it was "
            "signed)"
        ) from None


def listed_versions(targets: Mapping[str, Any]) -> list[int]:
    """The version numbers whose manifests a targets metadata lists, ascending."""
    found = []
    for path in targets:
        head, _, rest = path.partition("/")
        number = parse_version_dir(head)
        if number is not None and rest == MANIFEST_NAME:
            found.append(number)
    return sorted(found)


def expiry_of(md: Any) -> float:
    """When metadata `md` expires (unix seconds)."""
    return unix(md.signed.expires)


def now_utc() -> datetime:
    """Now, in whole seconds (metadata expiry times carry no fraction)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


def metadata_url(store: S3Store, file: str) -> str:
    """The URL of metadata file `file`, for messages."""
    return store.remote.name_url(metadata_name(file))


def get_metadata(store: S3Store, file: str) -> tuple[bytes, str] | None:
    """(bytes, ETag) of metadata file `file`, at most MAX_METADATA_BYTES; None when it does not exist."""
    return store.get_small(metadata_name(file), MAX_METADATA_BYTES)


def sign_with(md: Any, keys: Sequence[SigningKey]) -> None:
    """Replace `md`'s signatures by those of `keys`."""
    md.signatures.clear()
    for key in keys:
        md.sign(tuf_signer(key), append=True)


def to_bytes(md: Any) -> bytes:
    """The bytes a metadata file holds (indented JSON)."""
    from tuf.api.serialization.json import JSONSerializer

    return md.to_bytes(JSONSerializer(compact=False))
