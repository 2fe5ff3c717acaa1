"""The gate in front of vLLM's OpenAI server: what zerogr's admission cannot do on the server's event loop.

    python -m vllm.entrypoints.openai.api_server ... \
        --middleware zerogr_build.integrations.vllm.gate.ZerogrGate

An ASGI middleware (vLLM's --middleware): for each POST whose JSON body names zerogr in "vllm_xargs" it

- refuses "use_beam_search" with HTTP 400 (BEAM): vLLM's beam search drops vllm_xargs, so the request would
  decode unconstrained with no admission at all;
- opens the file the request names ("available"), and reads its Parquet footer, in a small pool of its own
  threads (FILE_WORKERS), each request waiting at most FILE_SECONDS; when every worker is still busy (a
  hung filesystem) it does not wait at all. The event loop never touches the filesystem, so /health and
  every other request keep their answers whatever the requests name;
- notes the request's API key (its "Authorization: Bearer" header), for the registry's [clients] scopes.

It hands this to admission (admission.py, run later for the same request by vLLM) as a Ticket in a context
variable. A body it cannot parse as a JSON object, or one without zerogr, passes untouched (vLLM answers
it); a body over MAX_BODY_BYTES gets HTTP 413. The gate decides nothing else: every zerogr rule is
admission's, which refuses a zerogr request that did not come through a gate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from ...base.errors import InputError
from .admission import TICKET, Ticket, front_view
from .registry import FileRefusal, Registry, RequestFile
from .spec import spec_of

logger = logging.getLogger("vllm.zerogr")
BEAM = (
    "zerogr: \"use_beam_search\" drops a request's zerogr arguments in vLLM; sample, or use zerogr's "
    "beam_search (docs/serving-engines.md)"
)
MAX_BODY_BYTES = 64 << 20  # a POST body the gate reads whole
PARSE_INLINE_BYTES = 64 << 10  # bodies up to this are parsed on the loop, larger ones in a thread
FILE_WORKERS = 4  # threads that open request files
FILE_SECONDS = 2.0  # how long a request waits for its file before it is refused
_POOL = ThreadPoolExecutor(FILE_WORKERS, thread_name_prefix="zerogr-files")
_FREE = threading.BoundedSemaphore(FILE_WORKERS)


class ZerogrGate:
    """Pure ASGI middleware (module docstring)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            await _error(413, f"zerogr: a request body over {MAX_BODY_BYTES} bytes")(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, key = (headers.get("authorization") or "").partition(" ")
        ticket = Ticket(key.strip() if scheme.lower() == "bearer" else None)
        zerogr = await _zerogr_args(body)
        if zerogr is not None:
            data, args = zerogr
            if data.get("use_beam_search"):
                await _error(400, BEAM)(scope, receive, send)
                return
            await _open_files(args, ticket)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        token = TICKET.set(ticket)
        try:
            await self.app(scope, replay, send)
        finally:
            TICKET.reset(token)


async def _read_body(receive) -> bytes | None:
    """The whole body (None when it passes MAX_BODY_BYTES)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _zerogr_args(body: bytes) -> tuple[dict, Any] | None:
    """(the body's JSON object, its vllm_xargs["zerogr"]) when it names zerogr, else None."""
    try:
        data = (
            json.loads(body) if len(body) <= PARSE_INLINE_BYTES else await asyncio.to_thread(json.loads, body)
        )
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    xargs = data.get("vllm_xargs")
    if not isinstance(xargs, dict) or "zerogr" not in xargs:
        return None
    return data, xargs["zerogr"]


async def _open_files(args: Any, ticket: Ticket) -> None:
    """Into ticket.files: the RequestFile (or refusal) of the file the arguments name, if any."""
    view = await asyncio.to_thread(front_view)  # loaded once per process; may read the catalogs' manifests
    if view is None:
        return
    try:
        spec = spec_of({"zerogr": args}, view.registry.limits)
    except InputError:
        return  # admission refuses it with its own line
    if spec is not None and isinstance(spec.available, str):
        ticket.files[spec.available] = await _open_file(view.registry, spec.available)


async def _open_file(registry: Registry, name: str) -> RequestFile | FileRefusal:
    """registry.open_request_file in the gate's pool, waiting at most FILE_SECONDS (fd closed)."""
    refused = registry.request_file_name(name)  # string checks only: a long or odd name costs no thread
    if isinstance(refused, FileRefusal):
        return refused
    if not _FREE.acquire(blocking=False):
        return FileRefusal(f"all {FILE_WORKERS} file workers are busy (a slow or hung filesystem?)")

    def work() -> RequestFile | FileRefusal:
        try:
            found = registry.open_request_file(name)
            if isinstance(found, FileRefusal):
                return found
            os.close(found[0])
            return found[1]
        finally:
            _FREE.release()

    future = asyncio.get_running_loop().run_in_executor(_POOL, work)
    try:
        return await asyncio.wait_for(asyncio.shield(future), FILE_SECONDS)
    except TimeoutError:
        return FileRefusal(f"{name[:200]!r}: not opened within {FILE_SECONDS} s")


def _error(status: int, message: str) -> JSONResponse:
    """vLLM's error body for one line."""
    kind = "BadRequestError" if status == 400 else "RequestEntityTooLarge"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


__all__ = ["BEAM", "FILE_SECONDS", "FILE_WORKERS", "MAX_BODY_BYTES", "ZerogrGate"]
