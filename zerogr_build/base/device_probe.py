"""A device's identity (`device.device_info`) read by a child process while this one works on.

Naming a device imports torch (its version, the CPU thread count it would use, CUDA properties): about a
second of imports, and CUDA's start on a GPU. A rebuild that reuses the previous plan needs only that
identity, so it starts the probe after its build and reads the answer when tune comes:

    probe = DeviceInfoProbe("cpu")     # starts `python -c ...` (nothing when torch is already imported here)
    ...                                # verify, the guards
    info = probe.info()                # the child's device_info, or device_info("cpu") computed here
    probe.close()                      # ends the child if it still runs (also on errors: a context manager)

The child runs this interpreter with this environment and the same zerogr_build, so it reads what this
process would. Its answer is used only when it names the torch this process would import (same file) and
is a complete record; anything else (a failed child, a timeout, another torch) falls back to computing
device_info here, which then raises what it raises.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .device import device_info

#: Seconds `info()` waits for the child before computing the identity here instead.
PROBE_TIMEOUT_S = 300.0
_CHILD = (
    "import json, sys\n"
    "from zerogr_build.base.device import device_info\n"
    "import torch\n"
    "info = device_info(sys.argv[1])\n"
    "print(json.dumps({'torch_file': torch.__file__, 'info': {k: (None if v is None else v if "
    "isinstance(v, (int, float, bool)) else str(v)) for k, v in info.items()}}))\n"
)
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def expected_torch_file() -> str | None:
    """The torch/__init__.py this process would import (found without importing it); None without torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    return None if spec is None or spec.origin is None else str(Path(spec.origin).resolve())


def accepted_answer(stdout: str, torch_file: str | None, device: str) -> dict | None:
    """The child's printed answer as a device_info dict, or None unless it is one JSON object naming
    `torch_file` with the fields device_info gives for this device type. Pure."""
    try:
        answer = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except ValueError:
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("info"), dict) or torch_file is None:
        return None
    named = answer.get("torch_file")
    if not isinstance(named, str) or str(Path(named).resolve()) != torch_file:
        return None
    info = answer["info"]
    wanted = {"type", "torch", "cupy", "name", "compute_capability", "arch", "driver", "cuda_runtime"}
    wanted |= {"threads"} if device == "cpu" else {"memory_bytes"}
    if set(info) != wanted or info["type"] != device.split(":", 1)[0]:
        return None
    return info


class DeviceInfoProbe:
    """device_info(device) computed by a child process started now (see the module docstring)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._proc: subprocess.Popen[str] | None = None
        self._torch_file = None if "torch" in sys.modules else expected_torch_file()
        if self._torch_file is None:
            return  # torch loaded here (answer here is cheap), or absent (device_info here says so)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_PACKAGE_ROOT), *([path] if path else [])])}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, device],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                text=True,
            )
        except OSError:
            self._proc = None

    def info(self, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
        """The device's identity: the child's answer when it is valid, else device_info computed here."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _end(proc)
            else:
                answer = accepted_answer(out, self._torch_file, self.device) if proc.returncode == 0 else None
                if answer is not None:
                    return answer
        return device_info(self.device)

    def close(self) -> None:
        """End the child if it still runs (its answer is not needed)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc)

    def __enter__(self) -> DeviceInfoProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


__all__ = ["PROBE_TIMEOUT_S", "DeviceInfoProbe", "accepted_answer", "expected_torch_file"]
