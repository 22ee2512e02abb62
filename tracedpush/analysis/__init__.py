"""Turn tracedpush traces into answers: where did each request's TTFT go, and why is
push faster or slower than pull here.

Pure Python (no vLLM, NIXL, Streamlit or pandas), so it runs on a laptop with only the
trace files::

    from tracedpush.analysis import TraceStore, analyze, compare, to_perfetto

    store = TraceStore.from_path("traces/")        # or TraceStore.from_jaeger(url)
    run = analyze(store)                            # clock skew corrected by default
    r = run.get(trace_id_or_request_id)
    r.critical_path                                 # [Segment(phase, service, start_ms, ...)]
    r.hidden                                        # overlapped phases, e.g. push's kv.register
    r.spans                                         # SpanView per span, on lanes, skew-corrected
    run.clock_offsets                               # {instance: ClockOffset(offset_ms, ...)}
    run.clock_windows                               # the same per stretch of the run (reported)
    run.table()                                     # one flat dict per request
    run_json(run)                                   # the documented JSON report
    cmp = compare(run)                              # push vs pull per prompt bucket and load
    store.refresh(); run = analyze(store)           # tail a growing directory
    AnalysisIndex(["traces/"]).update()             # the same run through the index

Modules: `model` (spans and answer dataclasses), `otlp` (OTLP/Jaeger JSON decoding),
`load` (`TraceStore`), `jaeger` (HTTP source), `timeline` (lanes, load, buckets), `skew`
(clock offsets), `critical_path`, `analyze`, `results` (what `analyze` returns, data
only), `compare`, and three renderers: `report` (text tables), `report_json` (the JSON
format), `perfetto`; `phases` (phase names), `command` (CLI), `steps` (engine steps and
thread samples), `tpot` (TPOT attribution), `contention`, `sampling` (sampled runs:
the ratios seen, the common sample that keeps statistics unbiased). Realistic generated traces
for tests and benchmarks live in `tracedpush.testing.synthetic`. `index` keeps results
and spans beside the traces, updated in proportion to what is new (`index_store`: what
it stores; `index_build`: its cold build on every core).
"""

from __future__ import annotations

from tracedpush.analysis import phases
from tracedpush.analysis.analyze import DEFAULT_BUCKETS, DEFAULT_LOAD_BUCKETS, analyze
from tracedpush.analysis.compare import (
    Comparison,
    ComparisonGroup,
    PhaseDelta,
    TtftAccount,
    compare,
    explain_delta,
)
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.load import FileSource, TraceStore
from tracedpush.analysis.model import (
    ClockOffset,
    Event,
    LoadStats,
    Resource,
    Segment,
    Span,
    SpanView,
)
from tracedpush.analysis.perfetto import to_perfetto, write_perfetto
from tracedpush.analysis.report_json import JSON_VERSION, request_json, run_json
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis
from tracedpush.analysis.steps import EngineStep, EngineSteps, ThreadSample
from tracedpush.analysis.tpot import explain_tpot_delta, top_mechanisms

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_LOAD_BUCKETS",
    "JSON_VERSION",
    "AnalysisIndex",
    "ClockOffset",
    "Comparison",
    "ComparisonGroup",
    "EngineStep",
    "EngineSteps",
    "Event",
    "FileSource",
    "LoadStats",
    "PhaseDelta",
    "RequestAnalysis",
    "Resource",
    "RunAnalysis",
    "Segment",
    "Span",
    "SpanView",
    "ThreadSample",
    "TraceStore",
    "TtftAccount",
    "analyze",
    "compare",
    "explain_delta",
    "explain_tpot_delta",
    "phases",
    "request_json",
    "run_json",
    "to_perfetto",
    "top_mechanisms",
    "write_perfetto",
]
