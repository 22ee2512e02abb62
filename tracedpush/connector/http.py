"""An ASGI middleware for vLLM's API server: the moment the engine's HTTP server had a request.

Without it, the time between the proxy sending a leg and vLLM's ``arrival_time`` (taken
after parsing, as vLLM starts rendering the prompt) looks like network time; under load
it is mostly the API server waiting for its loop and core. Install it with vLLM's own
flag, on P and on D:

    python -m vllm.entrypoints.openai.api_server ... \\
        --middleware tracedpush.connector.http.ReceiptMiddleware

(`tracedpush up` adds it.) For a request whose ``kv_transfer_params`` carry the proxy's
trace dict (``"tracedpush_trace": {...}``), it splices ``"received_ns": <unix ns>`` into
that dict; the scheduler-side connector reads it and the request's `prefill` / `decode`
span gets an ``http_received`` event. The body is never parsed: one regex search over
its bytes finds the dict, so the cost is microseconds on the API server's event loop and
nothing on the engine. Any other request passes through untouched.

*When* the HTTP server had it: not when the app runs (uvicorn runs it in a task of its
own, after whatever else the loop has ready), but when the request's bytes arrived, as
`receive_clock` tells: the kernel's receive stamp, else the moment the loop read them.
Its wrapping of uvicorn's protocols happens when this module is imported, which vLLM's
``--middleware`` does while building its app, before it serves.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from time import time_ns
from typing import Any

from tracedpush import semconv
from tracedpush.connector.receive_clock import (
    install_read_clock,
    received_ns,
    uninstall_read_clock,
)

__all__ = ["ReceiptMiddleware", "install_read_clock", "mark_received", "uninstall_read_clock"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_MARKER = re.compile(rb'"' + semconv.KV_PARAMS_TRACE_KEY.encode() + rb'"\s*:\s*\{')
_MAX_BODY = 64 << 20  # larger bodies are passed through unmarked rather than buffered


def mark_received(body: bytes, received_ns: int) -> bytes:
    """Return `body` with ``"received_ns": received_ns`` as the trace dict's first key."""
    m = _MARKER.search(body)
    if m is None:
        return body
    field = b'"' + semconv.TRACE_RECEIVED_NS_KEY.encode() + b'": ' + str(received_ns).encode()
    rest = body[m.end() :]
    sep = b"" if rest.lstrip().startswith(b"}") else b", "
    return body[: m.end()] + field + sep + rest


class ReceiptMiddleware:
    """Pure ASGI middleware (no Starlette dependency); POST bodies only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        install_read_clock()  # again, in case it was uninstalled since the import

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        first: Message | None = None
        while more:
            message = await receive()
            if message.get("type") != "http.request":  # a disconnect: hand it on as is
                first = message
                break
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = bool(message.get("more_body", False))
            if size > _MAX_BODY:
                break
        body = b"".join(chunks)
        if not more and first is None:  # stamped after the whole body is in
            body = mark_received(body, received_ns(scope) or time_ns())
        replay: list[Message] = [{"type": "http.request", "body": body, "more_body": more}]
        if first is not None:
            replay = [{"type": "http.request", "body": body, "more_body": False}, first]

        async def replay_receive() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        await self.app(scope, replay_receive, send)


install_read_clock()  # see the module docstring
