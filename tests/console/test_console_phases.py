"""Phases page: per-phase distributions are the analysis' numbers; outliers link out."""

from __future__ import annotations

import math
import statistics

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import compare
from tracedpush.testing.console import figure, no_exception, traces_of


def _critical_ms(expected, mode):
    reqs = expected.by_mode(mode)
    phases = {p for r in reqs for p in r.phase_ms()}
    return {p: sorted(r.phase_ms().get(p, 0.0) for r in reqs) for p in phases}


def _plotly_quantile(values: list[float], p: float) -> float:
    """Plotly.js's `Lib.interp` (its "linear" quartile method), written out here."""
    n = p * len(values) - 0.5
    if n < 0:
        return values[0]
    if n > len(values) - 1:
        return values[-1]
    lo = math.floor(n)
    frac = n - lo
    return frac * values[math.ceil(n)] + (1 - frac) * values[lo]


def assert_box_of(box: dict, values: list[float]) -> None:
    """The box is drawn from its statistics (not its values, which a browser would sort):
    they are those Plotly computes from the values, whiskers at the extremes."""
    values = sorted(values)
    assert "y" not in box or box["y"] is None  # no sample travels
    assert box["meta"]["n"] == len(values)
    assert box["q1"] == pytest.approx([_plotly_quantile(values, 0.25)])
    assert box["median"] == pytest.approx([statistics.median(values)])
    assert box["q3"] == pytest.approx([_plotly_quantile(values, 0.75)])
    assert box["lowerfence"] == pytest.approx([values[0]])
    assert box["upperfence"] == pytest.approx([values[-1]])


def test_boxes_are_each_phase_critical_ms_per_mode(app, traces, expected):
    at = app(traces=traces[0], page="views/phases.py")
    no_exception(at)
    fig = figure(at, "phase_box")
    for mode in ("push", "pull"):
        want = _critical_ms(expected, mode)
        boxes = traces_of(fig, kind="phase_box", mode=mode)
        got = {t["meta"]["phase"]: t for t in boxes}
        assert got.keys() == want.keys()
        for phase, values in want.items():
            assert_box_of(got[phase], values)
    # each box's largest values are points that carry their request (click -> timeline)
    (top,) = traces_of(fig, kind="phase_top", mode="push", phase="WRITE")
    pushes = sorted(expected.by_mode("push"), key=lambda r: -r.phase_ms().get("WRITE", 0.0))
    assert [row[1] for row in top["customdata"]] == [r.trace_id for r in pushes[:10]]
    assert top["y"] == pytest.approx([r.phase_ms()["WRITE"] for r in pushes[:10]])


def test_span_durations_measure(app, traces, expected):
    at = app(traces=traces[0], page="views/phases.py")
    at.radio(key="phases_measure").set_value("span durations").run()
    no_exception(at)
    fig = figure(at, "phase_box")
    (box,) = traces_of(fig, kind="phase_box", mode="pull", phase=sc.SPAN_KV_READ)
    want = sorted(s.duration_ms for r in expected.by_mode("pull") for s in r.spans
                  if s.name == sc.SPAN_KV_READ)  # fmt: skip
    assert_box_of(box, want)


def test_percentile_table_and_outliers(app, traces, expected):
    at = app(traces=traces[0], page="views/phases.py")
    frames = [df.value for df in at.dataframe]
    pct = next(f for f in frames if "push p50" in f.columns)
    overall = compare(expected).overall
    assert pct.loc["WRITE", "push p50"] == pytest.approx(overall.phases["push"]["WRITE"]["p50"])
    assert pct.loc["READ", "pull p90"] == pytest.approx(overall.phases["pull"]["READ"]["p90"])

    phase = at.selectbox(key="outlier_phase").value
    outliers = next(f for f in frames if f"{phase} ms" in f.columns)
    top = max(((r.phase_ms().get(phase, 0.0), r) for r in expected.requests), key=lambda t: t[0])[1]
    assert outliers.iloc[0]["request_id"] == top.request_id
    assert outliers.iloc[0]["timeline"] == f"timeline?request={top.trace_id}"


def test_no_mode_selected_is_a_message(app, traces):
    at = app(traces=traces[0], page="views/phases.py")
    at.multiselect(key="phases_modes").set_value([]).run()
    no_exception(at)
    assert any("No phases" in i.value for i in at.info)


def test_one_mode_chosen_after_both_draws_only_that_mode(app, traces):
    """The boxes are kept per snapshot (`Snapshot.memo`) by measure and modes: a page
    that showed both modes, then one, draws that one's boxes only."""
    at = app(traces=traces[0], page="views/phases.py")
    assert traces_of(figure(at, "phase_box"), kind="phase_box", mode="pull")
    at.multiselect(key="phases_modes").set_value(["push"]).run()
    no_exception(at)
    fig = figure(at, "phase_box")
    assert traces_of(fig, kind="phase_box", mode="push")
    assert not traces_of(fig, kind="phase_box", mode="pull")
