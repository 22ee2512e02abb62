"""The engine API-server middleware that stamps when the HTTP server had a request.

A real FastAPI app (what vLLM's API server is) behind the middleware, driven through
Starlette's test client: the app sees the body exactly as vLLM would parse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import os
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from tracedpush import semconv
from tracedpush.connector import http as http_connector
from tracedpush.connector import receive_clock
from tracedpush.connector.http import ReceiptMiddleware, mark_received

KEY = semconv.KV_PARAMS_TRACE_KEY
RECEIVED = semconv.TRACE_RECEIVED_NS_KEY


@pytest.fixture()
def client() -> TestClient:
    app = FastAPI()

    @app.post("/v1/completions")
    async def echo(request: Request) -> dict:
        return {"body": await request.json()}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    app.add_middleware(ReceiptMiddleware)  # how vLLM's --middleware installs a class
    return TestClient(app, raise_server_exceptions=False)


def test_marks_the_trace_dict_and_nothing_else(client: TestClient):
    body = {
        "model": "m",
        "prompt": 'a "tracedpush_trace" inside a prompt is just text',
        "kv_transfer_params": {"do_remote_decode": True, KEY: {"traceparent": "00-ab-cd-01"}},
    }
    before = time.time_ns()
    got = client.post("/v1/completions", content=json.dumps(body)).json()["body"]
    after = time.time_ns()
    trace = got["kv_transfer_params"][KEY]
    assert before <= trace[RECEIVED] <= after
    assert trace["traceparent"] == "00-ab-cd-01"
    del trace[RECEIVED]
    assert got == body  # everything else arrives byte-for-byte equivalent


def test_compact_and_empty_dicts(client: TestClient):
    raw = b'{"kv_transfer_params":{"' + KEY.encode() + b'":{}},"prompt":"x"}'
    got = client.post("/v1/completions", content=raw).json()["body"]
    assert isinstance(got["kv_transfer_params"][KEY][RECEIVED], int)


def test_requests_without_trace_context_pass_untouched(client: TestClient):
    body = {"model": "m", "prompt": "hi", "kv_transfer_params": {"do_remote_decode": True}}
    assert client.post("/v1/completions", json=body).json()["body"] == body
    assert client.get("/health").json() == {"ok": True}


def test_malformed_json_is_left_for_vllm_to_reject(client: TestClient):
    raw = b'{"kv_transfer_params": {"' + KEY.encode() + b'": {'  # truncated
    assert mark_received(raw, 5).startswith(raw[:-1])
    response = client.post("/v1/completions", content=b"{not json")
    assert response.status_code >= 400  # the app's own error, not a crash in ours


def test_mark_received_is_a_pure_splice():
    raw = b'{"a": 1, "' + KEY.encode() + b'": {"traceparent": "x"}}'
    out = mark_received(raw, 123)
    assert json.loads(out)[KEY] == {RECEIVED: 123, "traceparent": "x"}
    assert mark_received(b'{"a": 1}', 5) == b'{"a": 1}'


class _BusyLoop:
    """Outermost middleware that holds the event loop for `hold_s` before the app runs:
    the API server's loop busy with other requests' work."""

    def __init__(self, app, hold_s: float = 0.05) -> None:
        self.app, self.hold_s = app, hold_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            time.sleep(self.hold_s)
        await self.app(scope, receive, send)


@contextlib.contextmanager
def _serve(app: FastAPI, **config: str):
    """A real uvicorn server (the one vLLM's API server runs) on a free port, in a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def _real_server(http: str):
    """/v1/completions behind our middleware, with the loop held before the app runs."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def echo(request: Request) -> dict:
        return {"body": await request.json()}

    app.add_middleware(ReceiptMiddleware)
    app.add_middleware(_BusyLoop, hold_s=HOLD_S)  # added last: outermost, runs before ours
    with _serve(app, http=http) as port:
        yield port


def _received_after_send_ms(port: int) -> float:
    """Send the whole request in one write. (http.client writes the headers and the body
    separately: when the loop reads the headers alone, the app's hold runs before the
    body is read, and the read clock rightly says the body was read after it.)"""
    body = json.dumps({"prompt": "x", "kv_transfer_params": {KEY: {"traceparent": "t"}}})
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sent = time.time_ns()
        sock.sendall((head + body).encode())
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    response = http.client.HTTPResponse(_Replay(raw))
    response.begin()
    got = json.loads(response.read())["body"]
    return (got["kv_transfer_params"][KEY][RECEIVED] - sent) / 1e6


class _Replay:
    """A socket stand-in holding a response already read (for http.client's parser)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.data)


# How long the loop is held before the app runs: far beside what a loaded machine adds
# between the send and the read, so the two stamps differ by the hold alone.
HOLD_S = 0.3


@pytest.mark.parametrize("http_impl", ["httptools", "h11"])
def test_received_is_when_the_loop_read_the_bytes_not_when_the_app_ran(http_impl: str):
    """Real uvicorn, real socket. The loop is held 300 ms between reading the request and
    running the app: the stamp excludes that wait (it is the API server's, not the
    network's); without the read clock it would include it."""
    http_connector.install_read_clock()  # as importing the module does in the API server
    try:
        with _real_server(http_impl) as port:
            after_read = _received_after_send_ms(port)
            http_connector.uninstall_read_clock()
            after_call = _received_after_send_ms(port)
    finally:
        http_connector.uninstall_read_clock()
    hold_ms = HOLD_S * 1e3
    assert 0.0 <= after_read < hold_ms / 2, after_read  # the hold is not in it
    assert after_call >= hold_ms, after_call  # the fallback: when the app was called


@contextlib.contextmanager
def _stamping_server(loop: str):
    """Real uvicorn on `loop`, with the receive clock on: /echo returns the request's
    scope stamps, /block holds the event loop 100 ms (another request's long work),
    /block_later holds it 300 ms from 50 ms after it answered."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {k: request.scope.get(k) for k in (receive_clock.SCOPE_KEY, KERNEL)}

    @app.post("/block")
    async def block() -> dict:
        time.sleep(0.1)
        return {}

    @app.post("/block_later")
    async def block_later() -> dict:
        asyncio.get_running_loop().call_later(0.05, time.sleep, 0.3)
        return {}

    http_connector.install_read_clock()
    try:
        with _serve(app, loop=loop) as port:
            yield port
    finally:
        http_connector.uninstall_read_clock()


KERNEL = receive_clock.KERNEL_SCOPE_KEY


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_kernel_stamp_excludes_the_wait_for_the_event_loop(loop: str):
    """The bytes arrive while the server's loop is busy for 100 ms: the kernel's stamp is
    the arrival (transport only), the read clock is when the loop got round to it."""
    with _stamping_server(loop) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/echo", b"{}")  # a kept-alive connection, as the proxy's
        conn.getresponse().read()
        blocker = threading.Thread(
            target=lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10).request(
                "POST", "/block", b"{}"
            )
        )
        blocker.start()
        time.sleep(0.03)  # the loop is inside /block now
        sent = time.time_ns()
        conn.request("POST", "/echo", b"{}")
        got = json.loads(conn.getresponse().read())
        blocker.join()
        conn.close()
    kernel_ms = (got[KERNEL] - sent) / 1e6
    read_ms = (got[receive_clock.SCOPE_KEY] - sent) / 1e6
    assert 0.0 <= kernel_ms < 10.0, got
    assert read_ms >= 50.0, got  # what the read clock alone would have called network


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_new_connections_first_bytes_get_the_kernel_stamp_too(loop: str):
    """A request on a new connection arrives while the loop is busy and no connection is
    open (the engine's API server starved on a busy core, the proxy's pool empty): the
    stamp is still the arrival, not the late read. Linux stamps arriving packets only
    while some socket asks for stamps; the receive clock keeps one asking."""
    with _stamping_server(loop) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/block_later", b"{}", {"Connection": "close"})
        conn.getresponse().read()
        conn.close()
        time.sleep(0.15)  # the loop sleeps now, with no connection open
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        sent = time.time_ns()
        conn.request("POST", "/echo", b"{}")
        got = json.loads(conn.getresponse().read())
        conn.close()
    read_ms = (got[receive_clock.SCOPE_KEY] - sent) / 1e6
    assert read_ms >= 100.0, got  # the loop did read it late
    assert got[KERNEL] is not None, got
    assert 0.0 <= (got[KERNEL] - sent) / 1e6 < 10.0, got


def test_connections_leave_no_descriptors_behind():
    before = len(os.listdir("/proc/self/fd"))
    with _stamping_server("uvloop") as port:
        for _ in range(20):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/echo", b"{}")
            conn.getresponse().read()
            conn.close()
        time.sleep(0.2)
    assert len(os.listdir("/proc/self/fd")) <= before + 2
