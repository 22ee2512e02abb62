"""The console on a Jaeger source: a small HTTP server answering Jaeger's v3 query API
(``/api/v3/services``, ``/api/v3/traces`` search -> ``{"result": TracesData}``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.testing.console import figure, no_exception, traces_of
from tracedpush.testing.synthetic import generate


class FakeJaeger:
    """Serves every document it holds on each search (the store drops duplicates)."""

    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/api/v3/services":
                    body: Any = {"services": [sc.SERVICE_PROXY, sc.SERVICE_DECODE]}
                elif path == "/api/v3/traces":
                    spans = [rs for d in fake.docs for rs in d["resourceSpans"]]
                    body = {"result": {"resourceSpans": spans}}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jaeger() -> Iterator[FakeJaeger]:
    fake = FakeJaeger()
    yield fake
    fake.close()


def test_overview_from_jaeger(app, jaeger):
    jaeger.docs = generate(40, seed=21, start_unix_s=time.time() - 300).documents
    at = app(jaeger=jaeger.url)
    no_exception(at)
    modes = {
        t["meta"]["mode"] for t in traces_of(figure(at, "latency_by_load"), kind="latency_by_load")
    }
    assert modes == {"push", "pull"}
    at.switch_page("views/requests.py").run()
    no_exception(at)
    fig = figure(at, "requests")
    assert {t["meta"]["mode"] for t in traces_of(fig, kind="requests")} == {"push", "pull"}
    assert sum(len(t["customdata"]) for t in traces_of(fig, kind="requests")) == 40


def test_live_polls_jaeger(app, jaeger):
    now = time.time()
    jaeger.docs = generate(20, seed=22, start_unix_s=now - 200).documents
    at = app(jaeger=jaeger.url, page="views/live.py")
    no_exception(at)
    assert {m.label: m.value for m in at.metric}["pull requests"] == "10"
    jaeger.docs += generate(20, seed=23, start_unix_s=now - 100).documents
    for _ in range(20):
        at.run()
        if {m.label: m.value for m in at.metric}["pull requests"] == "20":
            break
        time.sleep(0.2)
    assert {m.label: m.value for m in at.metric}["pull requests"] == "20"
    jaeger.close()  # Jaeger goes away: old data stays, with a warning
    at.run()
    no_exception(at)
    assert {m.label: m.value for m in at.metric}["pull requests"] == "20"
    assert any("unreachable" in w.value for w in at.warning)
