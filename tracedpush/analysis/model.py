"""Data the analysis passes around: raw spans in, per-request answers out.

Raw spans (`Span`) keep nanosecond integers exactly as exported, so nothing is lost
before clock correction; answers (`Segment`, `SpanView`, ...) are in milliseconds
relative to the proxy's receipt of the request, which is what people read. Every class
uses ``slots`` because a 10,000-request run holds ~150,000 spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# OTLP span kinds (the JSON form also has "SPAN_KIND_*" strings; the loader maps them).
KIND_UNSPECIFIED = 0
KIND_INTERNAL = 1
KIND_SERVER = 2
KIND_CLIENT = 3
KIND_PRODUCER = 4
KIND_CONSUMER = 5

# OTLP status codes.
STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2


def round_ms(x: float | None) -> float | None:
    """Milliseconds as the JSON carries them (4 decimals; None stays None)."""
    return None if x is None else round(x, 4)


@dataclass(slots=True, frozen=True)
class Resource:
    """Who emitted a span; shared by every span of one export batch (not copied)."""

    service: str
    instance: str  # service.instance.id, else host.name, else service.name
    host: str
    pid: str
    attributes: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(slots=True)
class Event:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(slots=True)
class Span:
    """One span as exported (raw clock of its host, integer nanoseconds)."""

    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_id: str  # "" for a root
    name: str
    kind: int
    start_ns: int
    end_ns: int
    resource: Resource
    attributes: dict[str, Any]
    events: list[Event]
    status_code: int = STATUS_UNSET
    status_message: str = ""

    @property
    def service(self) -> str:
        return self.resource.service

    @property
    def instance(self) -> str:
        return self.resource.instance

    def event(self, name: str) -> Event | None:
        """The first event called `name`, if any."""
        for ev in self.events:
            if ev.name == name:
                return ev
        return None

    def event_ns(self, name: str) -> int | None:
        """Time of the first event called `name`, if any."""
        ev = self.event(name)
        return None if ev is None else ev.time_ns


@dataclass(slots=True)
class LoadStats:
    """What loading saw; shown by `tracedpush report` so silent data loss is visible."""

    files: int = 0
    bytes_read: int = 0
    lines_read: int = 0
    documents: int = 0  # TracesData objects parsed
    spans: int = 0  # spans kept (after de-duplication)
    duplicates: int = 0  # spans seen twice (same trace and span id)
    malformed: int = 0  # lines / documents / spans skipped because they did not parse
    partial: int = 0  # trailing lines still being written (kept for the next refresh)
    fetches: int = 0  # HTTP requests made (Jaeger)
    fetch_errors: int = 0
    errors: list[str] = field(default_factory=list)  # the last few problems, for humans

    def note(self, message: str) -> None:
        self.errors.append(message)
        if len(self.errors) > 20:
            del self.errors[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes_read": self.bytes_read,
            "lines_read": self.lines_read,
            "documents": self.documents,
            "spans": self.spans,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "partial": self.partial,
            "fetches": self.fetches,
            "fetch_errors": self.fetch_errors,
            "errors": list(self.errors),
        }


# ------------------------------------------------------------------------ answers


@dataclass(slots=True)
class Segment:
    """A piece of a request's timeline attributed to one phase.

    On the critical path, segments are consecutive and sum to the TTFT. Hidden segments
    are phases that overlapped the TTFT window but did not delay the first token.
    """

    phase: str
    service: str
    start_ms: float  # relative to the proxy's receipt of the request (skew-corrected)
    duration_ms: float
    span: str = ""  # span name the segment comes from ("" for a gap between spans)

    @property
    def end_ms(self) -> float:
        return self.start_ms + self.duration_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "service": self.service,
            "start_ms": round(self.start_ms, 4),
            "duration_ms": round(self.duration_ms, 4),
            "span": self.span,
        }


@dataclass(slots=True)
class SpanView:
    """A span placed on a request's timeline, ready to draw."""

    name: str
    service: str
    instance: str
    lane: str  # "service/instance/thread", e.g. "vllm-prefill/prefill-engine-0/scheduler"
    start_ms: float  # skew-corrected, relative to the proxy's receipt of the request
    duration_ms: float
    on_critical_path: bool
    status: str  # "unset", "ok" or "error"
    attributes: dict[str, Any]
    span_id: str
    parent_id: str
    host: str = ""
    pid: str = ""
    error: str = ""  # status message or error.type when status == "error"

    @property
    def end_ms(self) -> float:
        return self.start_ms + self.duration_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "service": self.service,
            "instance": self.instance,
            "lane": self.lane,
            "start_ms": round(self.start_ms, 4),
            "duration_ms": round(self.duration_ms, 4),
            "on_critical_path": self.on_critical_path,
            "status": self.status,
            "error": self.error,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "host": self.host,
            "pid": self.pid,
            "attributes": self.attributes,
        }


@dataclass(slots=True)
class ClockOffset:
    """Estimated clock offset of one instance relative to the proxy's clock.

    `offset_ms` is how far the instance's clock is ahead: corrected = raw - offset.
    The evidence (causal pairs) bounds the true offset to [lo_ms, hi_ms]; `bound_ms`
    is the largest error the chosen offset can have given that evidence.
    """

    instance: str
    offset_ms: float
    bound_ms: float
    pairs: int  # causal pairs that constrained it
    host: str = ""
    lo_ms: float = float("-inf")
    hi_ms: float = float("inf")
    reference: bool = False  # the clock everything else is expressed in
    consistent: bool = True  # False: the evidence contradicted itself (lo > hi)
    host_clock: bool = False  # tied to the other instances on its host (one kernel clock)
    # > 0: the clock moved during the run, and this is the offset of the stretches of the
    # run with the most pairs (this many), [lo_ms, hi_ms] their evidence (`skew.settle`)
    stretch_pairs: int = 0

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if x in (float("inf"), float("-inf")) else round(x, 4)

        return {
            "offset_ms": round(self.offset_ms, 4),
            "bound_ms": num(self.bound_ms),
            "pairs": self.pairs,
            "host": self.host,
            "lo_ms": num(self.lo_ms),
            "hi_ms": num(self.hi_ms),
            "reference": self.reference,
            "consistent": self.consistent,
            "host_clock": self.host_clock,
            "stretch_pairs": self.stretch_pairs,
        }


@dataclass(slots=True)
class OffsetWindow:
    """The clock offsets estimated from one stretch of the run alone (`skew.over_time`):
    the requests whose proxy root started in [start, end) on the proxy's raw clock.
    Beside the run's one offset per instance, they show a clock that stepped or drifted
    (the run's offset then falls outside some window's evidence)."""

    start_unix_ms: float
    end_unix_ms: float
    offsets: dict[str, ClockOffset]  # those of instances with pairs in the window
    # the lowest slack (ns) per (domain a, domain b) of the window's pairs: `skew.settle`
    # estimates a moved clock again from the windows it picks (not in the JSON)
    edges: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    requests: int = 0  # requests whose proxy root started in the window

    def to_json(self) -> dict[str, Any]:
        return {
            "start_unix_ms": self.start_unix_ms,
            "end_unix_ms": self.end_unix_ms,
            "requests": self.requests,
            "offsets_ms": {k: v.to_json() for k, v in sorted(self.offsets.items())},
        }
