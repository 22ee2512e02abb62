"""Loading from Jaeger, against a real HTTP server that behaves like jaeger-query.

The fake follows Jaeger's sources (github.com/jaegertracing/jaeger), release by release:

* API v3 (cmd/jaeger/internal/extension/jaegerquery/internal/apiv3/http_gateway.go and
  query_parser.go): ``/api/v3/services``; search ``/api/v3/traces`` with RFC 3339 bounds
  parsed strictly (``time.RFC3339Nano``), the depth from ``query.num_traces`` (before
  v2.19) or ``query.searchDepth`` > ``query.search_depth`` > ``query.num_traces``
  (v2.19+, default 100), ``query.raw_traces`` (+ ``query.rawTraces`` from v2.19);
  get ``/api/v3/traces/{id}`` reading ``raw_traces`` (+ ``rawTraces`` from v2.19) and
  not ``query.raw_traces``. Answers ``{"result": TracesData}``; nothing found is 404
  ``{"error": {"httpCode": 404, ...}}``; errors go through ``http.Error`` (text/plain,
  JSON body, newline); an unknown /api route is the router's plain "404 page not found".
* Without ``raw``, traces are adjusted (a shift stands for the clock-skew adjuster) and
  cut to ``max_trace_size`` spans (querysvc/service.go, ``receiveTraces``).
* Stores: ``memory`` (internal/storage/v2/memory/tenant.go: newest-inserted first, exact
  depth, a depth above ``max_traces`` is an error, start bounds inclusive) and
  ``cassandra`` (internal/storage/v1/cassandra/spanstore/reader.go: one index row per
  span, newest first, strict bounds, ``LIMIT depth * 3`` rows, then distinct traces).
* The internal API (``/api/traces``, ``/api/services``: microseconds, ``processes``),
  removed after v2.20 except ``/api/traces/{id}`` (commit 639eefe, #9260).
"""

from __future__ import annotations

import bisect
import copy
import json
import re
import threading
import time
import tracemalloc
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis.jaeger import JaegerSource, parse_duration
from tracedpush.analysis.model import LoadStats
from tracedpush.analysis.otlp import Decoder
from tracedpush.cli import main as cli_main
from tracedpush.testing import synthetic

Spans = list[tuple[dict, dict]]

# ------------------------------------------------------------------ fake Jaeger


def _split_by_trace(docs: list[dict[str, Any]]) -> dict[str, Spans]:
    """trace id -> [(resource, span)] from OTLP documents."""
    out: dict[str, Spans] = {}
    for d in docs:
        for rs in d["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.setdefault(s["traceId"], []).append((rs["resource"], s))
    return out


def _service(res: dict) -> str:
    for a in res["attributes"]:
        if a["key"] == sc.RES_SERVICE_NAME:
            return a["value"]["stringValue"]
    return ""


def _resource_spans(spans: Spans) -> bytes:
    """One trace's spans grouped per resource, as Jaeger's v3 API returns a trace (its
    answers concatenate each trace's ResourceSpans: http_gateway.go, returnTraces)."""
    groups: dict[int, tuple[dict, list[dict]]] = {}
    for res, s in spans:
        groups.setdefault(id(res), (res, []))[1].append(s)
    return b",".join(
        json.dumps(
            {"resource": res, "scopeSpans": [{"scope": {"name": "tracedpush"}, "spans": ss}]}
        ).encode()
        for res, ss in groups.values()
    )


def _result(fragments: list[bytes]) -> bytes:
    return b'{"result":{"resourceSpans":[' + b",".join(fragments) + b"]}}"


def _tag(key: str, value: dict[str, Any]) -> dict[str, Any]:
    (kind, v), *_ = value.items()
    typ = {"stringValue": "string", "intValue": "int64", "doubleValue": "float64"}.get(kind, "bool")
    return {"key": key, "type": typ, "value": int(v) if typ == "int64" else v}


def _legacy(trace_id: str, spans: Spans) -> dict[str, Any]:
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


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def _rfc3339_ns(text: str) -> int:
    """Go's time.Parse(time.RFC3339Nano, ...), to integer nanoseconds."""
    m = _RFC3339.match(text)
    if not m:
        raise ValueError(f'parsing time "{text}" as RFC3339Nano')
    base = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return int(base.timestamp()) * 1_000_000_000 + int((m[2] or "0").ljust(9, "0"))


class FakeJaeger:
    """A thread running an HTTP server that answers like jaeger-query `version`."""

    def __init__(
        self,
        docs: list[dict[str, Any]],
        *,
        v3: bool = True,
        version: tuple[int, int] = (2, 19),
        store: str = "memory",
        max_traces: int = 100_000,
        max_trace_size: int = 0,
        html_catch_all: bool = False,
    ) -> None:
        self.traces: dict[str, Spans] = {}
        self.order: dict[str, int] = {}  # trace id -> insertion number (memory store ring)
        self.held: dict[str, Spans] = {}  # spans not written yet (a root still in flight)
        self.v3 = v3
        self.version = version
        self.store = store
        self.max_traces = max_traces
        self.max_trace_size = max_trace_size
        self.html_catch_all = html_catch_all  # before v2.16 the UI answered unknown routes
        self.requests: list[str] = []
        self.fail_with: int | None = None
        self.failures: list[tuple[str, int | float]] = []  # (path prefix, code or stall s)
        self.short_answers = 0  # answers that left out traces without reaching the depth
        self._rows: dict[str, tuple[list[int], list[str]]] | None = None
        self._inserted = 0
        self._answers: dict[tuple[str, bool], bytes] = {}
        self.add(docs)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------- data
    def add(self, docs: list[dict[str, Any]]) -> None:
        self.add_traces(_split_by_trace(docs))

    def add_traces(self, traces: dict[str, Spans]) -> None:
        for tid, spans in traces.items():
            if tid not in self.traces:  # a new trace takes the ring's next slot
                self.order[tid] = self._inserted = self._inserted + 1
            self.traces.setdefault(tid, []).extend(spans)
        self._rows = None
        self._answers.clear()

    def hold(self, trace_id: str, *, roots_only: bool = True) -> None:
        """Take spans out of the store until `release` (exported later)."""
        spans = self.traces[trace_id]
        keep = [(r, s) for r, s in spans if roots_only and s["parentSpanId"]]
        self.held[trace_id] = [(r, s) for r, s in spans if not (roots_only and s["parentSpanId"])]
        if keep:
            self.traces[trace_id] = keep
        else:
            del self.traces[trace_id]
        self._rows = None
        self._answers.clear()

    def release(self, trace_id: str) -> None:
        self.add_traces({trace_id: self.held.pop(trace_id)})

    def fail_next(self, prefix: str, what: int | float, times: int = 1) -> None:
        """The next `times` requests under `prefix` fail with HTTP `what` (int) or stall
        `what` seconds (float) before answering."""
        self.failures += [(prefix, what)] * times

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _index(self) -> dict[str, tuple[list[int], list[str]]]:
        """service -> span start times (ns, sorted) and their trace ids: index rows."""
        if self._rows is None:
            rows: dict[str, list[tuple[int, str]]] = {}
            for tid, spans in self.traces.items():
                for res, s in spans:
                    rows.setdefault(_service(res), []).append((int(s["startTimeUnixNano"]), tid))
            self._rows = {}
            for service, items in rows.items():
                items.sort()
                self._rows[service] = ([t for t, _ in items], [tid for _, tid in items])
        return self._rows

    def search(self, service: str, lo_ns: int, hi_ns: int, depth: int) -> list[str]:
        times, tids = self._index().get(service, ([], []))
        if self.store == "cassandra":
            # start_time > ? AND start_time < ? (microseconds), newest first, LIMIT depth*3
            lo_us, hi_us = lo_ns // 1000, hi_ns // 1000
            i = bisect.bisect_right(times, lo_us * 1000 + 999)
            j = bisect.bisect_left(times, hi_us * 1000)
            picked = dict.fromkeys(tids[k] for k in range(j - 1, max(i, j - 3 * depth) - 1, -1))
            hits = list(picked)[:depth]
            if len(hits) < depth and j - i > 3 * depth and len(set(tids[i:j])) > len(hits):
                self.short_answers += 1  # traces left out, and not for the depth
            return hits
        i = bisect.bisect_left(times, lo_ns)
        j = bisect.bisect_right(times, hi_ns)  # the memory store: both bounds inclusive
        found = sorted(set(tids[i:j]), key=self.order.__getitem__, reverse=True)
        return found[:depth]

    def answer(self, tid: str, raw: bool) -> bytes:
        """One trace's ResourceSpans, serialized once (the fake must not be the bottleneck
        of a 10,000-trace test)."""
        key = (tid, raw)
        data = self._answers.get(key)
        if data is None:
            data = self._answers[key] = _resource_spans(self.answer_spans(tid, raw))
        return data

    def answer_spans(self, tid: str, raw: bool) -> Spans:
        """What Jaeger returns of one trace: raw, or adjusted and truncated."""
        spans = self.traces[tid]
        if raw:
            return spans
        out = []
        for res, s in spans:
            if s["parentSpanId"]:  # the clock-skew adjuster moves children
                s = dict(s, startTimeUnixNano=str(int(s["startTimeUnixNano"]) + 5000))
            out.append((res, s))
        return out[: self.max_trace_size] if self.max_trace_size else out

    # ---------------------------------------------------------------- HTTP
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

            def _error(self, code: int, message: str) -> None:
                """http.Error(w, json(GRPCGatewayError), code), as tryHandleError does."""
                body = json.dumps({"error": {"httpCode": code, "message": message}}) + "\n"
                self._send(code, body.encode(), "text/plain; charset=utf-8")

            def _no_route(self) -> None:
                if fake.html_catch_all:
                    return self._send(200, b"<!doctype html><html>Jaeger UI</html>", "text/html")
                return self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                fake.requests.append(self.path)
                for i, (prefix, what) in enumerate(fake.failures):
                    if url.path.startswith(prefix):
                        del fake.failures[i]
                        if isinstance(what, float):
                            time.sleep(what)
                            break
                        return self._error(what, "boom")
                if fake.fail_with:
                    return self._error(fake.fail_with, "boom")
                parts = url.path.strip("/").split("/")
                if parts[:2] == ["api", "v3"]:
                    if not fake.v3:
                        return self._no_route()
                    return self._v3(parts[2:], q)
                legacy_search = fake.version <= (2, 20)
                if parts[:2] == ["api", "traces"] and (len(parts) == 3 or legacy_search):
                    return self._legacy(parts[2:], q)
                if parts == ["api", "services"] and legacy_search:
                    services = sorted({_service(r) for sp in fake.traces.values() for r, _ in sp})
                    return self._send(200, {"data": services, "total": len(services)})
                return self._no_route()

            def _param(self, q: dict[str, str], canonical: str, snake: str) -> str:
                """getQueryParam: camelCase first from v2.19, snake_case only before."""
                if fake.version >= (2, 19) and q.get(canonical):
                    return q[canonical]
                return q.get(snake, "")

            def _v3(self, rest: list[str], q: dict[str, str]) -> None:
                if rest == ["services"]:
                    names = sorted({_service(r) for sp in fake.traces.values() for r, _ in sp})
                    return self._send(200, {"services": [*names, "jaeger"]})
                if rest == ["traces"]:
                    return self._find(q)
                if len(rest) == 2 and rest[0] == "traces":
                    raw = self._param(q, "rawTraces", "raw_traces") == "true"
                    if rest[1] not in fake.traces:
                        return self._error(404, "trace not found")
                    return self._send(200, _result([fake.answer(rest[1], raw)]))
                return self._no_route()

            def _find(self, q: dict[str, str]) -> None:
                try:
                    lo = _rfc3339_ns(self._param(q, "query.startTimeMin", "query.start_time_min"))
                    hi = _rfc3339_ns(self._param(q, "query.startTimeMax", "query.start_time_max"))
                except ValueError as exc:
                    return self._error(400, f"malformed parameter: {exc}")
                if fake.version >= (2, 19):
                    n = self._param(q, "query.searchDepth", "query.search_depth")
                    depth = int(n or q.get("query.num_traces") or 100)
                else:
                    depth = int(q.get("query.num_traces") or 0)
                if fake.store == "memory" and not 0 < depth <= fake.max_traces:
                    msg = "search depth must be greater than 0 and less than max traces"
                    return self._error(500, msg)
                raw = self._param(q, "query.rawTraces", "query.raw_traces") == "true"
                service = self._param(q, "query.serviceName", "query.service_name")
                hits = fake.search(service, lo, hi, depth)
                if not hits:
                    return self._error(404, "No traces found")
                return self._send(200, _result([fake.answer(t, raw) for t in hits]))

            def _legacy(self, rest: list[str], q: dict[str, str]) -> None:
                if rest:
                    spans = fake.traces.get(rest[0])
                    if spans is None:
                        return self._send(
                            404, {"data": None, "errors": [{"code": 404, "msg": "trace not found"}]}
                        )
                    raw = q.get("raw") == "true"
                    return self._send(
                        200,
                        {
                            "data": [_legacy(rest[0], fake.answer_spans(rest[0], raw))],
                            "total": 0,
                            "limit": 0,
                            "offset": 0,
                            "errors": None,
                        },
                    )
                depth = int(q.get("limit", 20))
                if fake.store == "memory" and depth > fake.max_traces:
                    msg = "search depth must be greater than 0 and less than max traces"
                    return self._send(500, {"data": None, "errors": [{"code": 500, "msg": msg}]})
                hits = fake.search(
                    q["service"], int(q["start"]) * 1000, int(q["end"]) * 1000, depth
                )
                raw = q.get("raw") == "true"
                data = [_legacy(t, fake.answer_spans(t, raw)) for t in hits]
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


def _source_store(url: str, **kwargs: Any) -> tuple[TraceStore, JaegerSource]:
    source = JaegerSource(url, **kwargs)
    store = TraceStore(source)
    store.refresh()
    return store, source


def _searches(fake: FakeJaeger) -> list[dict[str, str]]:
    return [
        {k: v[0] for k, v in parse_qs(urlparse(p).query).items()}
        for p in fake.requests
        if p.startswith("/api/v3/traces?")
    ]


def _spans(store: TraceStore, tid: str) -> set[tuple[str, int, int]]:
    return {(s.span_id, s.start_ns, s.end_ns) for s in store.spans(tid)}


def _clones(template: dict[str, Spans], n: int, t0_ns: int, gap_ns: int) -> dict[str, Spans]:
    """`n` copies of the template traces, new trace ids, the i-th moved to t0 + i * gap."""
    out: dict[str, Spans] = {}
    bases = list(template.values())
    for i in range(n):
        spans = bases[i % len(bases)]
        tid = f"{i + 1:032x}"
        first = min(int(s["startTimeUnixNano"]) for _, s in spans)
        shift = t0_ns + i * gap_ns - first
        out[tid] = [
            (
                res,
                dict(
                    s,
                    traceId=tid,
                    startTimeUnixNano=str(int(s["startTimeUnixNano"]) + shift),
                    endTimeUnixNano=str(int(s["endTimeUnixNano"]) + shift),
                    events=[
                        dict(e, timeUnixNano=str(int(e["timeUnixNano"]) + shift))
                        for e in s.get("events", [])
                    ],
                ),
            )
            for res, s in spans
        ]
    return out


# ------------------------------------------------------------------ basics


def test_v3_search_loads_every_trace_like_the_files(
    jaeger: FakeJaeger, gen: synthetic.SyntheticRun
) -> None:
    store = TraceStore.from_jaeger(jaeger.url, lookback="1h")
    assert store.last_error is None
    assert len(store) == 40
    assert _summary(store) == _summary(TraceStore.from_documents(gen.documents))
    searches = _searches(jaeger)
    assert searches and all(q["query.service_name"] == sc.SERVICE_PROXY for q in searches)
    # the parameters every v2 release reads (query_parser.go's deprecated aliases from v2.19)
    for q in searches:
        assert q["query.raw_traces"] == "true"
        assert q["query.num_traces"] == q["query.search_depth"] == "500"
        for key in ("query.start_time_min", "query.start_time_max"):
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", q[key]), q[key]


def test_full_search_answers_are_split(jaeger: FakeJaeger) -> None:
    store, _ = _source_store(jaeger.url, lookback="1h", limit=7)
    assert len(store) == 40  # at most 7 per answer, so the window was split
    assert len(_searches(jaeger)) > 6


def test_v3_trace_by_id(jaeger: FakeJaeger, gen: synthetic.SyntheticRun) -> None:
    wanted = [r.trace_id for r in gen.requests[:3]]
    store = TraceStore.from_jaeger(jaeger.url, trace_ids=wanted)
    assert store.last_error is None
    assert sorted(store.traces) == sorted(wanted)
    assert all(p.startswith("/api/v3/") for p in jaeger.requests)


def test_legacy_api_when_v3_is_absent(
    legacy_jaeger: FakeJaeger, gen: synthetic.SyntheticRun
) -> None:
    store = TraceStore.from_jaeger(legacy_jaeger.url, service=sc.SERVICE_PROXY, lookback="1h")
    assert store.last_error is None and store.stats.malformed == 0
    assert len(store) == 40
    # the switch is said, not silent
    assert any("no /api/v3/services" in e for e in store.stats.errors)
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


def test_legacy_when_the_ui_answers_unknown_routes(gen: synthetic.SyntheticRun) -> None:
    """Before v2.16 jaeger-query served index.html (200) for any unknown path, so a
    Jaeger without v3 answers /api/v3/services with HTML: that too means "no v3"."""
    fake = FakeJaeger(gen.documents, v3=False, version=(1, 30), html_catch_all=True)
    try:
        store = TraceStore.from_jaeger(fake.url, lookback="1h")
        assert store.last_error is None and len(store) == 40
    finally:
        fake.close()


def test_legacy_trace_by_id(legacy_jaeger: FakeJaeger, gen: synthetic.SyntheticRun) -> None:
    tid = gen.requests[5].trace_id
    store = TraceStore.from_jaeger(legacy_jaeger.url, trace_ids=[tid])
    assert list(store.traces) == [tid]
    (r,) = analyze(store).requests
    assert r.complete


def test_refresh_gets_new_traces_only(jaeger: FakeJaeger) -> None:
    store = TraceStore.from_jaeger(jaeger.url, lookback="1h")
    assert store.refresh() == 0
    assert len(_searches(jaeger)) == 2  # the second one only re-reads the recent overlap
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


def test_report_of_a_window_searches_that_window(
    jaeger: FakeJaeger, gen: synthetic.SyntheticRun, tmp_path: Any
) -> None:
    """`report --jaeger --since/--until` searches [since, until) (a second wider each
    side, for exporters' clocks), not the last `--lookback`, and keeps the requests the
    proxy received in it: those the same files give."""
    starts = sorted(r.start_unix_ns for r in gen.requests)
    since, until = (starts[9] + starts[10]) / 2e9, (starts[29] + starts[30]) / 2e9
    out = tmp_path / "w.json"
    window = ["--since", str(since), "--until", str(until)]
    args = ["report", "--jaeger", jaeger.url, *window, "--format", "json", "--out", str(out)]
    assert cli_main([*args, "--lookback", "1m"]) == 0  # a lookback that misses the window
    got = sorted(r["trace_id"] for r in json.loads(out.read_text())["requests"])
    want = sorted(r.trace_id for r in gen.requests if since * 1e9 <= r.start_unix_ns < until * 1e9)
    assert got == want and len(want) == 20
    searches = _searches(jaeger)
    assert searches
    for q in searches:
        lo = _rfc3339_ns(q["query.start_time_min"]) / 1e9
        hi = _rfc3339_ns(q["query.start_time_max"]) / 1e9
        assert since - 1.0 - 1e-5 <= lo < hi <= until + 1.0 + 1e-5  # (µs, and 1 µs early)
    files = tmp_path / "files"
    gen.write(files)
    assert cli_main(["report", "--traces", str(files), *window, "--format", "json",
                     "--out", str(tmp_path / "f.json")]) == 0  # fmt: skip
    from_files = json.loads((tmp_path / "f.json").read_text())["requests"]
    assert sorted(r["trace_id"] for r in from_files) == got


def test_parse_duration() -> None:
    assert parse_duration("1h") == 3600
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90
    assert parse_duration(15) == 15
    with pytest.raises(ValueError):
        parse_duration("soon")


# ------------------------------------------------------------------ 1. approximate depth


def test_cassandra_short_answers_are_split_on_time() -> None:
    """Cassandra reads depth*3 index rows, one per span: with 4 proxy spans per pull
    trace an answer holds fewer traces than the depth while more exist. Counting traces
    never splits such a window; counting the service's spans does."""
    run = synthetic.generate(300, seed=3, start_unix_s=time.time() - 900, engine_steps=False)
    fake = FakeJaeger(run.documents, store="cassandra")
    try:
        store, source = _source_store(fake.url, lookback="1h", limit=20)
        assert store.last_error is None
        assert fake.short_answers > 0  # the store did answer short
        assert len(store) == 300
        assert not source.saturated
        assert all(r.complete for r in analyze(store).requests)
    finally:
        fake.close()


def test_a_window_full_at_the_minimum_width_is_reported() -> None:
    run = synthetic.generate(2, seed=4, start_unix_s=time.time() - 300, engine_steps=False)
    start = time.time_ns() - 200 * 10**9
    same_ms = _clones(_split_by_trace(run.documents), 30, start, 1000)  # 30 in 30 µs
    fake = FakeJaeger([])
    fake.add_traces(same_ms)
    try:
        store, source = _source_store(fake.url, lookback="1h", limit=10)
        assert store.last_error is None
        assert 10 <= len(store) < 30
        assert "may be missing" in store.stats.errors[-1]
        assert source.saturated
    finally:
        fake.close()


# ------------------------------------------------------------------ 2. late root spans


def test_a_root_written_after_the_overlap_is_fetched_by_id(gen: synthetic.SyntheticRun) -> None:
    """The proxy exports the root when the request ends: a trace seen without it is
    fetched again by id, however long ago it started."""
    fake = FakeJaeger(gen.documents)
    try:
        tid = gen.requests[0].trace_id  # started ~600 s ago, long before the overlap
        fake.hold(tid)
        store, source = _source_store(fake.url, lookback="1h")
        assert tid in store.traces
        assert not any(s.parent_id == "" for s in store.spans(tid))
        store.refresh()  # still in flight: fetched, still rootless
        fake.release(tid)
        store.refresh()
        assert any(s.name == sc.SPAN_REQUEST for s in store.spans(tid))
        assert any(p.startswith(f"/api/v3/traces/{tid}?") for p in fake.requests)
        searched_from = _rfc3339_ns(_searches(fake)[-1]["query.start_time_min"])
        assert searched_from > max(s.start_ns for s in store.spans(tid))  # not searched
        assert tid not in source.pending
    finally:
        fake.close()


def test_refresh_overlaps_by_the_longest_request(gen: synthetic.SyntheticRun) -> None:
    """A trace none of whose spans were written at the last read (every proxy span still
    open) is found by the next search when it started within the longest request seen."""
    traces = _split_by_trace(copy.deepcopy(gen.documents))
    long_tid = gen.requests[1].trace_id
    for _, s in traces[long_tid]:
        if not s["parentSpanId"]:  # a 400 s request
            s["endTimeUnixNano"] = str(int(s["startTimeUnixNano"]) + 400 * 10**9)
    fake = FakeJaeger([])
    fake.add_traces(traces)
    late = synthetic.generate(2, seed=5, start_unix_s=time.time() - 300, engine_steps=False)
    late_ids = [r.trace_id for r in late.requests]
    fake.add(late.documents)
    try:
        for tid in late_ids:
            fake.hold(tid, roots_only=False)
        store, source = _source_store(fake.url, lookback="1h")  # margin 120 s
        assert not any(tid in store.traces for tid in late_ids)
        for tid in late_ids:
            fake.release(tid)
        store.refresh()
        assert all(tid in store.traces for tid in late_ids)
        # found by the search, which reached back further than the margin alone would
        searched_from = _rfc3339_ns(_searches(fake)[-1]["query.start_time_min"])
        earliest = min(s.start_ns for tid in late_ids for s in store.spans(tid))
        assert searched_from < earliest < time.time_ns() - 200 * 10**9
        assert not any(p.startswith("/api/v3/traces/") for p in fake.requests)
        assert source.longest_s == pytest.approx(400, abs=1)
        assert source.overlap_s() == pytest.approx(520, abs=1)
        # a configurable margin: 60 s + the longest request
        assert JaegerSource(fake.url, margin="60s", lookback="1h").overlap_s() == 60
    finally:
        fake.close()


# ------------------------------------------------------------------ 3. raw traces


@pytest.mark.parametrize("version", [(2, 18), (2, 19)])
def test_traces_come_back_raw_not_adjusted_or_truncated(
    gen: synthetic.SyntheticRun, version: tuple[int, int]
) -> None:
    fake = FakeJaeger(gen.documents, version=version, max_trace_size=3)
    truth = TraceStore.from_documents(gen.documents)
    wanted = [r.trace_id for r in gen.requests[:4]]
    try:
        by_id = TraceStore.from_jaeger(fake.url, trace_ids=wanted)
        searched = TraceStore.from_jaeger(fake.url, lookback="1h")
        for tid in wanted:
            assert _spans(by_id, tid) == _spans(truth, tid)
            assert _spans(searched, tid) == _spans(truth, tid)
        gets = [p for p in fake.requests if p.startswith("/api/v3/traces/")]
        assert gets and all("raw_traces=true" in p and "rawTraces=true" in p for p in gets)
    finally:
        fake.close()


# ------------------------------------------------------------------ 4. API choice


def test_a_failed_v3_probe_is_an_error_not_a_switch_to_legacy(
    gen: synthetic.SyntheticRun,
) -> None:
    fake = FakeJaeger(gen.documents, version=(2, 21))  # no internal search any more
    try:
        fake.fail_next("/api/v3/services", 500)  # a 500 is not retried
        store = TraceStore.from_jaeger(fake.url, lookback="1h")
        assert "HTTP 500" in (store.last_error or "")
        assert not any(p.startswith("/api/traces") for p in fake.requests)
        store.refresh()
        assert store.last_error is None and len(store) == 40
    finally:
        fake.close()


def test_a_timed_out_v3_probe_is_an_error_not_a_switch_to_legacy(
    gen: synthetic.SyntheticRun,
) -> None:
    fake = FakeJaeger(gen.documents, version=(2, 21))
    try:
        fake.fail_next("/api/v3/services", 1.0, times=2)
        store = TraceStore.from_jaeger(fake.url, lookback="1h", timeout=0.3)
        assert "unreachable" in (store.last_error or "")
        assert not any(p.startswith("/api/traces") for p in fake.requests)
        time.sleep(1.0)  # let the stalled handlers finish
        store.refresh()
        assert store.last_error is None and len(store) == 40
    finally:
        fake.close()


def test_no_jaeger_api_at_all_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeJaeger([], v3=False, version=(2, 21))  # e.g. a wrong base path
    try:
        store = TraceStore.from_jaeger(fake.url)
        assert "neither /api/v3/services nor /api/services" in (store.last_error or "")
        assert cli_main(["report", "--jaeger", fake.url]) == 1
        assert "neither" in capsys.readouterr().err
    finally:
        fake.close()


def test_forced_legacy_on_a_jaeger_without_it_is_an_error(gen: synthetic.SyntheticRun) -> None:
    fake = FakeJaeger(gen.documents, version=(2, 21))
    try:
        store, _ = _source_store(fake.url, api="legacy", service=sc.SERVICE_PROXY)
        assert "no such route" in (store.last_error or "")
    finally:
        fake.close()


# ------------------------------------------------------------------ 5. memory max_traces


@pytest.mark.parametrize("api", ["v3", "legacy"])
def test_memory_store_max_traces_below_the_depth(gen: synthetic.SyntheticRun, api: str) -> None:
    fake = FakeJaeger(gen.documents, max_traces=50, version=(2, 20))
    try:
        store, source = _source_store(fake.url, lookback="1h", api=api, service=sc.SERVICE_PROXY)
        assert store.last_error is None and len(store) == 40
        assert source.limit <= 50
        assert any("max_traces" in e for e in store.stats.errors)
    finally:
        fake.close()


# ------------------------------------------------------------------ 6. unknown trace id


def test_a_trace_id_jaeger_does_not_have_is_an_error(
    jaeger: FakeJaeger, gen: synthetic.SyntheticRun, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = "0123456789abcdef0123456789abcdef"
    known = gen.requests[0].trace_id
    store = TraceStore.from_jaeger(jaeger.url, trace_ids=[known, missing])
    assert known in store.traces
    assert missing in (store.last_error or "") and "not found" in (store.last_error or "")
    assert cli_main(["report", "--jaeger", jaeger.url, "--trace-id", missing]) == 1
    err = capsys.readouterr().err
    assert "not found" in err and missing in err


# ------------------------------------------------------------------ paging and memory


def test_ten_thousand_traces_are_paged_with_memory_bounded_by_an_answer() -> None:
    """10,000 traces in the last hour, read through a sink that keeps nothing: what the
    client holds at its peak is about one answer, not the run. (The proxy's spans only,
    to keep the test quick under tracemalloc; whole traces: docs/fleet.md's figures.)"""
    base = synthetic.generate(2, seed=6, start_unix_s=time.time() - 100, engine_steps=False)
    proxy_only = {
        tid: [(r, s) for r, s in spans if _service(r) == sc.SERVICE_PROXY]
        for tid, spans in _split_by_trace(base.documents).items()
    }
    n = 10_000
    start = time.time_ns() - 3000 * 10**9
    fake = FakeJaeger([], store="cassandra")
    fake.add_traces(_clones(proxy_only, n, start, 280 * 10**6))
    fake._index()  # the fake's own caches are built before measuring
    for tid in fake.traces:
        fake.answer(tid, raw=True)
    try:
        source = JaegerSource(fake.url, lookback="1h", timeout=30)
        stats = LoadStats()
        seen: set[str] = set()
        decoder = Decoder(lambda span: seen.add(span.trace_id), stats)
        tracemalloc.start()
        source.read(decoder, stats)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert source.last_error is None
        assert len(seen) == n and not source.saturated
        # one answer, parsed, plus the fake's own answer being built in this process
        assert peak < 12 * source.largest_answer, (peak, source.largest_answer)
        assert 12 * source.largest_answer < stats.bytes_read  # ... which is not the run
        print(
            f"\n{n} traces, {stats.fetches} requests, {source.windows} answers used, "
            f"{source.splits} dropped; {stats.bytes_read / 1e6:.1f} MB read, largest "
            f"answer {source.largest_answer / 1e6:.2f} MB, peak held {peak / 1e6:.1f} MB"
        )
    finally:
        fake.close()
