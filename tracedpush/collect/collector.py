"""`Collector`: what happens to one OTLP export request, whichever transport brought it.

Receive path (the HTTP handler's or gRPC's thread): decode, append to the store, queue
for forwarding (never waits on the target), feed the assembler. Traces the assembler
completes go to one analysis thread, which runs the existing critical path
(`tracedpush.analysis.analyze`) on each and observes the metrics, and which also
expires idle traces, so the receive path never runs the analysis.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedpush import semconv as sc
from tracedpush.analysis.analyze import analyze
from tracedpush.analysis.model import Resource, Span
from tracedpush.collect import decode
from tracedpush.collect.assemble import DEFAULT_MAX_PENDING, DEFAULT_TIMEOUT_S, Assembler
from tracedpush.collect.forward import Forwarder, Item
from tracedpush.collect.metrics import CollectMetrics
from tracedpush.collect.store import TraceFile

log = logging.getLogger("tracedpush.collect")


@dataclass(frozen=True, slots=True)
class Accepted:
    """What one export request came to: spans taken, spans rejected (partial success)."""

    spans: int
    rejected: int


class Collector:
    """Store, forward, assemble, analyse, count; thread-safe entry points `ingest_*`."""

    def __init__(
        self,
        traces_dir: str | os.PathLike[str] | None,
        *,
        forward: str | None = None,
        forward_queue: int = 1024,
        forward_timeout_s: float = 5.0,
        trace_timeout_s: float = DEFAULT_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.store = TraceFile(traces_dir) if traces_dir else None
        self.forwarder = Forwarder(forward, forward_queue, forward_timeout_s) if forward else None
        self.assembler = Assembler(trace_timeout_s, max_pending)
        self.metrics = CollectMetrics(self.dropped, lambda: self.assembler.pending)
        self.received = 0
        self.analysed = 0
        self.failed_analyses = 0
        self._ready: queue.Queue[tuple[str, list[Span]] | None] = queue.Queue(
            maxsize=max(1, max_pending)
        )
        self._sweep_every = min(1.0, max(0.05, trace_timeout_s / 4))
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tracedpush-collect", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ receive path
    def ingest_http(self, body: bytes, content_type: str | None, encoding: str | None) -> Accepted:
        """An OTLP/HTTP body; raises `decode.BadRequest` (-> 400) for a malformed one."""
        try:
            raw = decode.decompress(body, encoding)
            batch = decode.from_http(raw, content_type, None)
        except decode.BadRequest:
            self.metrics.rejected.inc()
            raise
        ctype = (content_type or decode.PROTOBUF).split(";")[0].strip()
        return self._take(batch, lambda: raw, ctype)

    def ingest_grpc(self, request: ExportTraceServiceRequest) -> Accepted:
        try:
            batch = decode.from_request(request)
        except decode.BadRequest:
            self.metrics.rejected.inc()
            raise
        return self._take(batch, request.SerializeToString, decode.PROTOBUF)

    def _take(self, batch: decode.Batch, body: Callable[[], bytes], content_type: str) -> Accepted:
        """Store, queue for forwarding (the body is only built when forwarding), assemble."""
        n = len(batch.spans)
        with self._count_lock:  # receivers run on several threads
            self.received += n
        self.metrics.spans.inc(n)
        if self.store is not None and n:
            self.store.write(batch.document)
        if self.forwarder is not None and n:
            self.forwarder.submit(Item(body(), content_type, n))
        complete, evicted = self.assembler.add(batch.spans)
        if evicted:
            self.metrics.traces.labels(sc.OUTCOME_EXPIRED).inc(evicted)
        for item in complete:
            try:
                self._ready.put_nowait(item)
            except queue.Full:  # analysis fell behind by max_pending traces
                self.metrics.traces.labels(sc.OUTCOME_EXPIRED).inc()
        return Accepted(n, batch.rejected)

    # ------------------------------------------------------------------ analysis thread
    def _run(self) -> None:
        while True:
            try:
                item = self._ready.get(timeout=self._sweep_every)
            except queue.Empty:
                pass
            else:
                if item is None:
                    self._ready.task_done()
                    return
                try:
                    self._analyse(*item)
                finally:
                    self._ready.task_done()
            expired = self.assembler.sweep()
            if expired:
                self.metrics.traces.labels(sc.OUTCOME_EXPIRED).inc(expired)

    def _analyse(self, trace_id: str, spans: Sequence[Span]) -> None:
        """The critical path of one whole trace, as `tracedpush report` computes it."""
        # The analysis tells processes apart by Resource *object* (a store's one decoder
        # interns them); spans of one process decoded from different export requests
        # carry equal but distinct objects, so intern them per trace first.
        same: dict[Resource, Resource] = {}
        for s in spans:
            s.resource = same.setdefault(s.resource, s.resource)
        try:
            run = analyze({trace_id: list(spans)}, spans=False)
        except Exception:  # one odd trace must not stop the metrics
            self.failed_analyses += 1
            log.exception("analysis of trace %s failed", trace_id)
            return
        self.metrics.traces.labels(sc.OUTCOME_COMPLETE).inc()
        for req in run.requests:
            if self.metrics.observe(req):
                self.analysed += 1

    # ------------------------------------------------------------------ state
    def dropped(self) -> dict[str, int]:
        """Spans lost by reason, store and forwarding together."""
        out = dict.fromkeys(sc.DROP_REASONS, 0)
        for part in (self.store, self.forwarder):
            if part is not None:
                for reason, n in part.dropped.items():
                    out[reason] = out.get(reason, 0) + n
        return out

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every completed trace was analysed (and forwarding drained)."""
        deadline = time.monotonic() + timeout_s
        while self._ready.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        ok = True
        if self.forwarder is not None:
            ok = self.forwarder.flush(timeout_s) and ok
        return ok

    def summary(self) -> str:
        a = self.assembler
        drops = ", ".join(f"{r} {n}" for r, n in self.dropped().items() if n) or "none"
        return (
            f"{self.received} spans received, {a.completed} traces complete, "
            f"{a.expired} expired, {a.pending} pending; dropped: {drops}"
        )

    def close(self) -> None:
        """Analyse what is complete, stop forwarding (briefly), close the file."""
        try:
            self._ready.put(None, timeout=5.0)
        except queue.Full:
            pass
        self._thread.join(timeout=5.0)
        if self.forwarder is not None:
            self.forwarder.close()
        if self.store is not None:
            self.store.close()
