"""How much memory this process may still allocate: the smallest of the machine's physical memory, the
headroom under its address-space limit (RLIMIT_AS, `ulimit -v`) and the headroom under its cgroup's memory
limit (v2 memory.max, v1 memory.limit_in_bytes; containers, systemd units, Kubernetes pods).

Used to refuse, before allocating it, a table that cannot fit (a forced dense step table). Under RLIMIT_AS
such an allocation fails with MemoryError; under a cgroup limit it may succeed and the kernel kills the
process when the pages are touched, so checking first is the only way to give a clear error.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

#: cgroup v1 reports "no limit" as a huge page-aligned number; anything above this is no limit.
_NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class MemoryLimit:
    """`bytes` this process may still allocate and `what` bounds it (for messages)."""

    bytes: int
    what: str


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_headroom() -> int | None:
    """RLIMIT_AS minus the address space in use now (VmSize), None without a limit."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ValueError, OSError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    return max(0, soft - used)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _NO_LIMIT else value


def cgroup_headroom(
    root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> int | None:
    """The smallest (limit - usage) over this process's memory cgroup and its ancestors, v2 or v1; None
    where no limit is set or none can be read. root / proc_cgroup: where the cgroup fs is mounted and this
    process's cgroup list (parameters for tests)."""
    root = Path(root)
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    best: int | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2 unified hierarchy
            base, limit_name, usage_name = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        rel = Path(path.lstrip("/"))
        # The cgroup itself and every ancestor (a namespaced mount shows the process's cgroup at its root).
        dirs = [base / rel, *[base / p for p in rel.parents]]
        for directory in dirs:
            limit = _read_int(directory / limit_name)
            if limit is None:
                continue
            usage = _read_int(directory / usage_name) or 0
            headroom = max(0, limit - usage)
            best = headroom if best is None else min(best, headroom)
    return best


def memory_limit() -> MemoryLimit | None:
    """The tightest of physical memory, RLIMIT_AS headroom and cgroup headroom (None when none is known)."""
    candidates = [
        (physical_memory_bytes(), "this machine's physical memory"),
        (_address_space_headroom(), "the headroom under this process's address-space limit (ulimit -v)"),
        (cgroup_headroom(), "the headroom under this process's cgroup memory limit"),
    ]
    known = [(value, what) for value, what in candidates if value is not None]
    if not known:
        return None
    value, what = min(known, key=lambda c: c[0])
    return MemoryLimit(value, what)
