"""The build box's whole job in one call: build -> verify -> tune (reusing the previous plan) -> quality
gate -> promote -> push, for cron (`zerogr rebuild`).

Modules: `run` (the stages, set-up checks, clean-up of unpromoted versions), `gate` (the quality gate's
inputs and run), `outcome` (exit codes and the result).
"""

from __future__ import annotations

from .gate import GateSpec
from .outcome import (
    EXIT_CRASH,
    EXIT_GATE_BROKEN,
    EXIT_GATE_FAILED,
    EXIT_OK,
    EXIT_PUSH_FAILED,
    EXIT_RETRY,
    EXIT_UNTUNED,
    EXIT_USAGE,
    EXIT_VERIFY,
    PROMOTED_CODES,
    Failure,
    RebuildResult,
)
from .run import PushSpec, RebuildRequest, check_request, default_tune_device, previous_version, rebuild

__all__ = [
    "EXIT_CRASH",
    "EXIT_GATE_BROKEN",
    "EXIT_GATE_FAILED",
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
    "previous_version",
    "rebuild",
]
