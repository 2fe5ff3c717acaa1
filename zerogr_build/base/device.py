"""Device identity: parsing device strings, the device a command runs on, and the key plans are filed under.

    parse_device("cuda")          -> "cuda:0"     the syntax check (InputError otherwise); no torch
    check_device("cuda:1")                        fails early when that CUDA device is not present
    device_for(gpu, device)       -> "cuda:N"     `--gpu N` / `--device D`: exactly one must be given
    device_info("cuda:0")         -> {...}        what identifies the device (recorded in a plan)
    device_key(info_or_device)    -> "cuda-nvidia-h200-sm90"   file-name-safe class of the device
    cuda_index(device)            -> 0            the CUDA device index a torch device names

Importing this module does not import torch: the CLI parses devices before deciding whether it needs torch.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import InputError

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def parse_device(text: str, option: str = "--device") -> str:
    """ "cpu", "cuda" or "cuda:N" -> the device it names ("cuda" is "cuda:0"); InputError naming `option`."""
    if not isinstance(text, str) or not _DEVICE.fullmatch(text):
        raise InputError(f"{option} must be cpu or cuda:N, got {text!r}")
    return "cuda:0" if text == "cuda" else text


def check_device(device: str) -> None:
    """Fail before any work when a CUDA device was asked for but is not there (torch imported only then)."""
    if device == "cpu":
        return
    import torch

    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device is available on this machine")
    if index >= torch.cuda.device_count():
        raise InputError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) present")


def device_for(gpu: int | None, device: str | None) -> str:
    """`--gpu N` / `--device D` -> a torch device string; exactly one must be given."""
    if (gpu is None) == (device is None):
        raise InputError("give exactly one of --gpu N or --device cpu|cuda:N")
    if gpu is not None:
        if gpu < 0:
            raise InputError(f"--gpu must be >= 0, got {gpu}")
        return f"cuda:{gpu}"
    assert device is not None
    return parse_device(device)


def cuda_index(device: Any = None) -> int | None:
    """CUDA device index of a torch device, "cuda:N" string or int (None / "cuda": the current device);
    None when `device` is not a CUDA device."""
    import torch

    if device is None:
        return torch.cuda.current_device()
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        return None
    return dev.index if dev.index is not None else torch.cuda.current_device()


def device_info(device: str) -> dict:
    """What identifies the device a plan was measured on (recorded in the plan, keyed by device_key)."""
    import torch

    dev = torch.device(device)
    info: dict[str, Any] = {"type": dev.type, "torch": torch.__version__, "cupy": _cupy_version()}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(
            name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            arch=f"sm_{props.major}{props.minor}",
            driver=_driver_version(),
            cuda_runtime=torch.version.cuda,
            memory_bytes=int(props.total_memory),
        )
    elif dev.type == "cpu":
        info.update(
            name=cpu_name(),
            compute_capability=None,
            arch=platform.machine(),
            driver=None,
            cuda_runtime=None,
            threads=torch.get_num_threads(),
        )
    else:
        raise InputError(f"cannot tune for device {device!r}: use cpu or cuda:N")
    return info


def device_key(info: Mapping[str, Any] | str | Any) -> str:
    """File-name-safe key of a device class: "cuda-nvidia-h200-sm90", "cpu-x86-64-amd-epyc-...-2t".

    info: a `device_info` dict, or a device (str / torch.device) whose info is read now. GPUs of one model
    and architecture share plans; CPUs also by thread count (timings depend on it)."""
    if not isinstance(info, Mapping):
        info = device_info(str(info))
    if info["type"] == "cuda":
        return f"cuda-{_slug(info['name'])}-{_slug(info['arch']).replace('-', '')}"
    return f"cpu-{_slug(info['arch'])}-{_slug(info['name'])}-{info.get('threads', 0)}t"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _cupy_version() -> str | None:
    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy

        return str(cupy.__version__)
    except Exception:  # noqa: BLE001 - an unusable cupy is the same as none for the record
        return None


def _driver_version() -> str | None:
    try:
        import cupy

        v = int(cupy.cuda.runtime.driverGetVersion())
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:  # noqa: BLE001
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


__all__ = [
    "check_device", "cpu_name", "cuda_index", "device_for", "device_info", "device_key", "parse_device",
]  # fmt: skip
