"""Overview page: the seed article's charts and the critical-path stack, from analysis."""

from __future__ import annotations

import pytest

from tracedpush.analysis import compare
from tracedpush.testing.console import figure, no_exception, traces_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_latency_by_load_plots_the_comparison_percentiles(app, traces, expected):
    at = app(traces=traces[0])
    no_exception(at)
    cmp = compare(expected)
    fig = figure(at, "latency_by_load")
    for metric in ("ttft", "tpot"):
        for mode in ("push", "pull"):
            (line,) = traces_of(fig, kind="latency_by_load", metric=metric, mode=mode, bucket="all")
            assert line["x"] == cmp.loads
            want = [cmp.group("all", ld).ttft if metric == "ttft" else cmp.group("all", ld).tpot
                    for ld in cmp.loads]  # fmt: skip
            assert line["y"] == pytest.approx([w[mode]["p50"] for w in want])
    # one column per prompt bucket as well
    for bucket in cmp.buckets:
        assert traces_of(fig, kind="latency_by_load", metric="ttft", mode="push", bucket=bucket)


def test_statistic_switch_redraws_with_p90(app, traces, expected):
    at = app(traces=traces[0])
    at.segmented_control(key="overview_stat").set_value("p90").run()
    no_exception(at)
    cmp = compare(expected)
    fig = figure(at, "latency_by_prompt")
    (line,) = traces_of(fig, kind="latency_by_prompt", metric="ttft", mode="pull")
    assert line["x"] == cmp.buckets
    want = [cmp.group(b, "all").ttft["pull"]["p90"] for b in cmp.buckets]
    assert line["y"] == pytest.approx(want)


def test_critical_path_stack_adds_up_to_mean_ttft(app, traces, expected):
    at = app(traces=traces[0])
    fig = figure(at, "critical_stack")
    bars = traces_of(fig, kind="critical_stack")
    cmp = compare(expected)
    buckets, modes = bars[0]["x"]
    for i, (bucket, mode) in enumerate(zip(buckets, modes, strict=True)):
        group = cmp.group("all" if bucket == "all prompts" else bucket, "all")
        stacked = sum(b["y"][i] for b in bars)
        assert stacked == pytest.approx(group.ttft[mode]["mean"], rel=1e-6)
    # push's stack has WRITE, pull's has READ and relay
    phases = {b["meta"]["phase"] for b in bars}
    assert {"WRITE", "READ", "relay", "writer queue", "notification"} <= phases
