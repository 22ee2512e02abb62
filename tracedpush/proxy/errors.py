"""Errors the proxy answers with, in OpenAI's error JSON shape.

Clients of an OpenAI-compatible server parse ``{"error": {"message", "type", "param",
"code"}}``; every refusal and upstream failure uses that shape so an SDK surfaces the
message (which names the bad key or the failed leg) instead of a decode error.
"""

from __future__ import annotations

import json
from typing import Any

from tracedpush import semconv


class ProxyError(Exception):
    """A request the proxy answers itself, with an HTTP status and an OpenAI error."""

    status: int = 500
    error_kind: str = "internal_error"
    code: str | None = None  # OpenAI's string code when there is one; else the status

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        body = error_body(self.message, self.error_kind, self.status, self.param)
        if self.code is not None:
            body["error"]["code"] = self.code
        return body


class BadRequest(ProxyError):
    """The client's request is malformed; no engine has seen it."""

    status = 400
    error_kind = "invalid_request_error"


class PayloadTooLarge(ProxyError):
    """The body is over --max-body-bytes; it was not read, and no engine has seen it."""

    status = 413
    error_kind = "invalid_request_error"


class ModelNotFound(ProxyError):
    """The engines do not serve the requested model (OpenAI's 404 ``model_not_found``)."""

    status = 404
    error_kind = "invalid_request_error"
    code = "model_not_found"


class RouteError(ProxyError):
    """No such route (404) or not with this method (405); answered as JSON, not text."""

    error_kind = "invalid_request_error"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NoInstance(ProxyError):
    """No healthy instance of a role to send the request to."""

    status = 503
    error_kind = "service_unavailable"


class UpstreamFailure(ProxyError):
    """A leg (prefill or decode) failed: refused, errored, timed out or answered garbage.

    ``status`` is 502 (bad gateway) or 504 (timeout); an engine's own 4xx answer is
    relayed with its status (it is the client's error, e.g. a prompt that is too long).
    """

    error_kind = "upstream_error"

    def __init__(
        self,
        leg: str,
        message: str,
        *,
        status: int = 502,
        error_type: str = semconv.ERR_UPSTREAM,
        upstream_status: int | None = None,
        sent: bool = True,
    ) -> None:
        super().__init__(f"{leg} leg: {message}")
        self.leg = leg
        self.sent = sent  # False: no connection, so the engine never saw the request
        self.status = status
        self.error_type = error_type
        self.upstream_status = upstream_status
        if status == 504:
            self.error_kind = "upstream_timeout"
        elif 400 <= status < 500:
            self.error_kind = "invalid_request_error"


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def sse_error_event(error: ProxyError) -> bytes:
    """An SSE event carrying an error, for failures after a stream has started."""
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


def upstream_error_message(raw: bytes, limit: int = 500) -> str:
    """The message inside an engine's error answer, else the start of its body."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:limit]
        if isinstance(data.get("message"), str):
            return data["message"][:limit]
        if isinstance(data.get("detail"), str):
            return data["detail"][:limit]
    text = raw[:limit].decode("utf-8", "replace").strip()
    return text or "(empty body)"
