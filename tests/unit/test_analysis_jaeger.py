"""Loading from Jaeger, against a real HTTP server answering in Jaeger's formats.

The server speaks Jaeger's query API: v3 (``/api/v3/services``, ``/api/v3/traces`` search
with RFC 3339 bounds and ``query.search_depth``, ``/api/v3/traces/{id}``; answers
``{"result": TracesData}``, errors ``{"error": {"httpCode", "message"}}``) and the
internal API (``/api/traces`` with microsecond ``start``/``end``, ``/api/traces/{id}``;
answers ``{"data": [trace], "total", "limit", "offset", "errors"}`` with ``processes``,
typed ``tags``, ``references`` and ``logs``, as jaeger-query's JSON model writes them).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis.jaeger import parse_duration
from tracedpush.cli import main as cli_main
from tracedpush.testing import synthetic

# ------------------------------------------------------------------ fake Jaeger


def _split_by_trace(docs: list[dict[str, Any]]) -> dict[str, list[tuple[dict, dict]]]:
    """trace id -> [(resource, span)] from OTLP documents."""
    out: dict[str, list[tuple[dict, dict]]] = {}
    for d in docs:
        for rs in d["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.setdefault(s["traceId"], []).append((rs["resource"], s))
    return out


def _otlp(traces: list[list[tuple[dict, dict]]]) -> dict[str, Any]:
    """Spans regrouped per resource, as Jaeger's v3 API returns them."""
    groups: dict[str, tuple[dict, list[dict]]] = {}
    for spans in traces:
        for res, s in spans:
            key = json.dumps(res, sort_keys=True)
            groups.setdefault(key, (res, []))[1].append(s)
    return {
        "resourceSpans": [
            {"resource": res, "scopeSpans": [{"scope": {"name": "tracedpush"}, "spans": spans}]}
            for res, spans in groups.values()
        ]
    }


def _tag(key: str, value: dict[str, Any]) -> dict[str, Any]:
    (kind, v), *_ = value.items()
    typ = {"stringValue": "string", "intValue": "int64", "doubleValue": "float64"}.get(kind, "bool")
    return {"key": key, "type": typ, "value": int(v) if typ == "int64" else v}


def _legacy(trace_id: str, spans: list[tuple[dict, dict]]) -> dict[str, Any]:
    """One trace in jaeger-query's internal JSON model (microseconds, processes)."""
    processes: dict[str, dict[str, Any]] = {}
    pids: dict[str, str] = {}
    out = []
    kinds = {1: "internal", 2: "server", 3: "client"}
    for res, s in spans:
        key = json.dumps(res, sort_keys=True)
        if key not in pids:
            pids[key] = f"p{len(pids) + 1}"
            attrs = {a["key"]: a["value"] for a in res["attributes"]}
            processes[pids[key]] = {
                "serviceName": attrs.pop(sc.RES_SERVICE_NAME)["stringValue"],
                "tags": [_tag(k, v) for k, v in attrs.items()],
            }
        start_us = int(s["startTimeUnixNano"]) // 1000
        tags = [_tag(a["key"], a["value"]) for a in s["attributes"]]
        tags.append({"key": "span.kind", "type": "string", "value": kinds[s["kind"]]})
        if s["status"].get("code") == 2:
            tags.append({"key": "otel.status_code", "type": "string", "value": "ERROR"})
            tags.append({"key": "error", "type": "bool", "value": True})
        tags.append({"key": "internal.span.format", "type": "string", "value": "otlp"})
        out.append(
            {
                "traceID": trace_id,
                "spanID": s["spanId"],
                "operationName": s["name"],
                "references": (
                    [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": s["parentSpanId"]}]
                    if s["parentSpanId"]
                    else []
                ),
                "startTime": start_us,
                "duration": int(s["endTimeUnixNano"]) // 1000 - start_us,
                "tags": tags,
                "logs": [
                    {
                        "timestamp": int(e["timeUnixNano"]) // 1000,
                        "fields": [{"key": "event", "type": "string", "value": e["name"]}],
                    }
                    for e in s.get("events", [])
                ],
                "processID": pids[json.dumps(res, sort_keys=True)],
                "warnings": None,
            }
        )
    return {"traceID": trace_id, "spans": out, "processes": processes, "warnings": None}


class FakeJaeger:
    """A thread running an HTTP server that answers like jaeger-query."""

    def __init__(self, docs: list[dict[str, Any]], *, v3: bool = True) -> None:
        self.traces = _split_by_trace(docs)
        self.v3 = v3
        self.requests: list[str] = []
        self.fail_with: int | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, docs: list[dict[str, Any]]) -> None:
        for tid, spans in _split_by_trace(docs).items():
            self.traces.setdefault(tid, []).extend(spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _root_start_s(self, spans: list[tuple[dict, dict]]) -> float:
        return min(int(s["startTimeUnixNano"]) for _, s in spans) / 1e9

    def _search(self, service: str, t0: float, t1: float, limit: int) -> list[str]:
        hits = []
        for tid, spans in self.traces.items():
            services = {
                a["value"]["stringValue"]
                for res, _ in spans
                for a in res["attributes"]
                if a["key"] == sc.RES_SERVICE_NAME
            }
            if service in services and t0 <= self._root_start_s(spans) < t1:
                hits.append(tid)
        hits.sort(key=lambda t: self._root_start_s(self.traces[t]), reverse=True)  # newest
        return hits[:limit]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                fake.requests.append(self.path)
                if fake.fail_with:
                    return self._send(
                        fake.fail_with, {"error": {"httpCode": fake.fail_with, "message": "boom"}}
                    )
                parts = url.path.strip("/").split("/")
                if parts[:2] == ["api", "v3"]:
                    if not fake.v3:
                        return self._send(404, b"404 page not found\n", "text/plain")
                    return self._v3(parts[2:], q)
                if parts[:2] == ["api", "traces"]:
                    return self._legacy(parts[2:], q)
                if parts == ["api", "services"]:
                    return self._send(200, {"data": [sc.SERVICE_PROXY], "total": 1})
                return self._send(404, b"404 page not found\n", "text/plain")

            def _v3(self, rest: list[str], q: dict[str, str]) -> None:
                if rest == ["services"]:
                    return self._send(
                        200,
                        {
                            "services": [
                                sc.SERVICE_PROXY,
                                sc.SERVICE_PREFILL,
                                sc.SERVICE_DECODE,
                                "jaeger",
                            ]
                        },
                    )
                if rest == ["traces"]:
                    try:  # RFC 3339, as Jaeger parses them
                        t0 = datetime.fromisoformat(
                            q["query.start_time_min"].replace("Z", "+00:00")
                        )
                        t1 = datetime.fromisoformat(
                            q["query.start_time_max"].replace("Z", "+00:00")
                        )
                    except (KeyError, ValueError) as exc:
                        msg = f"malformed parameter: {exc}"
                        return self._send(400, {"error": {"httpCode": 400, "message": msg}})
                    limit = int(q.get("query.search_depth") or q.get("query.num_traces") or 20)
                    hits = fake._search(
                        q["query.service_name"], t0.timestamp(), t1.timestamp(), limit
                    )
                    if not hits:
                        return self._send(
                            404, {"error": {"httpCode": 404, "message": "trace not found"}}
                        )
                    return self._send(200, {"result": _otlp([fake.traces[t] for t in hits])})
                if len(rest) == 2 and rest[0] == "traces":
                    spans = fake.traces.get(rest[1])
                    if spans is None:
                        return self._send(
                            404, {"error": {"httpCode": 404, "message": "trace not found"}}
                        )
                    return self._send(200, {"result": _otlp([spans])})
                return self._send(404, b"404 page not found\n", "text/plain")

            def _legacy(self, rest: list[str], q: dict[str, str]) -> None:
                if rest:
                    spans = fake.traces.get(rest[0])
                    if spans is None:
                        return self._send(
                            404, {"data": None, "errors": [{"code": 404, "msg": "trace not found"}]}
                        )
                    return self._send(
                        200,
                        {
                            "data": [_legacy(rest[0], spans)],
                            "total": 0,
                            "limit": 0,
                            "offset": 0,
                            "errors": None,
                        },
                    )
                hits = fake._search(
                    q["service"],
                    int(q["start"]) / 1e6,
                    int(q["end"]) / 1e6,
                    int(q.get("limit", 20)),
                )
                data = [_legacy(t, fake.traces[t]) for t in hits]
                return self._send(
                    200, {"data": data, "total": len(data), "limit": 0, "offset": 0, "errors": None}
                )

        return Handler


@pytest.fixture(scope="module")
def gen() -> synthetic.SyntheticRun:
    return synthetic.generate(40, seed=8, start_unix_s=time.time() - 600)


@pytest.fixture
def jaeger(gen: synthetic.SyntheticRun) -> Iterator[FakeJaeger]:
    fake = FakeJaeger(gen.documents)
    yield fake
    fake.close()


@pytest.fixture
def legacy_jaeger(gen: synthetic.SyntheticRun) -> Iterator[FakeJaeger]:
    fake = FakeJaeger(gen.documents, v3=False)
    yield fake
    fake.close()


def _summary(store: TraceStore) -> dict[str, tuple[float | None, tuple[str, ...]]]:
    return {
        r.trace_id: (r.ttft_ms, tuple(s.phase for s in r.critical_path))
        for r in analyze(store).requests
    }


# ------------------------------------------------------------------ tests


def test_v3_search_loads_every_trace_like_the_files(
    jaeger: FakeJaeger, gen: synthetic.SyntheticRun
) -> None:
    store = TraceStore.from_jaeger(jaeger.url, lookback="1h")
    assert store.last_error is None
    assert len(store) == 40
    assert _summary(store) == _summary(TraceStore.from_documents(gen.documents))
    searches = [p for p in jaeger.requests if p.startswith("/api/v3/traces?")]
    assert searches and all("query.service_name=tracedpush-proxy" in p for p in searches)


def test_full_search_answers_are_split(jaeger: FakeJaeger) -> None:
    store = TraceStore(None)
    from tracedpush.analysis.jaeger import JaegerSource

    store.source = JaegerSource(jaeger.url, lookback="1h", limit=7)
    store.refresh()
    assert len(store) == 40  # 7 per answer, so the window was split until nothing was cut
    assert sum(p.startswith("/api/v3/traces?") for p in jaeger.requests) > 6


def test_v3_trace_by_id(jaeger: FakeJaeger, gen: synthetic.SyntheticRun) -> None:
    wanted = [r.trace_id for r in gen.requests[:3]]
    store = TraceStore.from_jaeger(jaeger.url, trace_ids=wanted)
    assert sorted(store.traces) == sorted(wanted)
    assert all(p.startswith("/api/v3/traces/") for p in jaeger.requests)


def test_legacy_api_when_v3_is_absent(
    legacy_jaeger: FakeJaeger, gen: synthetic.SyntheticRun
) -> None:
    store = TraceStore.from_jaeger(legacy_jaeger.url, service=sc.SERVICE_PROXY, lookback="1h")
    assert store.last_error is None and store.stats.malformed == 0
    assert len(store) == 40
    run = analyze(store)
    truth = gen.by_trace()
    for r in run.requests:
        t = truth[r.trace_id]
        # microsecond timestamps: TTFT within a few microseconds, path sums within 1 ms
        assert r.ttft_ms == pytest.approx(t.ttft_ms, abs=0.01)
        assert abs(sum(s.duration_ms for s in r.critical_path) - r.ttft_ms) < 1.0
        assert r.complete, r.problems
        assert r.mode == t.mode
    root = next(s for s in store.all_spans() if s.name == sc.SPAN_REQUEST)
    assert root.kind == 2 and root.resource.instance == synthetic.PROXY_INSTANCE
    assert root.event_ns(sc.EVENT_FIRST_TOKEN) is not None
    assert any(p.startswith("/api/traces?") for p in legacy_jaeger.requests)


def test_legacy_trace_by_id(legacy_jaeger: FakeJaeger, gen: synthetic.SyntheticRun) -> None:
    tid = gen.requests[5].trace_id
    store = TraceStore.from_jaeger(legacy_jaeger.url, trace_ids=[tid])
    assert list(store.traces) == [tid]
    (r,) = analyze(store).requests
    assert r.complete


def test_refresh_gets_new_traces_only(jaeger: FakeJaeger) -> None:
    store = TraceStore.from_jaeger(jaeger.url, lookback="1h")
    assert store.refresh() == 0
    searches = [p for p in jaeger.requests if p.startswith("/api/v3/traces?")]
    assert len(searches) == 2  # the second one only re-reads the recent overlap window
    # request traces only: a search by the proxy's service does not reach the engines'
    # per-process step traces (docs/report.md, "Engine steps")
    more = synthetic.generate(4, seed=99, start_unix_s=time.time() - 30, engine_steps=False)
    jaeger.add(more.documents)
    added = store.refresh()
    assert added == sum(
        len(ss["spans"])
        for d in more.documents
        for rs in d["resourceSpans"]
        for ss in rs["scopeSpans"]
    )
    assert len(store) == 44
    assert store.refresh() == 0 and store.stats.duplicates >= added  # overlap re-read


def test_unreachable_jaeger_is_a_message_not_a_crash(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeJaeger([])
    url = fake.url
    fake.close()  # nothing listens there any more
    store = TraceStore.from_jaeger(url, timeout=2)
    assert "unreachable" in (store.last_error or "")
    assert store.stats.fetch_errors == 1 and len(store) == 0
    assert cli_main(["report", "--jaeger", url]) == 1
    assert "unreachable" in capsys.readouterr().err


def test_jaeger_error_answer(jaeger: FakeJaeger) -> None:
    jaeger.fail_with = 500
    store = TraceStore.from_jaeger(jaeger.url)
    assert "HTTP 500" in (store.last_error or "")
    jaeger.fail_with = None
    store.refresh()
    assert store.last_error is None and len(store) == 40


def test_report_command_from_jaeger(jaeger: FakeJaeger, tmp_path: Any) -> None:
    out = tmp_path / "r.json"
    assert cli_main(["report", "--jaeger", jaeger.url, "--format", "json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["requests"]) == 40


def test_parse_duration() -> None:
    assert parse_duration("1h") == 3600
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90
    assert parse_duration(15) == 15
    with pytest.raises(ValueError):
        parse_duration("soon")
