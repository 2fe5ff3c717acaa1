"""OUT/.device-info.json: the tune device's identity as a rebuild's probe last read it, filed under
base.device_probe.probe_key (a digest of everything that identity depends on), so the next rebuild on the
same host and install names its CPU without starting a child that imports torch (about 1.5 s of CPU, in
a run that wants its cores for verify and the guards).

    {"format": 1, "entries": [{"key": "<sha256 hex>", "info": {device_info's fields}}, ...]}

Newest first, at most MAX_ENTRIES (hosts or installs that share one OUT each keep theirs). Only a holder
of OUT's run lock writes it, replacing it atomically while holding OUT's lock, as every file in OUT is
written. It is data any OUT writer could have damaged: read with a size limit and never through a special
file or a symlink, and an entry that is not a complete record (device_probe.complete_record) is ignored.
A file that cannot be read is the same as none; one that cannot be written never fails the run (the
caller logs one line). A wrong record can only make tune reuse a plan measured on another CPU class
(slower scoring modes), never change what a search returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base.device_probe import complete_record
from ..base.errors import InputError
from ..base.small_files import read_small_json

MEMO_NAME = ".device-info.json"
MEMO_FORMAT = 1
#: Identities kept: the newest this many keys.
MAX_ENTRIES = 8
#: The most bytes read; a larger file is not a memo this code wrote.
MAX_BYTES = 64 << 10


def memo_path(out: str | os.PathLike) -> Path:
    return Path(out) / MEMO_NAME


def _entries(out: str | os.PathLike) -> list[dict[str, Any]]:
    """The memo's well-formed entries ({"key": str, "info": dict}), newest first; [] when there is no
    memo or it cannot be read (a directory, a FIFO, a symlink, no permission, too large, not JSON)."""
    try:
        memo = read_small_json(memo_path(out), MAX_BYTES, "tune device memo", follow_symlinks=False)
    except InputError:
        return []
    if (
        not isinstance(memo, dict)
        or memo.get("format") != MEMO_FORMAT
        or not isinstance(memo.get("entries"), list)
    ):
        return []
    return [
        e for e in memo["entries"] if isinstance(e, dict) and isinstance(e.get("key"), str) and "info" in e
    ]


def remembered(out: str | os.PathLike, key: str, device: str) -> dict[str, Any] | None:
    """The identity of `device` filed under `key` in OUT's memo, when it is a complete record; else None."""
    for entry in _entries(out):
        if entry["key"] == key:
            return dict(entry["info"]) if complete_record(entry["info"], device) else None
    return None


def remember(out: str | os.PathLike, key: str, info: Mapping[str, Any]) -> None:
    """File `info` under `key` in OUT's memo (newest first, MAX_ENTRIES kept), atomically, holding OUT's
    lock. The caller holds OUT's run lock. OSError when it cannot be written (anything but a regular file
    at the path is never replaced)."""
    from .lock import replace_out_file

    entries = [{"key": key, "info": dict(info)}]
    entries += [e for e in _entries(out) if e["key"] != key][: MAX_ENTRIES - 1]
    text = json.dumps({"format": MEMO_FORMAT, "entries": entries}, sort_keys=True) + "\n"
    replace_out_file(Path(out), memo_path(out), text.encode("utf-8"))


__all__ = ["MAX_ENTRIES", "MEMO_NAME", "memo_path", "remember", "remembered"]
