"""The engine API-server middleware that stamps when the HTTP server had a request.

A real FastAPI app (what vLLM's API server is) behind the middleware, driven through
Starlette's test client: the app sees the body exactly as vLLM would parse it.
"""

from __future__ import annotations

import json
import time

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from tracedpush import semconv
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
