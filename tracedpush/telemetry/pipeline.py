"""Per-connector telemetry runtime: recorder -> builder thread -> export sink.

Engine threads only touch `pipeline.record` (a `deque.append`). The builder thread
wakes every `interval_s`, drains the events, builds spans and hands them to the sink,
whose exporters have their own threads. Every `sweep_every_s` it also closes stale
requests, emits the process's engine steps and (optionally) samples its threads. If
the builder ever falls `max_backlog` events behind, the oldest events are discarded
and counted rather than letting memory grow; nothing ever blocks the recording thread.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

from opentelemetry.sdk.resources import Resource

from tracedpush.telemetry.builder import BuilderConfig, SpanBuilder
from tracedpush.telemetry.events import Recorder
from tracedpush.telemetry.export import SpanSink
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
        max_backlog: int = 1_000_000,
        sample_threads: bool = False,
        thread_roles: dict[int, str] | None = None,
    ) -> None:
        self.recorder = Recorder()
        self.record = self.recorder.record
        self.sink = sink
        self.builder = SpanBuilder(config, resource, sink.emit)
        self.interval_s = interval_s
        self.sweep_every_s = sweep_every_s
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
        last_sweep = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.pump()
            if time.monotonic() - last_sweep >= self.sweep_every_s:
                last_sweep = time.monotonic()
                with self._lock:
                    self._guard(self.builder.sweep)
                    if self.sample_threads:
                        self._guard(
                            self.builder.sample_threads,
                            None,
                            self.events_recorded,
                            self.thread_roles,
                        )

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
        self.sink.shutdown(timeout_s)
