"""`tracedpush collect --forward`: everything received reaches a real second OTLP
receiver, and a forward target that hangs never slows receiving (drops are counted)."""

from __future__ import annotations

import time

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis.load import TraceStore
from tracedpush.collect.service import BackgroundCollect, CollectConfig
from tracedpush.testing.collect import export_all, grpc_exporter, http_exporter, scrape
from tracedpush.testing.net import free_port
from tracedpush.testing.otlp import HangingEndpoint, OtlpHttpReceiver
from tracedpush.testing.synthetic import generate


def test_forwarding_reaches_a_second_receiver(tmp_path):
    run = generate(10, seed=5, engine_steps=False)
    names = sorted(s.name for spans in run.spans.values() for s in spans)
    port = free_port()
    receiver = OtlpHttpReceiver(port)
    try:
        config = CollectConfig(
            traces_dir=tmp_path, forward=f"http://127.0.0.1:{port}", any_port=True
        )
        with BackgroundCollect(config) as bg:
            ep = bg.endpoints
            exporters = [http_exporter(str(ep.http_url)), grpc_exporter(ep.grpc_port)]
            sent = export_all(exporters, run.spans.values(), batch=20)
            assert bg.collector.flush(10)
            forwarder = bg.collector.forwarder
            assert forwarder is not None and forwarder.forwarded == sent
            assert sum(forwarder.dropped.values()) == 0
    finally:
        receiver.close()
    # protobuf from gRPC and from HTTP both arrive as the OTLP/HTTP protobuf they were
    assert sorted(receiver.names) == names
    assert TraceStore.from_path(tmp_path).stats.spans == sent


@pytest.mark.serial  # a latency bound
def test_a_hanging_forward_target_never_blocks_receiving(tmp_path):
    run = generate(20, seed=6, engine_steps=False)
    hang = HangingEndpoint()
    try:
        config = CollectConfig(
            traces_dir=tmp_path,
            forward=f"http://127.0.0.1:{hang.port}",
            forward_queue=2,
            forward_timeout_s=1.0,
            any_port=True,
        )
        with BackgroundCollect(config) as bg:
            exporter = http_exporter(str(bg.endpoints.http_url), timeout=2)
            worst = 0.0
            sent = 0
            for spans in run.spans.values():
                for i in range(0, len(spans), 5):
                    t0 = time.monotonic()
                    sent += export_all([exporter], [spans[i : i + 5]], batch=5)
                    worst = max(worst, time.monotonic() - t0)
            # every export was answered at once although the target never answers
            assert worst < 0.5, worst
            assert bg.collector.flush(0.0) is False  # the hung attempt is still waiting
            deadline = time.monotonic() + 5
            while bg.collector.assembler.completed < 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)  # the analysis thread observes what the assembler completed
            metrics = scrape(str(bg.endpoints.metrics_url))
    finally:
        hang.close()
    queued_out = metrics.value(f"{sc.METRIC_SPANS_DROPPED}_total", reason=sc.DROP_QUEUE_FULL)
    assert queued_out > 0  # the queue of 2 requests overflowed, counted in spans
    assert metrics.value("tracedpush_collect_spans_total") == sent
    assert metrics.value("tracedpush_collect_traces_total", outcome="complete") == 20
    assert TraceStore.from_path(tmp_path).stats.spans == sent
