"""The quality gate: is filter-first safe for this model? Thresholds on a CompareReport, the decision, and
the quality record written into the bundle (`zerogr compare --min-overlap X [--max-recall-gap Y] --record`).

    thresholds = GateThresholds(min_overlap=0.995, max_recall_gap=0.01)
    decision = decide(report, thresholds)          # passed -> order "filter_first", else "score_first"
    name = record_quality(version_dir, quality_document(report, thresholds, decision, "my-model-v3"))

The rule: the gate passes when overlap@K >= min_overlap at every K measured and, with max_recall_gap,
Recall@K(score_first) - Recall@K(filter_first) <= max_recall_gap at every K (filter-first may not lose more
recall than that; gaining recall is never a failure). A failed gate records score_first: serving stays
exact (the model's own normalisation), only slower. The record is quality/<key>.json of the version
(docs/bundle-format.md, section 11.3), added under the same atomic, checksummed protocol as plans.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..bundle.amend import add_bundle_files
from ..bundle.quality import QUALITY_FORMAT, QUALITY_FORMAT_VERSION, quality_bytes, quality_file_name
from ..bundle.reader import load_manifest
from .report import CompareReport


@dataclass(frozen=True)
class GateThresholds:
    """min_overlap: the smallest overlap@K allowed at any K, in [0, 1]. max_recall_gap: the largest
    Recall@K(score_first) - Recall@K(filter_first) allowed at any K, in [0, 1], or None (not checked)."""

    min_overlap: float
    max_recall_gap: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("--min-overlap", self.min_overlap), ("--max-recall-gap", self.max_recall_gap)):
            if value is None and name == "--max-recall-gap":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise InputError(f"{name} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True)
class GateDecision:
    """passed; order ("filter_first" when passed, else "score_first"); the worst overlap and its K; the
    largest recall gap and its K (None without max_recall_gap); reasons: one line per broken threshold."""

    passed: bool
    order: str
    worst_overlap: float
    worst_overlap_k: int
    recall_gap: float | None
    recall_gap_k: int | None
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "order": self.order,
            "worst_overlap": self.worst_overlap,
            "worst_overlap_k": self.worst_overlap_k,
            "recall_gap": self.recall_gap,
            "recall_gap_k": self.recall_gap_k,
            "reasons": list(self.reasons),
        }


def decide(report: CompareReport, thresholds: GateThresholds) -> GateDecision:
    """The gate's verdict on one comparison (rule in the module docstring). InputError when
    max_recall_gap is set and the requests carried no ground-truth targets."""
    worst_k = min(report.overlap, key=lambda k: (report.overlap[k], k))
    worst = float(report.overlap[worst_k])
    reasons = []
    if worst < thresholds.min_overlap:
        reasons.append(f"overlap@{worst_k} = {worst:.4f} < min overlap {thresholds.min_overlap}")
    gap = gap_k = None
    if thresholds.max_recall_gap is not None:
        if not report.recall:
            raise InputError("--max-recall-gap needs requests with a target_item column (ground truth)")
        ff, sf = report.recall["filter_first"], report.recall["score_first"]
        gap_k = max(ff, key=lambda k: (sf[k] - ff[k], -k))
        gap = float(sf[gap_k] - ff[gap_k])
        if gap > thresholds.max_recall_gap:
            reasons.append(
                f"Recall@{gap_k} filter-first {ff[gap_k]:.4f} vs score-first {sf[gap_k]:.4f}: "
                f"gap {gap:.4f} > max recall gap {thresholds.max_recall_gap}"
            )
    passed = not reasons
    return GateDecision(
        passed=passed,
        order="filter_first" if passed else "score_first",
        worst_overlap=worst,
        worst_overlap_k=int(worst_k),
        recall_gap=gap,
        recall_gap_k=None if gap_k is None else int(gap_k),
        reasons=tuple(reasons),
    )


def quality_document(
    report: CompareReport,
    thresholds: GateThresholds,
    decision: GateDecision,
    model_version: str,
    *,
    bundle_version: int | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The quality record (docs/bundle-format.md, section 11.3) of one gate run: the decision, the
    thresholds, the measured overlap, and the whole report (informational)."""
    full = report.to_dict()
    return {
        "format": QUALITY_FORMAT,
        "format_version": QUALITY_FORMAT_VERSION,
        "model_version": model_version,
        "order": decision.order,
        "passed": decision.passed,
        "thresholds": {"min_overlap": thresholds.min_overlap, "max_recall_gap": thresholds.max_recall_gap},
        "overlap": full["overlap"],
        "decision": decision.to_dict(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundle_version": bundle_version,
        "model": model or {},
        "report": _finite(full),
    }


def record_quality(version_dir: str | Path, document: dict[str, Any]) -> str:
    """Add the record to a published version (bundle.add_bundle_files: atomic, checksummed, under the
    OUT lock); an older record of the same model version is replaced. Returns its file name."""
    name = quality_file_name(document["model_version"])
    add_bundle_files(version_dir, {name: quality_bytes(document)})
    return name


@dataclass(frozen=True)
class GateOutcome:
    """One gate run: the decision under `thresholds`, and where it was recorded ({file, model_version},
    None when not recorded)."""

    decision: GateDecision
    thresholds: GateThresholds
    recorded: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The `gate` entry of `zerogr compare --json`."""
        return {
            **self.decision.to_dict(),
            "min_overlap": self.thresholds.min_overlap,
            "max_recall_gap": self.thresholds.max_recall_gap,
            "recorded": self.recorded,
        }


def run_gate(
    report: CompareReport,
    thresholds: GateThresholds,
    version_dir: str | Path,
    *,
    record: bool = False,
    model_tag: str | None = None,
) -> GateOutcome:
    """Decide on a compare report of the version `version_dir`; with record, write the decision into that
    version as the quality record of model_tag (default: the bundle's model version, else the report's
    model_hash) for `Decoder(order="auto")`."""
    decision = decide(report, thresholds)
    if not record:
        return GateOutcome(decision, thresholds)
    manifest = load_manifest(version_dir)
    tag = model_tag or manifest["model_version"] or report.extra.get("model_hash")
    document = quality_document(
        report, thresholds, decision, tag, bundle_version=manifest["version"],
        model={k: report.extra[k] for k in ("model", "model_hash", "sid_map") if k in report.extra},
    )  # fmt: skip
    return GateOutcome(
        decision, thresholds, {"file": record_quality(version_dir, document), "model_version": tag}
    )


def _finite(value: Any) -> Any:
    """The report with NaN / infinities as null (the record is strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


__all__ = [
    "GateDecision",
    "GateOutcome",
    "GateThresholds",
    "decide",
    "quality_document",
    "run_gate",
    "record_quality",
]
