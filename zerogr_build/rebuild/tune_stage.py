"""A rebuild's tune stage: the previous version's plan copied when it may be reused (tune/reuse.py), else
measured on the tune device (tune/measure.py, which imports torch: only then). A failed tune leaves the
version valid but untuned (decoders use heuristic modes); the run reports it with exit 5."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..base.device_probe import DeviceInfoProbe
from ..base.progress import Progress
from .outcome import failure_message
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


__all__ = ["tune_stage"]
