"""Ray started by tests, tied to the test process that started it: when that process is gone, however it
ended, so is every Ray process it started. A fixture's teardown never runs when pytest (an xdist worker) is
killed, or when Ray's core worker ends it (Ray ends a driver process whose local raylet died), and Ray
processes left running hold their ports and memory for good.

- `start_ray_head`: `ray start --head --block` in a session of its own (so ending it never signals
  pytest), under a watchdog that kills that whole session (the head, its GCS, raylet and workers).
- `ray_processes_die_with_this_process`: for a `ray.init()` in the test process itself, whose GCS and
  raylet die with it (Ray's own fate sharing) but whose agents (ray::DashboardAgent,
  ray::RuntimeEnvAgent) do not: a watchdog kills every process that carries this process's marker in its
  environment (everything started after it, Ray's processes included).

The watchdog is told of its parent's death by the kernel (PR_SET_PDEATHSIG) and checks its parent pid
besides; it kills every process of its session (Ray's own processes leave its process group, not
the session). `ray stop --force` is not used: it kills every Ray process of the machine, other tests' and
other users' included."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

#: The watchdog: argv = the test process's pid, then the command it runs (in its own session).
WATCHDOG = r"""
import ctypes, os, signal, subprocess, sys, time
parent, session = int(sys.argv[1]), os.getsid(0)

def members():
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and int(name) != os.getpid() and os.getsid(int(name)) == session:
                yield int(name)
        except OSError:
            pass

def end(*_):
    # Ray's processes leave this process group (setpgrp) but not the session: kill the session's members
    for _ in range(50):
        found = list(members())
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    os._exit(0)

signal.signal(signal.SIGTERM, end)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:  # the parent died before the kernel could be asked to tell
    end()
head = subprocess.Popen(sys.argv[2:])
while head.poll() is None and os.getppid() == parent:
    time.sleep(0.2)
end()
"""


#: The second watchdog: argv = the test process's pid and the environment entry (NAME=value) that marks
#: what it started; when the test process is gone, every process carrying that entry is killed.
MARKED_WATCHDOG = r"""
import ctypes, os, signal, sys, time
parent, marker = int(sys.argv[1]), sys.argv[2].encode()

def marked():
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), parent):
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                if marker in environ.read().split(b"\0"):
                    yield int(name)
        except OSError:
            pass

def end(*_):
    for _ in range(50):
        found = list(marked())
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    os._exit(0)

signal.signal(signal.SIGTERM, end)
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
while os.getppid() == parent:
    time.sleep(0.2)
end()
"""
MARKER_ENV = "ZEROGR_TEST_OWNER"


@contextlib.contextmanager
def ray_processes_die_with_this_process() -> Iterator[None]:
    """Within the block, every process this one starts (a ray.init()'s included) carries a marker in its
    environment, and a watchdog in a session of its own kills them all once this process is gone. The
    block's end stops the watchdog (the caller has shut Ray down) and drops the marker."""
    marker = f"{os.getpid()}-{secrets.token_hex(6)}"
    watchdog = subprocess.Popen(
        [sys.executable, "-c", MARKED_WATCHDOG, str(os.getpid()), f"{MARKER_ENV}={marker}"],
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    os.environ[MARKER_ENV] = marker
    try:
        yield
    finally:
        os.environ.pop(MARKER_ENV, None)
        watchdog.kill()
        watchdog.wait()


def start_ray_head(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`ray ARGS` (e.g. start --head --block ...) in a session of its own under the watchdog (module
    docstring); its output goes to `log`. stop_ray_head ends it."""
    ray = str(Path(sys.executable).with_name("ray"))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), ray, *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def stop_ray_head(watchdog: subprocess.Popen, grace: float = 10.0) -> None:
    """End the head's session: SIGTERM to the watchdog (which kills every process of the session), then
    SIGKILL to whatever of the session is left after `grace` seconds; the watchdog reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(watchdog.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        watchdog.wait(timeout=grace)
    for pid in session_processes(watchdog.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    watchdog.wait()


def session_processes(session: int) -> list[int]:
    """The pids of the processes in session `session` (the watchdog's pid), zombies left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:  # fields: state, ppid, pgrp, session, ...
            found.append(int(entry.name))
    return found


def wait_until_gone(session: int, timeout: float = 30.0) -> list[int]:
    """Wait until no process of `session` is left; returns those left at the deadline."""
    deadline = time.monotonic() + timeout
    while (left := session_processes(session)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
