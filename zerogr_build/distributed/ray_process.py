"""`--engine ray` with Ray in a process of its own: the build's driver (distributed.driver, which writes the
version) and the CLI (which writes the metrics file) stay in the `zerogr` process, and every Ray call runs in
a child process that connects to the cluster (distributed.ray_engine.RayEngine) and answers the engine's
four calls over a socket pair. Whatever Ray does to its driver process (a core worker that ends it when the
node is lost, a `ray.init` that never returns, a SIGTERM handler of its own), it does to the child:

- connecting has a deadline (CONNECT_TIMEOUT_ENV, default DEFAULT_CONNECT_TIMEOUT_S): past it, or when the
  child ends or fails while connecting, ClusterError (exit 3) naming the address;
- a cluster that refuses the driver's authentication is InputError (exit 2) naming what to set, at the
  first refusal Ray logs (the child's output is read as it comes), never a retry;
- a child that ends during the build is ClusterError (exit 3): the node was lost, nothing was published;
- the child runs in its own session, and its whole process group (the Ray instance it started, if any) is
  killed when the build ends, however it ends.

The child is `python -c ...child_main` (this module, so both ends share one protocol): each request is
(operation, arguments, ids of released handles) and each answer ("ok", value) or ("error", exception).
Messages travel as pickle protocol 5 with their buffers (numpy arrays) sent out of band: an array is
copied once, from the socket into the memory it then lives in.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import itertools
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..base.errors import InputError, one_line
from .driver import ClusterError
from .ray_engine import RayEngine, check_address, connect, forwarded_env

#: Seconds `zerogr build --engine ray` waits for the connection to the cluster (or the local instance's
#: start); the environment variable overrides it.
CONNECT_TIMEOUT_ENV = "ZEROGR_RAY_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 60.0
#: Seconds the child gets to disconnect (and stop a local instance) before its process group is killed:
#: after the build, and after a build that failed.
CLOSE_TIMEOUT_S = 20.0
FAILED_CLOSE_TIMEOUT_S = 5.0
#: What Ray's client logs when the cluster refuses its token (or its lack of one).
AUTH_REFUSED_MARKERS = ("InvalidAuthToken", "UNAUTHENTICATED", "Unauthenticated")
#: Ray's own places for the token, in the order its loader reads them.
TOKEN_ENV, TOKEN_PATH_ENV, AUTH_MODE_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"
#: Lines of the child's output kept for the error line when it ends.
OUTPUT_TAIL = 40

#: A frame's header: the bytes that follow, and (for a pickle) how many out-of-band buffers follow it.
_FRAME = struct.Struct("<QI")
_CHILD = "import sys; from zerogr_build.distributed.ray_process import child_main; sys.exit(child_main())"


class RefId(int):
    """A handle's id among a request's arguments: the child puts its ObjectRef there."""


class Handle:
    """The engine's handle to a result held by the child (an ObjectRef there). Dropping the last reference
    tells the child to drop the ObjectRef, so Ray can free the object (with the next request)."""

    __slots__ = ("id", "_released")

    def __init__(self, ident: int, released: collections.deque[int]) -> None:
        self.id = ident
        self._released = released

    def __del__(self) -> None:
        self._released.append(self.id)


class RayProcessEngine:
    """distributed.driver.Engine over the child process's connection to the cluster."""

    name = "ray"

    def __init__(self, child: _Child) -> None:
        self._child = child
        self._released: collections.deque[int] = collections.deque()

    def cpus(self) -> int:
        return self._child.call("cpus", (), self._released)

    def largest_node_memory(self) -> int | None:
        return self._child.call("largest_node_memory", (), self._released)

    def submit(self, fn: Callable[..., Any], *args: Any, num_returns: int = 1, memory: int = 0) -> Any:
        sent = tuple(RefId(a.id) if isinstance(a, Handle) else a for a in args)
        ids = self._child.call("submit", (fn, sent, num_returns, memory), self._released)
        handles = [Handle(i, self._released) for i in ids]
        return handles[0] if num_returns == 1 else handles

    def get(self, ref: Handle) -> Any:
        return self._child.call("get", (ref.id,), self._released)


@contextlib.contextmanager
def ray_engine(address: str) -> Iterator[Any]:
    """An engine on the Ray cluster at `address`: "" starts a Ray instance on this machine for this build,
    "auto" the cluster running on this machine (`ray start --head`), host:port or ray://host:port a remote
    one. Ray runs in a process of its own (this module's child: a bounded connect, authentication
    failures as exit 2, a driver Ray ends as exit 3), stopped when the block ends. A process already
    connected to a cluster (a library caller's ray.init) builds there, in this process, and refuses any
    other address. Unreachable: ClusterError (exit 3); a malformed address: InputError (exit 2)."""
    if importlib.util.find_spec("ray") is None:
        raise InputError(
            "--engine ray needs Ray on this machine: pip install 'zerogr[ray]' (the cluster's Python "
            "environment needs zerogr too)"
        )
    target = check_address(address)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        connected = ray.get_runtime_context().gcs_address
        if address and address.strip().removeprefix("ray://") != connected:
            # the connection this process holds is another cluster (or may be): never build there silently
            raise InputError(
                f"this process is already connected to the Ray cluster at {connected}, so it cannot connect "
                f"to {address}: leave ray_address empty to build on the connected cluster, or call "
                "ray.shutdown() first"
            )
        yield RayEngine(ray, forwarded_env())
        return
    with ray_process_engine(target, address) as engine:
        yield engine


@contextlib.contextmanager
def ray_process_engine(target: str, address: str) -> Iterator[RayProcessEngine]:
    """A RayProcessEngine connected to `target` (what ray.init takes: "local", "auto", host:port,
    ray://host:port; `address` is how the user wrote it). The child and its process group are gone when
    the block ends."""
    env = child_env(dict(os.environ), target)
    child = _Child.start(target, env)
    try:
        child.wait_connected(address, connect_timeout(), env)
        yield RayProcessEngine(child)
        child.close(CLOSE_TIMEOUT_S)
    except Exception:
        child.close(FAILED_CLOSE_TIMEOUT_S)  # a bad row, a full disk: disconnect, briefly
        raise
    finally:
        child.kill()  # and at once on Ctrl-C or SIGTERM


def connect_timeout() -> float:
    """CONNECT_TIMEOUT_ENV in seconds, or the default; InputError (exit 2) for anything but a number > 0."""
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "")
    try:
        seconds = float(raw) if raw.strip() else DEFAULT_CONNECT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise InputError(
            f"{CONNECT_TIMEOUT_ENV}={raw!r}: expected seconds > 0 (default {DEFAULT_CONNECT_TIMEOUT_S:g})"
        )
    return seconds


def token_source(env: dict[str, str]) -> str | None:
    """Where Ray's loader would find a token in `env`, as it reads them: RAY_AUTH_TOKEN, the file named by
    RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token (`ray get-auth-token` prints it); None when nowhere."""
    if env.get(TOKEN_ENV, "").strip():
        return TOKEN_ENV
    named = env.get(TOKEN_PATH_ENV, "").strip()
    if named:
        return f"{TOKEN_PATH_ENV} ({named})" if Path(named).is_file() else None
    home = env.get("HOME") or str(Path.home())
    default = Path(home) / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def child_env(env: dict[str, str], target: str) -> dict[str, str]:
    """The child's environment: `env`, with token authentication turned on (RAY_AUTH_MODE=token) when it
    connects to a running cluster, RAY_AUTH_MODE is not set and a token is where Ray looks for one. Ray does
    the same for `ray.init(address="auto")`, not for an explicit address; a cluster started with
    `ray start --head` on a machine holding a token requires it (a cluster without authentication ignores
    it)."""
    if target != "local" and AUTH_MODE_ENV not in env and token_source(env) is not None:
        return {**env, AUTH_MODE_ENV: "token"}
    return env


def auth_error(address: str, env: dict[str, str]) -> InputError:
    """The one line (exit 2) for a cluster that refused the driver's authentication."""
    source, mode = token_source(env), env.get(AUTH_MODE_ENV, "")
    if mode.strip().lower() == "disabled":
        why = f"{AUTH_MODE_ENV}=disabled is set here; unset it and"
    elif source is None:
        why = "no token was found here;"
    else:
        why = f"the token from {source} was refused;"
    return InputError(
        f"authentication to the Ray cluster at {address} failed (it uses token authentication): {why} "
        f"set {TOKEN_ENV} to the cluster's token (`ray get-auth-token` on its head prints it), or "
        f"{TOKEN_PATH_ENV} to a file holding it, or copy it to ~/.ray/auth_token"
    )


class _Child:
    """The child process, its connection and a thread reading its output (stdout and stderr together)."""

    def __init__(self, process: subprocess.Popen, conn: socket.socket) -> None:
        self.process = process
        self.conn = conn
        self.tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL)
        self.auth_refused = threading.Event()
        self.reader = threading.Thread(target=self._read_output, name="zerogr-ray-output", daemon=True)
        self.reader.start()

    @classmethod
    def start(cls, target: str, env: dict[str, str]) -> _Child:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno()), target],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
            return cls(process, socket.socket(fileno=ours.detach()))

    def _read_output(self) -> None:
        echo = bool(os.environ.get("ZEROGR_DEBUG"))
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            self.tail.append(line)
            if any(marker in line for marker in AUTH_REFUSED_MARKERS):
                self.auth_refused.set()
            if echo:
                sys.stderr.write(f"ray: {line}\n")

    def wait_connected(self, address: str, timeout: float, env: dict[str, str]) -> None:
        """Return once the child reports it is connected (`address`: as the user gave it, "" for a local
        instance); raise its failure otherwise (module docstring)."""
        deadline = time.monotonic() + timeout
        while True:
            if select.select([self.conn], [], [], 0.2)[0]:
                try:
                    status, *detail = receive(self.conn)
                except (EOFError, OSError):
                    status, detail = "ended", []
                if status == "ready":
                    return
                if status == "auth":
                    raise auth_error(address, env)
                if not address:
                    raise ClusterError(f"could not start a local Ray instance ({self._why(detail)}): retry")
                raise ClusterError(
                    f"cannot connect to the Ray cluster at {address} ({self._why(detail)}): check that it "
                    "runs and that --ray-address (ray_address in the config) names it, then retry"
                )
            if self.auth_refused.is_set():
                raise auth_error(address, env)
            if time.monotonic() > deadline:
                if not address:
                    raise ClusterError(
                        f"a local Ray instance did not start within {timeout:g} s ({CONNECT_TIMEOUT_ENV} "
                        "sets the wait): retry"
                    )
                raise ClusterError(
                    f"cannot connect to the Ray cluster at {address}: no answer within {timeout:g} s (is it "
                    f"a Ray head? {CONNECT_TIMEOUT_ENV} sets the wait): check --ray-address, then retry"
                )

    def call(self, operation: str, args: tuple, released: collections.deque[int]) -> Any:
        """Send one request; return its answer's value, raise its exception, or ClusterError when the child
        has ended (the cluster's node was lost, or Ray ended its driver)."""
        dropped = []
        with contextlib.suppress(IndexError):
            while True:
                dropped.append(released.popleft())
        try:
            send(self.conn, (operation, args, dropped))
            status, value = receive(self.conn)
        except (EOFError, OSError):
            raise ClusterError(
                f"the Ray cluster failed during the build: its driver process ended ({self._why([])}): "
                "retry; nothing was published"
            ) from None
        if status == "error":
            raise value
        return value

    def _why(self, detail: list) -> str:
        """What ended the child or its connection: its own report, its exit, the last line it printed."""
        if detail:
            return " ".join(str(detail[0]).split())[:300]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2)
        code = self.process.returncode
        how = "still running" if code is None else f"exit {code}" if code >= 0 else _signal_name(-code)
        last = next((line for line in reversed(self.tail) if line.strip()), "")
        return how + (f"; it said: {' '.join(last.split())[:200]}" if last else "")

    def close(self, timeout: float) -> None:
        """Ask the child to disconnect (a local instance stops) and give it `timeout` seconds to end."""
        with contextlib.suppress(OSError):
            send(self.conn, ("close", (), []))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """Kill the child's process group (the child, and the Ray processes it started), then reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.conn.close()
        self.reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _signal_name(signum: int) -> str:
    try:
        return f"killed by {signal.Signals(signum).name}"
    except ValueError:
        return f"killed by signal {signum}"


# ----------------------------------------------------------------------------------------- the wire format


def send(conn: socket.socket, message: tuple) -> None:
    """`message` as pickle protocol 5: the pickle, then each out-of-band buffer (numpy arrays), each framed
    by its length; the buffers are sent from where they are, not copied."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    conn.sendall(_FRAME.pack(len(data), len(buffers)) + data)
    for buffer in buffers:
        raw = buffer.raw()
        conn.sendall(_FRAME.pack(raw.nbytes, 0))
        conn.sendall(raw)


def receive(conn: socket.socket) -> Any:
    """A message `send` wrote; each buffer is received once, into the memory its array then uses."""
    size, count = _FRAME.unpack(_read(conn, _FRAME.size))
    data = _read(conn, size)
    buffers = [_read(conn, _FRAME.unpack(_read(conn, _FRAME.size))[0]) for _ in range(count)]
    return pickle.loads(data, buffers=buffers)


def _read(conn: socket.socket, size: int) -> bytearray:
    """Exactly `size` bytes from `conn`; EOFError when it closes first."""
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        n = conn.recv_into(view[got:])
        if not n:
            raise EOFError("the connection closed")
        got += n
    return out


# ------------------------------------------------------------------------------------------------ the child


def child_main() -> int:
    """The child (argv: the socket's fd, the ray.init target): connect, report, answer until "close" or
    until the connection ends, then disconnect. SIGTERM, SIGHUP and SIGINT are the parent's to handle: the
    parent ends the child by closing the connection or killing its process group."""
    fd, target = int(sys.argv[1]), sys.argv[2]
    conn = socket.socket(fileno=fd)
    _ignore_terminal_signals()
    try:
        ray = connect(target)
    except BaseException as exc:  # noqa: BLE001 - any failure to connect is reported, then the child ends
        auth = type(exc).__name__ == "AuthenticationError"
        send(conn, ("auth" if auth else "failed", f"{type(exc).__name__}: {one_line(exc)}"))
        return 1
    _ignore_terminal_signals()  # ray.init installs a SIGTERM handler of its own
    try:
        send(conn, ("ready",))
        _answer(conn, RayEngine(ray, forwarded_env()))
    finally:
        ray.shutdown()
    return 0


def _answer(conn: socket.socket, engine: Any) -> None:
    refs: dict[int, Any] = {}
    ids = itertools.count()
    while True:
        try:
            operation, args, dropped = receive(conn)
        except (EOFError, OSError):
            return
        for ident in dropped:
            refs.pop(ident, None)
        if operation == "close":
            return
        try:
            if operation == "submit":
                fn, fn_args, num_returns, memory = args
                resolved = [refs[a] if isinstance(a, RefId) else a for a in fn_args]
                out = engine.submit(fn, *resolved, num_returns=num_returns, memory=memory)
                made = []
                for ref in out if num_returns != 1 else [out]:
                    made.append(next(ids))
                    refs[made[-1]] = ref
                answer: tuple = ("ok", made)
            elif operation == "get":
                answer = ("ok", engine.get(refs[args[0]]))
            else:
                answer = ("ok", getattr(engine, operation)())
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            answer = ("error", exc)
        try:
            send(conn, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            send(conn, ("error", RuntimeError(f"{type(exc).__name__}: {one_line(exc)}")))


def _ignore_terminal_signals() -> None:
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        with contextlib.suppress(AttributeError, ValueError):
            signal.signal(getattr(signal, name), lambda *_: None)
