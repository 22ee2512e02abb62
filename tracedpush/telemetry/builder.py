"""Turn a process's compact events (`telemetry.events`) into OpenTelemetry spans.

Runs on a background thread, never on an engine thread. One builder per connector
instance: the scheduler-side builder (EngineCore process) emits the engine spans
`prefill` / `decode`; the worker-side builder (one per worker rank) emits the `kv.*`
phase spans. Both also emit their process's `engine.steps` and `engine.threads`.

The pieces, along vLLM's own lines: `request_state` (per-request state and one handler
per event type), `engine_spans` / `push_emitter` / `pull_emitter` (the one emitter this
process needs, picked here at construction), `process_spans` (steps and threads),
`span_factory` (ids, attributes, status). With an `observations.SpanObserver`, every
span a request gets is also read into metric observations for the engine's /metrics.

Sampling: a request whose traceparent says "not sampled" (flags bit 0 off) gets no spans. A
worker still works out its KV phases, as `PhaseRecord`s the observer reads and nothing
exports, because the engine's metrics count every request (docs/metrics.md); the
scheduler side, whose engine span feeds no metric, drops the request at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from tracedpush.telemetry import events as ev
from tracedpush.telemetry.emitter import Emitter
from tracedpush.telemetry.engine_spans import EngineSpanEmitter
from tracedpush.telemetry.events import named
from tracedpush.telemetry.observations import SpanObserver
from tracedpush.telemetry.process_spans import ProcessSpans
from tracedpush.telemetry.pull_emitter import PullDecodeEmitter, PullPrefillEmitter
from tracedpush.telemetry.push_emitter import PushDecodeEmitter, PushPrefillEmitter
from tracedpush.telemetry.request_state import Handshake, Peers, RequestState, RequestTracker
from tracedpush.telemetry.span_factory import BuilderConfig, SpanFactory
from tracedpush.telemetry.threads import ThreadDeltas, sample_engine

__all__ = ["BuilderConfig", "SpanBuilder"]


class SpanBuilder:
    """Feed it drained events; it calls `emit(spans)` as phases complete."""

    def __init__(
        self,
        config: BuilderConfig,
        resource: Resource,
        emit: Callable[[list[ReadableSpan]], None],
        observer: SpanObserver | None = None,
    ) -> None:
        self.cfg = config
        self.emit = emit
        self.observer = observer  # metric observations from the spans (observations.py)
        self._thread_deltas = ThreadDeltas()  # each thread sample's CPU and wait, for them
        self.observer_errors = 0
        self.spans = SpanFactory(config, resource)
        self.tracker = RequestTracker(config.tp_size, config.mode)
        self.emitter = emitter_for(self.spans, self.tracker.handshakes, self.tracker.peers)
        self.process = ProcessSpans(self.spans)
        self._closes_when_ended = config.side == "worker" and config.role == "decode"
        self.spans_built = 0
        self.orphans = 0  # requests seen only through stray events, not traced
        self.unsampled = 0  # requests whose traceparent said not sampled: no spans built
        handlers = self.tracker.handlers
        count_prefill_steps = handlers[ev.SchedStep]

        def sched_step(e: ev.SchedStep) -> tuple[RequestState, ...] | list[RequestState]:
            self.process.on_sched_step(e)
            return count_prefill_steps(e)

        handlers[ev.SchedStep] = sched_step
        handlers[ev.WorkerStep] = self._worker_step

    @property
    def requests_seen(self) -> int:
        return self.tracker.requests_seen

    @property
    def open_requests(self) -> int:
        return len(self.tracker.reqs)

    def _worker_step(self, e: ev.WorkerStep) -> tuple[()]:
        self.process.on_worker_step(e)
        return ()

    # ------------------------------------------------------------------ driving
    def feed(self, events: Iterable[tuple]) -> None:
        touched: dict[str, RequestState] = {}
        handlers = self.tracker.handlers
        for raw in events:
            event = named(raw)  # hooks record plain tuples (see telemetry.events)
            handler = handlers.get(type(event))
            if handler is None:
                continue
            for req in handler(event) or ():
                req.last_seen = event.t
                touched[req.base] = req
        out: list[ReadableSpan] = []
        for req in touched.values():
            self._try_emit(req, out, final=False)
        self._flush(out)

    def sweep(self, now_ns: int | None = None) -> None:
        """Close requests that stopped making progress (open phases end as ERROR), and
        emit the steps recorded since the last sweep."""
        now_ns = now_ns or time.time_ns()
        limit = int(self.cfg.stale_after_s * 1e9)
        linger = int(self.cfg.linger_s * 1e9)
        # D's worker learns of the scheduler's end through the step metadata (`Finished`
        # facts). A decode request ended there (aborted while it waited for the KV) gets
        # nothing more, so its open phases close now, not at the stale limit, when an
        # engine stopped soon after would have lost them.
        ended = int(self.cfg.ended_grace_s * 1e9) if self._closes_when_ended else limit
        out: list[ReadableSpan] = []
        for base, req in list(self.tracker.reqs.items()):
            idle = now_ns - req.last_seen
            if req.done:
                if idle > linger:
                    self.tracker.forget(base)
            elif idle > limit:
                self._try_emit(req, out, final=True)
                self.tracker.forget(base)
            elif req.finished and idle > ended:
                self._try_emit(req, out, final=True)
                req.done = True  # kept until `linger_s`: a late notification is absorbed
            elif req.xfer_done and now_ns - req.xfer_done > 1e9 and len(req.telemetry) < req.n_done:
                req.n_done = len(req.telemetry)  # telemetry never came: emit without it
                self._try_emit(req, out, final=False)
        self.tracker.prune(now_ns, limit)
        self.process.flush_steps(out)
        self._flush(out)

    def sample_threads(
        self,
        now_ns: int | None = None,
        events_recorded: int = 0,
        known_roles: dict[int, str] | None = None,
    ) -> None:
        """One `engine.threads` span from /proc (the pipeline calls this about once a second)."""
        rows = sample_engine(self.cfg.side, known_roles)
        span = self.process.threads_span(rows, now_ns or time.time_ns(), events_recorded)
        if span is not None:
            self._flush([span])
        if self.observer is not None:  # the same numbers for the engine's /metrics
            self.observer.on_threads(self._thread_deltas.update(rows))

    def flush_all(self) -> None:
        """At shutdown: emit whatever is known, open phases marked ERROR."""
        self.sweep(now_ns=2**62)

    def _flush(self, out: list[ReadableSpan]) -> None:
        if out:
            self.spans_built += len(out)
            self.emit(out)

    # ------------------------------------------------------------------ emission
    def _try_emit(self, req: RequestState, out: list[ReadableSpan], *, final: bool) -> None:
        if req.done:
            return
        if not req.trace_id:
            if not final:
                return  # context not known yet (metadata not shipped yet)
            if not req.arrival:
                # Only stray events (e.g. a late notification for a request that ended
                # long ago): never start a second, partial trace for it.
                req.done = True
                self.orphans += 1
                return
            req.set_context(None)
        if not req.sampled:
            self._observe_only(req, final)
            return
        first = len(out)
        self.emitter.emit(req, out, final)
        if len(out) > first:
            self._observe(req, out[first:])

    def _observe_only(self, req: RequestState, final: bool) -> None:
        """An unsampled request: its phases reach the metrics, no span is built or sent."""
        if self.observer is None or not self.emitter.observed:
            req.done = True  # nothing this process would observe: forget it at once
        else:
            records: list[ReadableSpan] = []  # PhaseRecords (span_factory), not spans
            self.emitter.emit(req, records, final)
            if records:
                self._observe(req, records)
        if req.done:
            self.unsampled += 1

    def _observe(self, req: RequestState, spans: list[ReadableSpan]) -> None:
        if self.observer is not None:
            try:
                self.observer.on_spans(req, spans)
            except Exception:  # a metrics bug must not cost the spans
                self.observer_errors += 1


def emitter_for(
    spans: SpanFactory, handshakes: list[Handshake], peers: Peers | None = None
) -> Emitter:
    """The one emitter this process needs, by side, mode and role."""
    cfg = spans.cfg
    if cfg.side == "scheduler":
        return EngineSpanEmitter(spans, handshakes, peers)
    kinds: dict[tuple[str, str], type[Emitter]] = {
        ("push", "prefill"): PushPrefillEmitter,
        ("push", "decode"): PushDecodeEmitter,
        ("pull", "prefill"): PullPrefillEmitter,
        ("pull", "decode"): PullDecodeEmitter,
    }
    return kinds[(cfg.mode, cfg.role)](spans, handshakes, peers)
