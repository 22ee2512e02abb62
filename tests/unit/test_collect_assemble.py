"""Trace assembly in `tracedpush collect`: a trace completes exactly once whatever the
arrival order, incomplete traces expire and are counted, and memory stays bounded."""

from __future__ import annotations

import random
import time

from tracedpush import semconv as sc
from tracedpush.analysis.load import TraceStore
from tracedpush.collect.assemble import Assembler
from tracedpush.collect.service import BackgroundCollect, CollectConfig
from tracedpush.testing.collect import export_all, http_exporter, scrape
from tracedpush.testing.synthetic import generate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _request_spans(n: int, seed: int):
    store = TraceStore.from_documents(generate(n, seed=seed).documents)
    return [s for s in store.all_spans() if s.name not in sc.PROCESS_SPANS]


def test_each_trace_completes_once_in_any_arrival_order():
    spans = _request_spans(12, seed=1)
    random.Random(2).shuffle(spans)
    asm = Assembler(timeout_s=60)
    done: list[str] = []
    for i in range(0, len(spans), 7):
        complete, evicted = asm.add(spans[i : i + 7])
        assert evicted == 0
        done += [tid for tid, _ in complete]
    assert sorted(done) == sorted({s.trace_id for s in spans})
    assert asm.pending == 0 and asm.completed == 12
    # a straggler (a duplicate here) of a finished trace neither re-opens nor re-counts it
    assert asm.add(spans[:3]) == ([], 0) and asm.pending == 0 and asm.late == 3


def test_incomplete_traces_expire_and_memory_is_bounded():
    spans = [s for s in _request_spans(6, seed=3) if s.name != sc.SPAN_REQUEST]  # no roots
    clock = Clock()
    asm = Assembler(timeout_s=10, max_pending=4, clock=clock)
    complete, evicted = asm.add(spans)
    assert complete == [] and evicted == 2 and asm.pending == 4
    clock.now = 9.0
    assert asm.sweep() == 0
    clock.now = 10.5
    assert asm.sweep() == 4 and asm.pending == 0 and asm.expired == 6
    # their stragglers do not start them again
    asm.add(spans[:5])
    assert asm.pending == 0


def test_collector_counts_expired_traces_and_keeps_their_spans(tmp_path):
    run = generate(8, seed=4)
    engines_only = [spans for name, spans in run.spans.items() if "proxy" not in name]
    with BackgroundCollect(
        CollectConfig(traces_dir=tmp_path, trace_timeout_s=0.3, any_port=True)
    ) as bg:
        sent = export_all([http_exporter(str(bg.endpoints.http_url))], engines_only, batch=100)
        deadline = time.monotonic() + 5
        while bg.collector.assembler.expired < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = scrape(str(bg.endpoints.metrics_url))
    assert metrics.value("tracedpush_collect_traces_total", outcome="expired") == 8
    assert metrics.value("tracedpush_collect_traces_total", outcome="complete") == 0
    assert metrics.value(sc.METRIC_COLLECT_PENDING) == 0
    assert not metrics.series(f"{sc.METRIC_TTFT}_count")  # nothing observed
    assert TraceStore.from_path(tmp_path).stats.spans == sent  # stored all the same
