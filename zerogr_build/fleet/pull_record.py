"""What `zerogr pull` last pointed a local OUT's LATEST at, so that a local promotion (a rollback of one
host with `zerogr promote OUT/vNNNNNN`) sticks until the operator lets pull follow the remote again.

Pull writes OUT/.pulled (one line of JSON, replaced atomically under the OUT lock) in two steps around
each move of LATEST, so that no crash between the writes of LATEST and of the record makes pull's own
move look like an operator's:

    before LATEST moves: {"latest": "v000008", "previous": "v000007", "url": "s3://...", "at": "..."}
    once it has moved:   {"latest": "v000008", "url": "s3://bucket/prefix", "at": "2025-06-01T12:00:00Z"}

A LATEST that names "latest" or, while the record holds one, "previous" was set by pull (a pull killed
half-way leaves either). Any other version was moved there by someone other than pull: pull leaves it
("held") and says so, until `zerogr pull --follow-remote`. Without a record (an OUT that pull never
wrote) pull follows the remote. A record that cannot be read counts as none, with a warning; a record
without "previous" (the only form older versions of zerogr write) is read as it always was.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..base.errors import BundleError
from ..base.printable import printable
from ..bundle.files import atomic_replace_bytes, read_small_file
from ..bundle.format import parse_version_dir
from ..bundle.versions import read_latest

RECORD_NAME = ".pulled"
RECORD_LIMIT = 4096


@dataclass(frozen=True)
class PullRecord:
    """OUT/.pulled: the version pull pointed LATEST at, and, only while that move is under way (or was
    cut short), the version LATEST named before it."""

    latest: str
    previous: str | None = None

    def set_by_pull(self, name: str) -> bool:
        """True when a LATEST naming version dir `name` was put there by pull."""
        return name in (self.latest, self.previous)


def read_pull_record(out: Path) -> PullRecord | None:
    """OUT/.pulled, or None (no record, or an unreadable one: a warning)."""
    path = out / RECORD_NAME
    try:
        record = json.loads(read_small_file(path, RECORD_LIMIT))
    except FileNotFoundError:
        return None
    except (BundleError, ValueError, RecursionError) as exc:
        warnings.warn(f"{path}: ignored, not a pull record ({printable(exc)})", stacklevel=2)
        return None
    latest = record.get("latest") if isinstance(record, dict) else None
    if not isinstance(latest, str) or parse_version_dir(latest) is None:
        warnings.warn(f"{path}: ignored, names no version dir", stacklevel=2)
        return None
    previous = record.get("previous")
    if not isinstance(previous, str) or parse_version_dir(previous) is None:
        previous = None  # absent (a finished move, an older zerogr's record) or not a version dir name
    return PullRecord(latest, previous)


def read_record(out: Path) -> str | None:
    """The version dir name pull last pointed OUT/LATEST at, or None (no record, or an unreadable one)."""
    record = read_pull_record(out)
    return record.latest if record is not None else None


def _write(out: Path, body: dict) -> None:
    at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic_replace_bytes(out / RECORD_NAME, (json.dumps(body | {"at": at}) + "\n").encode())


def record_move(out: Path, previous: str, latest: str, url: str) -> None:
    """Record, before pull replaces OUT/LATEST, that it is moving LATEST from version dir `previous` to
    `latest` of remote OUT `url`: whichever of the two LATEST names after a crash is pull's own. Call
    under the OUT lock, then replace LATEST, then write_record."""
    _write(out, {"latest": latest, "previous": previous, "url": url})


def write_record(out: Path, latest: str, url: str) -> None:
    """Record that pull pointed OUT/LATEST at version dir `latest` of remote OUT `url` and the move is done
    (unless the record says exactly so already: a pull with nothing to do changes nothing). Call under the
    OUT lock, after LATEST was replaced."""
    try:
        current = json.loads(read_small_file(out / RECORD_NAME, RECORD_LIMIT))
    except (FileNotFoundError, BundleError, ValueError, RecursionError):
        current = None
    if (
        isinstance(current, dict)
        and current.get("latest") == latest
        and current.get("url") == url
        and "previous" not in current
    ):
        return
    _write(out, {"latest": latest, "url": url})


def held_latest(out: Path, target: str) -> str | None:
    """The version dir LATEST names when it was moved here away from what pull set, and is not `target`
    (pull must then leave it); None when pull may point LATEST at `target`."""
    record = read_pull_record(out)
    if record is None:
        return None
    try:
        current = read_latest(out)
    except BundleError:  # an unreadable LATEST is replaced, as it always was
        return None
    if current is None or current == target or record.set_by_pull(current):
        return None
    return current
