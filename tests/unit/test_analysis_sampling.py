"""Sampled runs in the analysis: the ratio(s) reported, and unbiased statistics.

Synthetic traces (tracedpush.testing.synthetic) stand in for a run; the proxy's sampler
attributes are put on their root spans as the proxy writes them.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, compare, run_json
from tracedpush.analysis.report import render
from tracedpush.analysis.results import RunAnalysis
from tracedpush.analysis.sampling import kept_at
from tracedpush.testing import synthetic


def documents(n: int = 120, seed: int = 5) -> list[dict[str, Any]]:
    return synthetic.generate(n, seed=seed).documents


def with_sampler(docs: list[dict[str, Any]], sampler: str, ratio: float | None) -> None:
    """Add the proxy's sampler attributes to every root span, in OTLP JSON."""
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    if span["name"] != sc.SPAN_REQUEST:
                        continue
                    attrs = span.setdefault("attributes", [])
                    attrs.append({"key": sc.SAMPLER, "value": {"stringValue": sampler}})
                    if ratio is not None:
                        attrs.append({"key": sc.SAMPLER_RATIO, "value": {"doubleValue": ratio}})


def counted(run: RunAnalysis) -> int:
    """Requests the comparison's statistics counted (both modes, all buckets)."""
    overall = compare(run).overall
    assert overall is not None
    return sum(overall.n.values())


def with_ttft(requests) -> int:
    """Requests the comparison could count (it needs a TTFT)."""
    return sum(r.ttft_ms is not None for r in requests)


def test_kept_at_is_the_sdks_trace_id_ratio_rule():
    rng = random.Random(3)
    for ratio in (0.0, 0.01, 0.1, 0.5, 1.0):
        sampler = TraceIdRatioBased(ratio)
        for _ in range(2000):
            tid = rng.getrandbits(128) or 1
            decision = sampler.should_sample(None, tid, "x").decision.is_sampled()
            assert kept_at(f"{tid:032x}", ratio) is decision
    assert kept_at("not hex", 1.0) is False


def test_one_ratio_is_reported_and_every_trace_counts():
    docs = documents()
    with_sampler(docs, "traceidratio", 0.01)
    run = analyze(TraceStore.from_documents(docs))
    assert {(r.sampler, r.sampling_ratio) for r in run.requests} == {("traceidratio", 0.01)}
    s = run.sampling()
    assert (s.ratios, s.unknown, s.common_ratio, s.used) == ({0.01: 120}, 0, None, 120)
    assert s.describe().startswith("sampled at 1% (traceidratio; 120 traces, each standing")
    assert counted(run) == with_ttft(run.requests) > 100  # one ratio: nothing to correct

    text = render(run)
    assert "sampled at 1% (traceidratio; 120 traces" in text
    assert "by prompt length and load (in flight at receipt); sampled at 1%" in text
    doc = json.loads(json.dumps(run_json(run)))
    assert doc["sampling"]["ratios"] == [{"ratio": 0.01, "traces": 120, "stands_for": 12000.0}]
    assert doc["sampling"]["common_ratio"] is None
    assert doc["sampling"]["traces_in_statistics"] == 120
    assert doc["sampling"]["summary"] == s.describe()
    assert {(r["sampler"], r["sampling_ratio"]) for r in doc["requests"]} == {
        ("traceidratio", 0.01)
    }


def test_every_request_kept_is_not_called_sampled():
    docs = documents(40)
    with_sampler(docs, "parentbased_always_on", 1.0)
    run = analyze(TraceStore.from_documents(docs))
    assert run.sampling().describe() == "sampling: every request (parentbased_always_on, 40 traces)"
    assert run.sampling().short() == ""
    assert "sampled at" not in render(run)


def test_changed_ratio_keeps_the_common_sample():
    """The first half of the run at 100%, the second at 50% (only traces whose id passes
    the 50% test exist there, as the sampler kept them): the statistics keep the first
    half's traces that a 50% sampler would have kept, and the whole second half."""
    run = analyze(TraceStore.from_documents(documents(200)))
    first, second = run.requests[:100], run.requests[100:]
    for r in first:
        r.sampler, r.sampling_ratio = "traceidratio", 1.0
    second = [r for r in second if kept_at(r.trace_id, 0.5)]
    for r in second:
        r.sampler, r.sampling_ratio = "traceidratio", 0.5
    run.requests = first + second
    s = run.sampling()
    assert s.common_ratio == 0.5 and s.ratios == {1.0: 100, 0.5: len(second)}
    common = [r for r in first if kept_at(r.trace_id, 0.5)] + second
    expected = len(common)
    assert 20 < expected - len(second) < 80  # some of the first half left out, not all
    assert s.used == expected
    assert counted(run) == with_ttft(common)
    assert "common sample" in s.describe() and f"uses the {expected} traces" in s.describe()
    assert "; common sample at 50% of 50%, 100%" in render(run)
    assert run_json(run)["sampling"]["common_ratio"] == 0.5


def test_traces_without_a_ratio_leave_a_mixed_run_s_statistics():
    """A client's traceparent decided those (at its own rate): unknown probability."""
    run = analyze(TraceStore.from_documents(documents(60)))
    for i, r in enumerate(run.requests):
        r.sampler = "parentbased_traceidratio"
        r.sampling_ratio = None if i % 3 == 0 else 1.0
    s = run.sampling()
    assert (s.unknown, s.common_ratio, s.used) == (20, 1.0, 40)
    assert counted(run) == with_ttft(r for r in run.requests if r.sampling_ratio == 1.0)
    assert "no ratio (20 traces)" in s.describe()


def test_traces_from_before_sampling_was_recorded_count_as_they_did():
    run = analyze(TraceStore.from_documents(documents(30)))
    s = run.sampling()
    assert (s.ratios, s.unknown, s.common_ratio, s.used) == ({}, 30, None, 30)
    assert counted(run) == with_ttft(run.requests)
    assert "sampl" not in render(run).split("clock skew")[0]  # no sampling line
    assert run_json(run)["sampling"]["summary"] == "sampling: not recorded (30 traces)"


@pytest.mark.parametrize("bad", [0.0, -1.0, 2.0, True, "0.5"])
def test_a_ratio_that_is_not_a_probability_is_not_one(bad):
    docs = documents(10)
    with_sampler(docs, "traceidratio", None)
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    if span["name"] == sc.SPAN_REQUEST:
                        value = (
                            {"boolValue": bad}
                            if isinstance(bad, bool)
                            else {"stringValue": bad}
                            if isinstance(bad, str)
                            else {"doubleValue": bad}
                        )
                        span["attributes"].append({"key": sc.SAMPLER_RATIO, "value": value})
    run = analyze(TraceStore.from_documents(docs))
    assert {r.sampling_ratio for r in run.requests} == {None}
