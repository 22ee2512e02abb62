"""Simulated processes and their spans, encoded exactly as the exporters encode theirs.

Spans are SDK `ReadableSpan`s (like the engines' `SpanFactory` makes) and each file line
is `tracedpush.telemetry.otlp_json.encode_traces_data` of a batch, so the generated
format is the exporters' by construction. The simulation works in milliseconds on one
true clock; `Emitter` turns those into each instance's skewed nanoseconds.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

from tracedpush import __version__
from tracedpush import semconv as sc
from tracedpush.telemetry.otlp_json import encode_traces_data

SCOPE = InstrumentationScope(sc.INSTRUMENTATION_SCOPE, __version__)

T = TypeVar("T", int, float)
# a span event: (name, time) or (name, time, attributes)
EventAt = tuple[str, T] | tuple[str, T, Mapping[str, Any]]


@dataclass(slots=True)
class Process:
    """One exporting process (its own resource, its own file) and the spans it ended."""

    service: str
    instance: str
    host: str
    pid: int
    spans: list[ReadableSpan] = field(default_factory=list)
    resource: Resource = field(init=False)

    def __post_init__(self) -> None:
        # Resource(...), not Resource.create: no SDK defaults or environment, so runs
        # are reproducible.
        self.resource = Resource(
            {
                sc.RES_SERVICE_NAME: self.service,
                sc.RES_SERVICE_INSTANCE_ID: self.instance,
                sc.RES_HOST_NAME: self.host,
                sc.RES_PROCESS_PID: self.pid,
                sc.RES_TRACEDPUSH_VERSION: __version__,
            }
        )

    def add(
        self,
        trace_id: int,
        span_id: int,
        parent_id: int,
        name: str,
        start_ns: int,
        end_ns: int,
        attrs: Mapping[str, Any],
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        events: Sequence[EventAt[int]] = (),
    ) -> None:
        """Record a finished span; `parent_id` 0 makes it a root, `events` are (name, ns)
        or (name, ns, attributes)."""
        self.spans.append(
            ReadableSpan(
                name=name,
                context=SpanContext(trace_id, span_id, False),
                parent=SpanContext(trace_id, parent_id, False) if parent_id else None,
                resource=self.resource,
                attributes=dict(attrs),
                events=[Event(e[0], e[2] if len(e) > 2 else None, e[1]) for e in events],
                kind=kind,
                instrumentation_scope=SCOPE,
                start_time=start_ns,
                end_time=max(end_ns, start_ns),
            )
        )

    def lines(self, batch: int) -> list[dict[str, Any]]:
        """`TracesData` documents in export order (by end time), `batch` spans each."""
        spans = sorted(self.spans, key=lambda s: s.end_time or 0)
        return [encode_traces_data(spans[i : i + batch]) for i in range(0, len(spans), batch)]


class Emitter:
    """Draws ids from the run's generator and records spans given on the true clock."""

    def __init__(
        self,
        rng: random.Random,
        base_ns: int,
        offsets_ns: Mapping[str, int],
        steps_ns: Mapping[str, tuple[float, int]] | None = None,
    ) -> None:
        self.rng = rng
        self.base_ns = base_ns
        self.offsets_ns = offsets_ns  # instance -> how far its clock is ahead
        # instance -> (true ms into the run, ns): its clock steps by that much then
        self.steps_ns = steps_ns or {}

    def new_id(self, nbytes: int) -> int:
        return self.rng.getrandbits(nbytes * 8)

    def ns(self, ms: float, proc: Process) -> int:
        """True-clock ms -> the unix ns `proc`'s clock shows then."""
        return self.base_ns + round(ms * 1e6) + self._offset(ms, proc)

    def true_ms(self, ns: int, proc: Process) -> float:
        """Inverse of `ns` (after a step, the later time where both would fit)."""
        at, step = self.steps_ns.get(proc.instance, (float("inf"), 0))
        ms = (ns - self.base_ns - self.offsets_ns.get(proc.instance, 0)) / 1e6
        return ms - step / 1e6 if ms - step / 1e6 >= at else ms

    def _offset(self, ms: float, proc: Process) -> int:
        at, step = self.steps_ns.get(proc.instance, (float("inf"), 0))
        return self.offsets_ns.get(proc.instance, 0) + (step if ms >= at else 0)

    def span(
        self,
        proc: Process,
        trace_id: int,
        parent_id: int,
        name: str,
        start_ms: float,
        end_ms: float,
        attrs: Mapping[str, Any],
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        events: Sequence[EventAt[float]] = (),
    ) -> int:
        """Record a span of a request trace; returns its id."""
        span_id = self.new_id(8)
        proc.add(
            trace_id,
            span_id,
            parent_id,
            name,
            self.ns(start_ms, proc),
            self.ns(max(end_ms, start_ms), proc),
            attrs,
            kind=kind,
            events=[(e[0], self.ns(e[1], proc), *e[2:]) for e in events],
        )
        return span_id
