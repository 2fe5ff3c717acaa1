"""`rebuild`: build -> verify -> tune (plan reuse) -> gate -> promote -> push, one call for cron.

Every stage runs in this process through the library (no `zerogr` or `python` looked up on PATH). The
run never raises for a failed stage: it returns a RebuildResult whose exit code tells a scheduler what to
do (outcome.py). Only BaseException (Ctrl-C, a terminating signal turned into one) passes through, after
the clean-up below.

Unpromoted versions: the build publishes OUT/vNNNNNN without moving LATEST. When a later stage fails
before promote, that version is removed (under the OUT lock), except after a failed verification, where it
is kept for inspection (`kept`; `zerogr status` marks it "unpromoted"). So an OUT never collects orphans.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..base.errors import BundleError, InputError, ZerogrError, one_line
from ..base.progress import NULL_PROGRESS, Progress
from ..base.redact import redact
from ..bundle import promote_bundle
from ..bundle.lock import out_lock
from ..bundle.versions import check_out_dir, discard_version, read_latest
from ..config import BuildSettings, TuneSettings
from .gate import GateSpec, run_gate
from .outcome import (
    EXIT_CRASH,
    EXIT_GATE_BROKEN,
    EXIT_GATE_FAILED,
    EXIT_PUSH_FAILED,
    EXIT_RETRY,
    EXIT_UNTUNED,
    EXIT_USAGE,
    EXIT_VERIFY,
    RebuildResult,
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class PushSpec:
    """--push URL [--push-keep N] [--push-signing-key KEY]: publish the promoted version to a remote OUT
    (s3://bucket/prefix), signed with the private key file KEY (None: unsigned)."""

    url: str
    keep: int | None = None
    signing_key: str | None = None
    timestamp_expiry_s: float | None = None  # the fleet's signed timestamp's life (None: the default)


@dataclass(frozen=True)
class RebuildRequest:
    """One rebuild: the catalog and build settings (promote is decided here), the device and settings to
    tune with, and the optional gate and push."""

    catalog: str
    settings: BuildSettings
    tune_device: str
    tune_settings: TuneSettings
    retune: bool = False
    gate: GateSpec | None = None
    push: PushSpec | None = None


def default_tune_device() -> str:
    """cuda:0 when torch sees a GPU, else cpu."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _silent(_: str) -> None:
    return None


def _message(exc: BaseException) -> str:
    text = one_line(exc)
    return text if isinstance(exc, ZerogrError) else f"{type(exc).__name__}: {text}"


class _Stages:
    """Wall time per stage into result.stages (a stage run twice adds up)."""

    def __init__(self, result: RebuildResult) -> None:
        self.result = result

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.result.stages[name] = self.result.stages.get(name, 0.0) + time.perf_counter() - t0


def check_request(request: RebuildRequest) -> Path:
    """Every set-up check, before anything is built: OUT, codebook sizes, tune device, gate inputs, push
    URL and its client. Raises InputError (exit 2). Returns the OUT dir."""
    from ..base.device import check_device
    from ..pipeline import check_codebook_sizes_given

    out = check_out_dir(request.settings.out)
    check_codebook_sizes_given(request.settings)
    check_device(request.tune_device)
    if request.gate is not None:
        request.gate.check(request.settings.model_version)
    if request.push is not None:
        from ..fleet.remote import RemoteOut, _boto3

        RemoteOut.parse(request.push.url)
        _boto3()
        if request.push.keep is not None and request.push.keep < 1:
            raise InputError(f"--push-keep must be >= 1, got {request.push.keep}")
        if request.push.signing_key is not None:
            from ..fleet.keys import load_signing_key

            load_signing_key(request.push.signing_key)
    return out


def previous_version(out: Path) -> Path | None:
    """The version LATEST names before this run promotes: the plan tune may reuse (None: none usable)."""
    try:
        name = read_latest(out)
    except BundleError:
        return None
    return out / name if name and (out / name).is_dir() else None


def rebuild(
    request: RebuildRequest,
    *,
    progress: Progress = NULL_PROGRESS,
    log: Log = _silent,
    result: RebuildResult | None = None,
) -> RebuildResult:
    """Run every stage; see the module docstring. Progress of build, tune and gate goes to `progress`,
    one line per decision to `log`. `result` (filled and returned) lets a caller read what an interrupted
    run did."""
    result = result if result is not None else RebuildResult()
    stage = _Stages(result)
    try:
        with stage("setup"):
            out = check_request(request)
    except ZerogrError as exc:
        return result.fail(EXIT_USAGE, "setup", _message(exc))
    previous = previous_version(out)
    if not _build(request, result, stage, progress, log):
        _renew_fleet(request, result, stage, log)
        return result
    try:
        _after_build(request, result, stage, previous, progress, log)
    except Exception as exc:  # a bug past every stage's own handling: remove the unpromoted version, re-raise
        result.fail(EXIT_CRASH, "crash", _message(exc))
        _clean_up(result, log)
        raise
    except BaseException as exc:  # Ctrl-C or a signal: remove the unpromoted version, re-raise
        result.fail(EXIT_RETRY, "interrupted", _message(exc))
        _clean_up(result, log)
        raise
    _clean_up(result, log)
    _renew_fleet(request, result, stage, log)
    return result


def _build(
    request: RebuildRequest, result: RebuildResult, stage: _Stages, progress: Progress, log: Log
) -> bool:
    from ..pipeline import build_bundle

    log(f"build {redact(request.catalog)} -> {request.settings.out}")
    try:
        with stage("build"):
            summary = build_bundle(
                request.catalog, replace(request.settings, promote=False), progress=progress
            )
    except InputError as exc:
        result.fail(EXIT_USAGE, "build", _message(exc))
        log(f"build refused the input; nothing published: {_message(exc)}")
        return False
    except Exception as exc:  # noqa: BLE001 - disk full, out of memory, a crash: retry later
        result.fail(EXIT_RETRY, "build", _message(exc))
        log(f"build failed; nothing published: {_message(exc)}")
        return False
    result.version_dir = Path(summary["bundle"]).resolve()
    result.facts = {
        "items": summary["items"],
        "distinct_sids": summary["distinct_sids"],
        "index_bytes": summary["index_bytes"],
        "version": summary["version"],
    }
    log(f"built {result.version_dir} (not promoted: LATEST unchanged)")
    return True


def _after_build(
    request: RebuildRequest,
    result: RebuildResult,
    stage: _Stages,
    previous: Path | None,
    progress: Progress,
    log: Log,
) -> None:
    from ..pipeline import verify_with_catalog

    vdir = result.version_dir
    assert vdir is not None
    with stage("verify"):
        if not _verify(lambda: verify_with_catalog(vdir, request.catalog), "verify", result, log):
            return
    with stage("tune"):
        tuned = _tune(request, vdir, previous, progress, log)
    with stage("verify"):
        if not _verify(lambda: _verify_files(vdir), "verify after tune", result, log):
            return
    gate_failed = False
    if request.gate is not None:
        try:
            with stage("gate"):
                log(f"quality gate: min overlap {request.gate.min_overlap} on {request.tune_device}")
                gated = run_gate(vdir, request.gate, request.tune_device, progress=progress)
        except Exception as exc:  # noqa: BLE001 - bad gate inputs or a crash in compare: not promoted
            result.fail(EXIT_GATE_BROKEN, "gate", _message(exc))
            log(f"quality gate could not run: {_message(exc)}")
            return
        gate_failed = not gated.decision.passed
        if gate_failed:
            reasons = "; ".join(gated.decision.reasons)
            log(f"QUALITY GATE FAILED for {gated.model_tag}: {reasons}; score_first recorded (exact, slower)")
        else:
            log(f"quality gate passed for {gated.model_tag}: filter_first recorded")
        with stage("verify"):
            if not _verify(lambda: _verify_files(vdir), "verify after the gate", result, log):
                return
    try:
        with stage("promote"):
            promote_bundle(vdir)
    except Exception as exc:  # noqa: BLE001 - pruned by another build, or I/O: retry later
        result.fail(EXIT_RETRY, "promote", _message(exc))
        log(f"promote failed: {_message(exc)}; LATEST was not moved")
        return
    result.promoted = True
    log(f"promoted {vdir.name}: LATEST -> {vdir.name}")
    if gate_failed:
        result.fail(EXIT_GATE_FAILED, "gate", "the quality gate failed: score_first recorded")
        if not tuned:
            result.notes.append("tune failed as well")
    elif not tuned:
        result.fail(EXIT_UNTUNED, "tune", "tune failed: promoted without a plan for this device")
    if request.push is not None:
        _push(request.push, vdir, result, stage, progress, log)


def _verify_files(vdir: Path) -> None:
    from ..bundle import verify_bundle

    verify_bundle(vdir)


def _verify(check: Callable[[], Any], what: str, result: RebuildResult, log: Log) -> bool:
    try:
        check()
    except Exception as exc:  # noqa: BLE001 - any failure to verify: never serve it
        result.fail(EXIT_VERIFY, "verify", f"{what} failed: {_message(exc)}")
        result.kept = True
        log(
            f"VERIFY FAILED ({what}) for {result.version_dir}: do not serve it; LATEST was not moved; "
            f"kept for inspection: {_message(exc)}"
        )
        return False
    return True


def _tune(request: RebuildRequest, vdir: Path, previous: Path | None, progress: Progress, log: Log) -> bool:
    """Reuse `previous`'s plan when allowed, else measure. False (logged) when tune failed."""
    from ..tune import tune_bundle
    from ..tune.reuse import reuse_plan

    try:
        if previous is not None and not request.retune:
            reused = reuse_plan(vdir, previous, request.tune_device, request.tune_settings)
            if reused.reused:
                log(f"tune: reused the plan of {previous.name} (same device, settings and step shapes)")
                return True
            log(f"tune: not reusing the plan of {previous.name}: {reused.refusal}; measuring")
        log(f"tune {vdir.name} on {request.tune_device}")
        tune_bundle(vdir, request.tune_device, request.tune_settings, progress=progress)
    except Exception as exc:  # noqa: BLE001 - the version stays valid; decoders use heuristic modes
        log(
            f"tune failed: {_message(exc)}; the version is valid but untuned (heuristic modes); rerun: "
            f"zerogr tune {vdir} --device {request.tune_device}"
        )
        return False
    return True


def _push(
    push: PushSpec, vdir: Path, result: RebuildResult, stage: _Stages, progress: Progress, log: Log
) -> None:
    from ..fleet.push import push_version

    try:
        with stage("push"):
            result.pushed = push_version(
                vdir, push.url, promote=True, keep=push.keep, signing_key=push.signing_key,
                timestamp_expiry_s=push.timestamp_expiry_s, progress=progress,
            )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - promoted here; the fleet keeps its version until a retry
        if result.failure is not None:  # a failed push outranks 5 and 10: the fleet did not get the version
            result.notes.append(result.failure.message)
            result.failure = None
        result.fail(EXIT_PUSH_FAILED, "push", _message(exc))
        log(
            f"push to {redact(push.url)} failed: {_message(exc)}; promoted here only; "
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


def _clean_up(result: RebuildResult, log: Log) -> None:
    """Remove the version this run published when it was not promoted (kept after a failed verify)."""
    vdir = result.version_dir
    if vdir is None or result.promoted or result.kept or not vdir.is_dir():
        return
    try:
        with out_lock(vdir.parent):
            if read_latest(vdir.parent) != vdir.name:
                discard_version(vdir.parent, vdir.name)
    except (OSError, ZerogrError) as exc:
        result.kept = True
        log(f"could not remove the unpromoted version {vdir}: {_message(exc)}")
        return
    log(f"removed the unpromoted version {vdir.name}")


def _renew_fleet(request: RebuildRequest, result: RebuildResult, stage: _Stages, log: Log) -> None:
    """Renew the fleet's signed timestamp on every run with --push and --push-signing-key that did not
    push (a signed push renews it), whether or not it built a version: hosts refuse the fleet's metadata
    once it expires, so a build box that stops signing is noticed, while one that runs keeps it fresh. A
    failure is exit 12 unless the run failed already."""
    push = request.push
    if push is None or push.signing_key is None or result.pushed is not None:
        return
    from ..fleet.metadata import iso
    from ..fleet.repository import renew_metadata

    try:
        with stage("renew"):
            done = renew_metadata(push.url, push.signing_key, timestamp_expiry_s=push.timestamp_expiry_s)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome stands; the fleet goes stale
        if result.failure is not None:
            result.notes.append(f"renewing the fleet's signed metadata failed too: {_message(exc)}")
        else:
            result.fail(EXIT_PUSH_FAILED, "renew", _message(exc))
        log(f"renewing the signed metadata of {redact(push.url)} failed: {_message(exc)}")
        return
    result.fleet = {"expires": done.expires, "latest": done.latest}
    log(f"renewed the signed metadata of {redact(push.url)}: it expires {iso(done.expires)}")
