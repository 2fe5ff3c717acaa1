"""A rebuild's tune stage: the previous version's plan copied when it may be reused (tune/reuse.py), else
measured on the tune device (tune/measure.py, which imports torch: only then). A failed tune leaves the
version valid but untuned (decoders use heuristic modes); the run reports it with exit 5.

A plan that may be reused needs only the device's identity (`tune_device_probe`): the one remembered in
OUT under the same probe_key (bundle/device_memo.py), else a child process names it while verify and the
guards run, so tune does not import torch here. What the child answered, or what a measuring tune
recorded (torch first imported there, as in the child), is remembered for the next run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ..base.device_probe import DeviceInfoProbe, complete_record, probe_key
from ..base.progress import Progress
from ..bundle import device_memo
from .outcome import RebuildResult, failure_message
from .request import RebuildRequest


def tune_stage(
    request: RebuildRequest,
    vdir: Path,
    previous: Path | None,
    progress: Progress,
    log: Callable[[str], None],
    probe: DeviceInfoProbe | None = None,
) -> bool:
    """Reuse `previous`'s plan when allowed (the device's identity from `probe` when given), else measure.
    False (logged) when tune failed."""
    from ..tune.reuse import reuse_plan

    try:
        if previous is not None and not request.retune:
            info = probe.info() if probe is not None else None
            reused = reuse_plan(vdir, previous, request.tune_device, request.tune_settings, info=info)
            if reused.reused:
                log(f"tune: reused the plan of {previous.name} (same device, settings and step shapes)")
                return True
            log(f"tune: not reusing the plan of {previous.name}: {reused.refusal}; measuring")
        from ..tune.measure import tune_bundle

        log(f"tune {vdir.name} on {request.tune_device}")
        tune_bundle(vdir, request.tune_device, request.tune_settings, progress=progress)
    except Exception as exc:  # noqa: BLE001 - the version stays valid; decoders use heuristic modes
        log(
            f"tune failed: {failure_message(exc)}; the version is valid but untuned (heuristic modes); "
            f"rerun: zerogr tune {vdir} --device {request.tune_device}"
        )
        return False
    return True


@contextlib.contextmanager
def tune_device_probe(
    request: RebuildRequest,
    out: Path,
    previous: Path | None,
    result: RebuildResult,
    log: Callable[[str], None],
) -> Iterator[DeviceInfoProbe | None]:
    """The probe tune_stage takes, for the stages after the build (None when the plan is measured). When
    they end without an exception, the device's identity is remembered in OUT (module docstring)."""
    may_reuse = previous is not None and not request.retune
    key = probe_key(request.tune_device)  # None once torch is imported (a quality gate imports it early)
    known = device_memo.remembered(out, key, request.tune_device) if key and may_reuse else None
    with DeviceInfoProbe(request.tune_device, known) if may_reuse else contextlib.nullcontext() as probe:
        yield probe
    learned = probe.probed if probe is not None else _measured_device(result, request.tune_device)
    if key is not None and learned is not None:
        try:
            device_memo.remember(out, key, learned)
        except OSError as exc:  # the next run probes again; this one is done
            log(f"could not remember the tune device in {device_memo.memo_path(out)}: {exc}")


def _measured_device(result: RebuildResult, device: str) -> dict | None:
    """The device record of the one plan this run's tune measured (not reused) in its promoted version,
    when it is a complete record of `device`; else None."""
    from ..runtime.plan import load_plan

    if not result.promoted or result.version_dir is None:
        return None
    records = []
    for path in sorted((result.version_dir / "plans").glob("*.json")):
        try:
            data = load_plan(path).data
        except Exception:  # noqa: BLE001 - a plan that does not load names no identity to remember
            continue
        if data.get("reused_from") is None and complete_record(data.get("device"), device):
            records.append(dict(data["device"]))
    return records[0] if len(records) == 1 else None


__all__ = ["tune_device_probe", "tune_stage"]
