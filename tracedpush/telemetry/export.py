"""Where spans go: per-exporter background workers with bounded, counted drop queues.

Configuration follows OpenTelemetry's environment variables:
- a traces directory (argument, or `TRACEDPUSH_TRACES_DIR`) -> OTLP JSON lines files;
- `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` -> OTLP, over
  `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`
  (`http/protobuf`, the spec's default, or `grpc`);
- `OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`, comma-separated) overrides which.

Each exporter runs on its own thread behind a bounded queue: an OTLP endpoint that is
down retries inside its own thread while the queue fills and then drops (counted, and
reported in the log at most every 30 s). Nothing here ever blocks the caller.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from tracedpush import __version__, semconv
from tracedpush.telemetry.jsonl import JsonLinesSpanExporter
from tracedpush.telemetry.threads import name_os_thread

log = logging.getLogger("tracedpush.export")

ENV_TRACES_DIR = "TRACEDPUSH_TRACES_DIR"
DEFAULT_MAX_QUEUE = 8192
DEFAULT_BATCH = 512
REPORT_EVERY_S = 30.0


def make_resource(
    service_name: str, instance_id: str, extra: dict[str, Any] | None = None
) -> Resource:
    attrs: dict[str, Any] = {
        semconv.RES_SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name,
        semconv.RES_SERVICE_INSTANCE_ID: instance_id,
        semconv.RES_HOST_NAME: socket.gethostname(),
        semconv.RES_PROCESS_PID: os.getpid(),
        semconv.RES_TRACEDPUSH_VERSION: __version__,
    }
    attrs.update(extra or {})
    return Resource.create(attrs)


class ExportWorker:
    """One exporter on one daemon thread, fed through a bounded queue."""

    def __init__(self, name: str, exporter: SpanExporter, max_queue: int = DEFAULT_MAX_QUEUE):
        self.name = name
        self.exporter = exporter
        self.max_queue = max_queue
        self.exported = 0
        self.dropped = 0
        self.failed_batches = 0
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._idle = threading.Event()
        self._idle.set()
        self._last_report = time.monotonic()
        self._reported_drops = 0
        self._thread = threading.Thread(
            target=self._run, name=f"tracedpush-export-{name}", daemon=True
        )
        self._thread.start()

    def submit(self, spans: Sequence[ReadableSpan]) -> None:
        room = self.max_queue - len(self._queue)
        if room < len(spans):
            self.dropped += len(spans) - max(room, 0)
            spans = spans[: max(room, 0)]
        self._queue.extend(spans)
        self._idle.clear()
        self._wake.set()

    def _run(self) -> None:
        name_os_thread(f"tracedpush-exp{self.name[:1]}")  # 15 bytes at most
        while True:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(DEFAULT_BATCH, len(self._queue)))]
                try:
                    ok = self.exporter.export(batch).name == "SUCCESS"
                except Exception:  # an exporter must never take the thread down
                    log.exception("tracedpush exporter %s raised", self.name)
                    ok = False
                if ok:
                    self.exported += len(batch)
                else:
                    self.failed_batches += 1
                    self.dropped += len(batch)
            self._idle.set()
            self._maybe_report()
            if self._stop:
                return

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if self.dropped > self._reported_drops and now - self._last_report >= REPORT_EVERY_S:
            log.warning(
                "tracedpush exporter %s: %d spans dropped so far (%d exported, %d failed batches)",
                self.name,
                self.dropped,
                self.exported,
                self.failed_batches,
            )
            self._reported_drops = self.dropped
            self._last_report = now

    def flush(self, timeout_s: float) -> bool:
        self._wake.set()
        return self._idle.wait(timeout_s)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        if self.dropped > self._reported_drops:
            log.warning(
                "tracedpush exporter %s: %d spans dropped in total", self.name, self.dropped
            )
        try:
            self.exporter.shutdown()
        except Exception:
            log.exception("tracedpush exporter %s failed to shut down", self.name)


class SpanSink:
    """Fan finished spans out to every configured exporter worker."""

    def __init__(self, workers: list[ExportWorker]):
        self.workers = workers
        self._closed = False
        atexit.register(self.shutdown)

    def emit(self, spans: Sequence[ReadableSpan]) -> None:
        for worker in self.workers:
            worker.submit(spans)

    def flush(self, timeout_s: float = 5.0) -> bool:
        return all(w.flush(timeout_s) for w in self.workers)

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            w.name: {"exported": w.exported, "dropped": w.dropped, "queued": len(w._queue)}
            for w in self.workers
        }

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self.workers:
            worker.shutdown(timeout_s)


def _otlp_exporter() -> SpanExporter:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http()
    raise ValueError(f"unsupported OTLP protocol {protocol!r} (use grpc or http/protobuf)")


def build_exporters(traces_dir: str | os.PathLike[str] | None, stem: str) -> list[ExportWorker]:
    """Exporter workers for a process, from the traces dir and the OTEL_* environment."""
    workers: list[ExportWorker] = []
    traces_dir = traces_dir or os.environ.get(ENV_TRACES_DIR)
    if traces_dir:
        workers.append(ExportWorker("jsonl", JsonLinesSpanExporter(Path(traces_dir), stem)))
    has_endpoint = bool(
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    wanted = os.environ.get("OTEL_TRACES_EXPORTER", "otlp" if has_endpoint else "none")
    for name in (n.strip() for n in wanted.split(",")):
        if name == "otlp":
            workers.append(ExportWorker("otlp", _otlp_exporter()))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            workers.append(ExportWorker("console", ConsoleSpanExporter()))
        elif name not in ("none", ""):
            raise ValueError(
                f"unsupported OTEL_TRACES_EXPORTER {name!r} (use otlp, console or none)"
            )
    return workers


class _SinkProcessor(SpanProcessor):
    """Hand each ended SDK span to the sink (whose workers batch and export)."""

    def __init__(self, sink: SpanSink):
        self.sink = sink

    def on_end(self, span: ReadableSpan) -> None:
        self.sink.emit((span,))

    def shutdown(self) -> None:
        self.sink.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.sink.flush(timeout_millis / 1000)


def build_tracer_provider(
    service_name: str,
    instance_id: str,
    traces_dir: str | os.PathLike[str] | None,
    extra_resource: dict[str, Any] | None = None,
) -> TracerProvider:
    """A TracerProvider for the proxy: JSONL files and/or OTLP, never blocking."""
    provider = TracerProvider(resource=make_resource(service_name, instance_id, extra_resource))
    workers = build_exporters(traces_dir, stem=service_name)
    if workers:
        provider.add_span_processor(_SinkProcessor(SpanSink(workers)))
    return provider
