"""`pull_version`: install the version a remote OUT's LATEST names (or a given one) into a local OUT, for a
cron job on every serving host (docs/bundle-format.md, "Remote OUT"; docs/fleet.md).

The remote is untrusted input (the trust rules of docs/bundle-format.md section 12):
  1. with trusted keys, refresh the fleet's signed metadata into OUT/.tuf (signed_view.py: expired, replayed,
     mixed or unsigned metadata is refused) and take the version its LATEST names; read
     vNNNNNN/manifest.json (at most 64 MiB) and check its length and sha256 against the signed targets.
     On an unsigned fleet, the version remote LATEST names (at most 4 KiB, a version dir name). Then the
     manifest: the schema, every file name (relative, no '..', no reserved name), `version` = N.
  2. list the version's objects: every listed file must exist with exactly its declared size (a missing,
     truncated or half-uploaded version is refused here, before anything is written); the sum of the
     sizes must fit the local disk's free space with a margin, and every name the local file system.
  3. under the OUT lock, claim a temp dir OUT/.tmp-<tag>/ (the local publish protocol, lock.py).
  4. stream each object into its file there, one chunk at a time, hashing as it goes and never reading
     past the declared size; then its size and sha256 must equal the manifest's. fsync each file.
  5. write the remote manifest's exact bytes and, on a signed fleet, the signed targets metadata that lists
     it as the version's proof (manifest.json.sig, for `zerogr verify --trusted-keys` on the host); open
     the version (headers against the manifest; with verify=True every invariant, as `zerogr verify`).
  6. under the OUT lock: rename the temp dir to vNNNNNN, record the counter, record the move of LATEST
     as pull's (pull_record.py: the versions before and after), replace LATEST, mark the move done,
     prune.
A version that is already installed downloads nothing; on a signed fleet every installed version the
signed targets list gets their current bytes as its proof (after a key rotation, or a host that pulled
unsigned before).
A LATEST promoted locally away from what pull last set is held: pull leaves it (and downloads nothing)
unless follow_remote.
Any refusal is one line naming the remote object; the temp dir is removed, so the OUT is as it was. A
disk that fills during the download is NotEnoughSpace (exit 3), as when it is too small from the start.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import BundleError, InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..bundle.files import atomic_replace_bytes, fsync_dir, read_small_file, write_bytes_durable
from ..bundle.format import (
    COUNTER_NAME,
    MANIFEST_NAME,
    MAX_VERSION,
    SIGNATURE_NAME,
    parse_version_dir,
    version_dir_name,
)
from ..bundle.lock import BuildClaim, out_lock, remove_stale_temps
from ..bundle.reader import MAX_MANIFEST_BYTES, open_bundle
from ..bundle.verify import verify_bundle
from ..bundle.versions import check_out_dir, next_version, prune_versions, replace_latest
from ..bundle.versions import read_latest as read_local_latest
from .local_disk import DISK_FULL, NotEnoughSpace, check_names_fit, check_space
from .pull_record import held_latest, record_move, write_record
from .remote import (
    NothingPublished,
    RefusedRemoteVersion,
    RemoteError,
    RemoteOut,
    S3Store,
    version_name,
)
from .remote_version import check_objects, parse_remote_manifest, read_remote_manifest, remote_latest_number
from .signed_view import METADATA_CACHE, SignedView, read_signed_view, refresh_proofs
from .signing import Trust, require_trust
from .transfer import TransferResult, for_each_on_threads

PULL_THREADS = 4


@dataclass(kw_only=True)
class PullResult(TransferResult):
    """What a pull did: the version, whether it was installed now (False: it was already there), whether
    LATEST was moved to it, and the versions pruned. `held`: the version LATEST stays at because it was
    promoted locally away from what pull last installed (then nothing was installed or moved)."""

    out: str
    installed: bool
    latest_moved: bool
    held: str | None = None

    def as_dict(self) -> dict:
        return super().as_dict() | {"path": str(Path(self.out) / version_dir_name(self.version))}


def _pulled(
    url: str,
    out: Path,
    number: int,
    installed: bool,
    moved: tuple[bool, list[str], str | None],
    files: int,
    total: int,
    manifest: dict,
    signed_by: str | None,
    view: SignedView | None,
) -> PullResult:
    return PullResult(
        url=url,
        out=str(out),
        version=number,
        installed=installed,
        latest_moved=moved[0],
        files=files,
        bytes=total,
        manifest=manifest,
        pruned=moved[1],
        signed_by=signed_by,
        held=moved[2],
        expires=view.expires if view is not None else None,
        fleet_latest=view.latest if view is not None else None,
    )


def pull_version(
    url: str,
    out_dir: str | Path,
    *,
    version: int | None = None,
    keep: int | None = None,
    verify: bool = False,
    follow_remote: bool = False,
    trust: Trust | None = None,
    progress: Progress = NULL_PROGRESS,
    store: S3Store | None = None,
    timings: dict[str, float] | None = None,
) -> PullResult:
    """Install remote version `version` (default: the one remote LATEST names) from `url` into the local
    OUT `out_dir` and point its LATEST at it; see the module docstring. `trust` is whom this host trusts:
    its keys, or Trust.unsigned() for an unsigned fleet; None is refused (InputError).

    A local LATEST that was promoted away from the version pull last set (pull_record.py: a host rolled
    back with `zerogr promote`) is left as it is: nothing is downloaded and the result names it as
    `held`. follow_remote=True points LATEST at the remote version all the same.

    Raises InputError (arguments, an OUT that cannot hold versions or already holds a different vN),
    NothingPublished (no remote LATEST, no such version), RefusedRemoteVersion (the remote version is
    incomplete, corrupt or hostile: nothing installed), RemoteError / NotEnoughSpace (retry later)."""
    if keep is not None and (isinstance(keep, bool) or int(keep) < 1):
        raise InputError(f"--keep must be >= 1, got {keep}")
    if version is not None and (isinstance(version, bool) or not 1 <= int(version) <= MAX_VERSION):
        raise InputError(f"--version must be between 1 and {MAX_VERSION}, got {version}")
    remote = RemoteOut.parse(url)
    trust = require_trust(trust, remote.url)
    out = check_out_dir(out_dir)
    timings = timings if timings is not None else {}
    store = store or S3Store(remote)

    t0 = time.perf_counter()
    view = None
    if trust.keys:
        out.mkdir(parents=True, exist_ok=True)
        view = read_signed_view(store, out / METADATA_CACHE, trust)
    number = version if version is not None else _latest_number(store, view)
    try:
        raw = read_remote_manifest(store, number, named_by_latest=version is None)
        if view is not None:
            view.check_manifest(number, raw, store.remote.name_url(version_name(number, MANIFEST_NAME)))
        manifest = parse_remote_manifest(store, number, raw)
    except RefusedRemoteVersion:  # pruned between the read of LATEST and the manifest's GET: a retry
        _latest_moved(store, number, version)
        raise
    signed_by = ", ".join(view.signed_by) if view is not None else None
    proof = view.targets_raw if view is not None else None
    timings["manifest"] = time.perf_counter() - t0
    entries = manifest["files"]
    total = sum(int(e["bytes"]) for e in entries.values())
    final = out / version_dir_name(number)

    held = None if follow_remote else held_latest(out, final.name)
    if held is not None:
        moved = (False, [], held)
        return _pulled(remote.url, out, number, False, moved, len(entries), total, manifest, signed_by, view)
    existing = _installed(store, number, final, raw)
    if existing:
        with out_lock(out):
            _refresh(out, view)
            moved = _point_latest_locked(out, final, keep, remote.url, follow_remote)
        return _pulled(remote.url, out, number, False, moved, len(entries), total, manifest, signed_by, view)

    t0 = time.perf_counter()
    try:
        check_objects(store, number, entries)
    except RefusedRemoteVersion:
        _latest_moved(store, number, version)
        raise
    out.mkdir(parents=True, exist_ok=True)
    check_space(out, total)
    check_names_fit(store, number, entries, out)
    timings["check"] = time.perf_counter() - t0

    with out_lock(out):
        remove_stale_temps(out)
        claim = BuildClaim(out)
    try:
        t0 = time.perf_counter()
        progress.stage("download", total)
        try:
            _download(store, number, entries, claim.dir, progress)
        except RefusedRemoteVersion:
            _latest_moved(store, number, version)
            raise
        write_bytes_durable(claim.dir / MANIFEST_NAME, raw)
        if proof is not None:
            write_bytes_durable(claim.dir / SIGNATURE_NAME, proof)
        fsync_dir(claim.dir)
        timings["download"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        _check_installed_copy(store, number, claim.dir, verify)
        timings["verify"] = time.perf_counter() - t0
        with out_lock(out):
            if _installed(store, number, final, raw):  # a concurrent pull of the same version won the rename
                claim.release()
                _refresh(out, view)
                moved = _point_latest_locked(out, final, keep, remote.url, follow_remote)
                return _pulled(
                    remote.url, out, number, False, moved, len(entries), total, manifest, signed_by, view
                )
            if final.exists() or final.is_symlink():
                raise InputError(
                    f"{final}: exists and is not remote {version_dir_name(number)}; not replaced"
                )
            counter = max(next_version(out) - 1, number)
            os.rename(claim.dir, final)
            fsync_dir(out)
            atomic_replace_bytes(out / COUNTER_NAME, f"{counter}\n".encode())
            moved = _point_latest_locked(out, final, keep, remote.url, follow_remote)
            _refresh(out, view)
            claim.release()
    except BaseException as exc:
        with out_lock(out):
            claim.release()
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise NotEnoughSpace(
                f"{out}: the disk filled during the download ({exc.strerror}); nothing was installed"
            ) from None
        raise
    return _pulled(remote.url, out, number, True, moved, len(entries), total, manifest, signed_by, view)


def _latest_number(store: S3Store, view: SignedView | None) -> int:
    """The version to pull: the one the signed metadata names (signed fleet), else remote LATEST's."""
    if view is None:
        return remote_latest_number(store)
    if view.latest is None:
        raise NothingPublished(f"{store.remote.url}: the fleet's signed metadata names no LATEST yet")
    return view.latest


def _refresh(out: Path, view: SignedView | None) -> None:
    if view is not None:
        refresh_proofs(out, view)


def _latest_moved(store: S3Store, number: int, asked: int | None) -> None:
    """A version that LATEST named and that lost objects during the pull was most likely pruned after a
    newer one was promoted: that is a retry (RemoteError), not a bad version."""
    if asked is not None:
        return
    try:
        current = remote_latest_number(store)
    except (RefusedRemoteVersion, NothingPublished):
        return
    if current != number:
        raise RemoteError(
            f"{store.remote.name_url('LATEST')}: moved from {version_dir_name(number)} to "
            f"{version_dir_name(current)} during the pull; run it again"
        )


def _installed(store: S3Store, number: int, final: Path, raw: bytes) -> bool:
    """True when the local version dir already holds exactly this manifest. A local path the file system
    cannot hold (its name past NAME_MAX or PATH_MAX) is RefusedRemoteVersion naming the remote version."""
    try:
        local = read_small_file(final / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except BundleError:
        if _too_long(final / MANIFEST_NAME):
            raise RefusedRemoteVersion(
                f"{store.remote.name_url(version_dir_name(number))}: its local path {final} is too long for "
                "this file system"
            ) from None
        local = b""
    if hashlib.sha256(local).digest() == hashlib.sha256(raw).digest():
        return True
    raise InputError(
        f"{final}: holds a different version than the remote one (this OUT is not a mirror of the remote; "
        "pull into an OUT dir that only pull writes)"
    )


def _too_long(path: Path) -> bool:
    """True when `path`'s name, or the whole path, is past the file system's limits."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ENAMETOOLONG
    return False


def _point_latest_locked(
    out: Path, final: Path, keep: int | None, url: str, follow: bool
) -> tuple[bool, list[str], str | None]:
    """Point LATEST at `final` unless it names it already, record it as pull's, prune: (moved, pruned,
    None). Unless `follow`, a LATEST promoted here away from pull's last one is left: (False, [], it).
    The record names the version being left before LATEST moves, so a pull killed between the two
    writes leaves a LATEST that the next pull still knows as its own. Call under the OUT lock."""
    held = None if follow else held_latest(out, final.name)
    if held is not None:
        return False, [], held
    moved = False
    try:
        current = read_local_latest(out)
    except BundleError:
        current = None
    if current != final.name:
        if current is not None and parse_version_dir(current) is not None:
            record_move(out, current, final.name, url)
        replace_latest(out, final.name)
        moved = True
    write_record(out, final.name, url)
    pruned = prune_versions(out, int(keep)) if keep is not None else []
    return moved, pruned, None


def _download(store: S3Store, number: int, entries: dict, tmp: Path, progress: Progress) -> None:
    """Stream every file into `tmp` (names already check_relpath'd by validate_manifest), checking each
    file's size and sha256 as it streams."""
    root = tmp.resolve()
    for name in entries:  # parent dirs first, on one thread; never through anything but a fresh dir
        parent = (tmp / name).parent
        if not parent.resolve().is_relative_to(root):
            raise RefusedRemoteVersion(
                f"{store.remote.name_url(version_name(number, name))}: leaves the version dir"
            )
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise RefusedRemoteVersion(
                f"{store.remote.name_url(version_name(number, name))}: its dir clashes with a listed file"
            ) from None
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            raise RefusedRemoteVersion(
                f"{store.remote.name_url(version_name(number, name))}: its name is too long for this disk"
            ) from None

    def fetch(name: str) -> None:
        entry = entries[name]
        where = store.remote.name_url(version_name(number, name))
        path = tmp / name
        try:
            sink = open(path, "xb")  # noqa: SIM115 - closed below
        except (FileExistsError, IsADirectoryError):
            raise RefusedRemoteVersion(f"{where}: clashes with another listed file or dir") from None
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            raise RefusedRemoteVersion(f"{where}: its name is too long for this disk") from None
        try:
            digest = store.stream_to(version_name(number, name), sink, int(entry["bytes"]), progress.advance)
            sink.flush()
            os.fsync(sink.fileno())
        finally:
            sink.close()
        if digest != entry["sha256"]:
            raise RefusedRemoteVersion(f"{where}: sha256 mismatch (corrupt or changed)")

    for_each_on_threads(fetch, sorted(entries), PULL_THREADS)


def _check_installed_copy(store: S3Store, number: int, tmp: Path, verify: bool) -> None:
    """Open the downloaded copy (manifest, sizes, array headers: constant memory) or, with verify, check
    every invariant; a failure names the remote object."""
    try:
        if verify:
            verify_bundle(tmp, checksums=False)
        else:
            open_bundle(tmp, verify_checksums=False)
    except BundleError as exc:
        message = str(exc).replace(str(tmp), store.remote.name_url(version_dir_name(number)))
        raise RefusedRemoteVersion(message) from None
