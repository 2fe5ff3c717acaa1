"""What one rebuild is asked to do (`RebuildRequest`), and the checks of it that need no lock, no network
and no catalog read (`check_request`): a wrong option is exit 2 before anything else happens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..base.errors import BundleError, InputError
from ..bundle.guards import GuardThresholds, check_reason
from ..bundle.versions import check_out_dir, read_latest
from ..config import BuildSettings, TuneSettings
from .gate import GateSpec


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
    tune with, the optional gate and push, the guards' thresholds (None: --no-guards) and the reason that
    lets fired guards through (--accept-change), and `force` (build even when the inputs did not change)."""

    catalog: str
    settings: BuildSettings
    tune_device: str
    tune_settings: TuneSettings
    retune: bool = False
    gate: GateSpec | None = None
    push: PushSpec | None = None
    guards: GuardThresholds | None = GuardThresholds()
    accept_change: str | None = None
    force: bool = False


def default_tune_device() -> str:
    """cuda:0 when torch sees a GPU, else cpu."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def check_request(request: RebuildRequest) -> Path:
    """The set-up checks that need no lock, network or catalog read: OUT, codebook sizes, tune device,
    gate inputs, push URL, its client and signing key, guard thresholds, the --accept-change reason.
    Raises InputError (exit 2). Returns the OUT dir."""
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
    if request.guards is not None:
        request.guards.check()
    elif request.accept_change is not None:
        raise InputError("--accept-change lets fired guards through: it means nothing with --no-guards")
    check_reason(request.accept_change)
    return out


def previous_version(out: Path) -> Path | None:
    """The version LATEST names before this run promotes: the plan tune may reuse, the version the guards
    and the no-change check compare with (None: none usable)."""
    try:
        name = read_latest(out)
    except BundleError:
        return None
    return out / name if name and (out / name).is_dir() else None
