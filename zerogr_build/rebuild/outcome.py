"""What a rebuild run ended with: its exit code (what a scheduler should do), the version it produced, the
stage that failed and why, and the facts its metrics report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_OK = 0  # built, verified, tuned (and gated), promoted (and pushed)
EXIT_USAGE = 2  # bad input, usage or set-up: nothing was published; fix it, do not retry
EXIT_RETRY = 3  # build failed otherwise, or promote failed: LATEST not moved; retry later
EXIT_VERIFY = 4  # the new version failed verification: do not serve it; alert a human
EXIT_UNTUNED = 5  # promoted, but tune failed: no plan for this device
EXIT_CRASH = 1  # an unexpected error outside every stage (a bug): the version, if any, is removed
EXIT_GATE_FAILED = 10  # promoted with score_first recorded: the gate failed
EXIT_GATE_BROKEN = 11  # the gate could not run: not promoted
EXIT_PUSH_FAILED = 12  # promoted locally, but the push to the remote OUT failed: retry the push

# Exit codes after which LATEST names the printed version (and --push ran).
PROMOTED_CODES = frozenset({EXIT_OK, EXIT_UNTUNED, EXIT_GATE_FAILED, EXIT_PUSH_FAILED})


@dataclass(frozen=True)
class Failure:
    """The stage that failed (setup, build, verify, tune, gate, promote, push, or the signal's name) and
    its one-line reason."""

    stage: str
    message: str


@dataclass
class RebuildResult:
    """One run's outcome. `version_dir` is the version built (None when the build did not publish);
    `kept` is True when a failed run left that version in OUT unpromoted (a failed verify: kept for
    inspection), False when it was removed or promoted."""

    exit_code: int = EXIT_OK
    version_dir: Path | None = None
    promoted: bool = False
    kept: bool = False
    failure: Failure | None = None
    notes: list[str] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    pushed: Any = None  # the PushResult of --push
    fleet: dict[str, Any] = field(default_factory=dict)  # the fleet's signed metadata: expires, latest

    def fail(self, code: int, stage: str, message: str) -> RebuildResult:
        """Record the failure (the first one wins: a later clean-up problem never hides it)."""
        if self.failure is None:
            self.exit_code = code
            self.failure = Failure(stage, message)
        return self
