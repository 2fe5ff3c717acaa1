"""A host's view of the fleet through its signed metadata (metadata.py), read with python-tuf's client
(`tuf.ngclient.Updater`) over the same S3 client pull uses; and the check of a pulled version on disk.

The host's trusted keys (--trusted-keys) anchor it. With memory (OUT/.tuf/ holds a root these keys
anchored for this remote OUT), the host starts from the newest root it trusted. Without (the first pull,
a lost or re-imaged OUT, other keys, another remote OUT), it starts from:
  - the root the host was given (Trust.root, --trusted-root: TUF's "ship the current root with the
    client"), when the store's roots reach its version: a store whose roots stop short of it is refused;
  - else the newest root version on the store that a threshold of the trusted keys signed.
A memory older than the given root is replaced by it (its root files only: the timestamp it trusted stays
the floor a replay must pass). Before anything is loaded, the chain of roots from the starting root to the
newest root file on the store must be whole: every version in between present, each signed by the
threshold of the one before and of its own keys; a gap (deleted roots, a stray later root) is refused.
From there the Updater follows the chain of roots (key rotations) and loads timestamp, snapshot and
targets, refusing expired metadata, metadata older than what this host has seen (a replay), files that do
not match what newer metadata says of them (mixed states), and anything the root's keys did not sign. It
keeps what it trusts in OUT/.tuf/ (METADATA_CACHE): that memory is what makes a replay visible.

A pulled version keeps the signed targets metadata that lists it as its manifest.json.sig (its proof);
`check_local_version` checks it against the roots in OUT/.tuf/ anchored by the trusted keys, so
`zerogr verify --trusted-keys` works on the host without the store.

Every refusal is UntrustedVersion (exit 4) naming the metadata file, or ExpiredFleetMetadata naming when
it expired; a store that fails is RemoteError (exit 3).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import BundleError, InputError, ZerogrError
from ..bundle.files import fsync_dir, read_small_file, temp_tag, write_bytes_durable
from ..bundle.format import MANIFEST_NAME, SIGNATURE_NAME, TEMP_PREFIX, parse_version_dir
from ..bundle.reader import MAX_MANIFEST_BYTES
from ..bundle.versions import version_dirs
from .metadata import (
    MAX_METADATA_BYTES,
    METADATA_DIR,
    TIMESTAMP_FILE,
    ExpiredFleetMetadata,
    UntrustedVersion,
    check_manifest,
    expiry_of,
    get_metadata,
    iso,
    latest_of,
    listed_versions,
    manifest_target,
    metadata_name,
    metadata_url,
    next_root_checked,
    parse_metadata,
    parse_role_file,
    refused_as,
    signed_by,
    signed_by_trusted,
    to_bytes,
    tuf,
)
from .remote import RemoteError, S3Store
from .signing import Trust

#: Where a host keeps the fleet metadata it trusts, inside its OUT dir.
METADATA_CACHE = ".tuf"
ANCHOR_RECORD = "anchor.json"
LOCK_FILE = ".lock"
#: Root versions tried when looking for the one the trusted keys anchor.
MAX_ROOTS = 1000


@dataclass(frozen=True)
class SignedView:
    """What the fleet's signed metadata says, as this host verified it: the version LATEST names (None:
    none yet), the targets ({path: TargetFile}), the signed targets metadata's bytes (a version's proof),
    when the metadata expires (the earliest of its four files, unix seconds), and who signed the targets."""

    url: str
    latest: int | None
    targets: dict[str, Any]
    targets_raw: bytes
    expires: float
    signed_by: list[str]

    @property
    def versions(self) -> list[int]:
        """The versions the targets list, ascending."""
        return listed_versions(self.targets)

    def check_manifest(self, number: int, manifest_raw: bytes, where: str) -> None:
        """UntrustedVersion naming `where` unless the targets list version `number` with these bytes."""
        check_manifest(self.targets, number, manifest_raw, where)


def _fetcher(store: S3Store, base: str) -> Any:
    from tuf.api.exceptions import DownloadHTTPError
    from tuf.ngclient.fetcher import FetcherInterface

    class StoreFetcher(FetcherInterface):
        """Metadata files from the remote OUT's tuf/ through the store's client (bounded reads)."""

        def __init__(self) -> None:
            self.fetched: dict[str, bytes] = {}
            self.last = TIMESTAMP_FILE

        def _fetch(self, url: str) -> Iterator[bytes]:
            name = url[len(base) :] if url.startswith(base) else ""
            if not name or "/" in name:
                raise DownloadHTTPError(f"{url}: not the fleet's metadata", 404)
            self.last = name
            got = get_metadata(store, name)
            if got is None:
                raise DownloadHTTPError(f"{metadata_url(store, name)}: missing", 404)
            self.fetched[name] = got[0]
            return iter([got[0]])

    return StoreFetcher()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive flock on directory/.lock: one Updater at a time writes the cache."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _cache_errors(cache: Path) -> Iterator[None]:
    """The cache dir created; a path the local file system cannot hold is InputError (exit 2) naming it."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        raise InputError(
            f"{cache}: the fleet metadata a host keeps does not fit this file system's path limits "
            f"({exc.strerror}); pull into an OUT dir with a shorter path"
        ) from None


def read_signed_view(store: S3Store, cache: Path, trust: Trust) -> SignedView:
    """Refresh the fleet's signed metadata into `cache` (a host's OUT/.tuf, or a temp dir) and return what
    it says; see the module docstring."""
    tuf()
    from tuf.ngclient import Updater, UpdaterConfig

    base = store.remote.name_url(METADATA_DIR) + "/"
    with _cache_errors(cache), _locked(cache):
        fetcher = _fetcher(store, base)
        try:
            roots = _listed_roots(store)
            bootstrap, start = _anchor(store, cache, trust, roots)
            _check_chain(store, start, roots)
            updater = Updater(
                str(cache), base, fetcher=fetcher, bootstrap=bootstrap,
                config=UpdaterConfig(prefix_targets_with_hash=False),
            )  # fmt: skip
            _write_anchor(store, cache, trust)
            updater.refresh()
        except Exception as exc:
            raise _refusal(exc, store, fetcher, cache) from None
        where = metadata_url(store, "targets.json")
        files = [parse_metadata((cache / f"{role}.json").read_bytes(), role, where) for role in _ROLES]
        targets_raw = (cache / "targets.json").read_bytes()
        root, _, _, targets = files
        return SignedView(
            url=store.remote.url,
            latest=latest_of(targets.signed.targets, where),
            targets=dict(targets.signed.targets),
            targets_raw=targets_raw,
            expires=min(expiry_of(md) for md in files),
            signed_by=signed_by(root.signed, "targets", targets),
        )


_ROLES = ("root", "timestamp", "snapshot", "targets")


def _listed_roots(store: S3Store) -> list[int]:
    """The root versions the store holds (tuf/<N>.root.json), ascending."""
    listing = store.list_under(metadata_name(""))
    return sorted(p[0] for name in listing if (p := parse_role_file(name)) and p[1] == "root")


def _anchor(store: S3Store, cache: Path, trust: Trust, roots: list[int]) -> tuple[bytes | None, Any]:
    """(bootstrap, starting root): (None, the cached root) when `cache` holds a root these trusted keys
    anchored for this remote OUT, no older than the root the host was given; else (the bytes of the root
    to start from, it parsed), after clearing what `cache` may no longer carry over. See the module
    docstring."""
    memory = _memory(store, cache, trust)
    pinned = trust.root
    if memory is not None and (pinned is None or _holds(cache, memory, pinned)):
        return None, memory
    _forget(cache, roots_only=memory is not None)
    top = roots[-1] if roots else 0
    if pinned is not None:
        version = pinned.signed.version
        if top < version:
            raise UntrustedVersion(
                f"{store.remote.name_url(METADATA_DIR)}/: the fleet's root metadata stops at version {top}, "
                f"older than the root this host was given ({trust.root_file}: version {version}): later "
                "roots were deleted, or this is not that fleet; nothing installed"
            )
        return to_bytes(pinned), pinned
    if not roots:
        raise UntrustedVersion(
            f"{metadata_url(store, '1.root.json')}: missing: the fleet has no signed metadata (push with "
            "--signing-key), and this host trusts only signed versions"
        )
    for version in reversed(roots[-MAX_ROOTS:]):
        got = get_metadata(store, f"{version}.root.json")
        try:
            md = parse_metadata(got[0], "root", "root") if got else None
        except UntrustedVersion:
            continue
        if md is not None and md.signed.version == version and signed_by_trusted(md, trust.keys):
            return got[0], md
    raise UntrustedVersion(
        f"{store.remote.name_url(METADATA_DIR)}/: no root metadata is signed by the trusted keys "
        f"({', '.join(sorted(trust.keys))}): not the fleet these keys sign, or a fleet whose keys were "
        "rotated past them"
    )


def _memory(store: S3Store, cache: Path, trust: Trust) -> Any | None:
    """The root this host trusted last, when `cache` holds one these trusted keys anchored for this
    remote OUT; else None."""
    try:
        record = json.loads(read_small_file(cache / ANCHOR_RECORD, 1 << 16))
    except (FileNotFoundError, BundleError, ValueError, RecursionError):
        return None
    if record != _anchor_record(store, trust):
        return None
    try:
        raw = read_small_file(cache / "root.json", MAX_METADATA_BYTES)
        return parse_metadata(raw, "root", str(cache / "root.json"))
    except (OSError, BundleError, UntrustedVersion):
        return None


def _holds(cache: Path, memory: Any, pinned: Any) -> bool:
    """True when the host's memory is no older than the root it was given and, where it went through
    that root's version, went through that very root."""
    version = pinned.signed.version
    if memory.signed.version < version:
        return False
    try:
        raw = read_small_file(cache / "root_history" / f"{version}.root.json", MAX_METADATA_BYTES)
        seen = parse_metadata(raw, "root", "root")
    except FileNotFoundError:
        return True  # the memory starts past it
    except (OSError, BundleError, UntrustedVersion):
        return False
    return seen.signed_bytes == pinned.signed_bytes


def _forget(cache: Path, *, roots_only: bool) -> None:
    """Empty `cache` (the lock file stays); `roots_only`: only its roots and the anchor record, so the
    timestamp, snapshot and targets it trusted stay the floor a replay must pass."""
    for child in cache.iterdir():
        if child.name == LOCK_FILE or (roots_only and child.name not in _ROOT_FILES):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


_ROOT_FILES = ("root.json", "root_history", ANCHOR_RECORD)


def _check_chain(store: S3Store, start: Any, roots: list[int]) -> None:
    """UntrustedVersion unless every root version from `start`'s next up to the newest one the store lists
    is there and verifies as the successor of the one before: a host never stops at a root that a later
    one on the store rotated away, whatever was deleted in between."""
    top = roots[-1] if roots else 0
    first = start.signed.version + 1
    if top - first >= MAX_ROOTS:
        raise UntrustedVersion(
            f"{metadata_url(store, f'{top}.root.json')}: more than {MAX_ROOTS} root versions past the one "
            f"this host starts from ({start.signed.version}); nothing installed"
        )
    current = start
    for version in range(first, top + 1):
        name = f"{version}.root.json"
        where = metadata_url(store, name)
        got = get_metadata(store, name)
        if got is None:
            raise UntrustedVersion(
                f"{where}: missing, though the store holds root metadata up to version {top}: the chain "
                "of roots is broken (a root deleted, or a stray later one); nothing installed"
            )
        md = parse_metadata(got[0], "root", where)
        next_root_checked(current.signed, md, where)
        current = md


def _anchor_record(store: S3Store, trust: Trust) -> dict:
    return {"url": store.remote.url, "keys": sorted(trust.keys)}


def _write_anchor(store: S3Store, cache: Path, trust: Trust) -> None:
    from ..bundle.files import atomic_replace_bytes

    atomic_replace_bytes(cache / ANCHOR_RECORD, json.dumps(_anchor_record(store, trust)).encode())


def _refusal(exc: Exception, store: S3Store, fetcher: Any, cache: Path) -> Exception:
    """The zerogr error for what the Updater raised."""
    from tuf.api import exceptions as tx

    if isinstance(exc, (ZerogrError, OSError)):
        return exc
    cause = exc.__cause__
    if isinstance(exc, tx.DownloadError) and isinstance(cause, ZerogrError):
        return cause
    role = next((r for r in _ROLES if r in str(exc)), None)
    name = fetcher.last
    if role is not None:
        name = next((n for n in reversed(fetcher.fetched) if _role_of(n) == role), f"{role}.json")
    where = metadata_url(store, name)
    if isinstance(exc, tx.ExpiredMetadataError):
        expires = _expiry(fetcher.fetched.get(name) or _cached(cache, role))
        when = iso(expires) if expires is not None else "an unknown time"
        return ExpiredFleetMetadata(
            f"{where}: the fleet's signed metadata expired at {when}: nothing newer was signed since (is the "
            "build box's rebuild running?); nothing installed, this host keeps serving what it has",
            expires,
        )
    if isinstance(exc, tx.BadVersionNumberError):
        return UntrustedVersion(
            f"{where}: older than the fleet metadata this host already trusts ({exc}): a replay of an "
            "earlier state; nothing installed"
        )
    if isinstance(exc, tx.DownloadHTTPError):
        return UntrustedVersion(f"{where}: missing, though the fleet's signed metadata names it")
    if isinstance(exc, tx.LengthOrHashMismatchError):
        return UntrustedVersion(
            f"{where}: not the file the newer signed metadata names (changed, or from another state)"
        )
    if isinstance(exc, tx.UnsignedMetadataError):
        return UntrustedVersion(f"{where}: not signed by the fleet's keys ({exc})")
    if isinstance(exc, (tx.RepositoryError, tx.DownloadLengthMismatchError)):
        return UntrustedVersion(f"{where}: {exc}")
    if isinstance(exc, tx.DownloadError):
        return RemoteError(f"{where}: {exc}")
    return exc


def _role_of(name: str) -> str | None:
    if name == TIMESTAMP_FILE:
        return "timestamp"
    parsed = parse_role_file(name)
    return parsed[1] if parsed else None


def _cached(cache: Path, role: str | None) -> bytes | None:
    with contextlib.suppress(OSError):
        return (cache / f"{role}.json").read_bytes() if role else None
    return None


def _expiry(raw: bytes | None) -> float | None:
    """The expiry of metadata bytes the Updater verified before finding them expired."""
    if raw is None:
        return None
    try:
        return expiry_of(tuf().Metadata.from_bytes(raw))
    except Exception:  # noqa: BLE001 - only for the message
        return None


def check_local_version(version_dir: Path, trust: Trust) -> str:
    """The key ids that signed the proof of the local version `version_dir` (its manifest.json.sig: the
    fleet's signed targets metadata that listed it when it was pulled), checked against the roots in
    OUT/.tuf/ that the trusted keys anchor. UntrustedVersion naming the file otherwise. Expiry is not
    checked here: pull refuses stale metadata; this checks the bytes on disk."""
    history = version_dir.parent / METADATA_CACHE / "root_history"
    roots = sorted(
        (p[0], path)
        for path in (history.iterdir() if history.is_dir() else ())
        if (p := parse_role_file(path.name))
    )
    current = None
    for version, path in roots:
        md = parse_metadata(read_small_file(path, MAX_METADATA_BYTES), "root", str(path))
        if current is None:
            current = md if signed_by_trusted(md, trust.keys) else None
        elif version == current.signed.version + 1:
            next_root_checked(current.signed, md, str(path))
            current = md
    if current is None:
        raise UntrustedVersion(
            f"{version_dir}: no fleet metadata signed by the trusted keys in {history.parent} to check it "
            "against (a version is checked once zerogr pull --trusted-keys installed it)"
        )
    proof_path = version_dir / SIGNATURE_NAME
    try:
        proof = read_small_file(proof_path, MAX_METADATA_BYTES)
    except FileNotFoundError:
        raise UntrustedVersion(
            f"{proof_path}: missing: not installed by a pull with --trusted-keys"
        ) from None
    except BundleError as exc:
        raise UntrustedVersion(str(exc)) from None
    targets = parse_metadata(proof, "targets", f"{proof_path} (an older signature: pull again to renew it)")
    with refused_as(str(proof_path)):
        signers = signed_by(current.signed, "targets", targets)
    number = parse_version_dir(version_dir.name)
    if number is None:
        raise UntrustedVersion(f"{version_dir}: not a version dir (vNNNNNN)")
    manifest = read_small_file(version_dir / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    check_manifest(targets.signed.targets, number, manifest, str(version_dir / MANIFEST_NAME))
    return ", ".join(signers)


def refresh_proofs(out: Path, view: SignedView) -> None:
    """Give every installed version the signed targets list names, with these manifest bytes, the current
    targets metadata as its proof (after a key rotation, or a host that pulled unsigned before). Call
    under the OUT lock."""
    for number, path in version_dirs(out):
        if manifest_target(number) not in view.targets:
            continue
        try:
            view.check_manifest(number, read_small_file(path / MANIFEST_NAME, MAX_MANIFEST_BYTES), "")
        except (FileNotFoundError, BundleError, UntrustedVersion):
            continue
        with contextlib.suppress(FileNotFoundError, BundleError):
            if read_small_file(path / SIGNATURE_NAME, MAX_METADATA_BYTES) == view.targets_raw:
                continue
        temp = out / f"{TEMP_PREFIX}{temp_tag()}-{SIGNATURE_NAME}"
        try:
            write_bytes_durable(temp, view.targets_raw)
            os.replace(temp, path / SIGNATURE_NAME)
        finally:
            temp.unlink(missing_ok=True)
        fsync_dir(path)
