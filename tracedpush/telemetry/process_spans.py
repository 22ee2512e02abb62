"""Per-process spans: the anatomy of every engine step, and the OS view of its threads.

They belong to no request, so they never bloat a request's trace: each process has one
trace of its own (id derived from engine id, side and pid). `engine.steps` carries a
batch of steps as parallel arrays (about one span a second); `engine.threads` one /proc
sample of the process's threads; `engine.export` the export and drop counters, so spans
lost to a down exporter or a full store show up in the store itself. docs/spans.md
documents all three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from tracedpush import semconv as sc
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.context import trace_id_for
from tracedpush.telemetry.span_factory import SpanFactory
from tracedpush.telemetry.threads import ThreadRow


def _us(ns: int) -> int:
    return ns // 1000


class ProcessSpans:
    def __init__(self, spans: SpanFactory, max_steps: int = 4096) -> None:
        self.spans = spans
        cfg = spans.cfg
        self.trace_id = trace_id_for(f"process/{cfg.engine_id}/{cfg.side}/{os.getpid()}")
        self.max_steps = max_steps
        self._sched: list[ev.SchedStep] = []
        self._worker: list[ev.WorkerStep] = []
        self._last_sample_ns = 0
        self._last_export_ns = 0
        self._last_cpu: dict[tuple[int, int], float] = {}

    def on_sched_step(self, e: ev.SchedStep) -> None:
        self._sched.append(e)

    def on_worker_step(self, e: ev.WorkerStep) -> None:
        self._worker.append(e)

    @property
    def pending(self) -> int:
        return len(self._sched) + len(self._worker)

    def flush_steps(self, out: list[ReadableSpan]) -> None:
        """One `engine.steps` span per side with what was recorded since the last flush."""
        if self._sched:
            steps, self._sched = self._sched, []
            for i in range(0, len(steps), self.max_steps):
                out.append(self._sched_span(steps[i : i + self.max_steps]))
        if self._worker:
            steps2, self._worker = self._worker, []
            for i in range(0, len(steps2), self.max_steps):
                out.append(self._worker_span(steps2[i : i + self.max_steps]))

    def _base_attrs(self) -> dict[str, Any]:
        cfg = self.spans.cfg
        return {
            sc.MODE: cfg.mode,
            sc.ROLE: cfg.role,
            sc.ENGINE_ID: cfg.engine_id,
            sc.SIDE: cfg.side,
        }

    def _sched_span(self, steps: list[ev.SchedStep]) -> ReadableSpan:
        prefill, decode, nreqs = [], [], []
        for s in steps:
            tokens = s.num_scheduled_tokens.values()
            prefill.append(sum(n for n in tokens if n > 1))
            decode.append(sum(1 for n in tokens if n == 1))
            nreqs.append(len(s.num_scheduled_tokens))
        attrs = self._base_attrs()
        attrs[sc.STEP_SEQ] = [s.seq for s in steps]
        attrs[sc.STEP_START_NS] = [s.t for s in steps]
        attrs[sc.STEP_PREFILL_TOKENS] = prefill
        attrs[sc.STEP_DECODE_REQS] = decode
        attrs[sc.STEP_NUM_REQS] = nreqs
        return self._span(sc.SPAN_ENGINE_STEPS, steps[0].t, steps[-1].t, attrs)

    def _worker_span(self, steps: list[ev.WorkerStep]) -> ReadableSpan:
        attrs = self._base_attrs()
        attrs[sc.STEP_SEQ] = [s.seq for s in steps]
        attrs[sc.STEP_START_NS] = [s.t for s in steps]
        attrs[sc.STEP_DURATION_US] = [_us(s.t_end - s.t) for s in steps]
        attrs[sc.STEP_CONNECTOR_US] = [
            _us(s.bind_ns + s.load_ns + s.save_ns + s.results_ns + s.other_ns) for s in steps
        ]
        attrs[sc.STEP_BIND_US] = [_us(s.bind_ns) for s in steps]
        attrs[sc.STEP_LOAD_US] = [_us(s.load_ns) for s in steps]
        attrs[sc.STEP_SAVE_US] = [_us(s.save_ns) for s in steps]
        attrs[sc.STEP_RESULTS_US] = [_us(s.results_ns) for s in steps]
        attrs[sc.STEP_LOADS_STARTED] = [s.loads_started for s in steps]
        attrs[sc.STEP_LOADS_FINISHED] = [s.loads_finished for s in steps]
        return self._span(sc.SPAN_ENGINE_STEPS, steps[0].t, steps[-1].t_end, attrs)

    def threads_span(
        self, rows: list[ThreadRow], now_ns: int, events_recorded: int = 0
    ) -> ReadableSpan | None:
        start, self._last_sample_ns = self._last_sample_ns or now_ns, now_ns
        # Only threads that are new or used CPU since the last sample: most of an
        # engine's ~80 threads (idle pools) never do, and cumulative values still give
        # exact deltas between the samples a thread appears in.
        last, self._last_cpu = self._last_cpu, {(r.pid, r.tid): r.cpu_ms for r in rows}
        rows = [r for r in rows if last.get((r.pid, r.tid)) != r.cpu_ms]
        if not rows:
            return None
        attrs = self._base_attrs()
        attrs[sc.THREAD_PID] = [r.pid for r in rows]
        attrs[sc.THREAD_TID] = [r.tid for r in rows]
        attrs[sc.THREAD_PROCESS] = [r.process for r in rows]
        attrs[sc.THREAD_NAME] = [r.name for r in rows]
        attrs[sc.THREAD_ROLE] = [r.role for r in rows]
        attrs[sc.THREAD_CPU_MS] = [round(r.cpu_ms, 1) for r in rows]
        if any(r.wait_ms >= 0 for r in rows):  # no schedstats (not Linux): no attribute
            attrs[sc.THREAD_CPU_WAIT_MS] = [round(r.wait_ms, 1) for r in rows]
        attrs[sc.THREAD_CORE] = [r.core for r in rows]
        attrs[sc.THREAD_AFFINITY] = [r.affinity for r in rows]
        attrs[sc.EVENTS_RECORDED] = events_recorded
        return self._span(sc.SPAN_ENGINE_THREADS, start, now_ns, attrs)

    def export_span(
        self,
        exporters: Mapping[str, Mapping[str, Any]],
        now_ns: int,
        events_dropped: int = 0,
        final: bool = False,
    ) -> ReadableSpan | None:
        """One `engine.export` span from `SpanSink.stats()` (a plain dict, so this module
        needs nothing from the exporters); None without exporters. Counts are cumulative:
        a record lost to a full store is made up for by the next one that lands."""
        if not exporters:
            return None
        start, self._last_export_ns = self._last_export_ns or now_ns, now_ns
        names = sorted(exporters)
        rows = [exporters[n] for n in names]
        attrs = self._base_attrs()
        attrs[sc.EXPORT_EXPORTER] = names
        attrs[sc.EXPORT_EXPORTED] = [int(r.get("exported", 0)) for r in rows]
        attrs[sc.EXPORT_QUEUED] = [int(r.get("queued", 0)) for r in rows]
        attrs[sc.EXPORT_FAILING] = [bool(r.get("failing", False)) for r in rows]
        for reason, key in sc.EXPORT_DROPPED.items():
            attrs[key] = [int(r.get("dropped_by_reason", {}).get(reason, 0)) for r in rows]
        attrs[sc.EVENTS_DROPPED] = events_dropped
        attrs[sc.EXPORT_FINAL] = final
        return self._span(sc.SPAN_ENGINE_EXPORT, start, now_ns, attrs)

    def _span(self, name: str, start: int, end: int, attrs: dict[str, Any]) -> ReadableSpan:
        return self.spans.span(
            name,
            self.trace_id,
            start,
            end,
            attrs,
            span_id=self.spans.random_id(),
            parent_id=0,
            events=[],
            error=None,
        )
