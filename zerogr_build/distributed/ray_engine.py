"""The Ray adapter of the partitioned build (distributed.driver.Engine): connect to a cluster, run the
task bodies of distributed.tasks as Ray tasks (results in Ray's object store, retried when a worker
dies), and turn Ray's failures into one-line errors with exit codes; `connect` and the address check.
Ray is imported only in the process that connects (distributed.ray_process's child, or a library caller
already connected), when a build asks for `--engine ray`; it is the optional extra `zerogr[ray]`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from ..base.errors import InputError, ZerogrError, one_line
from .driver import ClusterError

#: Times Ray reruns a task whose worker process or node died (its inputs stay in the object store).
MAX_RETRIES = 3
#: Seconds to wait for a cluster's address to accept a connection before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Environment variables passed to the tasks (the catalog's object-store credentials and endpoint): the
#: workers read the catalog files with the driver's access.
FORWARDED_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")


class RayEngine:
    """distributed.driver.Engine on a connected Ray cluster."""

    name = "ray"

    def __init__(self, ray: Any, env: dict[str, str]) -> None:
        self.ray = ray
        self._remote: dict[Callable[..., Any], Any] = {}
        self._options: dict[str, Any] = {"max_retries": MAX_RETRIES, "retry_exceptions": False}
        if env:
            self._options["runtime_env"] = {"env_vars": env}

    def cpus(self) -> int:
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def largest_node_memory(self) -> int | None:
        memory = [int(n["Resources"].get("memory", 0)) for n in self.ray.nodes() if n.get("Alive")]
        return max(memory) if memory and max(memory) > 0 else None

    def submit(self, fn: Callable[..., Any], *args: Any, num_returns: int = 1, memory: int = 0) -> Any:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self.ray.remote(fn)
        options = dict(self._options, num_returns=num_returns)
        if memory:
            options["memory"] = int(memory)
        return remote.options(**options).remote(*args)

    def get(self, ref: Any) -> Any:
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ZerogrError):
                raise cause from None
            if isinstance(cause, MemoryError):
                raise _memory_error() from None
            raise RuntimeError(f"a Ray task failed: {one_line(cause or exc)}") from None
        except exceptions.OutOfMemoryError:
            raise _memory_error() from None
        except exceptions.ObjectStoreFullError as exc:
            raise ClusterError(
                f"the Ray object store is full ({one_line(exc)[:200]}): retry when the cluster is idle, or "
                "give it more object-store memory or nodes"
            ) from None
        except (exceptions.RayError, ConnectionError) as exc:
            raise ClusterError(
                f"the Ray cluster failed during the build ({type(exc).__name__}: {one_line(exc)[:300]}): "
                "retry; nothing was published"
            ) from None


def _memory_error() -> InputError:
    return InputError(
        "a Ray worker ran out of memory building a partition: raise --partitions (smaller partitions) or "
        "give the workers more memory; nothing was published"
    )


def forwarded_env() -> dict[str, str]:
    """The driver's object-store variables (FORWARDED_ENV_PREFIXES) the tasks get."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def connect(target: str) -> Any:
    """ray.init(target) the way a build connects (warnings only, no worker logs, no dashboard for a local
    instance); the `ray` module once connected. Whatever Ray raises is raised."""
    import ray

    ray.init(
        address=target,
        logging_level=logging.WARNING,
        log_to_driver=False,
        include_dashboard=False if target == "local" else None,
        configure_logging=True,
    )
    return ray


def check_address(address: str) -> str:
    """The address to pass to ray.init ("local": start an instance), after a TCP probe of host:port."""
    text = address.strip()
    if not text:
        return "local"  # a new instance, never a cluster someone else started on this machine
    if text == "auto":
        return "auto"
    hostport = text.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"--ray-address {address!r}: expected host:port of the cluster's head (e.g. 10.0.0.5:6379), "
            "ray://host:10001, or auto"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ClusterError(
            f"cannot reach the Ray cluster at {hostport} ({one_line(exc)}): check that it runs and that "
            "--ray-address (ray_address in the config) names its head, then retry"
        ) from None
    return text
