"""Per-connector telemetry runtime: recorder -> builder thread -> export sink.

Engine threads only touch `pipeline.record` (a `deque.append`). The builder thread
wakes every `interval_s`, drains the events, builds spans and hands them to the sink,
whose exporters have their own threads. Every `sweep_every_s` it also closes stale
requests, emits the process's engine steps and (optionally) samples its threads. Every
`export_stats_every_s`, when spans were built or lost since the last one, and once more
at shutdown, it writes the sink's export and drop counters into the trace store as an
`engine.export` span, so spans lost to a down exporter or a full disk are visible where
the traces are. If the builder ever falls `max_backlog` events behind, the oldest
events are discarded and counted rather than letting memory grow; nothing ever blocks
the recording thread.

With `observations`, the builder also reads each KV span into metric observations
(`telemetry.observations`), and each sweep adds the spans the sink dropped since the
previous one, by reason: the connector's `get_kv_connector_stats` drains them into
vLLM's connector metrics (docs/metrics.md).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any

from opentelemetry.sdk.resources import Resource

from tracedpush import semconv
from tracedpush.telemetry.builder import BuilderConfig, SpanBuilder
from tracedpush.telemetry.events import Recorder
from tracedpush.telemetry.export import SpanSink
from tracedpush.telemetry.observations import SPANS_DROPPED, Observations, SpanObserver
from tracedpush.telemetry.threads import name_os_thread

log = logging.getLogger("tracedpush.pipeline")


class Pipeline:
    def __init__(
        self,
        config: BuilderConfig,
        resource: Resource,
        sink: SpanSink,
        *,
        interval_s: float = 0.1,
        sweep_every_s: float = 1.0,
        export_stats_every_s: float = 10.0,
        max_backlog: int = 1_000_000,
        sample_threads: bool = False,
        thread_roles: dict[int, str] | None = None,
        observations: Observations | None = None,
    ) -> None:
        self.recorder = Recorder()
        self.record = self.recorder.record
        self.sink = sink
        self.observations = observations
        self._drops_seen: dict[str, int] = {}  # sink drops already observed, by reason
        observer = (
            SpanObserver(config.mode, config.role, observations)
            if observations is not None
            else None
        )
        self.builder = SpanBuilder(config, resource, sink.emit, observer)
        self.interval_s = interval_s
        self.sweep_every_s = sweep_every_s
        self.export_stats_every_s = export_stats_every_s
        self._last_export_stats: tuple[int, ...] | None = None
        self.sample_threads = sample_threads  # an /proc sample of our threads each sweep
        self.thread_roles = thread_roles or {}  # native threads identified at start (NIXL's)
        self.max_backlog = max_backlog
        self.events_dropped = 0
        self.events_recorded = 0  # drained so far: what the engine threads recorded
        self.builder_errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # serialises builder work between thread and shutdown
        self._thread = threading.Thread(
            target=self._run, name=f"tracedpush-builder-{config.side}", daemon=True
        )
        self._thread.start()
        atexit.register(self.shutdown)

    def _run(self) -> None:
        name_os_thread(f"tracedpush-bld{self.builder.cfg.side[0]}")  # 15 bytes at most
        last_sweep = last_stats = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.pump()
            if time.monotonic() - last_sweep >= self.sweep_every_s:
                last_sweep = time.monotonic()
                with self._lock:
                    self._guard(self.builder.sweep)
                    self._guard(self.observe_drops)
                    if self.sample_threads:
                        self._guard(
                            self.builder.sample_threads,
                            None,
                            self.events_recorded,
                            self.thread_roles,
                        )
                if time.monotonic() - last_stats >= self.export_stats_every_s:
                    last_stats = time.monotonic()
                    self.emit_export_stats()

    def pump(self) -> None:
        """Drain and build now (the thread calls this; tests may too)."""
        with self._lock:
            backlog = len(self.recorder)
            if backlog > self.max_backlog:
                dropped = len(self.recorder.drain(backlog - self.max_backlog))
                self.events_dropped += dropped
                log.warning("tracedpush: builder behind, dropped %d events", dropped)
            events = self.recorder.drain()
            self.events_recorded += len(events)
            if events:
                self._guard(self.builder.feed, events)

    def observe_drops(self) -> None:
        """Hand the spans the sink dropped since the last call, by reason (summed over
        the exporters), to the metrics as deltas."""
        if self.observations is None:
            return
        totals = dict.fromkeys(semconv.DROP_REASONS, 0)
        for worker in self.sink.stats().values():
            for reason, n in worker["dropped_by_reason"].items():
                totals[reason] = totals.get(reason, 0) + n
        seen = self._drops_seen
        for reason, n in totals.items():
            delta = n - seen.get(reason, 0)
            if delta > 0:
                self.observations.put((SPANS_DROPPED, reason, delta))
                seen[reason] = n

    def emit_export_stats(self, force: bool = False, final: bool = False) -> None:
        """One `engine.export` span with the sink's counters, if spans were built or lost
        since the last one (or `force`). The span itself is not counted as built, so an
        idle process emits none until the `final` one it writes as it shuts down."""
        with self._lock:
            stats = self.sink.stats()
            key = (
                self.builder.spans_built,
                self.events_dropped,
                *(w["dropped"] for w in stats.values()),
            )
            if not (force or final) and key == self._last_export_stats:
                return
            self._last_export_stats = key
            self._guard(self._emit_export_record, stats, final)

    def _emit_export_record(self, stats: dict[str, dict[str, Any]], final: bool) -> None:
        span = self.builder.process.export_span(stats, time.time_ns(), self.events_dropped, final)
        if span is not None:
            self.sink.emit([span])

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # a builder bug must never reach the engine
            self.builder_errors += 1
            if self.builder_errors <= 3:
                log.exception("tracedpush span builder failed (error %d)", self.builder_errors)

    def stats(self) -> dict[str, object]:
        return {
            "events_pending": len(self.recorder),
            "events_recorded": self.events_recorded,
            "events_dropped": self.events_dropped,
            "builder_errors": self.builder_errors,
            "spans_built": self.builder.spans_built,
            "open_requests": self.builder.open_requests,
            "orphan_requests": self.builder.orphans,
            "unsampled_requests": self.builder.unsampled,
            "observations_dropped": self.observations.dropped if self.observations else 0,
            "observer_errors": self.builder.observer_errors,
            "exporters": self.sink.stats(),
        }

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        self.pump()
        with self._lock:
            self._guard(self.builder.flush_all)
        # so the last record counts what the final spans became (not waiting on a dead exporter)
        self.sink.flush(timeout_s, failing_wait_s=0.0)
        self.emit_export_stats(final=True)
        self.sink.shutdown(timeout_s)
