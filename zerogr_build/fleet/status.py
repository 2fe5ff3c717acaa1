"""`out_status`: the versions of a local or remote OUT, for `zerogr status`: which one LATEST names, each
version's age, size, model tag, plans and kernels, the quality gate's recorded decision per model tag, and
whether it passes its check.

Checks: a local version is verified completely (`verify_bundle`: every sha256 and invariant). A remote
version gets a cheap check by default: its manifest is valid and names its own number, and every listed
file exists with exactly its declared size (one listing, no download); `verify=True` also streams every
object and checks its sha256 (the whole bundle is read, memory stays at one chunk per stream). Given
trusted keys, a remote OUT's signed metadata is read as a host reads it (signed_view.py: expired,
replayed or unsigned metadata is refused, exit 4), LATEST is the version it names, and every version must
be in its targets with exactly its manifest bytes; a local version's proof (manifest.json.sig) is checked
against the metadata its pull kept. A remote OUT is read only with trusted keys or as an unsigned fleet
(Trust.unsigned()). A version-like prefix past MAX_VERSION is a failing row naming it.

A remote version whose manifest is gone by the time it is read was pruned by a concurrent push: it is
left out, not reported as failing, unless LATEST names it (then its row says it was removed, and the
check fails). When the store cannot say whether the manifest is still there, the row keeps its error.

Quality records (quality/<key>.json, a few KiB each) are read on both sides by the same rules as
`load_quality`; a remote one is also checked against the manifest's size and sha256. One that breaks a
rule is shown as {"file", "error"}, never as a decision, and fails its version's check.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from ..base.errors import BundleError, InputError, ZerogrError, one_line
from ..bundle.format import MANIFEST_NAME, parse_version_dir, shown_version_dir, version_dir_name
from ..bundle.quality import MAX_QUALITY_BYTES, load_quality, parse_quality, quality_key_of, quality_row
from ..bundle.reader import load_manifest
from ..bundle.verify import verify_bundle
from ..bundle.versions import read_latest, version_dirs
from .metadata import iso
from .remote import CLAIM_NAME, RemoteOut, S3Store, is_remote, list_versions, oversized_note, version_name
from .remote_version import parse_remote_manifest, read_remote_manifest
from .signed_view import SignedView, check_local_version, read_signed_view
from .signing import Trust, require_trust


def out_status(
    target: str | Path, *, verify: bool = False, store: S3Store | None = None, trust: Trust | None = None
) -> dict:
    """{"out", "remote", "check", "latest", "ok", "versions": [...]} for a local OUT dir or an s3:// URL.
    `trust`: the keys whose signatures are checked, or Trust.unsigned(); a remote OUT needs one.

    Each version: {"version", "name", "latest", "unpromoted" (newer than LATEST's, or no LATEST),
    "complete", "created_at", "age_s", "bytes", "files", "model_version", "items", "plans", "kernels",
    "quality", "signed_by" (the trusted key id that signed it; None when not checked), "ok", "error"};
    "quality" lists the gate's recorded decisions, one {"file", "model_version",
    "order", "passed", "min_overlap", "max_recall_gap",
    "worst_overlap"} per record, or {"file", "error"} for one that breaks the format. "ok" (top level) is
    True when LATEST names a complete version that passes its check and no complete version fails it.
    A remote OUT read with trusted keys also has "fleet": {"latest", "expires", "expires_at",
    "signed_by"}, what its signed metadata says."""
    if is_remote(str(target)):
        return _remote_status(RemoteOut.parse(str(target)), verify, store, trust)
    return _local_status(Path(target), trust)


def _summary(manifest: dict) -> dict[str, Any]:
    files = manifest["files"]
    created = manifest.get("created_at")
    age = None
    if isinstance(created, str):
        try:
            age = max(time.time() - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp(), 0.0)
        except ValueError:
            age = None
    return {
        "created_at": created,
        "age_s": age,
        "bytes": sum(int(e["bytes"]) for e in files.values()),
        "files": len(files),
        "model_version": manifest.get("model_version"),
        "items": manifest["leaves"]["items"],
        "plans": sorted(
            n[len("plans/") : -len(".json")] for n in files if n.startswith("plans/") and n.endswith(".json")
        ),
        "kernels": sorted({n.split("/")[1] for n in files if n.startswith("kernels/") and n.count("/") >= 2}),
    }


def _empty(number: int, latest: str | None) -> dict[str, Any]:
    name = version_dir_name(number)
    latest_number = parse_version_dir(latest) if latest else None
    return {
        "version": number,
        "name": name,
        "latest": name == latest,
        # Newer than the version LATEST names (or no LATEST): never served from this OUT, e.g. a version a
        # rebuild kept after it failed verification.
        "unpromoted": latest_number is None or number > latest_number,
        "complete": False,
        "created_at": None,
        "age_s": None,
        "bytes": None,
        "files": None,
        "model_version": None,
        "items": None,
        "plans": [],
        "kernels": [],
        "quality": [],
        "signed_by": None,
        "ok": False,
        "error": None,
    }


def _overall(versions: list[dict]) -> bool:
    named = [v for v in versions if v["latest"]]
    broken = [v for v in versions if v["complete"] or v.get("hostile")]
    return bool(named) and named[0]["ok"] and all(v["ok"] for v in broken)


def _local_status(out: Path, trust: Trust | None) -> dict:
    if not out.is_dir():
        raise InputError(f"{out}: no such OUT dir")
    if (out / MANIFEST_NAME).exists():
        raise InputError(f"{out}: is a version dir; pass its OUT dir")
    try:
        latest = read_latest(out)
    except BundleError as exc:
        latest = f"<unreadable: {one_line(exc)}>"
    versions = []
    for number, path in version_dirs(out):
        entry = _empty(number, latest)
        if path.name != entry["name"]:  # v0000007 (7 digits, zero-padded) is not v000007
            continue
        try:
            manifest = load_manifest(path)
            entry.update(_summary(manifest))
            entry["complete"] = True
            entry["quality"] = _local_quality(path, manifest)
            verify_bundle(path)
            if trust is not None and trust.keys:
                entry["signed_by"] = check_local_version(path, trust)
            entry["ok"] = True
        except ZerogrError as exc:
            entry["error"] = one_line(exc)
            entry["complete"] = entry["complete"] or (path / MANIFEST_NAME).is_file()
        versions.append(entry)
    return {
        "out": str(out),
        "remote": False,
        "check": "full",
        "latest": latest,
        "ok": _overall(versions),
        "versions": versions,
    }


def _remote_status(remote: RemoteOut, verify: bool, store: S3Store | None, trust: Trust | None) -> dict:
    trust = require_trust(trust, remote.url)
    store = store or S3Store(remote)
    view = None
    if trust.keys:
        with tempfile.TemporaryDirectory(prefix="zerogr-status-") as cache:
            view = read_signed_view(store, Path(cache), trust)
    state = list_versions(store)
    latest = state.latest
    if view is not None:
        latest = version_dir_name(view.latest) if view.latest is not None else None
    versions = [_oversized_row(remote, name) for name in state.oversized]
    for number in sorted(state.objects):
        objects = state.objects[number]
        entry = _empty(number, latest)
        if MANIFEST_NAME not in objects:
            newest = max(obj.modified.timestamp() for obj in objects.values())
            entry["age_s"] = max(time.time() - newest, 0.0)
            entry["error"] = (
                "incomplete: no manifest.json (an upload in progress, or a push that died)"
                if CLAIM_NAME in objects
                else "incomplete: no manifest.json"
            )
            versions.append(entry)
            continue
        entry["complete"] = True
        try:
            manifest, entry["signed_by"] = _remote_manifest(store, number, view)
            entry.update(_summary(manifest))
            entry["quality"] = _remote_quality(store, number, manifest)
            _check_remote_files(store, number, manifest, objects, verify)
            broken = [row["error"] for row in entry["quality"] if "error" in row]
            if broken:
                raise BundleError(broken[0])
            entry["ok"] = True
        except ZerogrError as exc:
            entry["error"] = one_line(exc)
            if _removed_since_listing(store, number):
                if not entry["latest"]:
                    continue  # pruned by a concurrent push since the listing: not a failing version
                entry["complete"] = False
                entry["error"] = (
                    f"removed while it was read ({MANIFEST_NAME} is gone), and LATEST names it: "
                    "hosts cannot pull it"
                )
        versions.append(entry)
    report = {
        "out": remote.url,
        "remote": True,
        "check": "sha256" if verify else "sizes",
        "latest": latest,
        "ok": _overall(versions),
        "versions": versions,
    }
    if view is not None:
        report["fleet"] = {
            "latest": latest,
            "expires": view.expires,
            "expires_at": iso(view.expires),
            "signed_by": view.signed_by,
        }
    return report


def _oversized_row(remote: RemoteOut, name: str) -> dict[str, Any]:
    """The failing row of a version-like prefix past MAX_VERSION."""
    entry = _empty(0, None)
    entry.update(name=shown_version_dir(name), unpromoted=False, hostile=True)
    entry["error"] = f"{remote.url}/{oversized_note(name)}"
    return entry


def _removed_since_listing(store: S3Store, number: int) -> bool:
    """True when remote version `number`'s manifest is gone now; False when it is there, or when the store
    cannot say (then the version's own error stands)."""
    try:
        return store.head(version_name(number, MANIFEST_NAME)) is None
    except ZerogrError:
        return False


def _quality_names(manifest: dict) -> list[tuple[str, str]]:
    """[(file name, key)] of the quality records a manifest lists."""
    return sorted((name, key) for name in manifest["files"] if (key := quality_key_of(name)) is not None)


def _local_quality(path: Path, manifest: dict) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, key in _quality_names(manifest):
        try:
            rows.append(quality_row(name, load_quality(path / name, expect_key=key)))
        except BundleError as exc:
            rows.append({"file": name, "error": one_line(exc)})
    return rows


def _remote_quality(store: S3Store, number: int, manifest: dict) -> list[dict[str, Any]]:
    """The quality records of a remote version, each read whole (at most MAX_QUALITY_BYTES), checked
    against the manifest's size and sha256 and then against the format."""
    rows: list[dict[str, Any]] = []
    for name, key in _quality_names(manifest):
        object_name = version_name(number, name)
        where = store.remote.name_url(object_name)
        declared = manifest["files"][name]
        try:
            got = store.get_small(object_name, MAX_QUALITY_BYTES)
            if got is None:
                raise BundleError(f"{where}: missing (listed in the manifest)")
            raw = got[0]
            if len(raw) != int(declared["bytes"]):
                raise BundleError(f"{where}: {len(raw)} bytes, the manifest says {declared['bytes']}")
            if hashlib.sha256(raw).hexdigest() != declared["sha256"]:
                raise BundleError(f"{where}: sha256 mismatch (corrupt or changed)")
            rows.append(quality_row(name, parse_quality(raw, where, expect_key=key)))
        except BundleError as exc:  # RefusedRemoteVersion (too big) is a BundleError too
            rows.append({"file": name, "error": one_line(exc)})
    return rows


def _remote_manifest(store: S3Store, number: int, view: SignedView | None) -> tuple[dict, str | None]:
    """(the remote manifest, the key ids that signed the targets listing it, or None on an unsigned
    fleet): its bytes are checked against the signed targets before the manifest is parsed."""
    raw = read_remote_manifest(store, number, named_by_latest=True)
    if view is None:
        return parse_remote_manifest(store, number, raw), None
    view.check_manifest(number, raw, store.remote.name_url(version_name(number, MANIFEST_NAME)))
    return parse_remote_manifest(store, number, raw), ", ".join(view.signed_by)


def _check_remote_files(store: S3Store, number: int, manifest: dict, objects: dict, verify: bool) -> None:
    for name, entry in sorted(manifest["files"].items()):
        where = store.remote.name_url(version_name(number, name))
        obj = objects.get(name)
        if obj is None:
            raise BundleError(f"{where}: missing (listed in the manifest)")
        if obj.size != int(entry["bytes"]):
            raise BundleError(f"{where}: {obj.size} bytes, the manifest says {entry['bytes']}")
        if (
            verify
            and store.stream_to(version_name(number, name), None, int(entry["bytes"])) != entry["sha256"]
        ):
            raise BundleError(f"{where}: sha256 mismatch (corrupt or changed)")
