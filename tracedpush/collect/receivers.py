"""The collector's listeners: OTLP/HTTP and /metrics (aiohttp), OTLP/gRPC (grpcio).

OTLP/HTTP follows the spec: POST /v1/traces with `application/x-protobuf` or
`application/json`, optionally gzip; the answer is an `ExportTraceServiceResponse` in
the request's encoding (with `partialSuccess` when spans were skipped), a malformed
body gets 400 with a `google.rpc.Status`. gRPC serves `TraceService/Export` and answers
INVALID_ARGUMENT for a request it cannot read. The work of a request runs on a thread
pool, not on the event loop, so a big batch does not stall the listeners.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from aiohttp import web
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tracedpush.collect import decode
from tracedpush.collect.collector import Accepted, Collector

TRACES_PATH = "/v1/traces"
GRPC_MAX_MESSAGE = decode.MAX_BODY_BYTES
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tracedpush-collect-http")


def _response(accepted: Accepted, as_json: bool) -> web.Response:
    resp = trace_service_pb2.ExportTraceServiceResponse()
    if accepted.rejected:
        resp.partial_success.rejected_spans = accepted.rejected
        resp.partial_success.error_message = f"{accepted.rejected} spans could not be decoded"
    if as_json:
        body: dict[str, Any] = {}
        if accepted.rejected:
            body["partialSuccess"] = {
                "rejectedSpans": str(accepted.rejected),
                "errorMessage": resp.partial_success.error_message,
            }
        return web.json_response(body)
    return web.Response(body=resp.SerializeToString(), content_type=decode.PROTOBUF)


def _bad_request(message: str, as_json: bool) -> web.Response:
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message)
    if as_json:
        return web.json_response({"code": status.code, "message": message}, status=400)
    return web.Response(status=400, body=status.SerializeToString(), content_type=decode.PROTOBUF)


def otlp_http_app(collector: Collector) -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        ctype = request.headers.get("Content-Type", decode.PROTOBUF)
        as_json = ctype.split(";")[0].strip().lower() == decode.JSON
        try:
            # aiohttp has already undone a gzip / deflate Content-Encoding here
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise
        except Exception as exc:  # a body that does not decompress
            collector.metrics.rejected.inc()
            return _bad_request(f"unreadable body: {exc!r}", as_json)
        loop = asyncio.get_running_loop()
        try:
            accepted = await loop.run_in_executor(_POOL, collector.ingest_http, body, ctype, None)
        except decode.BadRequest as exc:
            return _bad_request(str(exc), as_json)
        return _response(accepted, as_json)

    app = web.Application(client_max_size=decode.MAX_BODY_BYTES)
    app.router.add_post(TRACES_PATH, traces)
    return app


def metrics_app(collector: Collector) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        body, content_type = collector.metrics.render(request.headers.get("Accept"))
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text=json.dumps({"status": "ok", "summary": collector.summary()}))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            accepted = self.collector.ingest_grpc(request)
        except decode.BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        resp = trace_service_pb2.ExportTraceServiceResponse()
        if accepted.rejected:
            resp.partial_success.rejected_spans = accepted.rejected
            resp.partial_success.error_message = f"{accepted.rejected} spans could not be decoded"
        return resp


def grpc_server(collector: Collector, host: str, port: int) -> tuple[grpc.Server, int]:
    """A started gRPC server and the port it bound; OSError when it cannot bind."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=4, thread_name_prefix="tracedpush-collect-grpc"),
        options=[
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
            ("grpc.so_reuseport", 0),  # a second collector on the port must fail, not share
        ],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(collector), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpcio raises RuntimeError on a port it cannot bind
        raise OSError(f"cannot listen on {host}:{port} (gRPC): {exc}") from None
    if not bound:
        raise OSError(f"cannot listen on {host}:{port} (gRPC)")
    server.start()
    return server, bound
