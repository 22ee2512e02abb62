"""The proxy's /metrics beyond request counts: the TPOT histogram (streamed requests
only, vLLM's definition) and the spans its own exporters dropped, by reason."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tracedpush import semconv
from tracedpush.proxy.metrics import TPOT_BUCKETS, ProxyMetrics, sink_drop_stats
from tracedpush.telemetry.export import ExportWorker, SpanSink, _SinkProcessor
from tracedpush.testing.stub_engine import StubEngine, proxy_rig

STREAM = {"model": "stub-model", "prompt": "a b c d", "max_tokens": 7, "stream": True}


def _sample(text: str, series: str) -> float:
    """The value of one exposition line, by its exact series (name and labels)."""
    (value,) = [
        line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(series + " ")
    ]
    return float(value)


def test_tpot_is_the_mean_gap_between_first_and_last_token():
    metrics = ProxyMetrics("push")
    metrics.observe_tpot(1_000_000_000, 1_300_000_000, 4)  # 0.3 s over 3 gaps
    text = metrics.render([])
    assert _sample(text, 'tracedpush_proxy_tpot_seconds_count{mode="push"}') == 1
    assert abs(_sample(text, 'tracedpush_proxy_tpot_seconds_sum{mode="push"}') - 0.1) < 1e-9
    assert _sample(text, 'tracedpush_proxy_tpot_seconds_bucket{mode="push",le="0.075"}') == 0
    assert _sample(text, 'tracedpush_proxy_tpot_seconds_bucket{mode="push",le="0.1"}') == 1
    assert _sample(text, 'tracedpush_proxy_tpot_seconds_bucket{mode="push",le="+Inf"}') == 1
    assert "# TYPE tracedpush_proxy_tpot_seconds histogram" in text
    assert (
        len([ln for ln in text.splitlines() if "tpot_seconds_bucket" in ln])
        == len(TPOT_BUCKETS) + 1
    )


def test_tpot_is_not_observed_when_undefined():
    metrics = ProxyMetrics("pull")
    metrics.observe_tpot(5, 5, 3)  # non-streamed: first token == last token
    metrics.observe_tpot(5, 9, 1)  # a single token has no inter-token time
    metrics.observe_tpot(None, 9, 3)
    metrics.observe_tpot(5, None, 3)
    metrics.observe_tpot(5, 9, None)
    assert metrics.tpot.count == 0


def test_spans_dropped_are_summed_over_exporters_and_every_reason_is_exposed():
    stats = {
        "jsonl": {"dropped_by_reason": {"queue_full": 2, "export_failed": 0, "store_full": 5}},
        "otlp": {"dropped_by_reason": {"queue_full": 1, "export_failed": 7, "store_full": 0}},
    }
    text = ProxyMetrics("push", lambda: stats).render([])
    assert "# TYPE tracedpush_proxy_spans_dropped_total counter" in text
    assert _sample(text, 'tracedpush_proxy_spans_dropped_total{reason="queue_full"}') == 3
    assert _sample(text, 'tracedpush_proxy_spans_dropped_total{reason="export_failed"}') == 7
    assert _sample(text, 'tracedpush_proxy_spans_dropped_total{reason="store_full"}') == 5
    # No sink (tests' providers): still a zero per reason, so rate() has a series.
    bare = ProxyMetrics("push").render([])
    for reason in semconv.DROP_REASONS:
        assert _sample(bare, f'tracedpush_proxy_spans_dropped_total{{reason="{reason}"}}') == 0


class _NullExporter:
    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_the_sink_is_found_in_a_provider_built_like_the_proxys():
    """`build_tracer_provider` puts a SpanSink behind a processor; the proxy reads its
    drop counters from there (a provider without one gives None)."""
    worker = ExportWorker("jsonl", _NullExporter(), target="test")
    worker.drops["store_full"] += 4
    sink = SpanSink([worker])
    provider = TracerProvider()
    provider.add_span_processor(_SinkProcessor(sink))
    try:
        stats = sink_drop_stats(provider)
        assert stats is not None
        assert stats()["jsonl"]["dropped_by_reason"]["store_full"] == 4
        assert sink_drop_stats(TracerProvider()) is None
        assert sink_drop_stats(None) is None
    finally:
        provider.shutdown()


def test_streamed_requests_through_the_proxy_observe_tpot():
    async def scenario() -> None:
        decode = StubEngine("decode", mode="pull", token_delay=0.05)
        async with proxy_rig("pull", decode=[decode]) as rig:
            resp = await rig.client.post("/v1/completions", json=STREAM)
            assert resp.status == 200
            await resp.read()
            non_streamed = {**STREAM, "stream": False}
            assert (await rig.client.post("/v1/completions", json=non_streamed)).status == 200
            text = await (await rig.client.get("/metrics")).text()
        # one observation: the streamed request (the non-streamed one has no TPOT)
        assert _sample(text, 'tracedpush_proxy_tpot_seconds_count{mode="pull"}') == 1
        tpot = _sample(text, 'tracedpush_proxy_tpot_seconds_sum{mode="pull"}')
        assert 0.03 < tpot < 1.0, tpot  # 3 tokens, ~50 ms apart
        assert _sample(text, 'tracedpush_proxy_ttft_seconds_count{mode="pull"}') == 2

    asyncio.run(asyncio.wait_for(scenario(), 30))
