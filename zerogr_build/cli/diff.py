"""`zerogr diff OLD NEW`: what changed between two versions (bundle.diff.diff_versions), as tables or JSON."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from ._errors import cli_errors
from ._options import JsonOpt
from ._progress import progress_for
from ._render import plain, stdout_console


def diff(
    old: Annotated[
        str,
        typer.Argument(
            help="The version to compare against: a version dir, or an OUT dir (its LATEST).",
            metavar="OLD",
            show_default=False,
        ),
    ],
    new: Annotated[
        str,
        typer.Argument(
            help="The version to compare: a version dir, or an OUT dir (its LATEST).",
            metavar="NEW",
            show_default=False,
        ),
    ],
    json_out: JsonOpt = False,
) -> None:
    """Compare version NEW with version OLD, exactly: the items added, removed and whose SID changed
    (matched by item id), and each version's items, distinct SIDs, share of items in shared SIDs, rows and
    fan-out per step (children per prefix: mean, p99, max), the first token's largest share and model tag.

    Each version's item file is read once, in batches. The matching holds at most half of what a build of
    the larger version holds at its peak (26 bytes per item, at least 256 MiB); when both versions' hashed
    ids and SIDs need more, they are spilled in parts to a temporary dir in $TMPDIR (about 16 bytes per
    item and version for 4-step SIDs, plus a string id's bytes; removed at the end) and matched one part
    at a time (the guards spill next to the versions, in OUT). `zerogr diff OUT OUT/v000008` compares a
    new, unpromoted version with the one LATEST names, as the guards of `zerogr rebuild` do. --json prints
    one object whose top-level keys include items_added, items_removed and items_sid_changed.
    """
    from ..bundle.diff import diff_versions

    with cli_errors():
        with progress_for(json_out) as progress:
            result = diff_versions(old, new, progress=progress)
        if json_out:
            sys.stdout.write(json.dumps(result.to_json()) + "\n")
            return
        console = stdout_console()
        report = result.to_json()
        console.print(summary_table(report))
        console.print(steps_table(report))


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def summary_table(report: dict[str, Any]) -> Table:
    """Old, new and the change: versions, model tags, items, distinct SIDs, shared-SID and first-token
    shares, then the items added, removed and whose SID changed."""
    old, new = report["old"], report["new"]
    table = Table(title=plain(f"{old['path']} -> {new['path']}"), title_justify="left")
    for name in ("", "old", "new", "change"):
        table.add_column(name, justify="left" if not name else "right", no_wrap=True)
    table.add_row("version", str(old["version"]), str(new["version"]), "")
    table.add_row(
        "model tag", plain(old["model_version"] or "-"), plain(new["model_version"] or "-"),
        "changed" if report["model_tag_changed"] else "same",
    )  # fmt: skip
    for key, label in (("items", "items"), ("distinct_sids", "distinct SIDs")):
        change = new[key] - old[key]
        table.add_row(label, f"{old[key]:,}", f"{new[key]:,}", f"{change:+,} ({_share(change, old[key])})")
    table.add_row(
        "items in shared SIDs", _share(old["items_in_shared_sids"], old["items"]),
        _share(new["items_in_shared_sids"], new["items"]), "",
    )  # fmt: skip
    table.add_row(
        "largest first token", f"{old['first_token']}: {_share(old['first_token_items'], old['items'])}",
        f"{new['first_token']}: {_share(new['first_token_items'], new['items'])}", "",
    )  # fmt: skip
    table.add_row(
        "items added", "", f"{report['items_added']:,}", _share(report["items_added"], old["items"])
    )
    table.add_row(
        "items removed", "", f"{report['items_removed']:,}", _share(report["items_removed"], old["items"])
    )
    sid_note = "" if report["sids_comparable"] else " (SID lengths differ)"
    table.add_row(
        "items whose SID changed", "", f"{report['items_sid_changed']:,}",
        _share(report["items_sid_changed"], report["items_common"]) + sid_note,
    )  # fmt: skip
    return table


def steps_table(report: dict[str, Any]) -> Table:
    """Rows and children per prefix (mean / p99 / max) of every step, old beside new."""
    old, new = report["old"]["steps"], report["new"]["steps"]
    table = Table(title="per step: rows and children per prefix (mean / p99 / max)", title_justify="left")
    for name in ("step", "old rows", "old fan-out", "new rows", "new fan-out"):
        table.add_column(name, justify="right", no_wrap=True)
    for t in range(max(len(old), len(new))):
        cells = []
        for steps in (old, new):
            if t < len(steps):
                s = steps[t]
                cells += [f"{s['rows']:,}", f"{s['fanout_mean']:.2f} / {s['fanout_p99']} / {s['fanout_max']}"]
            else:
                cells += ["-", "-"]
        table.add_row(str(t), *cells)
    return table
