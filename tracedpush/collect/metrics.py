"""`tracedpush collect`'s /metrics: TTFT and its critical-path phases, with exemplars.

Every complete trace's critical path (tracedpush.analysis) is observed once: one
observation per phase on the path (a phase that occurs twice counts its sum) in
`tracedpush_ttft_phase_seconds{mode, phase}` and the TTFT in
`tracedpush_ttft_seconds{mode}`. Each observation carries the OpenMetrics exemplar
`{trace_id="<32 hex>"}`, so a slow bucket in Grafana links to that request's trace in
Jaeger or the console. Exemplars only exist in the OpenMetrics format, which is served
when the scraper asks for it (`Accept: application/openmetrics-text`, as Prometheus
does); the classic text format is served otherwise.

A private `CollectorRegistry`: several collectors in one process (tests) never share
series, and nothing else in the process leaks into this /metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tracedpush import semconv as sc
from tracedpush.analysis.phases import PHASES
from tracedpush.analysis.results import RequestAnalysis

# The proxy's tracedpush_proxy_ttft_seconds buckets, with finer ones below 10 ms.
TTFT_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
EXEMPLAR_KEY: Final = "trace_id"


class _Live(Collector):
    """Values read at scrape time from the collector's own plain counters."""

    def __init__(
        self, dropped: Callable[[], Mapping[str, int]], pending: Callable[[], int]
    ) -> None:
        self.dropped = dropped
        self.pending = pending

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            sc.METRIC_SPANS_DROPPED,
            "Spans the collector received but could not store (store_full, export_failed) "
            "or forward (queue_full, export_failed), by reason.",
            labels=[sc.LABEL_REASON],
        )
        for reason, n in sorted(self.dropped().items()):
            c.add_metric([reason], n)
        yield c
        g = GaugeMetricFamily(
            sc.METRIC_COLLECT_PENDING, "Traces waiting for their spans (not yet complete)."
        )
        g.add_metric([], self.pending())
        yield g


class CollectMetrics:
    """The series of the module docstring, in their own registry."""

    def __init__(
        self,
        dropped: Callable[[], Mapping[str, int]] = dict,
        pending: Callable[[], int] = lambda: 0,
    ) -> None:
        self.registry = CollectorRegistry()
        self.phase = Histogram(
            sc.METRIC_TTFT_PHASE,
            "Critical-path time of each TTFT phase (tracedpush.analysis.phases), one "
            "observation per complete trace and phase on its path; exemplar trace_id.",
            [sc.LABEL_MODE, sc.LABEL_PHASE],
            buckets=sc.PHASE_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            sc.METRIC_TTFT,
            "TTFT of each complete trace: the proxy's receipt -> first token sent to the "
            "client, the sum of its critical-path phases; exemplar trace_id.",
            [sc.LABEL_MODE],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.traces = Counter(
            sc.METRIC_COLLECT_TRACES,
            "Request traces assembled (complete: analysed) or given up on (expired: "
            "incomplete after the trace timeout, or evicted by the pending limit).",
            [sc.LABEL_OUTCOME],
            registry=self.registry,
        )
        self.spans = Counter(
            sc.METRIC_COLLECT_SPANS,
            "Spans received over OTLP (HTTP and gRPC).",
            registry=self.registry,
        )
        self.rejected = Counter(
            sc.METRIC_COLLECT_REJECTED,
            "OTLP export requests refused as malformed (answered 400 / INVALID_ARGUMENT).",
            registry=self.registry,
        )
        for outcome in (sc.OUTCOME_COMPLETE, sc.OUTCOME_EXPIRED):
            self.traces.labels(outcome)  # present at 0 from the first scrape
        self.registry.register(_Live(dropped, pending))
        self._modes: set[str] = set()

    def _first_of(self, mode: str) -> None:
        """Every phase's series of a mode exists from its first trace on (at 0 where no
        request spent time in it), so a dashboard panel per phase is never empty."""
        self._modes.add(mode)
        for phase in PHASES:
            self.phase.labels(mode, phase)

    def observe(self, req: RequestAnalysis) -> bool:
        """Observe one analysed request; False when it has no TTFT (it failed)."""
        if req.ttft_ms is None:
            return False
        if req.mode not in self._modes:
            self._first_of(req.mode)
        exemplar = {EXEMPLAR_KEY: req.trace_id}
        for phase, ms in req.phase_ms().items():
            self.phase.labels(req.mode, phase).observe(ms / 1000.0, exemplar)
        self.ttft.labels(req.mode).observe(req.ttft_ms / 1000.0, exemplar)
        return True

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this Accept header."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
