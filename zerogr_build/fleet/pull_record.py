"""What `zerogr pull` last pointed a local OUT's LATEST at, so that a local promotion (a rollback of one
host with `zerogr promote OUT/vNNNNNN`) sticks until the operator lets pull follow the remote again.

Pull writes OUT/.pulled (one line of JSON, replaced atomically under the OUT lock, after LATEST):

    {"latest": "v000002", "url": "s3://bucket/prefix", "at": "2025-06-01T12:00:00Z"}

A LATEST that names another version than "latest" there was moved by someone other than pull: pull
leaves it ("held") and says so, until `zerogr pull --follow-remote`. Without a record (an OUT that pull
never wrote) pull follows the remote. A record that cannot be read counts as none, with a warning.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime, timezone
from pathlib import Path

from ..base.errors import BundleError
from ..base.printable import printable
from ..bundle.files import atomic_replace_bytes, read_small_file
from ..bundle.format import parse_version_dir
from ..bundle.versions import read_latest

RECORD_NAME = ".pulled"
RECORD_LIMIT = 4096


def read_record(out: Path) -> str | None:
    """The version dir name pull last pointed OUT/LATEST at, or None (no record, or an unreadable one)."""
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
    return latest


def write_record(out: Path, latest: str, url: str) -> None:
    """Record that pull pointed OUT/LATEST at version dir `latest` of remote OUT `url` (unless the record
    says so already: a pull with nothing to do changes nothing). Call under the OUT lock, after LATEST
    was replaced."""
    try:
        current = json.loads(read_small_file(out / RECORD_NAME, RECORD_LIMIT))
    except (FileNotFoundError, BundleError, ValueError, RecursionError):
        current = None
    if isinstance(current, dict) and current.get("latest") == latest and current.get("url") == url:
        return
    at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = json.dumps({"latest": latest, "url": url, "at": at}) + "\n"
    atomic_replace_bytes(out / RECORD_NAME, body.encode())


def held_latest(out: Path, target: str) -> str | None:
    """The version dir LATEST names when it was moved here away from what pull last set, and is not
    `target` (pull must then leave it); None when pull may point LATEST at `target`."""
    record = read_record(out)
    if record is None:
        return None
    try:
        current = read_latest(out)
    except BundleError:  # an unreadable LATEST is replaced, as it always was
        return None
    if current is None or current in (record, target):
        return None
    return current
