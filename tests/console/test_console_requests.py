"""Requests page: every request as a point of the chosen measure against the chosen axis,
and the requests with the largest values, each opening its timeline."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tracedpush.analysis.results import RunAnalysis
from tracedpush.testing.console import figure, kinds, no_exception, traces_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PAGE = "views/requests.py"


def _points(fig: dict) -> dict[str, tuple[float, float]]:
    """trace id -> (x, y) of every point of the requests scatter."""
    out = {}
    for t in traces_of(fig, kind="requests"):
        for x, y, custom in zip(t["x"], t["y"], t["customdata"], strict=True):
            out[custom[-1]] = (x, y)
    return out


def _same(got: dict[str, tuple[float, float]], want: dict[str, tuple[float, float]]) -> None:
    assert got.keys() == want.keys()
    for tid, (x, y) in want.items():
        assert got[tid] == (pytest.approx(x), pytest.approx(y)), tid


def test_every_request_is_a_clickable_point(app, traces, expected: RunAnalysis):
    at = app(traces=traces[0], page=PAGE)
    no_exception(at)
    got = _points(figure(at, "requests"))
    want = {r.trace_id: (r.prompt_tokens, r.ttft_ms) for r in expected.requests}
    _same(got, {t: xy for t, xy in want.items() if xy[1] is not None})


def test_a_phase_against_arrival(app, traces, expected: RunAnalysis):
    """Any phase's time on the critical path, against arrival on a date axis (in UTC: this
    browser reports no time zone); requests without that phase are left out (and the
    caption says so)."""
    at = app(traces=traces[0], page=PAGE)
    y = "critical_ms.WRITE"
    at.selectbox(key="requests_y").set_value(y)
    at.selectbox(key="requests_x").set_value("start_unix_ms").run()
    no_exception(at)
    fig = figure(at, "requests")
    assert fig["layout"]["xaxis"]["type"] == "date"
    want = {
        r.trace_id: (r.start_unix_ms, r.phase_ms()["WRITE"])
        for r in expected.requests
        if "WRITE" in r.phase_ms()
    }
    assert 0 < len(want) < len(expected.requests)  # pull requests have no WRITE
    # a date axis draws wall times: back to unix ms
    got = {t: (pd.Timestamp(x).value / 1e6, y) for t, (x, y) in _points(fig).items()}
    _same(got, want)
    assert fig["layout"]["xaxis"]["title"]["text"] == "arrival (UTC)"
    caption = " ".join(c.value for c in at.caption)
    assert f"{len(want):,} of {len(expected.requests):,} requests" in caption
    assert "left out" in caption


def test_a_log_scale_for_the_measure(app, traces):
    at = app(traces=traces[0], page=PAGE)
    linear = figure(at, "requests")
    assert linear["layout"]["yaxis"].get("type") != "log"
    at.toggle(key="requests_log").set_value(True).run()
    no_exception(at)
    logged = figure(at, "requests")
    assert logged["layout"]["yaxis"]["type"] == "log"
    assert _points(logged) == _points(linear)


def test_the_largest_requests_by_the_measure(app, traces, expected: RunAnalysis):
    at = app(traces=traces[0], page=PAGE)
    at.selectbox(key="requests_y").set_value("tpot_ms")
    at.slider(key="largest_n").set_value(7).run()
    no_exception(at)
    (frame,) = [d.value for d in at.dataframe]
    tpots = sorted((r.tpot_ms for r in expected.requests if r.tpot_ms is not None), reverse=True)
    assert frame["tpot_ms"].tolist() == pytest.approx(tpots[:7])
    by_request = {r.request_id: r.trace_id for r in expected.requests}
    links = frame["timeline"].tolist()
    assert links == [f"timeline?request={by_request[q]}" for q in frame["request_id"]]
    assert all(not math.isnan(v) for v in frame["tpot_ms"])


def test_the_overview_links_to_it_and_draws_no_scatter(app, traces):
    at = app(traces=traces[0])
    no_exception(at)
    assert "requests" not in kinds(at) and "latency_by_load" in kinds(at)
    (link,) = [e for e in at.get("page_link") if "requests" in e.proto.page]
    assert "Every request" in link.proto.label
