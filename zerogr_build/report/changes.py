"""The changes between the report's last two versions: the item counts of `zerogr diff`, exact, in the
shape diff_section shows (its top-level keys become rows). The guards record them in the new version's
manifest (`changes`) when they compare it with the version before; the report reads that record when it
is against the version shown before, and compares the two versions itself otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base.errors import ZerogrError


def version_changes(old_dir: str | Path, new_dir: str | Path) -> dict[str, Any]:
    """{items_added, items_removed, items_sid_changed, items_common, sids_comparable, model_tag_changed}
    of `new_dir` against `old_dir` (two version dirs): the record of the guards when they compared the
    two, else counted now; {"not compared": why} when either cannot be read."""
    from ..bundle import load_manifest
    from ..bundle.diff import diff_versions

    old, new = Path(old_dir), Path(new_dir)
    try:
        recorded = load_manifest(new).get("changes")
        if isinstance(recorded, dict) and recorded.get("against") == old.name:
            return {key: value for key, value in recorded.items() if key != "against"}
        return diff_versions(old, new).counts()
    except (ZerogrError, OSError, ValueError) as exc:
        return {"not compared": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a damaged record: the page shows why, never loses itself
        return {"not compared": f"{type(exc).__name__}: {exc}"}
