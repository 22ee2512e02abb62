"""Scheduler side (EngineCore): the engine span `prefill` (P) or `decode` (D).

It starts when the engine's HTTP server had the request (the API-server middleware's
`http_received`), else at vLLM's arrival_time, and carries the events that bound each
engine-local phase: `http_received`, `vllm_arrival`, `core_received`,
`scheduler_received`, then `compute_started` (P) or `blocks_allocated` / `kv_received`
(D). See docs/spans.md.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import Event

from tracedpush import semconv
from tracedpush.telemetry.emitter import Emitter, Out
from tracedpush.telemetry.request_state import RequestState
from tracedpush.telemetry.span_factory import Error

_OK_FINISH = ("FINISHED_STOPPED",)
End = tuple[int, Error] | None  # (end ns, error), or None: not ended yet


class EngineSpanEmitter(Emitter):
    observed = False  # prefill / decode feed no metric: unsampled requests skip it

    def emit(self, req: RequestState, out: Out, final: bool) -> None:
        if not req.arrival:
            req.done = final  # only worker-ish events seen: nothing to build
            return
        events = []
        if req.received:  # and vLLM's arrival_time, which splits the API server's time
            events.append(Event(semconv.EVENT_HTTP_RECEIVED, timestamp=req.received))
            events.append(Event(semconv.EVENT_VLLM_ARRIVAL, timestamp=req.arrival))
        if req.sched_recv:
            if req.core_recv and req.arrival <= req.core_recv <= req.sched_recv:
                events.append(Event(semconv.EVENT_CORE_RECEIVED, timestamp=req.core_recv))
            events.append(Event(semconv.EVENT_SCHEDULER_RECEIVED, timestamp=req.sched_recv))
        if self.spans.cfg.role == "prefill":
            name = semconv.SPAN_PREFILL
            found = self._prefill_end(req, events, final)
        else:
            name = semconv.SPAN_DECODE
            found = self._decode_end(req, events, final)
        if found is None:
            return
        end, status = found
        attrs = self.spans.attrs(req)
        attrs[semconv.PROMPT_TOKENS] = req.prompt_len
        attrs[semconv.THREAD] = "scheduler"
        if name == semconv.SPAN_DECODE:
            attrs[semconv.DECODE_END] = "first_token_scheduled"
        elif req.steps:
            attrs[semconv.PREFILL_STEPS] = req.steps
        if req.n_blocks:
            attrs[semconv.KV_BLOCKS] = req.n_blocks
        start = req.received or req.arrival
        out.append(
            self.spans.span(
                name,
                req.trace_id,
                start,
                end,
                attrs,
                span_id=self.spans.engine_span_id(req),
                parent_id=req.parent_id,
                events=events,
                error=status,
            )
        )
        req.emitted.add(name)
        req.done = True

    @staticmethod
    def _prefill_end(
        req: RequestState, events: list[Event], final: bool
    ) -> tuple[int, Error] | None:
        if req.sched:
            events.append(Event(semconv.EVENT_COMPUTE_STARTED, timestamp=req.sched))
        if not req.finished:
            if not final:
                return None
            return req.last_seen, (semconv.ERR_UPSTREAM, "request never finished")
        status = req.finish_status
        if status and not status.startswith("FINISHED_LENGTH") and status not in _OK_FINISH:
            return req.finished, (semconv.ERR_UPSTREAM, f"prefill ended {status}")
        return req.finished, None

    @staticmethod
    def _decode_end(
        req: RequestState, events: list[Event], final: bool
    ) -> tuple[int, Error] | None:
        if req.alloc:
            events.append(Event(semconv.EVENT_BLOCKS_ALLOCATED, timestamp=req.alloc))
        if req.recv_done:
            events.append(Event(semconv.EVENT_KV_RECEIVED, timestamp=req.recv_done))
        if req.sched:
            return req.sched, None
        if req.finished:
            return req.finished, (
                semconv.ERR_UPSTREAM,
                f"finished before first token ({req.finish_status})",
            )
        if final:
            return req.last_seen, (semconv.ERR_NOTIFY_TIMEOUT, "never scheduled")
        return None
