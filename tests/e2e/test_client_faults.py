"""Clients that misbehave, on the shared real 1P1D (issue 11, item 5).

A client that hangs up before its first token, or mid-stream, must cost the deployment
nothing: P and D free every block (read on their own /metrics). In push mode that
takes the proxy letting P's leg finish: D frees the blocks it registered only when P's
WRITE lands (proxy/app.py, push_flow).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.parse

import pytest

from tracedpush.launcher.metrics import metric_sum
from tracedpush.testing.figures import Figures

MODES = [pytest.param(m, marks=pytest.mark.pd(m), id=m) for m in ("push", "pull")]
FREED_WITHIN_S = 60.0  # P's KV lease (30 s) in pull mode, plus slack
LONG_PROMPT = "a client that leaves early " * 600  # ~3,000 tokens: P's prefill takes a while

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


class Stream:
    """One streamed completion on a raw socket, so the test decides when to leave."""

    def __init__(self, proxy_url: str, body: dict, request_id: str) -> None:
        url = urllib.parse.urlsplit(proxy_url)
        raw = json.dumps(body).encode()
        self.sock = socket.create_connection((url.hostname, url.port), timeout=60)
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            f"X-Request-Id: {request_id}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + raw)
        self.buf = b""

    @property
    def events(self) -> int:
        return self.buf.count(b"\ndata: {")

    def read_until(self, n: int) -> int:
        """Read until `n` SSE data events have arrived (or the stream ends)."""
        while self.events < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        return self.events

    def read_to_end(self) -> dict:
        """Read to `data: [DONE]`; return the usage chunk.

        Counting events would not do: vLLM merges tokens into one event when its API
        server falls behind (seen in CI: 8 tokens came as fewer events).
        """
        while b"data: [DONE]" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, f"stream ended without [DONE]: {self.buf[-500:]!r}"
            self.buf += chunk
        events = [json.loads(m) for m in re.findall(rb"^data: (\{.*\})\r?$", self.buf, re.M)]
        return next(e["usage"] for e in reversed(events) if e.get("usage"))

    def close(self) -> None:
        self.sock.close()


def _wait_idle(urls: dict[str, str]) -> dict[str, float]:
    """Seconds until each engine's KV usage is back to 0 (fails after FREED_WITHIN_S)."""
    t0 = time.monotonic()
    freed: dict[str, float] = {}
    while len(freed) < len(urls):
        for name, url in urls.items():
            if name not in freed and metric_sum(url, "vllm:kv_cache_usage_perc") == 0:
                freed[name] = time.monotonic() - t0
        held = {n: metric_sum(u, "vllm:kv_cache_usage_perc") for n, u in urls.items()}
        assert time.monotonic() - t0 < FREED_WITHIN_S, f"KV still held: {held}"
        time.sleep(0.5)
    return freed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("when", ["before the first token", "mid-stream"])
def test_a_client_that_leaves_costs_the_engines_nothing(figures: Figures, pd, mode: str, when: str):
    body = {"model": pd.model_name, "prompt": LONG_PROMPT, "stream": True}
    body |= {"max_tokens": 200, "ignore_eos": True}
    engines = {"prefill": pd.prefill_url, "decode": pd.decode_url}
    _wait_idle(engines)
    streams = [Stream(pd.proxy_url, body, f"leave-{mode}-{i}-{time.time_ns()}") for i in range(4)]
    for s in streams:
        if when == "before the first token":
            time.sleep(0.1)  # P is prefilling (D has registered, in push mode)
            assert s.events == 0
        else:
            assert s.read_until(5) >= 5  # tokens are flowing from D
        s.close()
    freed = _wait_idle(engines)
    figures.record(
        clients=len(streams),
        prefill_kv_freed_s=freed["prefill"],
        decode_kv_freed_s=freed["decode"],
    )
    # the engines are fine afterwards: a whole request goes through
    after_body = body | {"max_tokens": 8, "prompt": "after"}
    after_body["stream_options"] = {"include_usage": True}
    after = Stream(pd.proxy_url, after_body, f"after-{mode}-{time.time_ns()}")
    usage = after.read_to_end()
    figures.record(after_request_tokens=usage["completion_tokens"], after_request_expected=8)
    assert usage["completion_tokens"] == 8
    after.close()
    print(f"\n{mode}, {when}: KV freed after {freed}")
