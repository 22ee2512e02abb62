"""`tracedpush collect` in process on free ports, fed by the real OpenTelemetry SDK's OTLP
exporters (HTTP with gzip, and gRPC) with synthetic push and pull traces: what it stores
is what `tracedpush report` reads, and its /metrics are the analysis' numbers, with
exemplars pointing at traces in the store."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import analyze
from tracedpush.analysis.load import TraceStore
from tracedpush.analysis.phases import PHASES
from tracedpush.collect.service import BackgroundCollect, CollectConfig
from tracedpush.testing.collect import (
    ONE_HOST,
    export_all,
    grpc_exporter,
    http_exporter,
    scrape,
)
from tracedpush.testing.synthetic import generate

N_REQUESTS = 40


@pytest.fixture(scope="module")
def run():
    # one host: every clock is the proxy's, so analysing a trace alone (collect) and the
    # whole store at once (report) place the spans identically
    return generate(N_REQUESTS, seed=11, hosts=ONE_HOST)


@pytest.fixture(scope="module")
def collected(run, tmp_path_factory):
    """Half the processes export over HTTP (gzip), half over gRPC; returns the store
    directory, the final scrape and the collector's summary."""
    traces = tmp_path_factory.mktemp("traces")
    with BackgroundCollect(CollectConfig(traces_dir=traces, any_port=True)) as bg:
        ep = bg.endpoints
        exporters = [http_exporter(str(ep.http_url)), grpc_exporter(ep.grpc_port)]
        sent = export_all(exporters, run.spans.values(), batch=50)
        assert bg.collector.flush(10)
        metrics = scrape(str(ep.metrics_url))
        summary = bg.collector.summary()
        for e in exporters:
            e.shutdown()
    return traces, metrics, summary, sent


def test_store_holds_every_span_and_report_reads_it(run, collected):
    traces, _, _, sent = collected
    files = list(Path(traces).glob("*.jsonl"))
    assert [f.name.startswith("tracedpush-collect-") for f in files] == [True]
    store = TraceStore.from_path(traces)
    assert store.stats.spans == sent and store.stats.malformed == 0
    assert store.stats.duplicates == 0
    result = analyze(store)
    assert len(result.requests) == N_REQUESTS
    truth = run.by_trace()
    for req in result.requests:
        assert req.complete, req.problems
        assert req.ttft_ms == pytest.approx(truth[req.trace_id].ttft_ms, abs=1e-3)
    # engine.steps / engine.threads (process traces) are stored too
    assert any(s.name == sc.SPAN_ENGINE_STEPS for s in store.all_spans())


def test_every_request_trace_completes_once(collected):
    _, metrics, summary, _ = collected
    assert metrics.value("tracedpush_collect_traces_total", outcome="complete") == N_REQUESTS
    assert metrics.value("tracedpush_collect_traces_total", outcome="expired") == 0
    assert "0 pending" in summary


def test_metrics_are_the_analysis_numbers(collected):
    traces, metrics, _, sent = collected
    assert metrics.content_type.startswith("application/openmetrics-text")
    assert metrics.value("tracedpush_collect_spans_total") == sent
    result = analyze(TraceStore.from_path(traces))
    phase_sums: dict[tuple[str, str], float] = defaultdict(float)
    phase_counts: dict[tuple[str, str], int] = defaultdict(int)
    ttft: dict[str, float] = defaultdict(float)
    for req in result.requests:
        ttft[req.mode] += req.ttft_ms / 1000
        for phase, ms in req.phase_ms().items():
            phase_sums[(req.mode, phase)] += ms / 1000
            phase_counts[(req.mode, phase)] += 1
    name = sc.METRIC_TTFT_PHASE
    got = {
        (dict(ls)["mode"], dict(ls)["phase"]): v for ls, v in metrics.series(f"{name}_sum").items()
    }
    # every phase of a mode has a series from its first trace on, at 0 if never on a path
    assert set(got) == {(mode, phase) for mode in ttft for phase in PHASES}
    assert all(got[key] == 0 for key in set(got) - set(phase_sums))
    for key, total in phase_sums.items():
        assert got[key] == pytest.approx(total, rel=1e-9, abs=1e-12), key
        mode, phase = key
        assert metrics.value(f"{name}_count", mode=mode, phase=phase) == phase_counts[key]
    for mode, total in ttft.items():
        assert metrics.value(f"{sc.METRIC_TTFT}_sum", mode=mode) == pytest.approx(total, rel=1e-9)
        assert metrics.value(f"{sc.METRIC_TTFT}_count", mode=mode) == N_REQUESTS / 2
        # the critical path's invariant, visible in the metrics: phases add up to TTFT
        phases = sum(v for (m, _), v in got.items() if m == mode)
        assert phases == pytest.approx(total, rel=1e-9)


def test_buckets_carry_exemplars_of_stored_traces(collected):
    traces, metrics, _, _ = collected
    stored = set(TraceStore.from_path(traces).traces)
    phase_exemplars = [
        ex for name, _, ex in metrics.exemplars if name == f"{sc.METRIC_TTFT_PHASE}_bucket"
    ]
    ttft_exemplars = [ex for name, _, ex in metrics.exemplars if name == f"{sc.METRIC_TTFT}_bucket"]
    assert phase_exemplars and ttft_exemplars
    for ex in phase_exemplars + ttft_exemplars:
        assert set(ex) == {"trace_id"}
        assert len(ex["trace_id"]) == 32 and ex["trace_id"] in stored


def test_plain_scrapers_get_the_classic_format_without_exemplars(collected, run):
    with BackgroundCollect(CollectConfig(any_port=True)) as bg:
        ep = bg.endpoints
        export_all([http_exporter(str(ep.http_url), gzip=False)], run.spans.values(), batch=400)
        assert bg.collector.flush(10)
        plain = scrape(str(ep.metrics_url), accept="text/plain")
        assert bg.collector.store is None  # no --traces: nothing stored
    assert plain.content_type.startswith("text/plain")
    assert f"{sc.METRIC_TTFT_PHASE}_bucket" in plain.text and " # {" not in plain.text


def _post(url: str, body: bytes, ctype: str, encoding: str | None = None):
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_bad_bodies_get_400_and_the_collector_carries_on(run, tmp_path):
    doc = run.files[next(iter(run.files))][0]
    with BackgroundCollect(CollectConfig(traces_dir=tmp_path, any_port=True)) as bg:
        url = f"{bg.endpoints.http_url}/v1/traces"
        bad = [
            (b"\xff\x00garbage", "application/x-protobuf", None),
            (b"{not json", "application/json", None),
            (b"[1, 2]", "application/json", None),
            (b'{"resourceSpans": 7}', "application/json", None),
            (b"plain bytes", "application/x-protobuf", "gzip"),
            (b"{}", "text/html", None),
        ]
        for body, ctype, enc in bad:
            status, _ = _post(url, body, ctype, enc)
            assert status == 400, (body, ctype, enc)
        # one span with an unreadable id: the rest is taken, the bad one reported
        broken = json.loads(json.dumps(doc))
        broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz"
        status, answer = _post(
            url, gzip.compress(json.dumps(broken).encode()), "application/json", "gzip"
        )
        assert status == 200 and json.loads(answer)["partialSuccess"]["rejectedSpans"] == "1"
        status, _ = _post(url, json.dumps(doc).encode(), "application/json")
        assert status == 200
        metrics = scrape(str(bg.endpoints.metrics_url))
    assert metrics.value("tracedpush_collect_rejected_total") == len(bad)
    n = sum(len(ss["spans"]) for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])
    assert TraceStore.from_path(tmp_path).stats.spans == n  # the broken copy's spans are dupes


def test_across_hosts_each_trace_is_analysed_on_its_own(tmp_path):
    """Skewed clocks on three hosts: collect's numbers are `analyze()` of each trace
    alone (its offsets from that trace's causal pairs; docs/collect.md, Clocks)."""
    run = generate(10, seed=12, clock_offsets_ms={"decode-0": 40.0}, engine_steps=False)
    with BackgroundCollect(CollectConfig(traces_dir=tmp_path, any_port=True)) as bg:
        ep = bg.endpoints
        export_all([grpc_exporter(ep.grpc_port)], run.spans.values(), batch=30)
        assert bg.collector.flush(10)
        metrics = scrape(str(ep.metrics_url))
    store = TraceStore.from_path(tmp_path)
    sums: dict[tuple[str, str], float] = defaultdict(float)
    truth = run.by_trace()
    for tid in store.traces:
        (req,) = analyze({tid: store.spans(tid)}, spans=False).requests
        # the TTFT is the proxy's own measure: no skew can move it
        assert req.ttft_ms == pytest.approx(truth[tid].ttft_ms, abs=1e-3)
        for phase, ms in req.phase_ms().items():
            sums[(req.mode, phase)] += ms / 1000
    for (mode, phase), total in sums.items():
        got = metrics.value(f"{sc.METRIC_TTFT_PHASE}_sum", mode=mode, phase=phase)
        assert got == pytest.approx(total, rel=1e-9, abs=1e-12), (mode, phase)
