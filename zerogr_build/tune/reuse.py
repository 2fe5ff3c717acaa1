"""Plan reuse: copy the previous version's tuned plan into a new version instead of measuring again, when
nothing that decides the measurement has changed (`zerogr tune --reuse-from PREV`, `zerogr rebuild`).

A plan is reused only when all of these hold (`reuse_refusal` checks them in this order; docs/operations.md):

1. PREV is another version than the one being tuned, and has a valid plan for this device's key.
2. The same software: the plan records this zerogr version (plans written before zerogr recorded it are
   never reused).
3. The same device: type, name, compute capability, architecture, CPU thread count, driver, CUDA runtime,
   torch and CuPy versions, exactly as `device_info` reports them now.
4. The same measurement settings: batch sizes, beam width, dtypes, hidden dim (of --weights when given) and
   order. Warmup, iters and seed only change how precisely it is measured, not what.
5. The same number of steps and codebook sizes.
6. Every step has the same format, and its rows, children (nnz) and largest row (max_slots) are each within
   `tolerance` (default 10%) of PREV's: |new - old| <= tolerance * old.

A reused plan is written with `add_bundle_files`, the same journaled, checksummed amend as a measured one,
together with the kernel files it names (copied from PREV after checking their sha256 against PREV's
manifest), so `zerogr verify` passes on the result. The copy records where it came from under `reused_from`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.device import device_info, device_key
from ..base.errors import BundleError, InputError, ZerogrError, one_line
from ..base.version import __version__
from ..bundle import add_bundle_files, load_manifest, open_bundle, resolve_bundle
from ..config import TuneSettings
from ..runtime.plan import load_plan

REUSE_TOLERANCE = 0.10
DEVICE_FIELDS = (
    "type", "name", "compute_capability", "arch", "threads", "driver", "cuda_runtime", "torch", "cupy",
)  # fmt: skip
SETTINGS_FIELDS = ("batch_sizes", "beam_width", "dtypes", "hidden_dim", "order")
STEP_FIELDS = ("rows", "nnz", "max_slots")


@dataclass
class ReuseOutcome:
    """What `reuse_plan` did: `plan_path`/`plan`/`kernel_files` when it reused (like TuneResult), else
    `refusal`, one line saying why the plan could not be reused (tune measures then)."""

    plan_path: Path | None = None
    plan: dict | None = None
    kernel_files: tuple[str, ...] = ()
    refusal: str | None = None
    source: Path | None = None

    @property
    def reused(self) -> bool:
        return self.plan is not None


def tune_dtypes(settings: TuneSettings, device_type: str) -> tuple[str, ...]:
    """The dtypes a tune measures: the settings', else fp32 and bf16 on a GPU, fp32 on a CPU."""
    return tuple(settings.dtypes or (("fp32", "bf16") if device_type == "cuda" else ("fp32",)))


def measured_settings(settings: TuneSettings, device_type: str, hidden_dim: int) -> dict[str, Any]:
    """The settings that decide what a tune measures, as a plan records them (rule 4)."""
    return {
        "batch_sizes": list(settings.batch_sizes),
        "beam_width": settings.beam_width,
        "dtypes": list(tune_dtypes(settings, device_type)),
        "hidden_dim": hidden_dim,
        "order": settings.order,
    }


def _within(new: float, old: float, tolerance: float) -> bool:
    return abs(new - old) <= tolerance * old


def reuse_refusal(
    plan: Mapping[str, Any],
    prev_manifest: Mapping[str, Any],
    new_manifest: Mapping[str, Any],
    info: Mapping[str, Any],
    settings: Mapping[str, Any],
    tolerance: float = REUSE_TOLERANCE,
) -> str | None:
    """Rules 2-6 of the module docstring on a plan document, the two manifests, this device's info and the
    settings a tune would measure now (`measured_settings`). Returns None when the plan may be reused,
    else the first broken rule as one line. Pure."""
    if plan.get("zerogr_version") != __version__:
        then = plan.get("zerogr_version") or "of unknown version"
        return f"it was measured by zerogr {then}, this is zerogr {__version__}"
    recorded = plan.get("device") if isinstance(plan.get("device"), Mapping) else {}
    for name in DEVICE_FIELDS:
        if recorded.get(name) != info.get(name):
            return f"device {name} differs: {recorded.get(name)!r} then, {info.get(name)!r} now"
    measured = plan.get("settings") if isinstance(plan.get("settings"), Mapping) else {}
    for name in SETTINGS_FIELDS:
        if measured.get(name) != settings.get(name):
            return f"tune setting {name} differs: {measured.get(name)!r} then, {settings.get(name)!r} now"
    old_sizes, new_sizes = list(prev_manifest["codebook_sizes"]), list(new_manifest["codebook_sizes"])
    if old_sizes != new_sizes:
        return f"codebook sizes differ: {old_sizes} then, {new_sizes} now"
    for old, new in zip(prev_manifest["steps"], new_manifest["steps"], strict=True):
        t = new["step"]
        if old["format"] != new["format"]:
            return f"step {t} format differs: {old['format']} then, {new['format']} now"
        for name in STEP_FIELDS:
            if not _within(new[name], old[name], tolerance):
                change = (new[name] - old[name]) / old[name]
                return (
                    f"step {t} {name} changed by {change:+.1%} ({old[name]:,} -> {new[name]:,}), "
                    f"more than {tolerance:.0%}"
                )
    return None


def reuse_plan(
    bundle_path: str | Path | None,
    prev_path: str | Path,
    device: str,
    settings: TuneSettings,
    *,
    tolerance: float = REUSE_TOLERANCE,
    info: Mapping[str, Any] | None = None,
) -> ReuseOutcome:
    """Copy PREV's plan for `device` (and the kernel files it names) into the bundle when the rule of the
    module docstring holds; otherwise return the refusal and write nothing. Problems with PREV (missing,
    unreadable, a broken plan, a kernel file whose checksum fails) are refusals too: the caller then
    measures as usual. Problems with the bundle being tuned raise as they would in tune. `info`: the
    device's `device_info` when the caller has it already (base/device_probe.py), else it is read here."""
    if not 0 <= tolerance < 1:
        raise InputError(f"the plan-reuse tolerance must be in [0, 1), got {tolerance}")
    vdir = resolve_bundle(bundle_path)
    new_manifest = load_manifest(vdir)
    info = dict(info) if info is not None else device_info(device)
    key = device_key(info)
    hidden_dim = settings.hidden_dim
    if settings.weights:
        from ..runtime.weights import load_weights_file

        hidden_dim = int(load_weights_file(settings.weights, new_manifest["codebook_sizes"])[0].shape[1])
    wanted = measured_settings(settings, info["type"], hidden_dim)
    try:
        prev_dir = resolve_bundle(prev_path)
        if prev_dir.resolve() == vdir.resolve():
            return ReuseOutcome(refusal=f"{prev_path} is the version being tuned", source=prev_dir)
        prev = open_bundle(prev_dir, verify_checksums=False)  # the files copied are hashed below
        name = prev.plans().get(key)
        if name is None:
            return ReuseOutcome(refusal=f"{prev_dir.name} has no plan for {key}", source=prev_dir)
        raw = _checked_bytes(prev, name)  # what is copied: the checksummed bytes
        load_plan(prev.file(name), expect_key=key)  # every rule of the plan format, naming the file
        plan = json.loads(raw)
        refusal = reuse_refusal(plan, prev.manifest, new_manifest, info, wanted, tolerance)
        if refusal is not None:
            return ReuseOutcome(refusal=refusal, source=prev_dir)
        kernels = plan.get("kernels")
        kernel_names = list(kernels.get("files") or []) if isinstance(kernels, Mapping) else []
        files = {n: _checked_bytes(prev, n) for n in _kernel_names(kernel_names, prev.manifest["files"])}
    except (ZerogrError, ValueError, OSError) as exc:  # no such PREV, a broken one, a failed read
        return ReuseOutcome(refusal=one_line(exc))
    measured_in = _measured_in(plan.get("reused_from"), plan.get("bundle_version"))
    plan_created_at = plan.get("created_at") if isinstance(plan.get("created_at"), str) else None
    plan.update(
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        bundle_version=new_manifest["version"],
        reused_from={
            "bundle_version": prev.version,
            "measured_in": measured_in,
            "plan_created_at": plan_created_at,
            "tolerance": tolerance,
        },
    )
    plan_name = f"plans/{key}.json"
    files[plan_name] = (json.dumps(plan, indent=2, sort_keys=False) + "\n").encode()
    add_bundle_files(vdir, files)
    return ReuseOutcome(
        vdir / plan_name, plan, tuple(n for n in files if n.startswith("kernels/")), source=prev_dir
    )


def _version_number(value: Any) -> int | None:
    """A version number read from an informational field: a non-negative int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _measured_in(reused_from: Any, bundle_version: Any) -> int | None:
    """The version whose run measured a plan, from its informational fields: `reused_from.measured_in`
    when the plan is itself a copy, else its `bundle_version`. Readers must not need these fields, so any
    other JSON value in them is ignored (None), never an error."""
    if isinstance(reused_from, Mapping) and _version_number(reused_from.get("measured_in")) is not None:
        return _version_number(reused_from.get("measured_in"))
    return _version_number(bundle_version)


def _kernel_names(names: Sequence[Any], listed: Mapping[str, Any]) -> list[str]:
    """The kernel files a plan names, each a kernels/ file PREV's manifest lists (BundleError otherwise)."""
    out = []
    for name in names:
        if not (isinstance(name, str) and name.startswith("kernels/") and name in listed):
            raise BundleError(f"the plan names kernel file {name!r}, which the bundle does not list")
        out.append(name)
    return out


def _checked_bytes(bundle: Any, name: str) -> bytes:
    """A listed file's bytes, after checking its size and sha256 against the manifest."""
    entry = bundle.manifest["files"][name]
    path = bundle.file(name)
    with path.open("rb") as f:
        data = f.read(entry["bytes"] + 1)
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise BundleError(f"{path}: size or sha256 differs from the manifest")
    return data


__all__ = [
    "REUSE_TOLERANCE",
    "ReuseOutcome",
    "measured_settings",
    "reuse_plan",
    "reuse_refusal",
    "tune_dtypes",
]
