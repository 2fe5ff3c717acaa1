"""The rebuild's quality gate: `zerogr compare` on the new version with the saved model, its decision
recorded in the version (quality/<model tag>.json) before promote.

The model is either a Hugging Face model dir with its SID map (`model_dir`, `sid_map`; requests hold
input_ids) or a `module:function` of the `compare --model` contract (`model_fn`; requests hold request
ids). Every input is checked before the build (`GateSpec.check`), so a wrong path is a set-up error
(exit 2), not a version built for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..compare.inputs import DEFAULT_KS, beam_width_for, load_model_fn, parse_ks


@dataclass(frozen=True)
class GateSpec:
    """What the gate decodes and with which thresholds (`compare --min-overlap/--max-recall-gap`)."""

    requests: str
    min_overlap: float = 0.995
    model_dir: str | None = None
    sid_map: str | None = None
    model_fn: str | None = None
    max_recall_gap: float | None = None
    ks: tuple[int, ...] = tuple(DEFAULT_KS)
    beam_width: int | None = None
    batch_size: int = 64
    model_tag: str | None = None

    def check(self, model_version: str | None) -> None:
        """InputError unless the gate can run: one model, its files present, the thresholds and K valid,
        the model function importable, and a tag to file the record under."""
        from ..compare.gate import GateThresholds

        if (self.model_dir is None) == (self.model_fn is None):
            raise InputError("the quality gate takes exactly one of --gate-model DIR and --gate-model-fn")
        if (self.sid_map is None) != (self.model_dir is None):
            raise InputError("--gate-model DIR needs --gate-sid-map FILE (and --gate-model-fn takes none)")
        for option, path, kind in (
            ("--gate-model", self.model_dir, "dir"),
            ("--gate-sid-map", self.sid_map, "file"),
            ("--gate-requests", self.requests, "file"),
        ):
            if path is None:
                continue
            if not (Path(path).is_dir() if kind == "dir" else Path(path).is_file()):
                raise InputError(f"{option} {path}: no such {kind}")
        GateThresholds(self.min_overlap, self.max_recall_gap)
        beam_width_for(parse_ks(list(self.ks)), self.beam_width)
        if self.batch_size < 1:
            raise InputError(f"the gate's --batch-size must be >= 1, got {self.batch_size}")
        if self.model_fn is not None:
            load_model_fn(self.model_fn)
            if not (self.model_tag or model_version):
                raise InputError(
                    "--gate-model-fn: the record needs a model tag: pass --model-version (build) or "
                    "--model-tag in --gate-args"
                )


@dataclass(frozen=True)
class GateOutcome:
    """The decision (compare.gate.GateDecision), the record file written, and the tag it is filed under."""

    decision: Any
    record: str
    model_tag: str


def run_gate(
    version_dir: Path, spec: GateSpec, device: str, *, progress: Progress = NULL_PROGRESS
) -> GateOutcome:
    """Decode spec.requests filter-first and score-first on `version_dir` with the model, decide, and
    record the decision in the version. Raises whatever compare raises."""
    from ..bundle import load_manifest
    from ..compare import run_compare
    from ..compare.gate import GateThresholds, decide, quality_document, record_quality

    thresholds = GateThresholds(spec.min_overlap, spec.max_recall_gap)
    common = {"beam_width": spec.beam_width, "ks": list(spec.ks), "batch_size": spec.batch_size}
    if spec.model_dir is not None:
        from ..integrations.hf.compare import run_hf_compare

        report = run_hf_compare(
            version_dir, spec.model_dir, spec.sid_map, spec.requests, device=device, progress=progress,
            **common,
        )  # fmt: skip
    else:
        report = run_compare(
            version_dir, spec.model_fn, spec.requests, device=device, progress=progress, **common
        )
    decision = decide(report, thresholds)
    manifest = load_manifest(version_dir)
    tag = spec.model_tag or manifest["model_version"] or report.extra.get("model_hash")
    document = quality_document(
        report, thresholds, decision, tag, bundle_version=manifest["version"],
        model={k: report.extra[k] for k in ("model", "model_hash", "sid_map") if k in report.extra},
    )  # fmt: skip
    return GateOutcome(decision, record_quality(version_dir, document), str(tag))
