"""Preflight: what a rebuild checks in its first seconds, before it builds anything: the push target
answers with the credentials given, and OUT has room for the version it is about to build (pruning
versions beyond --keep first when it has not). Plus how a full disk is recognised and named later on.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path

from ..base.errors import ZerogrError, one_line
from ..base.units import human_bytes
from ..bundle.format import MANIFEST_NAME, parse_version_dir, version_dir_name
from ..bundle.lock import out_lock
from ..bundle.reader import load_manifest
from ..bundle.versions import discard_version, list_versions, read_latest
from .request import PushSpec

#: The next version is expected to take LATEST's bytes times this (a catalog grows between runs).
SPACE_MARGIN = 1.2
#: What a run also writes to OUT for a while, per item of LATEST: the build's copy of the catalog SIDs
#: for verify (8 bytes per item, more for SIDs wider than 64 bits), then the guards' spilled ids when the
#: comparison passes its memory budget (up to 8 bytes per item of each version).
TRANSIENT_BYTES_PER_ITEM = 16
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFull(ZerogrError):
    """No room for the version in OUT, even after pruning beyond --keep (exit 8: retrying alone will not
    help)."""

    exit_code = 8


def check_push_target(push: PushSpec) -> None:
    """The remote OUT answers with the credentials given: one read of its LATEST, with short timeouts and
    two attempts, so a wrong set-up is known in seconds. RemoteAccessError (exit 2): no credentials,
    access denied, no such bucket; RemoteError (exit 3): the store did not answer."""
    from botocore.config import Config

    from ..fleet.remote import RemoteOut, S3Store, _boto3
    from ..fleet.remote import read_latest as read_remote_latest

    config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=10)
    client = _boto3().session.Session().client("s3", config=config)
    read_remote_latest(S3Store(RemoteOut.parse(push.url), client))


def version_bytes(version_dir: Path) -> int:
    """Bytes of a version: every file its manifest lists, and the manifest."""
    manifest = load_manifest(version_dir)
    return (
        sum(entry["bytes"] for entry in manifest["files"].values())
        + (version_dir / MANIFEST_NAME).stat().st_size
    )


def needed_bytes(previous: Path) -> int:
    """What a run that follows version `previous` needs free in OUT: the new version and what the run
    writes meanwhile (TRANSIENT_BYTES_PER_ITEM), both estimated from `previous`, times SPACE_MARGIN."""
    items = int(load_manifest(previous)["leaves"]["items"])
    return int((version_bytes(previous) + TRANSIENT_BYTES_PER_ITEM * items) * SPACE_MARGIN)


def make_room(out: Path, previous: Path | None, keep: int, log: Callable[[str], None]) -> None:
    """Room in OUT for the next version and what the run writes meanwhile (needed_bytes; nothing to go
    by without a previous version). When short and `keep` > 0, first remove versions beyond the newest
    keep - 1 (the new one makes keep), never the one LATEST names nor the one before it (the rollback).
    DiskFull naming OUT, the space free and needed, when it is still short."""
    if previous is None:
        return
    size = version_bytes(previous)
    need = needed_bytes(previous)
    free = shutil.disk_usage(out).free
    if free >= need:
        return
    if keep > 0:
        pruned = prune_for_room(out, keep - 1)
        if pruned:
            short = f"{human_bytes(free)} free, about {human_bytes(need)} needed"
            log(f"short of space ({short}): pruned {', '.join(pruned)} (beyond --keep {keep})")
        free = shutil.disk_usage(out).free
    if free < need:
        raise DiskFull(
            f"{out}: disk full: {human_bytes(free)} free, the next version and the run's temporary files "
            f"need about {human_bytes(need)} (LATEST {previous.name} takes {human_bytes(size)}); free space "
            "or lower --keep (retrying alone will not help)"
        )


def prune_for_room(out: Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` versions, never the one LATEST names nor the newest one below it.
    Returns the names removed."""
    with out_lock(out):
        latest = read_latest(out)
        numbers = list_versions(out)
        latest_number = parse_version_dir(latest) if latest else None
        spared = {latest}
        if latest_number is not None:
            below = [n for n in numbers if n < latest_number]
            if below:
                spared.add(version_dir_name(below[-1]))
        doomed = [version_dir_name(n) for n in numbers[: max(len(numbers) - keep, 0)]]
        removed = []
        for name in doomed:
            if name in spared:
                continue
            discard_version(out, name)
            removed.append(name)
    return removed


def is_disk_full(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) is a full disk or an exceeded quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        if "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def disk_full_message(exc: BaseException, out: Path) -> str:
    """One line naming the path that could not be written (OUT when the error does not say)."""
    seen: BaseException | None = exc
    path = None
    while seen is not None and path is None:
        path = getattr(seen, "filename", None)
        seen = seen.__cause__ or seen.__context__
    return (
        f"disk full writing {path or out}: {one_line(exc)}; free space in {out} or lower --keep "
        "(retrying alone will not help)"
    )
