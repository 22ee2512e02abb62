"""Metric observations: what the span builder hands to the engine's Prometheus metrics.

vLLM collects connector metrics by calling `get_kv_connector_stats()` on the engine's
own threads (the model runner each step, the scheduler each step), so that call must
cost no more than recording an event. Nothing is computed there: the builder thread,
as it emits a KV phase span, reads the numbers off the span itself (its duration, its
bytes, its error.type) and appends them to a bounded deque (`Observations.put`); the
connector's `get_kv_connector_stats` pops what arrived (`Observations.take`). A deque's
`append` and `popleft` are atomic, so no lock is taken, and because the numbers come
from the spans, /metrics and the traces cannot disagree.

The deque is bounded: if nothing drains it, the oldest observations are discarded and
counted (`dropped`), never letting memory grow.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from tracedpush import semconv
from tracedpush.telemetry.request_state import RequestState

# Observation layouts (plain tuples, first element the kind):
PHASE: Final = 0  # (PHASE, phase, seconds)
FAILURE: Final = 1  # (FAILURE, reason)
BYTES: Final = 2  # (BYTES, n)
SPANS_DROPPED: Final = 3  # (SPANS_DROPPED, reason, n): spans lost since the last one
# (THREADS, process, thread role, cpu s, wait s): since the last sample, summed over the
# threads of that process and role (`threads.ThreadDeltas`)
THREADS: Final = 4

DEFAULT_MAXLEN: Final = 16384  # a few thousand requests' worth between two drains


class Observations:
    """Bounded single-producer (builder thread), single-consumer (engine thread) queue."""

    def __init__(self, maxlen: int = DEFAULT_MAXLEN) -> None:
        self.items: deque[tuple] = deque(maxlen=maxlen)
        self.dropped = 0  # discarded unread because the deque was full (builder thread)
        self._reported = 0  # dropped count already handed out by take (consumer thread)

    def put(self, item: tuple) -> None:
        """Builder thread. A full deque discards its oldest item (deque maxlen)."""
        items = self.items
        if len(items) == items.maxlen:
            self.dropped += 1
        items.append(item)

    def take(self) -> tuple[list[tuple], int]:
        """Engine thread: the items that arrived since the last take (oldest first), and
        how many were dropped since then. O(new items), no lock."""
        items = self.items
        out: list[tuple] = []
        if items:
            pop = items.popleft
            for _ in range(len(items)):
                try:
                    out.append(pop())
                except IndexError:  # the producer discarded one meanwhile
                    break
        lost = self.dropped - self._reported
        self._reported += lost
        return out, lost


class SpanObserver:
    """Builder thread: turn the KV spans just emitted for a request into observations.

    Durations of spans that ended without error feed the phase histogram; a failed span
    counts one failure under its error.type instead (its duration is a timeout, not a
    phase). Derived phases are computed from the span's own events and bounds.
    """

    def __init__(self, mode: str, role: str, observations: Observations) -> None:
        self.mode = mode
        self.role = role
        self.put = observations.put
        self.observations = observations
        # thread CPU and waits not handed over yet: (process, role) -> [cpu s, wait s]
        self._threads: dict[tuple[str, str], list[float]] = {}

    def on_threads(self, deltas: dict[tuple[str, str], tuple[float, float]]) -> None:
        """A thread sample's CPU and waits (ms, by process and role: `ThreadDeltas`).
        Handed over only while the hand-off is at most half full, else summed here
        until it is: an idle engine (nobody drains it: vLLM collects stats as it steps)
        keeps a few sums, not a queue that fills and drops the KV observations."""
        pending = self._threads
        for key, (cpu, wait) in deltas.items():
            acc = pending.setdefault(key, [0.0, 0.0])
            acc[0] += cpu / 1e3
            acc[1] += wait / 1e3
        items = self.observations.items
        if pending and len(items) <= (items.maxlen or 0) // 2:
            for (process, role), (cpu_s, wait_s) in pending.items():
                self.put((THREADS, process, role, cpu_s, wait_s))
            pending.clear()

    def on_spans(self, req: RequestState, spans: Sequence[ReadableSpan]) -> None:
        put = self.put
        for span in spans:
            phase = semconv.KV_SPAN_PHASE.get(span.name)
            if phase is None:
                continue
            attrs: Any = span.attributes or {}
            n_bytes = attrs.get(semconv.KV_BYTES)
            if n_bytes:
                put((BYTES, int(n_bytes)))
            if span.status.status_code is StatusCode.ERROR:
                put((FAILURE, str(attrs.get(semconv.ERROR_TYPE, semconv.ERR_TRANSFER))))
                continue
            start, end = span.start_time or 0, span.end_time or 0
            put((PHASE, phase, (end - start) / 1e9))
            if span.name == semconv.SPAN_KV_RENDEZVOUS:
                self._rendezvous(span, end)
            elif span.name == semconv.SPAN_KV_REGISTER:
                for event in span.events:
                    if event.name == semconv.EVENT_HANDSHAKE:
                        ms = (event.attributes or {}).get("duration_ms")
                        if ms is not None:
                            put((PHASE, semconv.KV_PHASE_HANDSHAKE, float(ms) / 1e3))
            elif (
                span.name == semconv.SPAN_KV_DESC_PREP
                and self.mode == "pull"
                and self.role == "decode"
                and req.alloc
            ):
                # D: blocks allocated (the decode span's blocks_allocated) -> prep starts
                put((PHASE, semconv.KV_PHASE_STEP_HANDOFF, max(0, start - req.alloc) / 1e9))

    def _rendezvous(self, span: ReadableSpan, end: int) -> None:
        """P, push: the rendezvous's inputs, the hand-off to the writer, the writer's
        start (its end), cut as the critical path cuts them (analysis.critical_path)."""
        times = {e.name: e.timestamp for e in span.events}
        finished = times.get(semconv.EVENT_PREFILL_FINISHED)
        arrived = times.get(semconv.EVENT_REGISTRATION_ARRIVED)
        handed = times.get(semconv.EVENT_HANDED_TO_WRITER)
        put = self.put
        if finished and arrived:
            # P had its blocks and waited for D's registration (0 when it came first)
            put((PHASE, semconv.KV_PHASE_REGISTRATION_WAIT, max(0, arrived - finished) / 1e9))
        ready = max(finished or 0, arrived or 0)
        if handed and ready:
            put((PHASE, semconv.KV_PHASE_STEP_HANDOFF, max(0, handed - ready) / 1e9))
            put((PHASE, semconv.KV_PHASE_WRITER_QUEUE, max(0, end - max(handed, ready)) / 1e9))
