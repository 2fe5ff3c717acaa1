"""How many cores a short parallel region can count on right now (Linux; elsewhere: all of them).

A parallel loop with a static split ends when its slowest thread does: when other processes keep the cores
busy, one of its threads waits for a time slice (milliseconds) while the work itself takes a fraction of
that. The kernel's count of runnable threads at this instant (/proc/loadavg, fourth field, "running/
total") tells whether that is about to happen: runnable threads beyond the caller's own, on a machine with
that few cores, would share them with the region's threads. This process's own runnable threads (the
caller, and pool threads still spinning after the previous parallel region, which are about to sleep
or to join the next one) are not counted against it.
"""

from __future__ import annotations

import os

LOADAVG = "/proc/loadavg"
TASKS = "/proc/self/task"


def machine_cores() -> int:
    """Cores of the machine (what /proc/loadavg's counts are relative to)."""
    return os.cpu_count() or 1


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return machine_cores()


def runnable_threads(path: str = LOADAVG) -> int | None:
    """Threads runnable on the whole machine at this instant, the caller included; None where unknown."""
    try:
        with open(path, "rb") as f:
            running = f.read().split()[3].split(b"/")[0]
        return int(running)
    except (OSError, IndexError, ValueError):
        return None


def own_runnable_threads(tasks: str = TASKS) -> int:
    """Threads of this process in the running state right now (the caller included), at least 1."""
    running = 0
    try:
        names = os.listdir(tasks)
    except OSError:
        return 1
    for name in names:
        try:
            with open(f"{tasks}/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        running += state == b"R"
    return max(1, running)


def free_cores(path: str = LOADAVG, tasks: str = TASKS) -> int:
    """Cores no other process's thread is running or about to run on right now: usable cores, less the
    machine's runnable threads that are not this process's; at least 1."""
    usable = usable_cores()
    running = runnable_threads(path)
    if running is None:
        return usable
    others = max(0, running - own_runnable_threads(tasks))
    return max(1, min(usable, machine_cores() - others))
