"""The changes between the report's last two versions: the item counts of `zerogr diff`, exact, in the
shape diff_section shows (its top-level keys become rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base.errors import ZerogrError

SHOWN = ("items_added", "items_removed", "items_sid_changed", "items_common", "sids_comparable",
         "model_tag_changed")  # fmt: skip


def version_changes(old_dir: str | Path, new_dir: str | Path) -> dict[str, Any]:
    """{items_added, items_removed, items_sid_changed, items_common, sids_comparable, model_tag_changed}
    of `new_dir` against `old_dir` (two version dirs); {"not compared": why} when either cannot be read."""
    from ..bundle.diff import diff_versions

    try:
        compared = diff_versions(old_dir, new_dir).to_json()
    except (ZerogrError, OSError, ValueError) as exc:
        return {"not compared": str(exc)}
    return {key: compared[key] for key in SHOWN}
