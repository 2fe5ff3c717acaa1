"""What a rebuild run ended with: its exit code (what a scheduler should do), the version it produced, the
stage that failed and why, and the facts its metrics report."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import ZerogrError, one_line

EXIT_OK = 0  # built, verified, tuned (and gated), promoted (and pushed)
EXIT_USAGE = 2  # bad input, usage or set-up: nothing was published; fix it, do not retry
EXIT_RETRY = 3  # build failed otherwise, or promote failed: LATEST not moved; retry later
EXIT_VERIFY = 4  # the new version failed verification: do not serve it; alert a human
EXIT_UNTUNED = 5  # promoted, but tune failed: no plan for this device
EXIT_CRASH = 1  # an unexpected error outside every stage (a bug): the version, if any, is removed
EXIT_GUARDS = 6  # the guards refused the new version (or could not compare it): not promoted, removed
EXIT_LOCKED = 7  # another rebuild holds OUT's run lock: this run did nothing
EXIT_DISK_FULL = 8  # no space for the version, even after pruning beyond --keep: free space, then rerun
EXIT_GATE_FAILED = 10  # promoted with score_first recorded: the gate failed
EXIT_GATE_BROKEN = 11  # the gate could not run: not promoted
EXIT_PUSH_FAILED = 12  # promoted locally, but the push to the remote OUT failed: retry the push

# Exit codes after which LATEST names the printed version (and --push ran).
PROMOTED_CODES = frozenset({EXIT_OK, EXIT_UNTUNED, EXIT_GATE_FAILED, EXIT_PUSH_FAILED})


def failure_message(exc: BaseException) -> str:
    """One line for a failed stage: a zerogr error's own message, anything else prefixed with its type."""
    text = one_line(exc)
    return text if isinstance(exc, ZerogrError) else f"{type(exc).__name__}: {text}"


def new_run_id() -> str:
    """A run id that sorts by start time and is unique enough to tell runs apart in logs, metrics and
    manifests: UTC start time and 6 random hex digits, e.g. 20261129T201713Z-3f2a9c."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class Failure:
    """The stage that failed (setup, build, verify, tune, gate, promote, push, or the signal's name) and
    its one-line reason."""

    stage: str
    message: str


@dataclass
class RebuildResult:
    """One run's outcome. `version_dir` is the version built (None when the build did not publish), or
    with `unchanged` the version LATEST names (the inputs had not changed: nothing built); `kept` is True
    when a failed run left that version in OUT unpromoted (a failed verify: kept for inspection), False
    when it was removed or promoted. `guards` is the GuardReport of the new version (None: not run)."""

    exit_code: int = EXIT_OK
    run_id: str = field(default_factory=new_run_id)
    version_dir: Path | None = None
    promoted: bool = False
    unchanged: bool = False
    kept: bool = False
    guards: Any = None
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
