"""Pure pieces of the console: figure builders, click handling, request pairing."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tracedpush.analysis import phases as ph
from tracedpush.console import charts, selection, ui, zones


def test_every_phase_has_its_own_colour():
    colours = [charts.phase_color(p) for p in ph.PHASES]
    assert len(set(colours)) == len(colours)
    assert charts.phase_color("kv.write") == charts.phase_color(ph.WRITE)


def test_lane_labels():
    assert charts.lane_label("vllm-prefill/prefill-0/push_writer") == "P prefill-0 · push_writer"
    assert charts.lane_label("vllm-decode/decode-0/model_runner/tp1") == (
        "D decode-0 · model_runner · tp1"
    )
    assert charts.lane_label("tracedpush-proxy/host:8000/pid 7") == "proxy · pid 7"


def test_timeline_without_requests_is_an_empty_figure():
    fig = charts.timeline([])
    assert not fig.data and "no request" in fig.layout.annotations[0].text


def test_clicked_point_gives_its_trace_id():
    event = {"selection": {"points": [{"customdata": ["push-00001", 3, "abc123"]}]}}
    assert ui.picked_trace_id(event) == "abc123"
    obj = SimpleNamespace(selection=SimpleNamespace(points=[{"customdata": "def"}]))
    assert ui.picked_trace_id(obj) == "def"
    assert ui.picked_trace_id({"selection": {"points": []}}) is None
    assert ui.picked_trace_id(None) is None


def _req(mode, prompt, load, complete=True, ttft=10.0, start=0.0):
    return SimpleNamespace(mode=mode, prompt_tokens=prompt, load=load, complete=complete,
                           ttft_ms=ttft, start_unix_ms=start)  # fmt: skip


def test_counterpart_is_the_nearest_complete_request_of_the_other_mode():
    push = _req("push", 1000, 4)
    near_incomplete = _req("pull", 1000, 4, complete=False)
    near = _req("pull", 1100, 4)
    far = _req("pull", 4000, 4)
    same_mode = _req("push", 1000, 4)
    pool = [near_incomplete, near, far, same_mode]
    assert selection.counterpart(push, pool) is near
    assert selection.counterpart(push, [same_mode]) is None


def test_typical_is_the_median_ttft():
    reqs = [_req("push", 100, 1, ttft=t) for t in (5.0, 1.0, 9.0)]
    assert selection.typical(reqs, "push").ttft_ms == 5.0
    assert selection.typical(reqs, "pull") is None
    assert selection.mode_order(["unknown", "pull", "push"]) == ["push", "pull", "unknown"]


def _table(n: int, mode: str = "push"):
    import pandas as pd

    rng = np.random.default_rng(3)
    return pd.DataFrame(
        {
            "mode": [mode] * n,
            "prompt_tokens": rng.integers(64, 8192, n),
            "ttft_ms": rng.lognormal(5, 1, n),
            "start_unix_ms": np.arange(n) * 10.0,
            "request_id": [f"r{i}" for i in range(n)],
            "load": rng.integers(1, 32, n),
            "trace_id": [f"{i:032x}" for i in range(n)],
        }
    )


def test_a_big_scatter_draws_the_slowest_and_an_even_sample():
    table = _table(charts.MAX_POINTS * 5)
    fig = charts.requests_scatter(table)
    (trace,) = fig.data
    ids = [row[-1] for row in trace.customdata]
    assert len(ids) == len(set(ids)) == charts.MAX_POINTS
    assert trace.meta["of"] == len(table)
    slowest = set(table.nlargest(charts.SLOWEST, "ttft_ms")["trace_id"])
    assert slowest <= set(ids)  # every outlier is clickable
    # the rest is spread evenly over the run: each fifth of it keeps about its share
    rest = [int(t, 16) for t in ids if t not in slowest]
    fifths = np.bincount(np.array(rest) * 5 // len(table), minlength=5)
    assert fifths.min() >= 0.95 * len(rest) / 5
    assert "Drawn: 5,000 of 25,000 push requests" in charts.drawn_note(fig, "requests")


def test_a_small_scatter_draws_every_request_and_says_nothing():
    table = _table(500)
    fig = charts.requests_scatter(table)
    assert len(fig.data[0].customdata) == 500
    assert charts.drawn_note(fig, "requests") == ""
    live = charts.window_ttft(_table(charts.MAX_POINTS, "pull"))
    assert len(live.data[0].customdata) == charts.MAX_POINTS
    assert charts.drawn_note(live, "window_ttft") == ""


def test_arrival_is_drawn_in_the_visitors_time_zone():
    """Plotly's date axis has no time zone: the points are wall times in the browser's,
    and the axis says which."""
    table = _table(50).assign(start_unix_ms=1_772_962_200_000.0 + np.arange(50) * 1e3)
    kolkata = zones.zone("Asia/Kolkata")
    fig = charts.requests_scatter(table, charts.ARRIVAL, x_title="arrival (x)", tz=kolkata)
    (trace,) = fig.data
    assert fig.layout.xaxis.type == "date"
    assert np.datetime64(trace.x[0], "s") == np.datetime64("2026-03-08T15:00:00")
    utc = charts.requests_scatter(table, charts.ARRIVAL)
    assert np.datetime64(utc.data[0].x[0], "s") == np.datetime64("2026-03-08T09:30:00")
    live = charts.window_ttft(table, tz=kolkata)
    assert np.datetime64(live.data[0].x[0], "s") == np.datetime64("2026-03-08T15:00:00")
    assert live.layout.xaxis.title.text == "arrival (Asia/Kolkata)"


def test_the_live_scatter_draws_a_sample_keeping_the_slowest():
    """The Live page's scatter is capped as the overview's, and keeps every one of the
    slowest requests."""
    table = _table(charts.MAX_POINTS * 4 + 1, "pull")
    live = charts.window_ttft(table)
    (trace,) = live.data
    ids = list(trace.customdata)
    assert len(ids) == len(set(ids)) == charts.MAX_POINTS
    assert set(table.nlargest(charts.SLOWEST, "ttft_ms")["request_id"]) <= set(ids)
    assert "Drawn: 5,000 of 20,001 pull requests" in charts.drawn_note(live, "window_ttft")


def test_every_mode_has_one_legend_entry_even_without_the_first_phase():
    """The legend names each mode once, on its first box: pull has no box of the first
    phase (WRITE is push's only) and is still in the legend."""
    import pandas as pd

    frame = pd.DataFrame(
        {
            "phase": ["WRITE", "WRITE", "NETWORK", "NETWORK", "READ"],
            "mode": ["push", "push", "push", "pull", "pull"],
            "ms": [1.0, 2.0, 0.5, 0.7, 3.0],
            "request_id": [f"r{i}" for i in range(5)],
            "trace_id": [f"{i:032x}" for i in range(5)],
        }
    )
    boxes = charts.phase_box_parts(frame)
    assert boxes.order[0] == "WRITE" and [p.mode for p in boxes.parts if p.phase == "WRITE"] == [
        "push"
    ]
    fig = charts.draw_phase_boxes(boxes)
    shown = [t.name for t in fig.data if t.showlegend]
    assert sorted(shown) == ["pull", "push"]


def test_a_snapshot_keeps_what_pages_derive_once_per_key():
    from tracedpush.console.data import Snapshot
    from tracedpush.console.source import Source

    made = []
    snap = Snapshot(Source("traces", "x"), 1, SimpleNamespace(requests=[]), None)
    for _ in range(3):
        assert snap.memo(("a", 1), lambda: made.append("a") or "A") == "A"
    assert snap.memo(("b", 1), lambda: made.append("b") or "B") == "B"
    assert made == ["a", "b"]
    fresh = Snapshot(Source("traces", "x"), 2, SimpleNamespace(requests=[]), None)
    assert fresh.memo(("a", 1), lambda: "A2") == "A2"  # a refresh's snapshot makes its own
