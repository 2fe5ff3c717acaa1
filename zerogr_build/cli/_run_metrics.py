"""What a `zerogr rebuild` run reports in its --metrics-file: the file of a running run, written once the run
lock is held; at the end the stages, the bundle facts, the guards (value, threshold and whether each
fired; the reason that let fired guards through) and whether the inputs were unchanged. Plus the
preflight of the metrics path itself."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ._live_metrics import live_facts
from ._metrics import JobMetrics


def writes_start(metrics: JobMetrics) -> Callable[[Any], None]:
    """rebuild's on_start: the metrics file of a running run, once the run lock is held."""

    def on_start(result: Any) -> None:
        try:
            metrics.write_start(result.run_id)
        except OSError as exc:
            sys.stderr.write(f"WARNING: could not write the metrics file {metrics.path}: {exc}\n")

    return on_start


def report_run(metrics: JobMetrics, result: Any, out: Path) -> None:
    """What the run measured, into the metrics: stages, bundle facts, the failure, the guards (value,
    threshold and whether it fired, per guard; the reason that let fired guards through), unchanged.
    The bundle facts are those of the version LATEST names in OUT (`out`) once the run ended: the one it
    promoted, or with unchanged inputs the one already there; a run that promoted nothing (refused,
    failed, interrupted) reports LATEST's, never the version it built."""
    metrics.add_stages(result.stages)
    metrics.bundle(**(result.facts if result.promoted or result.unchanged else live_facts(out)))
    if result.failure is not None:
        metrics.fail(result.failure.stage, result.failure.message)
    metrics.job_value("unchanged", "1 when the inputs had not changed: no new version.", result.unchanged)
    if result.guards is not None:
        report_guards(metrics, result.guards)


def report_guards(metrics: JobMetrics, report: Any) -> None:
    """A GuardReport into the metrics: zerogr_<job>_guard_value / _guard_threshold / _guard_fired{guard}
    for every guard measured, and zerogr_<job>_change_accepted_info{reason} when --accept-change let
    fired guards through."""
    for check in report.checks:
        labels = {"guard": check.guard}
        metrics.job_labelled("guard_value", "What each guard measured.", labels, check.value)
        metrics.job_labelled("guard_threshold", "Each guard's threshold.", labels, check.threshold)
        metrics.job_labelled(
            "guard_fired", "1 when the guard fired (refused or accepted).", labels, check.fired
        )
    if report.accepted is not None and report.fired:
        doc = "1: --accept-change let fired guards through."
        metrics.job_labelled("change_accepted_info", doc, {"reason": report.accepted}, 1)


def check_metrics_file(path: Path | None) -> None:
    """Preflight of --metrics-file: its dir exists (or can be made) and is writable, so monitoring is not
    blind to the run. InputError (exit 2) otherwise. (Something other than a regular file at PATH is left
    as it is, with a warning, as for every command.)"""
    if path is None:
        return
    probe = path.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"--metrics-file {path}: {probe} is not a writable directory")
