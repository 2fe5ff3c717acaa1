"""The push stage of a rebuild: the promoted version to the fleet's remote OUT (fleet.push), and the
`zerogr push` line that retries it when it fails."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from ..base.progress import Progress
from ..base.redact import redact
from .outcome import EXIT_PUSH_FAILED, RebuildResult, failure_message
from .request import PushSpec


def push_stage(
    push: PushSpec, vdir: Path, result: RebuildResult, progress: Progress, log: Callable[[str], None]
) -> None:
    """Push the promoted version `vdir` (signed with the run's key) and move the remote LATEST; a failure
    is EXIT_PUSH_FAILED, which outranks 5 and 10 (the fleet did not get the version), logged with the
    command line that retries it."""
    from ..fleet.push import push_version

    try:
        result.pushed = push_version(
            vdir, push.url, promote=True, keep=push.keep, signing_key=push.signing_key, progress=progress
        )
    except Exception as exc:  # noqa: BLE001 - promoted here; the fleet keeps its version until a retry
        if result.failure is not None:  # a failed push outranks 5 and 10: the fleet did not get the version
            result.notes.append(result.failure.message)
            result.failure = None
        result.fail(EXIT_PUSH_FAILED, "push", failure_message(exc))
        log(
            f"push to {redact(push.url)} failed: {failure_message(exc)}; promoted here only; "
            f"retry: {retry_push(push, vdir)}"
        )
        return
    pushed = result.pushed
    log(
        f"pushed {vdir.name} to {pushed.url} as v{pushed.version:06d}"
        + (" (LATEST moved)" if pushed.promoted else f" (remote LATEST stays {pushed.latest})")
        + (f", signed by {pushed.signed_by}" if pushed.signed_by else ", unsigned (no --push-signing-key)")
    )


def retry_push(push: PushSpec, vdir: Path) -> str:
    """The `zerogr push` command line that retries a failed push of `vdir` as this run would have pushed
    it: the same remote OUT, --keep and signing key (an unsigned retry would not be promoted over a
    signed remote LATEST, and would freeze the hosts that trust keys if it were)."""
    words = ["zerogr", "push", str(vdir), redact(push.url)]
    if push.keep is not None:
        words += ["--keep", str(push.keep)]
    if push.signing_key is not None:
        words += ["--signing-key", str(push.signing_key)]
    return shlex.join(words)
