"""Making `ReadableSpan`s for a request: ids, common attributes, status.

Span identity: the engine span's id is derived from (trace id, role, base id), so a
worker can parent its spans to the scheduler's span without any extra message.

An unsampled request's phases are `PhaseRecord`s instead: the numbers the engine's
metrics read (`observations.SpanObserver`), without span ids, context or resource, and
never exported.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracedpush import __version__, semconv
from tracedpush.telemetry.context import span_id_for
from tracedpush.telemetry.request_state import RequestState

SCOPE = InstrumentationScope(semconv.INSTRUMENTATION_SCOPE, __version__)
FLAGS = TraceFlags(TraceFlags.SAMPLED)

Error = tuple[str, str] | None  # (error.type, description)
_UNSET = Status(StatusCode.UNSET)


class PhaseRecord:
    """A phase of an unsampled request: what `SpanObserver` reads off a span (name,
    bounds, attributes, events, status), and nothing else."""

    __slots__ = ("attributes", "end_time", "events", "name", "start_time", "status")

    def __init__(
        self,
        name: str,
        start: int,
        end: int,
        attributes: dict[str, Any],
        events: list[Event],
        status: Status,
    ) -> None:
        self.name = name
        self.start_time = start
        self.end_time = end
        self.attributes = attributes
        self.events = events
        self.status = status


@dataclass(frozen=True)
class BuilderConfig:
    mode: str  # "push" | "pull"
    role: str  # "prefill" | "decode"
    side: str  # "scheduler" | "worker"
    engine_id: str
    tp_rank: int = 0
    tp_size: int = 1
    stale_after_s: float = 120.0  # close a request's open phases as failed after this
    linger_s: float = 300.0  # keep a finished request this long to absorb late events
    # D's worker: close a request's open KV phases this long after D's scheduler ended it
    # (an abort while it waited for the KV): nothing will arrive for it any more
    ended_grace_s: float = 1.0


class SpanFactory:
    def __init__(self, config: BuilderConfig, resource: Resource) -> None:
        self.cfg = config
        self.resource = resource
        self._rand = random.Random()

    def random_id(self) -> int:
        return self._rand.getrandbits(64) or 1

    def engine_span_id(self, req: RequestState) -> int:
        return span_id_for(req.trace_id, self.cfg.role, req.base)

    def attrs(self, req: RequestState) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            semconv.MODE: self.cfg.mode,
            semconv.ROLE: self.cfg.role,
            semconv.ENGINE_ID: self.cfg.engine_id,
            semconv.REQUEST_ID: req.base,
            semconv.LOCAL_REQUEST_ID: req.local_id,
        }
        if self.cfg.side == "worker":
            attrs[semconv.TP_RANK] = self.cfg.tp_rank
        if req.remote_engine:
            attrs[semconv.REMOTE_ENGINE_ID] = req.remote_engine
        return attrs

    def child(
        self,
        out: list[ReadableSpan],
        req: RequestState,
        name: str,
        start: int,
        end: int,
        attrs: dict[str, Any],
        events: list[Event] | None = None,
        error: Error = None,
    ) -> None:
        """A phase span under the request's engine span (a `PhaseRecord` if the request
        is not sampled); marks it emitted."""
        if not req.sampled:
            status = _UNSET
            if error:
                attrs[semconv.ERROR_TYPE] = error[0]
                status = Status(StatusCode.ERROR, error[1])
            record = PhaseRecord(name, start, max(start, end), attrs, events or [], status)
            out.append(record)  # type: ignore[arg-type]  # read like a span, never exported
            req.emitted.add(name)
            return
        out.append(
            self.span(
                name,
                req.trace_id,
                start,
                end,
                attrs,
                span_id=self.random_id(),
                parent_id=self.engine_span_id(req),
                events=events or [],
                error=error,
            )
        )
        req.emitted.add(name)

    def span(
        self,
        name: str,
        trace_id: int,
        start: int,
        end: int,
        attrs: dict[str, Any],
        *,
        span_id: int,
        parent_id: int,
        events: list[Event],
        error: Error,
    ) -> ReadableSpan:
        if error:
            attrs[semconv.ERROR_TYPE] = error[0]
            status = Status(StatusCode.ERROR, error[1])
        else:
            status = Status(StatusCode.UNSET)
        return ReadableSpan(
            name=name,
            context=SpanContext(trace_id, span_id, False, FLAGS),
            parent=SpanContext(trace_id, parent_id, True, FLAGS) if parent_id else None,
            resource=self.resource,
            attributes=attrs,
            events=events,
            kind=SpanKind.INTERNAL,
            instrumentation_scope=SCOPE,
            status=status,
            start_time=start,
            end_time=max(start, end),
        )
