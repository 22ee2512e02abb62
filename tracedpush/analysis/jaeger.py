"""Read traces from a Jaeger query service (stdlib HTTP, no client library).

What is sent was checked against Jaeger's sources (github.com/jaegertracing/jaeger; the
API v3 HTTP gateway is cmd/query/app/apiv3/http_gateway.go up to v2.13, then
cmd/jaeger/internal/extension/jaegerquery/internal/apiv3/http_gateway.go, with its
search parameters in query_parser.go from v2.19):

* Search: ``GET /api/v3/traces?query.service_name=S&query.start_time_min=T0&
  query.start_time_max=T1`` with RFC 3339 (``time.RFC3339Nano``) bounds, the depth as
  ``query.num_traces`` (v2.0+) and ``query.search_depth`` (v2.19+, which reads it
  first), and ``query.raw_traces=true``. The snake_case names are deprecated aliases of
  camelCase ones since v2.19 and still read.
* Get: ``GET /api/v3/traces/{id}`` reads ``raw_traces`` (v2.2+) and, from v2.19,
  ``rawTraces``; it ignores ``query.raw_traces``. Without them Jaeger adjusts the trace
  (clock skew) and truncates it to ``max_trace_size`` spans (querysvc/service.go,
  ``receiveTraces``), so both are sent.
* Answers are ``{"result": TracesData}`` (the v1 gRPC gateway sent several, one per
  line); "nothing found" is HTTP 404 with ``{"error": {"httpCode": 404, ...}}``; a route
  that does not exist is a plain-text 404 from the router.
* ``/api/v3/services`` decides the API: 200 means v3; only a router 404, or the UI's
  index.html (served for unknown paths before v2.16), means a Jaeger without v3 (before
  v1.35), read through the internal ``/api/traces`` (microseconds, ``processes``). Any
  other failure is an error, never a silent switch: Jaeger after
  v2.20 removed ``/api/services`` and the ``/api/traces`` search (commit 639eefe,
  #9260), so a wrongly chosen legacy API would read nothing.

Paging. A search answer holds whole traces, so one answer is the unit of memory: spans
are decoded and handed to the sink answer by answer, and an answer never holds more
than the search depth. A window is trusted only if it is clearly not full: under 90% of
the depth in traces, *and* in spans of the searched service starting in it.
The second test is what catches Cassandra, which limits index rows (one per span,
``depth * 3``: internal/storage/v1/cassandra/spanstore/reader.go), not traces, and so
answers short while more traces exist. A full window is split on time (sized from the
answer's density) down to a minimum width; one still full there is kept and reported.

Refreshing re-reads from the previous window's end minus the margin plus the longest
request seen: search matches spans by start time, and the proxy exports its root span
when the request ends. Traces seen without a root are fetched again by id later.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis.model import LoadStats, Span
from tracedpush.analysis.otlp import Decoder, Malformed

MARGIN_S = 120.0  # re-read at least this much before the previous window's end
CLOCKS_US = 1_000_000  # a search window's ends widened this much: exporters' clocks
MIN_WINDOW_US = 1_000  # search windows are not split below 1 ms
FULL = 0.9  # an answer with this share of the depth (traces or spans) may be cut off
REFETCH_MAX = 200  # rootless traces fetched again by id per refresh
PENDING_MAX = 10_000  # rootless traces remembered
GIVE_UP_S = 3600.0  # a trace still without its root after this long is left incomplete
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# memory store: internal/storage/v2/memory/memory.go, errInvalidSearchDepth
_DEPTH_ABOVE_MAX_TRACES = "less than max traces"


def parse_duration(text: str | float) -> float:
    """ "90s", "30m", "1h", "2d", "1h30m" or a number of seconds -> seconds."""
    if isinstance(text, int | float):
        return float(text)
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", s)
    if not parts or "".join(n + u for n, u in parts) != s.replace(" ", ""):
        raise ValueError(f"bad duration {text!r} (use e.g. 90s, 30m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _rfc3339(t_us: int) -> str:
    """Microseconds since the epoch as RFC 3339 (Go parses it with time.RFC3339Nano)."""
    s, us = divmod(t_us, 1_000_000)
    return datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{us:06d}Z"


class JaegerError(RuntimeError):
    """Jaeger could not be reached or answered with an error."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def no_route(self) -> bool:
        """A 404 from the HTTP router (plain text), not Jaeger's JSON "not found"."""
        return self.status == 404 and not self.body.lstrip().startswith("{")


class JaegerSource:
    """A `TraceStore` source backed by Jaeger's HTTP query API."""

    def __init__(
        self,
        url: str,
        *,
        service: str | None = None,
        lookback: str | float = "1h",
        trace_ids: Iterable[str] | None = None,
        timeout: float = 10.0,
        limit: int = 500,  # search depth: the most traces one answer (so memory) holds
        api: str = "auto",  # "auto", "v3" or "legacy"
        margin: str | float = MARGIN_S,
        retries: int = 1,
        since: float | None = None,
        until: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.service = service
        self.lookback_s = parse_duration(lookback)
        self.trace_ids = list(trace_ids or [])
        self.timeout = timeout
        self.limit = limit
        self.api = api
        self.margin_s = parse_duration(margin)
        self.retries = retries
        # unix s: search [since, until) (`report --since/--until`) instead of the lookback
        self.since_s, self.until_s = since, until
        self.last_error: str | None = None
        self.longest_s = 0.0  # longest request (root span) seen
        self.pending: dict[str, float] = {}  # rootless trace id -> when first seen
        self.windows = 0  # search answers used
        self.splits = 0  # search answers dropped because they may have been cut off
        self.largest_answer = 0  # bytes: what one answer costs, the unit of memory
        self.saturated: list[str] = []  # minimum-width windows still full (last read)
        self._until_us: int | None = None  # end of the last window searched
        self._services: list[str] | None = None  # what /api/v3/services listed
        self._exact = False  # the store counts traces exactly (Jaeger's memory store)
        self._notes: list[str] = []

    def describe(self) -> str:
        return f"jaeger {self.url}" + (f" service={self.service}" if self.service else "")

    # ------------------------------------------------------------------ HTTP
    def _get(self, path: str, params: dict[str, Any] | None, stats: LoadStats) -> bytes:
        """GET, retried on a transient failure; JaegerError for any other answer than 2xx."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        for attempt in range(self.retries + 1):
            stats.fetches += 1
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    data = resp.read()
                stats.bytes_read += len(data)
                return data
            except urllib.error.HTTPError as exc:
                body = exc.read()[:400].decode("utf-8", "replace")
                err = JaegerError(f"{url}: HTTP {exc.code}: {body.strip()}", exc.code, body)
                if exc.code not in (502, 503, 504) or attempt == self.retries:
                    raise err from exc
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                if attempt == self.retries:
                    msg = f"Jaeger at {self.url} is unreachable: {reason}"
                    raise JaegerError(msg) from exc
        raise AssertionError("unreachable")

    @staticmethod
    def _documents(data: bytes) -> list[Any]:
        """One JSON document, or newline-separated ones (the v1 gRPC gateway's stream)."""
        try:
            docs = [json.loads(data)]
        except ValueError:
            docs = [json.loads(line) for line in data.splitlines() if line.strip()]
        for doc in docs:
            if not isinstance(doc, dict):
                continue
            err = doc.get("error")
            if isinstance(err, dict) and "result" not in doc:
                raise JaegerError(f"Jaeger error: {err.get('message') or err}")
            if doc.get("errors") and not doc.get("data"):
                raise JaegerError(f"Jaeger errors: {doc['errors']}")
        return docs

    # ------------------------------------------------------------------ API choice
    def _resolve_api(self, stats: LoadStats) -> None:
        """Probe /api/v3/services once it answers; fall back to legacy only on a 404."""
        if self.api == "legacy" or self._services is not None:
            return
        try:
            data = self._get("/api/v3/services", None, stats)
        except JaegerError as exc:
            if not exc.no_route or self.api == "v3":
                raise
            data = b"<404>"
        if data.lstrip()[:1] == b"<":  # a 404, or the UI's index.html (before v2.16)
            if self.api == "v3":
                raise JaegerError(f"{self.url} does not serve /api/v3/services", 404)
            self.api = "legacy"
            self._notes.append(
                f"{self.url} has no /api/v3/services route: Jaeger before 1.35, read "
                "through its internal /api/traces API"
            )
            return
        self.api = "v3"
        self._services = [str(n) for n in json.loads(data).get("services") or []]

    def services(self, stats: LoadStats) -> list[str]:
        self._resolve_api(stats)
        if self._services is not None:
            return self._services
        try:
            data = self._get("/api/services", None, stats)
        except JaegerError as exc:
            if exc.no_route:
                raise JaegerError(
                    f"{self.url} has neither /api/v3/services nor /api/services (HTTP 404): "
                    "is it Jaeger's query service (port 16686), with its base path?",
                    404,
                ) from exc
            raise
        self._services = [str(n) for n in json.loads(data).get("data") or []]
        return self._services

    def _services_to_search(self, stats: LoadStats) -> list[str]:
        if self.service:
            return [self.service]
        names = self.services(stats)
        proxies = [n for n in names if n == sc.SERVICE_PROXY or "proxy" in n]
        # every trace through the proxy has the proxy's root span; without proxies
        # (requests sent straight to the engines) search the engines themselves.
        return proxies or [n for n in names if not n.startswith("jaeger")] or [sc.SERVICE_PROXY]

    # ------------------------------------------------------------------ get by id
    def trace(self, trace_id: str, decoder: Decoder, stats: LoadStats) -> bool:
        """Fetch one trace (raw: not adjusted, not truncated); False if Jaeger has none."""
        self._resolve_api(stats)
        if self.api == "legacy":
            path, params = f"/api/traces/{trace_id}", {"raw": "true"}
        else:
            path, params = f"/api/v3/traces/{trace_id}", {"raw_traces": "true", "rawTraces": "true"}
        try:
            data = self._get(path, params, stats)
        except JaegerError as exc:
            if exc.status == 404:
                return False
            raise
        self._hand_on(self._documents(data), decoder, stats)
        return True

    # ------------------------------------------------------------------ search
    def _search(
        self, service: str, a_us: int, b_us: int, stats: LoadStats
    ) -> tuple[list[Any], int, int, int]:
        """One answer for [a, b): documents, distinct traces, spans of `service` starting
        in the window, and the earliest such start (µs)."""
        # Cassandra compares start_time strictly on both sides, the memory store neither:
        # starting 1 µs early leaves no instant of a boundary unread by either.
        lo, hi = a_us - 1, b_us
        while True:
            depth = self.limit
            if self.api == "legacy":
                path = "/api/traces"
                params: dict[str, Any] = {
                    "service": service,
                    "start": lo,
                    "end": hi,
                    "limit": depth,
                    "raw": "true",
                }
            else:
                path = "/api/v3/traces"
                params = {
                    "query.service_name": service,
                    "query.start_time_min": _rfc3339(lo),
                    "query.start_time_max": _rfc3339(hi),
                    "query.num_traces": depth,
                    "query.search_depth": depth,
                    "query.raw_traces": "true",
                }
            try:
                data = self._get(path, params, stats)
                break
            except JaegerError as exc:
                if exc.status == 404 and not exc.no_route:
                    return [], 0, 0, b_us  # v3: "No traces found"
                if exc.no_route:
                    raise JaegerError(
                        f"{self.url}{path}: HTTP 404, no such route: this Jaeger does not "
                        f"serve the {'internal' if self.api == 'legacy' else 'v3'} search API",
                        404,
                    ) from exc
                if _DEPTH_ABOVE_MAX_TRACES not in exc.body or depth <= 1:
                    raise
                # Jaeger's memory store refuses a depth above its max_traces
                self.limit = depth // 2
                self._exact = True
                self._notes.append(
                    f"Jaeger's memory store keeps fewer than {depth} traces (its max_traces): "
                    f"searching {self.limit} at a time"
                )
        self.largest_answer = max(self.largest_answer, len(data))
        docs = self._documents(data)
        del data
        traces, rows, first = _census(docs, service, lo * 1000, hi * 1000)
        return docs, len(traces), rows, min(first // 1000, b_us)

    def _full(self, n: int, rows: int) -> bool:
        """May the store have left traces out of this answer?"""
        threshold = max(1, int(FULL * self.limit))
        return n >= threshold or (not self._exact and rows >= threshold)

    def _walk(self, service: str, a: int, end: int, decoder: Decoder, stats: LoadStats) -> int:
        """[a, end) (µs) in time windows no answer of which may have been cut off, handed
        on one answer at a time; returns the number of spans."""
        step = end - a
        n_spans = 0
        while a < end:
            b = min(end, a + step)
            docs, n, rows, first = self._search(service, a, b, stats)
            if self._full(n, rows):
                if b - a > MIN_WINDOW_US:
                    # size the retry from the answer's density: it holds the newest part
                    # of the window (Cassandra orders by start time, the memory store by
                    # arrival), `rows` spans in [first, b)
                    self.splits += 1
                    target = max(1, int(FULL * self.limit) // 2)
                    guess = (b - first) * target // rows if rows else (b - a) // 2
                    step = max(MIN_WINDOW_US, min((b - a) // 2, guess))
                    continue
                self.saturated.append(
                    f"{service} {_rfc3339(a)}..{_rfc3339(b)}: {n} traces, {rows} spans"
                )
            self.windows += 1
            n_spans += self._hand_on(docs, decoder, stats)
            del docs
            # aim the next window at half the threshold, growing at most 4-fold
            target = max(1, int(FULL * self.limit) // 2)
            used = n if self._exact else max(n, rows)
            step = max(MIN_WINDOW_US, int((b - a) * min(4.0, target / max(used, 1))))
            a = b
        return n_spans

    # ------------------------------------------------------------------ decoding
    def _hand_on(self, docs: list[Any], decoder: Decoder, stats: LoadStats) -> int:
        """Decode documents into `decoder`, noting which traces lack their root span."""
        seen: set[str] = set()
        rooted: set[str] = set()
        longest = self.longest_s

        def sink(span: Span) -> None:
            nonlocal longest
            seen.add(span.trace_id)
            if not span.parent_id:
                rooted.add(span.trace_id)
                longest = max(longest, (span.end_ns - span.start_ns) / 1e9)
            decoder.sink(span)

        tap = Decoder(sink, stats)
        tap._resources = decoder._resources  # share interned resources
        n = 0
        for doc in docs:
            try:
                n += tap.document(doc)
            except Malformed as exc:
                stats.malformed += 1
                stats.note(f"jaeger answer skipped: {exc}")
        self.longest_s = longest
        now = time.time()
        for tid in seen:
            if tid in rooted:
                self.pending.pop(tid, None)
            elif tid not in self.pending:
                self.pending[tid] = now
        while len(self.pending) > PENDING_MAX:
            del self.pending[next(iter(self.pending))]
        return n

    def _refetch(self, before: float, decoder: Decoder, stats: LoadStats) -> None:
        """Fetch again, by id, traces an earlier read saw without their root span."""
        now = time.time()
        due = [t for t, seen in self.pending.items() if seen < before][:REFETCH_MAX]
        given_up = []
        for tid in due:
            first = self.pending.pop(tid)
            if now - first > GIVE_UP_S:
                given_up.append(tid)
                continue
            if not self.trace(tid, decoder, stats):
                continue  # gone from the store (evicted, expired)
            if tid in self.pending:  # still rootless: back of the queue, same first sighting
                del self.pending[tid]
                self.pending[tid] = first
        if given_up:
            self._notes.append(
                f"{len(given_up)} trace(s) still without a root span {GIVE_UP_S:.0f} s after "
                f"they were first seen, no longer fetched (e.g. {given_up[0]})"
            )

    def overlap_s(self) -> float:
        """How far before the previous window's end a refresh searches again: a request
        started that long ago may have exported its root span since."""
        return min(self.margin_s + self.longest_s, max(self.margin_s, self.lookback_s))

    # ------------------------------------------------------------------ Source
    def read(self, decoder: Decoder, stats: LoadStats) -> None:
        started = time.time()
        self._notes = []
        self.saturated = []
        try:
            self._resolve_api(stats)
            if self.trace_ids:
                missing = [t for t in self.trace_ids if not self.trace(t, decoder, stats)]
                self._flush_notes(stats)
                self.last_error = None
                if missing:
                    self.last_error = (
                        f"not found in Jaeger at {self.url} ({self.api} API): "
                        f"trace {', '.join(missing)}"
                    )
                    stats.note(self.last_error)
                return
            now_us = int(started * 1e6)
            if self._until_us is not None:
                t0_us = self._until_us - int(self.overlap_s() * 1e6)
            elif self.since_s is not None:
                t0_us = int(self.since_s * 1e6) - CLOCKS_US
            else:
                t0_us = now_us - int(self.lookback_s * 1e6)
            end_us = now_us if self.until_s is None else int(self.until_s * 1e6)
            for service in self._services_to_search(stats):
                self._walk(service, t0_us, end_us + CLOCKS_US, decoder, stats)
            self._until_us = end_us
            self._refetch(started, decoder, stats)
            if self.saturated:
                self._notes.append(
                    f"{len(self.saturated)} search window(s) of {MIN_WINDOW_US // 1000} ms "
                    f"still held {int(FULL * 100)}% of the search depth ({self.limit}): "
                    f"traces starting there may be missing ({self.saturated[0]})"
                )
            self.last_error = None
            self._flush_notes(stats)
        except JaegerError as exc:
            stats.fetch_errors += 1
            self.last_error = str(exc)
            self._flush_notes(stats)
            stats.note(str(exc))
        except (ValueError, Malformed) as exc:
            stats.fetch_errors += 1
            self.last_error = f"Jaeger answered something that is not JSON: {exc}"
            self._flush_notes(stats)
            stats.note(self.last_error)

    def _flush_notes(self, stats: LoadStats) -> None:
        for note in self._notes:
            stats.note(note)
        self._notes = []


def _census(docs: list[Any], service: str, lo_ns: int, hi_ns: int) -> tuple[set[str], int, int]:
    """Trace ids in an answer, the spans of `service` starting in [lo, hi] (the index rows
    a store may have counted), and the earliest of those starts (ns)."""
    traces: set[str] = set()
    rows = 0
    first = hi_ns
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        body = doc.get("result", doc)
        if isinstance(body, dict) and "resourceSpans" in body:
            for rs in body.get("resourceSpans") or ():
                attrs = (rs.get("resource") or {}).get("attributes") or ()
                ours = any(
                    a.get("key") == sc.RES_SERVICE_NAME
                    and (a.get("value") or {}).get("stringValue") == service
                    for a in attrs
                )
                for ss in rs.get("scopeSpans") or ():
                    for s in ss.get("spans") or ():
                        traces.add(s.get("traceId", ""))
                        if ours:
                            t = int(s.get("startTimeUnixNano") or 0)
                            if lo_ns <= t <= hi_ns:
                                rows += 1
                                first = min(first, t)
        elif isinstance(doc.get("data"), list):  # internal API
            for tr in doc["data"]:
                traces.add(tr.get("traceID", ""))
                procs = tr.get("processes") or {}
                for s in tr.get("spans") or ():
                    proc = procs.get(s.get("processID"), {})
                    if proc.get("serviceName") == service:
                        t = int(s.get("startTime") or 0) * 1000
                        if lo_ns <= t <= hi_ns:
                            rows += 1
                            first = min(first, t)
    return traces, rows, first
