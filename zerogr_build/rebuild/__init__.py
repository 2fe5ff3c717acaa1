"""The build box's whole job in one call: build -> verify -> guards -> tune (reusing the previous plan) ->
quality gate -> promote -> push, for cron (`zerogr rebuild`).

Modules: `run` (the stages in order), `request` (what a run is asked to do, and its set-up checks),
`preflight` (push target, room on disk, a full disk named), `inputs` (unchanged since LATEST: no new
version), `leftovers` (unpromoted versions, and those of runs that never finished), `tune_stage` (plan
reuse, else a measured tune), `gate` (the quality gate's inputs and run), `outcome` (exit codes and the
result).
"""

from __future__ import annotations

from .gate import GateSpec
from .outcome import (
    EXIT_CRASH,
    EXIT_DISK_FULL,
    EXIT_GATE_BROKEN,
    EXIT_GATE_FAILED,
    EXIT_GUARDS,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_PUSH_FAILED,
    EXIT_RETRY,
    EXIT_UNTUNED,
    EXIT_USAGE,
    EXIT_VERIFY,
    PROMOTED_CODES,
    Failure,
    RebuildResult,
    new_run_id,
)
from .request import PushSpec, RebuildRequest, check_request, default_tune_device, previous_version
from .run import rebuild

__all__ = [
    "EXIT_CRASH",
    "EXIT_DISK_FULL",
    "EXIT_GATE_BROKEN",
    "EXIT_GATE_FAILED",
    "EXIT_GUARDS",
    "EXIT_LOCKED",
    "EXIT_OK",
    "EXIT_PUSH_FAILED",
    "EXIT_RETRY",
    "EXIT_UNTUNED",
    "EXIT_USAGE",
    "EXIT_VERIFY",
    "PROMOTED_CODES",
    "Failure",
    "GateSpec",
    "PushSpec",
    "RebuildRequest",
    "RebuildResult",
    "check_request",
    "default_tune_device",
    "new_run_id",
    "previous_version",
    "rebuild",
]
