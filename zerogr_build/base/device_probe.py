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

A CPU's identity is a function of what `probe_key` digests (torch's and cupy's files, the CPUs this
process may use, the thread settings of the environment), all read without importing torch. A caller that
remembers an earlier answer under that key (bundle/device_memo.py) passes it as `known`, and no child
starts:

    probe = DeviceInfoProbe("cpu", known=remembered_info)   # a complete record for this probe_key
    probe.info()                                             # that record; probe.probed is None
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .device import cpu_name, device_info
from .version import __version__

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
#: The environment variables that set how many threads torch (OpenMP, MKL) uses: device_info's "threads".
THREAD_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_THREAD_LIMIT", "OMP_DYNAMIC", "MKL_DYNAMIC",
    "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
)  # fmt: skip
#: Where a container's CPU limit is (cgroup v2, then v1).
_CGROUP_CPU = ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us")


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
    return info if complete_record(info, device) else None


def complete_record(info: Any, device: str) -> bool:
    """Whether `info` is a dict with exactly the fields device_info gives for this device type, each
    None, a bool, a number or a string, naming that type. Pure."""
    if not isinstance(info, dict):
        return False
    wanted = {"type", "torch", "cupy", "name", "compute_capability", "arch", "driver", "cuda_runtime"}
    wanted |= {"threads"} if device == "cpu" else {"memory_bytes"}
    if set(info) != wanted or info["type"] != device.split(":", 1)[0]:
        return False
    return all(v is None or isinstance(v, (bool, int, float, str)) for v in info.values())


def probe_key(device: str) -> str | None:
    """sha256 hex of everything device_info(device) depends on for a CPU, read without importing torch:
    zerogr's version, the interpreter, the files (path, inode, size, mtime) of torch (its package, version
    and native libraries) and of cupy, the CPU's model and architecture, the CPUs this process may run on,
    the container's CPU limit, and THREAD_ENV. None for a GPU (its identity is read from the device each
    time), without torch, or with torch already imported here (device_info is then cheap)."""
    if device != "cpu" or "torch" in sys.modules:
        return None
    torch_file = expected_torch_file()
    if torch_file is None:
        return None
    torch_dir = Path(torch_file).parent
    files = [Path(torch_file), torch_dir / "version.py", *sorted(torch_dir.glob("_C*.so"))]
    files += sorted((torch_dir / "lib").glob("*.so*"))
    try:
        cupy = importlib.util.find_spec("cupy")
    except (ImportError, ValueError):
        cupy = None
    if cupy is not None and cupy.origin is not None:
        files += [Path(cupy.origin), Path(cupy.origin).with_name("_version.py")]
    facts = {
        "zerogr": __version__,
        "python": sys.executable,
        "files": [_file_identity(path) for path in files],
        "cpu": [platform.machine(), cpu_name(), os.cpu_count(), sorted(os.sched_getaffinity(0))],
        "cgroup": [_small_text(path) for path in _CGROUP_CPU],
        "env": {name: os.environ.get(name) for name in THREAD_ENV},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _file_identity(path: Path) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [str(path)]
    return [str(path), st.st_ino, st.st_size, st.st_mtime_ns]


def _small_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(256)
    except OSError:
        return None


class DeviceInfoProbe:
    """device_info(device) computed by a child process started now (see the module docstring), or `known`
    when that is a complete record (complete_record): the identity remembered for this probe_key."""

    def __init__(self, device: str, known: Mapping[str, Any] | None = None) -> None:
        self.device = device
        self._proc: subprocess.Popen[str] | None = None
        self._known = dict(known) if known is not None and complete_record(dict(known), device) else None
        self.probed: dict[str, Any] | None = None
        """The answer a child gave (set by info()), for the caller to remember; None otherwise."""
        self._torch_file = None if "torch" in sys.modules else expected_torch_file()
        if self._torch_file is None or self._known is not None:
            return  # torch loaded here (answer here is cheap), absent (device_info here says so), or known
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
        """The device's identity: `known`, else the child's answer when it is valid, else device_info
        computed here."""
        if self._known is not None:
            return dict(self._known)
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _end(proc)
            else:
                answer = accepted_answer(out, self._torch_file, self.device) if proc.returncode == 0 else None
                if answer is not None:
                    self.probed = dict(answer)
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


__all__ = [
    "PROBE_TIMEOUT_S", "THREAD_ENV", "DeviceInfoProbe", "accepted_answer", "complete_record",
    "expected_torch_file", "probe_key",
]  # fmt: skip
