"""What a rebuild leaves in OUT, and who removes it.

- A run that ends (however it ends, short of kill -9 or a power cut) removes the version it built unless
  it promoted it, or kept it for inspection after a failed verification (`remove_unpromoted`).
- A run that never ended (killed with -9, or the machine died) cannot. Every version a rebuild builds
  names its run in the manifest (`rebuild_run`), and the run lock's record names the runs that never
  ended, so the next run removes exactly their unpromoted versions before it builds
  (`remove_unfinished_runs`). A version `zerogr build --no-promote` published has no `rebuild_run` and is
  never touched; neither is one a finished run kept for inspection.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from ..base.errors import ZerogrError, one_line
from ..bundle.format import version_dir_name
from ..bundle.lock import out_lock
from ..bundle.reader import load_manifest
from ..bundle.versions import discard_version, list_versions, read_latest
from .outcome import RebuildResult

Log = Callable[[str], None]


def remove_unfinished_runs(out: Path, run_ids: Collection[str], log: Log) -> list[str]:
    """Remove the versions whose manifest names one of `run_ids` (runs that never finished) unless LATEST
    names them. Returns the names removed; a version that cannot be read or removed is logged and kept."""
    if not run_ids:
        return []
    removed = []
    with out_lock(out):
        latest = read_latest(out)
        for number in list_versions(out):
            name = version_dir_name(number)
            if name == latest:
                continue
            try:
                if load_manifest(out / name).get("rebuild_run") not in run_ids:
                    continue
                discard_version(out, name)
            except (OSError, ZerogrError) as exc:
                log(f"could not check or remove {out / name}: {one_line(exc)}")
                continue
            removed.append(name)
    if removed:
        log(f"removed {', '.join(removed)}: built by a run that never finished ({', '.join(run_ids)})")
    return removed


def remove_unpromoted(result: RebuildResult, log: Log) -> None:
    """Remove the version this run published when it was not promoted (kept after a failed verify)."""
    vdir = result.version_dir
    if vdir is None or result.promoted or result.unchanged or result.kept or not vdir.is_dir():
        return
    try:
        with out_lock(vdir.parent):
            if read_latest(vdir.parent) != vdir.name:
                discard_version(vdir.parent, vdir.name)
    except (OSError, ZerogrError) as exc:
        result.kept = True
        log(f"could not remove the unpromoted version {vdir}: {one_line(exc)}")
        return
    log(f"removed the unpromoted version {vdir.name}")
