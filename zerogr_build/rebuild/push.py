"""The fleet stages of a rebuild: the promoted version to the fleet's remote OUT (fleet.push), the
`zerogr push` line that retries it when it fails, the check that LATEST ever reached the fleet (a run with
unchanged inputs pushes a version whose last push failed), and the renewal of the fleet's signed
timestamp on a run that pushed nothing."""

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
            vdir, push.url, promote=True, keep=push.keep, signing_key=push.signing_key,
            timestamp_expiry_s=push.timestamp_expiry_s, progress=progress,
        )  # fmt: skip
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
    result.facts["remote_version"] = pushed.version
    if pushed.expires is not None:
        result.fleet = {"expires": pushed.expires, "latest": pushed.fleet_latest}
    log(
        f"pushed {vdir.name} to {pushed.url} as v{pushed.version:06d}"
        + (" (LATEST moved)" if pushed.promoted else f" (remote LATEST stays {pushed.latest})")
        + (f", signed by {pushed.signed_by}" if pushed.signed_by else ", unsigned (no --push-signing-key)")
    )


def never_pushed(push: PushSpec, vdir: Path, log: Callable[[str], None]) -> bool:
    """True when the fleet's remote OUT holds no complete copy of version `vdir` (no vNNNNNN/manifest.json
    under its number): its push failed, or never ran. A copy that is there, named by LATEST or not, counts
    as pushed: a fleet rolled back from it stays rolled back. When the store cannot be asked, True: the
    push then fails with its own error and retry line."""
    from ..bundle.format import MANIFEST_NAME
    from ..fleet.remote import RemoteOut, S3Store

    try:
        return S3Store(RemoteOut.parse(push.url)).head(f"{vdir.name}/{MANIFEST_NAME}") is None
    except Exception as exc:  # noqa: BLE001 - the push that follows reports it
        log(f"could not ask {redact(push.url)} for {vdir.name}: {failure_message(exc)}")
        return True


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


def renew_stage(push: PushSpec, result: RebuildResult, log: Callable[[str], None]) -> None:
    """Renew the fleet's signed timestamp on a run with a signing key that did not push (a signed push
    renews it), whether or not it built a version: hosts refuse the fleet's metadata once it expires, so a
    build box that stops signing is noticed, while one that runs keeps it fresh. A failure is
    EXIT_PUSH_FAILED unless the run failed already."""
    from ..fleet.metadata import iso
    from ..fleet.repository import renew_metadata

    try:
        done = renew_metadata(push.url, push.signing_key, timestamp_expiry_s=push.timestamp_expiry_s)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome stands; the fleet goes stale
        if result.failure is not None:
            result.notes.append(f"renewing the fleet's signed metadata failed too: {failure_message(exc)}")
        else:
            result.fail(EXIT_PUSH_FAILED, "renew", failure_message(exc))
        log(f"renewing the signed metadata of {redact(push.url)} failed: {failure_message(exc)}")
        return
    result.fleet = {"expires": done.expires, "latest": done.latest}
    log(f"renewed the signed metadata of {redact(push.url)}: it expires {iso(done.expires)}")
