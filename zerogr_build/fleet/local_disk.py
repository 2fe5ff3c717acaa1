"""The local side of a pull: will the version fit the host's disk, and can its names be created there.

A refusal here is exit 3 (NotEnoughSpace: free space, then retry) or exit 4 (RefusedRemoteVersion naming
the remote object whose name the local file system cannot hold), before anything is written.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .remote import RefusedRemoteVersion, RemoteError, S3Store, version_name

#: Free space left on the local disk after a pull: max(this, 5 % of the bundle).
FREE_SPACE_MARGIN = 64 << 20
#: Errors of a local write that mean the disk (or the user's quota) is full: exit 3, retry later.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: Bytes a pulled file's path may need beyond OUT and its manifest name: the temp or version dir's name.
NAME_ROOM = 64


class NotEnoughSpace(RemoteError):
    """The local OUT's disk cannot hold the version (exit 3: free space, then retry)."""


def check_space(out: Path, total: int) -> None:
    """NotEnoughSpace unless `out`'s disk has `total` bytes free plus the margin."""
    free = shutil.disk_usage(out).free
    need = total + max(FREE_SPACE_MARGIN, total // 20)
    if need > free:
        raise NotEnoughSpace(
            f"{out}: {free:,} bytes free, the version needs {total:,} (+ a {need - total:,}-byte margin)"
        )


def check_names_fit(store: S3Store, number: int, entries: dict, out: Path) -> None:
    """Every name remote version `number` lists can be created under `out`: no component longer than the
    file system's NAME_MAX bytes, no path past its PATH_MAX (with room for the temp dir's name), every
    character encodable. RefusedRemoteVersion naming the remote object otherwise."""
    try:
        name_max, path_max = os.pathconf(out, "PC_NAME_MAX"), os.pathconf(out, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    base = len(os.fsencode(out.resolve())) + 1 + NAME_ROOM
    for name in sorted(entries):
        where = store.remote.name_url(version_name(number, name))
        try:
            parts = [os.fsencode(part) for part in name.split("/")]
        except UnicodeEncodeError:
            raise RefusedRemoteVersion(f"{where}: its name cannot be a local file name") from None
        too_long = name_max > 0 and any(len(part) > name_max for part in parts)
        if too_long or (path_max > 0 and base + sum(len(p) + 1 for p in parts) >= path_max):
            raise RefusedRemoteVersion(f"{where}: its name is too long for the local file system of {out}")
