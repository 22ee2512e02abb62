"""Where spans go: per-exporter background workers with bounded, counted drop queues.

Configuration follows OpenTelemetry's environment variables:
- a traces directory (argument, or `TRACEDPUSH_TRACES_DIR`) -> OTLP JSON lines files;
- `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` -> OTLP, over
  `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`
  (`http/protobuf`, the spec's default, or `grpc`), each attempt bounded by
  `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT` (seconds, default
  10: the SDK exporters fit their own retries inside that deadline);
- `OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`, comma-separated) overrides which.

Each exporter runs on its own thread behind a bounded queue, so nothing here ever
blocks the caller: `submit` is a length check and a `deque.extend`, no I/O, no lock
held. An exporter that is down, hangs (each attempt ends at its timeout) or writes to a
full store drops batches while the queue fills and then drops at the queue; every span
lost is counted by reason (`semconv.DROP_REASONS`). The log gets one line when an
exporter starts failing (what, where, the errno) and one when it resumes (how long, how
many spans lost), never one per batch; queue-full drops while the exporter is healthy
are summed up at most every 30 s. Each batch is a fresh attempt, so export resumes by
itself when the endpoint answers or the disk has room again.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracedpush import __version__, semconv
from tracedpush.telemetry.jsonl import JsonLinesSpanExporter
from tracedpush.telemetry.process_spans import ProcessSpans
from tracedpush.telemetry.span_factory import BuilderConfig, SpanFactory
from tracedpush.telemetry.threads import name_os_thread

log = logging.getLogger("tracedpush.export")

ENV_TRACES_DIR = "TRACEDPUSH_TRACES_DIR"
DEFAULT_MAX_QUEUE = 8192
DEFAULT_BATCH = 512
REPORT_EVERY_S = 30.0
# A failure this soon after an outage ended continues that outage, silently: a store on
# the edge of full takes a small batch now and then, and each must not log again.
FLAP_S = 30.0
FAILING_SHUTDOWN_WAIT_S = 1.0  # at exit, how long to wait for an exporter that is failing
EXPORT_RECORD_EVERY_S = 10.0  # the proxy's engine.export records, as the engines' period


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


@dataclass(slots=True)
class _Outage:
    """An exporter's current run of failures: when it began, the drops then."""

    since: float  # time.monotonic()
    drops_before: dict[str, int] = field(default_factory=dict)
    ended: float | None = None  # when a batch last got through (time.monotonic())
    relapses: int = 0  # failures again within FLAP_S of a batch getting through


class ExportWorker:
    """One exporter on one daemon thread, fed through a bounded queue.

    `target` names where spans go (an endpoint) in log lines; JSON lines files name
    their own path. Counters are plain ints read without a lock: the caller's thread
    only ever adds to `drops["queue_full"]`, the worker thread to the rest.
    """

    def __init__(
        self,
        name: str,
        exporter: SpanExporter,
        max_queue: int = DEFAULT_MAX_QUEUE,
        *,
        target: str = "",
    ) -> None:
        self.name = name
        self.exporter = exporter
        self.target = target
        self.max_queue = max_queue
        self.exported = 0
        self.failed_batches = 0
        self.drops: dict[str, int] = dict.fromkeys(semconv.DROP_REASONS, 0)
        self._queue: deque[ReadableSpan] = deque()
        self._in_flight = 0
        self._outage: _Outage | None = None
        self._last_outage: _Outage | None = None  # the one that ended, for FLAP_S
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

    @property
    def dropped(self) -> int:
        """Spans lost for any reason."""
        return sum(self.drops.values())

    @property
    def failing(self) -> bool:
        return self._outage is not None

    def submit(self, spans: Sequence[ReadableSpan]) -> None:
        """Queue spans; what does not fit is dropped and counted. Never blocks."""
        room = self.max_queue - len(self._queue)
        if room < len(spans):
            self.drops[semconv.DROP_QUEUE_FULL] += len(spans) - max(room, 0)
            spans = spans[: max(room, 0)]
        self._queue.extend(spans)
        self._idle.clear()
        self._wake.set()

    def _run(self) -> None:
        name_os_thread(f"tracedpush-exp{self.name[:1]}")  # 15 bytes at most
        while True:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            while self._queue and not self._stop:
                n = min(DEFAULT_BATCH, len(self._queue))
                self._in_flight = n  # set before popping: flush always sees these spans
                batch = [self._queue.popleft() for _ in range(n)]
                self._export(batch)
                self._in_flight = 0
            self._idle.set()
            self._maybe_report()
            if self._stop:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        """One attempt at one batch: count what landed and what was lost, and log the
        start and the end of an outage (once each, never per batch)."""
        t0 = time.monotonic()
        before = dict(self.drops)  # an outage counts from the start of its first attempt
        reason = semconv.DROP_EXPORT_FAILED
        what = ""
        raised: BaseException | None = None
        try:
            if isinstance(self.exporter, JsonLinesSpanExporter):
                result = self.exporter.write(batch)
                landed, lost = result.written, result.dropped
                if result.error is not None:
                    if result.store_full:
                        reason = semconv.DROP_STORE_FULL
                    what = f"cannot write {result.path} ({result.describe_error()})"
            else:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
                landed, lost = (len(batch), 0) if ok else (0, len(batch))
        except Exception as exc:  # an exporter must never take the thread down
            landed, lost, raised = 0, len(batch), exc
        self.exported += landed
        if not lost:
            if self._outage is not None:
                self._resumed()
            return
        last = self._last_outage
        if self._outage is None and last is not None and t0 - (last.ended or 0.0) < FLAP_S:
            last.relapses += 1  # the same outage again: counted, not logged
            self._outage, self._last_outage = last, None
        if self._outage is None:
            self._outage = _Outage(t0, before)
            if not what:
                where = f" to {self.target}" if self.target else ""
                cause = f": {raised!r}" if raised is not None else ""
                what = f"export{where} failed after {time.monotonic() - t0:.1f} s{cause}"
            log.warning(
                "tracedpush exporter %s: %s; dropping spans (counted as %s) and retrying "
                "with each new batch until one gets through",
                self.name,
                what,
                reason,
                exc_info=raised,
            )
        self.failed_batches += 1
        self.drops[reason] += lost

    def _resumed(self) -> None:
        outage, self._outage = self._outage, None
        if outage is None:
            return
        outage.ended = now = time.monotonic()
        self._last_outage = outage
        lost = {r: n - outage.drops_before.get(r, 0) for r, n in self.drops.items()}
        detail = ", ".join(f"{r} {n}" for r, n in lost.items() if n)
        where = f" to {self.target}" if self.target else ""
        if isinstance(self.exporter, JsonLinesSpanExporter):
            where = f" to {self.exporter.path}"
        again = (
            f", after failing again {outage.relapses} time(s) once batches got through"
            if outage.relapses
            else ""
        )
        log.warning(
            "tracedpush exporter %s: export resumed%s %.1f s after it first failed%s; "
            "%d spans lost meanwhile%s",
            self.name,
            where,
            now - outage.since,
            again,
            sum(lost.values()),
            f" ({detail})" if detail else "",
        )
        self._reported_drops = self.dropped
        self._last_report = time.monotonic()

    def _maybe_report(self) -> None:
        """Drops outside an outage (the queue overflowed a healthy but slow exporter)."""
        now = time.monotonic()
        if (
            self._outage is None
            and self.dropped > self._reported_drops
            and now - self._last_report >= REPORT_EVERY_S
        ):
            log.warning(
                "tracedpush exporter %s: %d spans dropped so far (%s; %d exported)",
                self.name,
                self.dropped,
                ", ".join(f"{r} {n}" for r, n in self.drops.items() if n),
                self.exported,
            )
            self._reported_drops = self.dropped
            self._last_report = now

    def stats(self) -> dict[str, Any]:
        """Plain counters (see `SpanSink.stats`)."""
        return {
            "exported": self.exported,
            "dropped": self.dropped,
            "dropped_by_reason": dict(self.drops),
            "queued": len(self._queue) + self._in_flight,
            "failed_batches": self.failed_batches,
            "failing": self.failing,
        }

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far was exported or dropped."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._wake.set()
            if not self._idle.wait(max(0.0, deadline - time.monotonic())):
                return False
            # `_idle` can be set just after a concurrent submit: trust only the queue.
            if not self._queue and not self._in_flight:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        # Waiting out a hung endpoint's timeouts batch after batch would only delay exit
        # (the thread is a daemon: an attempt still hanging dies with the process).
        failing_wait = min(timeout_s, FAILING_SHUTDOWN_WAIT_S)
        self.flush(failing_wait if self.failing else timeout_s)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=failing_wait if self.failing else timeout_s)
        unsent = len(self._queue) + self._in_flight
        if self.dropped > self._reported_drops or self.failing or unsent:
            log.warning(
                "tracedpush exporter %s: at shutdown %d spans dropped in total (%s), %d not sent%s",
                self.name,
                self.dropped,
                ", ".join(f"{r} {n}" for r, n in self.drops.items() if n) or "none",
                unsent,
                ", still failing" if self.failing else "",
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

    def flush(self, timeout_s: float = 5.0, *, failing_wait_s: float | None = None) -> bool:
        """Wait for every worker's queue to drain; `failing_wait_s` caps the wait on a
        worker that is failing (a hung endpoint would take its timeout per batch)."""
        ok = True
        for w in self.workers:
            wait = timeout_s if failing_wait_s is None or not w.failing else failing_wait_s
            ok = w.flush(min(timeout_s, wait)) and ok
        return ok

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per exporter, plain ints (and a dict of drops by reason), cheap and lock-free:

        `{"jsonl": {"exported", "dropped", "dropped_by_reason": {"queue_full",
        "export_failed", "store_full"}, "queued", "failed_batches", "failing"}}`.

        Where it is read: engines via `Pipeline.stats()["exporters"]` (the connector's
        `tracedpush_stats`) and in the trace store as `engine.export` spans; the proxy's
        sink sits in its TracerProvider (`_SinkProcessor.sink`). For /metrics: counters
        `exported` and `dropped_by_reason` (labels exporter, reason), gauges `queued`
        and `failing`.
        """
        return {w.name: w.stats() for w in self.workers}

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self.workers:
            worker.shutdown(timeout_s)


def _otlp_exporter() -> tuple[SpanExporter, str]:
    """The SDK's OTLP exporter for the environment, and where it sends (for logs)."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    target = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "the default endpoint"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(), f"{target} (grpc)"
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http(), f"{target} (http/protobuf)"
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
            exporter, target = _otlp_exporter()
            workers.append(ExportWorker("otlp", exporter, target=target))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            workers.append(ExportWorker("console", ConsoleSpanExporter(), target="stdout"))
        elif name not in ("none", ""):
            raise ValueError(
                f"unsupported OTEL_TRACES_EXPORTER {name!r} (use otlp, console or none)"
            )
    return workers


class _SinkProcessor(SpanProcessor):
    """Hand each ended SDK span to the sink (whose workers batch and export). With
    `records`, also the process's own `engine.export` records, as engine processes write
    them: every `every_s` (a thread of its own) when spans were exported or lost since
    the last one, and a final one at shutdown, after the last spans were flushed. The
    proxy's, so that the report's trace completeness covers it: a root span it dropped
    loses a whole request."""

    def __init__(
        self,
        sink: SpanSink,
        records: ProcessSpans | None = None,
        every_s: float | None = None,
    ):
        self.sink = sink
        self.records = records
        self.every_s = EXPORT_RECORD_EVERY_S if every_s is None else every_s
        self._last_key: tuple[int, ...] | None = None
        self._records = 0  # records given to the sink
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if records is not None:
            self._thread = threading.Thread(
                target=self._loop, name="tracedpush-export-records", daemon=True
            )
            self._thread.start()

    def on_end(self, span: ReadableSpan) -> None:
        self.sink.emit((span,))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._record(final=False)

    def _record(self, final: bool) -> None:
        assert self.records is not None
        stats = self.sink.stats()
        # every span given to the sink, but the records themselves: none since the last
        # record means an idle process, which writes none until its final one
        key = tuple(
            w["exported"] + w["dropped"] + w["queued"] - self._records for w in stats.values()
        )
        if key == (self._last_key or (0,) * len(key)) and not final:
            return
        self._last_key = key
        try:
            span = self.records.export_span(stats, time.time_ns(), final=final)
        except Exception:  # a record must never cost the process its spans
            log.exception("tracedpush export record failed")
            return
        if span is not None:
            self._records += 1
            self.sink.emit((span,))

    def shutdown(self) -> None:
        if self._thread is not None and not self.sink.closed:
            self._stop.set()
            self._thread.join(timeout=5.0)
            # so the last record counts what the final spans became
            self.sink.flush(5.0, failing_wait_s=0.0)
            self._record(final=True)
        self.sink.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.sink.flush(timeout_millis / 1000)


def build_tracer_provider(
    service_name: str,
    instance_id: str,
    traces_dir: str | os.PathLike[str] | None,
    extra_resource: dict[str, Any] | None = None,
    *,
    mode: str = "",
) -> TracerProvider:
    """A TracerProvider for the proxy: JSONL files and/or OTLP, never blocking, with the
    process's own export records (`_SinkProcessor`) under `instance_id` and `mode`."""
    workers = build_exporters(traces_dir, stem=service_name)
    extra = {**(extra_resource or {}), semconv.RES_EXPORT_RECORDS: bool(workers)}
    resource = make_resource(service_name, instance_id, extra)
    provider = TracerProvider(resource=resource)
    if workers:
        cfg = BuilderConfig(mode=mode, role="proxy", side="", engine_id=instance_id)
        records = ProcessSpans(SpanFactory(cfg, resource))
        provider.add_span_processor(_SinkProcessor(SpanSink(workers), records))
    return provider
