"""Guards: a new version compared with the one LATEST names, before it is promoted (`zerogr rebuild`, and
`zerogr build --guards` / `zerogr promote --guards`), so a truncated catalog export or collapsed SIDs never
reach the serving hosts.

Each guard measures one number of the diff (bundle/diff.py) and fires when it crosses its threshold
(`GuardThresholds`, the config's [guards] table):

    items_ratio           new items / LATEST's items                   fires below min_items_ratio
    items_removed         LATEST's items missing from the new version,
                          as a share of LATEST's items                 fires above max_items_removed
    shared_sid_items      share of the new version's items whose SID
                          names another item too                       fires above max_shared_sid_items
    distinct_sids_ratio   new distinct SIDs / LATEST's                 fires below min_distinct_sids_ratio
    sid_changed_same_tag  share of the items in both whose SID changed
                          while the model tag did not                  fires above max_sid_changed_same_tag
                          (never when the tag changed: a new model redraws SIDs)

What every guard measured is recorded in the version's manifest (`guards`, docs/bundle-format.md section
5). `--accept-change REASON` lets fired guards through; the reason, the guards and the version compared
with are recorded there too (`accept_change`). The first version of an OUT (no LATEST) has nothing to be
compared with and passes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.errors import InputError, ZerogrError
from ..base.printable import printable
from ..base.progress import NULL_PROGRESS, Progress
from .versions import read_latest

if TYPE_CHECKING:
    from .diff import VersionDiff


class GuardsRefused(ZerogrError):
    """The guards refused a version (exit 6): nothing was promoted."""

    exit_code = 6


#: The longest --accept-change reason kept (one line in the manifest, a metrics label).
MAX_REASON_CHARS = 200


@dataclass(frozen=True)
class GuardThresholds:
    """Where each guard fires (the config's [guards] table). The defaults let a model update (every SID
    redrawn under a new tag) and normal churn (a few % of items removed and added) through, and stop a
    catalog cut to 60% or less, and a version where over 20% of the items share SIDs. A min of 0 or a max
    of 1 turns a guard off."""

    min_items_ratio: float = 0.8
    """New items / LATEST's items: below this the export was probably cut short."""
    max_items_removed: float = 0.2
    """Share of LATEST's items missing from the new version."""
    max_shared_sid_items: float = 0.2
    """Share of the new version's items whose SID names another item too (collapsed SIDs)."""
    min_distinct_sids_ratio: float = 0.8
    """New distinct SIDs / LATEST's."""
    max_sid_changed_same_tag: float = 0.05
    """Share of the items in both whose SID changed while the model tag stayed the same."""

    def check(self, where: str = "[guards]") -> GuardThresholds:
        """InputError naming `where` unless every ratio is >= 0 and every share in 0..1. Returns self."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            share = f.name.startswith("max_")
            if not (0.0 <= value <= 1.0 if share else value >= 0.0):
                wanted = "in 0..1" if share else ">= 0"
                raise InputError(f"{where}: {f.name} must be {wanted}, got {value}")
        return self


@dataclass(frozen=True)
class GuardCheck:
    """One guard measured: its value, threshold, which side of it is bad (`bound` "min": below fires;
    "max": above fires), whether it fired, and why it did not apply (`note`)."""

    guard: str
    value: float
    threshold: float
    bound: str
    fired: bool
    note: str = ""

    def line(self) -> str:
        """`guard items_ratio 0.4000 (min 0.8000): FIRED`, one line for a log."""
        verdict = "FIRED" if self.fired else ("not applied: " + self.note if self.note else "ok")
        return f"guard {self.guard} {self.value:.4f} ({self.bound} {self.threshold:.4f}): {verdict}"


def evaluate_guards(diff: VersionDiff, thresholds: GuardThresholds) -> list[GuardCheck]:
    """Every guard of `diff` (old = LATEST, new = the version to promote) against `thresholds`."""
    old, new = diff.old, diff.new
    common = diff.items_common

    def check(guard: str, value: float, threshold: float, bound: str, note: str = "") -> GuardCheck:
        crossed = value < threshold if bound == "min" else value > threshold
        return GuardCheck(guard, float(value), float(threshold), bound, crossed and not note, note)

    tag_note = ""
    if diff.model_tag_changed:
        tag_note = f"model tag changed ({old.model_version} -> {new.model_version})"
    return [
        check("items_ratio", new.items / old.items, thresholds.min_items_ratio, "min"),
        check("items_removed", diff.items_removed / old.items, thresholds.max_items_removed, "max"),
        check("shared_sid_items", new.shared_sid_items_ratio, thresholds.max_shared_sid_items, "max"),
        check(
            "distinct_sids_ratio",
            new.distinct_sids / old.distinct_sids,
            thresholds.min_distinct_sids_ratio,
            "min",
        ),  # fmt: skip
        check(
            "sid_changed_same_tag",
            diff.items_sid_changed / common if common else 0.0,
            thresholds.max_sid_changed_same_tag,
            "max",
            tag_note,
        ),  # fmt: skip
    ]


@dataclass
class GuardReport:
    """The guards of one version: the version compared with (`against`, None when there was no LATEST),
    every check, and the --accept-change reason that let fired guards through (None: none given, or none
    needed)."""

    version: str
    against: str | None
    checks: list[GuardCheck] = field(default_factory=list)
    accepted: str | None = None
    diff: VersionDiff | None = None

    @property
    def fired(self) -> list[GuardCheck]:
        return [c for c in self.checks if c.fired]

    @property
    def refused(self) -> bool:
        """True when a guard fired and no --accept-change let it through."""
        return bool(self.fired) and self.accepted is None

    def fired_text(self) -> str:
        """The fired guards with value and threshold: `items_ratio 0.4000 (min 0.8000); ...`."""
        return "; ".join(f"{c.guard} {c.value:.4f} ({c.bound} {c.threshold:.4f})" for c in self.fired)

    def lines(self) -> list[str]:
        """What the guards measured, for a log: one line per guard, then the verdict."""
        if self.against is None:
            return [f"guards: {self.version} is the first version here (no LATEST): nothing to compare with"]
        lines = [f"guards: {self.version} against LATEST {self.against}"]
        lines += [check.line() for check in self.checks]
        names = ", ".join(c.guard for c in self.fired)
        if self.refused:
            lines.append(
                f"guards REFUSED {self.version}: {names} (--accept-change REASON lets an intended change "
                "through)"
            )
        elif self.fired:
            lines.append(f"guards fired ({names}), accepted: {self.accepted}")
        else:
            lines.append("guards passed")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "against": self.against,
            "refused": self.refused,
            "accepted": self.accepted,
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "diff": self.diff.to_json() if self.diff is not None else None,
        }


def check_reason(reason: str | None) -> str | None:
    """The --accept-change reason as recorded: stripped, one line, printable; InputError when empty or
    longer than MAX_REASON_CHARS."""
    if reason is None:
        return None
    text = " ".join(str(reason).split())
    if not text:
        raise InputError("--accept-change needs a reason (what changed on purpose), e.g. 'new catalog scope'")
    if len(text) > MAX_REASON_CHARS or printable(text) != text:
        raise InputError(
            f"--accept-change: the reason must be printable text of at most {MAX_REASON_CHARS} characters"
        )
    return text


def guard_version(
    version_dir: str | Path,
    thresholds: GuardThresholds,
    *,
    accept_change: str | None = None,
    progress: Progress = NULL_PROGRESS,
) -> GuardReport:
    """Run the guards of the published version `version_dir` against the version its OUT's LATEST names.

    What each guard measured is written into the version's manifest (`guards`) before this returns, and
    when a guard fired and `accept_change` is given, the acceptance too (`accept_change`: reason, guards,
    against, at). A version that LATEST already names, or an OUT without LATEST, passes with nothing
    compared or recorded (`against` None for the latter)."""
    from .amend import set_manifest_fields
    from .diff import diff_versions

    vdir = Path(version_dir)
    reason = check_reason(accept_change)
    latest = read_latest(vdir.parent)
    if latest is None:
        return GuardReport(vdir.name, None)
    if latest == vdir.name:
        return GuardReport(vdir.name, latest)
    # Items past the matching's memory spill next to the versions (the disk that holds them), not to /tmp.
    diff = diff_versions(vdir.parent / latest, vdir, spill_dir=vdir.parent, progress=progress)
    report = GuardReport(vdir.name, latest, evaluate_guards(diff, thresholds), diff=diff)
    record: dict[str, Any] = {
        "guards": [dataclasses.asdict(c) for c in report.checks],
        "changes": {"against": latest, **diff.counts()},
    }
    if report.fired and reason is not None:
        report.accepted = reason
        record["accept_change"] = {
            "reason": reason,
            "guards": [c.guard for c in report.fired],
            "against": latest,
            "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    set_manifest_fields(vdir, record)
    return report


def enforce_guards(
    version_dir: str | Path,
    thresholds: GuardThresholds,
    *,
    accept_change: str | None = None,
    discard_refused: bool = False,
    on_report: Any = None,
    progress: Progress = NULL_PROGRESS,
) -> GuardReport:
    """guard_version for `zerogr build --guards` and `zerogr promote --guards`, before they promote.
    `on_report(report)` sees the report first (to log and measure it). When the guards refuse the
    version: GuardsRefused (exit 6) naming each fired guard, and with `discard_refused` the version removed
    (a build's own version; never one LATEST names)."""
    from .lock import out_lock
    from .versions import discard_version

    vdir = Path(version_dir)
    report = guard_version(vdir, thresholds, accept_change=accept_change, progress=progress)
    if on_report is not None:
        on_report(report)
    if report.refused:
        fate = "not promoted"
        if discard_refused:
            with out_lock(vdir.parent):
                if read_latest(vdir.parent) != vdir.name and vdir.is_dir():
                    discard_version(vdir.parent, vdir.name)
                    fate = "removed"
        raise GuardsRefused(
            f"the guards refused {report.version} against LATEST {report.against}: {report.fired_text()}; "
            f"{fate}, LATEST not moved (--accept-change REASON lets an intended change through)"
        )
    return report
