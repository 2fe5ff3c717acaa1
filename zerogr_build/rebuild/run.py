"""`rebuild`: build -> verify -> guards -> tune (plan reuse) -> gate -> promote -> push, one call for cron.

Every stage runs in this process through the library (no `zerogr` or `python` looked up on PATH). The
run never raises for a failed stage: it returns a RebuildResult whose exit code tells a scheduler what to
do (outcome.py). Only BaseException (Ctrl-C, a terminating signal turned into one) passes through, after
the clean-up below.

Order: the set-up checks (request.py) -> the run lock on OUT (bundle/lock.py; held to the end; another
holder: exit 7) -> the run's line in OUT's run history (history.py; rewritten with its outcome as it
ends) -> the versions of runs that never finished are removed (leftovers.py) -> preflight
(preflight.py: the push target answers, room for the version) -> the inputs against LATEST's
(inputs.py: unchanged, no version is built) -> build -> verify -> guards against LATEST (bundle/guards.py;
refused: exit 6) -> tune -> gate -> promote -> the fleet step (push).

Unpromoted versions: the build publishes OUT/vNNNNNN without moving LATEST. When a later stage fails
before promote, that version is removed (under the OUT lock), except after a failed verification, where it
is kept for inspection (`kept`; `zerogr status` marks it "unpromoted"). So an OUT never collects orphans.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.errors import InputError, ZerogrError
from ..base.progress import NULL_PROGRESS, Progress
from ..base.redact import redact
from ..base.units import human_bytes
from ..bundle import load_manifest, promote_bundle
from ..bundle.lock import RunLock, RunLockHeld, acquire_run_lock
from . import history
from .gate import run_gate
from .inputs import recorded_inputs, request_inputs
from .leftovers import remove_unfinished_runs, remove_unpromoted
from .outcome import (
    EXIT_CRASH,
    EXIT_DISK_FULL,
    EXIT_GATE_BROKEN,
    EXIT_GATE_FAILED,
    EXIT_GUARDS,
    EXIT_LOCKED,
    EXIT_RETRY,
    EXIT_UNTUNED,
    EXIT_USAGE,
    EXIT_VERIFY,
    RebuildResult,
    failure_message,
)
from .preflight import DiskFull, check_push_target, disk_full_message, is_disk_full, make_room
from .push import never_pushed, push_stage, renew_stage
from .request import RebuildRequest, check_request, previous_version
from .tune_stage import tune_device_probe, tune_stage

if TYPE_CHECKING:
    from ..base.device_probe import DeviceInfoProbe
    from ..bundle.files import HashCache
    from ..bundle.witness import KeepWitness

Log = Callable[[str], None]


def _silent(_: str) -> None:
    return None


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


def _fail_io(result: RebuildResult, stage: str, exc: Exception, out: Path, otherwise: int) -> str:
    """Record a stage's failure: a full disk is EXIT_DISK_FULL naming the path, anything else `otherwise`.
    Returns the message."""
    if is_disk_full(exc):
        message = disk_full_message(exc, out)
        result.fail(EXIT_DISK_FULL, stage, message)
        return message
    result.fail(otherwise, stage, failure_message(exc))
    return failure_message(exc)


def rebuild(
    request: RebuildRequest,
    *,
    progress: Progress = NULL_PROGRESS,
    log: Log = _silent,
    result: RebuildResult | None = None,
    on_start: Callable[[RebuildResult], None] | None = None,
) -> RebuildResult:
    """Run every stage; see the module docstring. Progress of build, tune and gate goes to `progress`,
    one line per decision to `log`. `result` (filled and returned; its run_id names the run) lets a caller
    read what an interrupted run did. `on_start(result)` is called once the run lock is held, before
    anything else is done (the CLI writes the metrics file of a running run there); not at all when
    another run holds the lock (exit 7) or a set-up check failed (exit 2)."""
    result = result if result is not None else RebuildResult()
    stage = _Stages(result)
    try:
        with stage("setup"):
            out = check_request(request)
            out.mkdir(parents=True, exist_ok=True)
            lock = acquire_run_lock(out, result.run_id)
    except RunLockHeld as exc:
        return result.fail(EXIT_LOCKED, "lock", str(exc))
    except (ZerogrError, OSError) as exc:
        if isinstance(exc, OSError) and is_disk_full(exc):
            return result.fail(EXIT_DISK_FULL, "setup", disk_full_message(exc, Path(request.settings.out)))
        return result.fail(EXIT_USAGE, "setup", failure_message(exc))
    push_url = request.push.url if request.push is not None else None
    try:
        history.record_start(out, result, lock.record.pid, lock.record.host, log)
        if on_start is not None:
            on_start(result)
        _locked(request, out, lock, result, stage, progress, log)
    except BaseException as exc:
        history.record_end(out, result, push_url, log, ended_by=exc)
        raise
    else:
        history.record_end(out, result, push_url, log)
    finally:
        lock.release()
    return result


def _locked(
    request: RebuildRequest,
    out: Path,
    lock: RunLock,
    result: RebuildResult,
    stage: _Stages,
    progress: Progress,
    log: Log,
) -> None:
    """The run, holding the run lock."""
    log(f"run {result.run_id}: pid {lock.record.pid} on {lock.record.host}, holding {lock.path}")
    if lock.unfinished is not None:
        log(f"the run before never finished ({lock.unfinished.describe()}): taking over")
    try:
        with stage("setup"):
            remove_unfinished_runs(out, lock.pending, log)
            lock.cleaned()
            if request.push is not None:
                check_push_target(request.push)
            make_room(out, previous_version(out), request.settings.keep, log)
    except DiskFull as exc:
        result.fail(EXIT_DISK_FULL, "setup", str(exc))
        return
    except ZerogrError as exc:
        result.fail(EXIT_RETRY if exc.exit_code == EXIT_RETRY else EXIT_USAGE, "setup", failure_message(exc))
        return
    previous = previous_version(out)
    unchanged = (
        previous is not None and not request.force and _unchanged(request, previous, result, stage, log)
    )
    if not unchanged and result.failure is None:
        _new_version(request, out, previous, result, stage, progress, log)
    _fleet(request, result, stage, progress, log)


def _new_version(
    request: RebuildRequest,
    out: Path,
    previous: Path | None,
    result: RebuildResult,
    stage: _Stages,
    progress: Progress,
    log: Log,
) -> None:
    """Build, verify, guard, tune, gate and promote a new version; remove it unless it was promoted (or
    kept for inspection)."""
    from ..bundle.witness import KeepWitness

    kept = KeepWitness(spill_dir=out)  # the catalog as the build read it, for verify (bundle/witness.py)
    if not _build(request, out, result, stage, progress, log, kept):
        return
    try:
        with tune_device_probe(request, out, previous, result, log) as probe:
            _after_build(request, result, stage, previous, progress, log, kept, probe)
    except Exception as exc:  # a bug past every stage's own handling: remove the unpromoted version, re-raise
        result.fail(EXIT_CRASH, "crash", failure_message(exc))
        remove_unpromoted(result, log)
        raise
    except BaseException as exc:  # Ctrl-C or a signal: remove the unpromoted version, re-raise
        result.fail(EXIT_RETRY, "interrupted", failure_message(exc))
        remove_unpromoted(result, log)
        raise
    remove_unpromoted(result, log)


def _unchanged(
    request: RebuildRequest, previous: Path, result: RebuildResult, stage: _Stages, log: Log
) -> bool:
    """True when the inputs are those of `previous` (LATEST's version): the result then names it. A
    catalog that cannot be read fails the run (exit 2 bad input, 8 disk full, 3 otherwise)."""
    try:
        with stage("inputs"):
            t0 = time.perf_counter()
            wanted = request_inputs(request.catalog, request.settings)
            manifest = load_manifest(previous)
            changes = wanted.changes(recorded_inputs(manifest))
    except InputError as exc:
        result.fail(EXIT_USAGE, "inputs", failure_message(exc))
        return False
    except Exception as exc:  # noqa: BLE001 - the catalog's store failed: retry later
        _fail_io(result, "inputs", exc, previous.parent, EXIT_RETRY)
        return False
    seconds = time.perf_counter() - t0
    if changes:
        log(f"inputs changed since LATEST {previous.name}: {', '.join(changes)} (catalog {wanted.catalog})")
        return False
    result.unchanged = True
    result.version_dir = previous.resolve()
    result.facts = _manifest_facts(manifest)
    log(
        f"inputs unchanged since LATEST {previous.name} (catalog {wanted.catalog}, read in {seconds:.1f} s; "
        "model tag, codebook sizes and build settings the same): no new version; --force builds one anyway"
    )
    return True


def _manifest_facts(manifest: dict[str, Any]) -> dict[str, float]:
    leaves = manifest["leaves"]
    return {
        "items": leaves["items"],
        "distinct_sids": leaves["count"],
        "index_bytes": manifest.get("index_bytes"),
        "version": manifest["version"],
    }


def _build(
    request: RebuildRequest,
    out: Path,
    result: RebuildResult,
    stage: _Stages,
    progress: Progress,
    log: Log,
    kept: KeepWitness,
) -> bool:
    from ..pipeline import build_bundle

    log(f"build {redact(request.catalog)} -> {request.settings.out}")
    try:
        with stage("build"):
            summary = build_bundle(
                request.catalog,
                replace(request.settings, promote=False),
                progress=progress,
                manifest_extra={"rebuild_run": result.run_id},
                keep_witness=kept,
            )
    except InputError as exc:
        result.fail(EXIT_USAGE, "build", failure_message(exc))
        log(f"build refused the input; nothing published: {failure_message(exc)}")
        return False
    except Exception as exc:  # noqa: BLE001 - out of memory, a crash, a store that failed: retry later
        log(f"build failed; nothing published: {_fail_io(result, 'build', exc, out, EXIT_RETRY)}")
        return False
    result.version_dir = Path(summary["bundle"]).resolve()
    items = summary["items"]
    result.facts = {
        "items": items,
        "distinct_sids": summary["distinct_sids"],
        "index_bytes": summary["index_bytes"],
        "version": summary["version"],
        "shared_sid_items_ratio": summary["items_in_shared_sids"] / items,
    }
    log(
        f"built {result.version_dir} (not promoted: LATEST unchanged): {items:,} items, "
        f"{summary['distinct_sids']:,} distinct SIDs, index {human_bytes(summary['index_bytes'])}"
    )
    shared, share = summary["items_in_shared_sids"], 100 * summary["items_in_shared_sids"] / items
    log(
        f"{shared:,} items share {summary['shared_sids']:,} SIDs with other items ({share:.2f}% of the "
        f"items; {summary['collisions']:,} beyond one per SID)"
    )
    return True


def _after_build(
    request: RebuildRequest,
    result: RebuildResult,
    stage: _Stages,
    previous: Path | None,
    progress: Progress,
    log: Log,
    kept: KeepWitness,
    probe: DeviceInfoProbe | None,
) -> None:
    from ..bundle.files import HashCache
    from ..pipeline import verify_with_catalog

    vdir = result.version_dir
    assert vdir is not None
    hashes = HashCache()  # each file hashed once in this run unless it changed (tune and gate add files)
    with stage("verify"):
        # Against the catalog as the build read it (its witness; the ray engine has none: read again).
        witness, kept.witness = kept.witness, None
        check = partial(verify_with_catalog, vdir, request.catalog, hash_cache=hashes, witness=witness)
        passed = _verify(check, "verify", result, log)
        del witness, check  # the catalog's copy goes before the guards
        if not passed:
            return
    if request.guards is not None and not _guards(request, vdir, result, stage, progress, log):
        return
    with stage("tune"):
        tuned = tune_stage(request, vdir, previous, progress, log, probe)
    with stage("verify"):
        if not _verify(lambda: _verify_files(vdir, hashes), "verify after tune", result, log):
            return
    gate_failed = False
    if request.gate is not None:
        try:
            with stage("gate"):
                log(f"quality gate: min overlap {request.gate.min_overlap} on {request.tune_device}")
                gated = run_gate(vdir, request.gate, request.tune_device, progress=progress)
        except Exception as exc:  # noqa: BLE001 - bad gate inputs or a crash in compare: not promoted
            result.fail(EXIT_GATE_BROKEN, "gate", failure_message(exc))
            log(f"quality gate could not run: {failure_message(exc)}")
            return
        gate_failed = not gated.decision.passed
        if gate_failed:
            reasons = "; ".join(gated.decision.reasons)
            log(f"QUALITY GATE FAILED for {gated.model_tag}: {reasons}; score_first recorded (exact, slower)")
        else:
            log(f"quality gate passed for {gated.model_tag}: filter_first recorded")
        with stage("verify"):
            if not _verify(lambda: _verify_files(vdir, hashes), "verify after the gate", result, log):
                return
    try:
        with stage("promote"):
            promote_bundle(vdir)
    except Exception as exc:  # noqa: BLE001 - pruned by another build, or I/O: retry later
        message = _fail_io(result, "promote", exc, vdir.parent, EXIT_RETRY)
        log(f"promote failed: {message}; LATEST was not moved")
        return
    result.promoted = True
    log(f"promoted {vdir.name}: LATEST -> {vdir.name}")
    if gate_failed:
        result.fail(EXIT_GATE_FAILED, "gate", "the quality gate failed: score_first recorded")
        if not tuned:
            result.notes.append("tune failed as well")
    elif not tuned:
        result.fail(EXIT_UNTUNED, "tune", "tune failed: promoted without a plan for this device")


def _guards(
    request: RebuildRequest, vdir: Path, result: RebuildResult, stage: _Stages, progress: Progress, log: Log
) -> bool:
    """The guards of `vdir` against LATEST; False (exit 6 recorded, the version to be removed) when they
    refused it or could not compare it."""
    from ..bundle.guards import guard_version

    assert request.guards is not None
    try:
        with stage("guards"):
            report = guard_version(
                vdir, request.guards, accept_change=request.accept_change, progress=progress
            )
    except Exception as exc:  # noqa: BLE001 - LATEST unreadable or damaged: never promote past it blind
        message = _fail_io(result, "guards", exc, vdir.parent, EXIT_GUARDS)
        log(f"the guards could not compare {vdir.name} with LATEST: {message}")
        return False
    result.guards = report
    for line in report.lines():
        log(line)
    if report.refused:
        result.fail(EXIT_GUARDS, "guards", f"the guards refused {vdir.name}: {report.fired_text()}")
        return False
    if request.accept_change is not None and not report.fired:
        log("--accept-change: no guard fired, so nothing was accepted or recorded")
    return True


def _verify_files(vdir: Path, hashes: HashCache) -> None:
    from ..bundle import verify_bundle

    verify_bundle(vdir, hash_cache=hashes)


def _verify(check: Callable[[], Any], what: str, result: RebuildResult, log: Log) -> bool:
    try:
        check()
    except Exception as exc:  # noqa: BLE001 - any failure to verify: never serve it
        result.fail(EXIT_VERIFY, "verify", f"{what} failed: {failure_message(exc)}")
        result.kept = True
        log(
            f"VERIFY FAILED ({what}) for {result.version_dir}: do not serve it; LATEST was not moved; "
            f"kept for inspection: {failure_message(exc)}"
        )
        return False
    return True


def _fleet(
    request: RebuildRequest, result: RebuildResult, stage: _Stages, progress: Progress, log: Log
) -> None:
    """The fleet's part of the run, reached by every run that got past preflight: one that promoted a new
    version, one that made none (its inputs had not changed) and one whose version failed. Anything the
    fleet needs on every run goes here; --push publishes a version this run promoted, or LATEST when the
    inputs had not changed and its own push never completed (it failed, and nothing changed since); a run
    with a signing key that had nothing to push renews the fleet's signed timestamp."""
    push, vdir = request.push, result.version_dir
    if push is None:
        return
    catch_up = result.unchanged and vdir is not None and never_pushed(push, vdir, log)
    if catch_up:
        log(f"LATEST {vdir.name} is not on {redact(push.url)} (its push failed): pushing it")
    if result.promoted or catch_up:
        assert vdir is not None
        with stage("push"):
            push_stage(push, vdir, result, progress, log)
    elif push.signing_key is not None:
        with stage("renew"):
            renew_stage(push, result, log)
