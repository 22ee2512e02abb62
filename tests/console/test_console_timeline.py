"""Request timeline page: the Gantt draws exactly the analysis' critical path, hidden
phases and skew-corrected spans, push beside a comparable pull request."""

from __future__ import annotations

import re

import pytest
from conftest import DECODE_SKEW_MS

from tracedpush import semconv as sc
from tracedpush.console import charts, zones
from tracedpush.testing.console import figure, no_exception, traces_of


def _push_with_registration_first(traces, expected):
    truth = traces[1].by_trace()
    for r in expected.by_mode("push"):
        if truth[r.trace_id].rendezvous_first == "registration" and r.complete:
            return r
    raise AssertionError("the synthetic run has no push request whose registration came first")


def _segments(trace):
    return list(zip(trace["text"], trace["base"], trace["x"], strict=True))


def _expected(segments):
    return [(s.phase, pytest.approx(s.start_ms), pytest.approx(s.duration_ms)) for s in segments]


def test_push_timeline_draws_the_analysis_critical_path(app, traces, expected):
    req = _push_with_registration_first(traces, expected)
    at = app(traces=traces[0], page="views/timeline.py", query={"request": req.trace_id})
    no_exception(at)
    fig = figure(at, "timeline")
    (critical,) = traces_of(fig, kind="critical", trace_id=req.trace_id)
    assert _segments(critical) == _expected(req.critical_path)
    assert critical["marker"]["opacity"] == 1.0
    (hidden,) = traces_of(fig, kind="hidden", trace_id=req.trace_id)
    assert _segments(hidden) == _expected(req.hidden)
    assert hidden["marker"]["opacity"] == charts.DIM
    # The judged story: push's path runs through rendezvous, WRITE and notification...
    phases = [s.phase for s in req.critical_path]
    assert {"writer queue", "WRITE", "notification"} <= set(phases)
    assert critical["text"] == phases
    # ...while registration overlapped prefill, on another lane, dimmed.
    (dimmed,) = traces_of(fig, kind="spans-dimmed", trace_id=req.trace_id)
    (lit,) = traces_of(fig, kind="spans", trace_id=req.trace_id)
    assert sorted(dimmed["text"]) == sorted(s.name for s in req.spans if not s.on_critical_path)
    assert sorted(lit["text"]) == sorted(s.name for s in req.spans if s.on_critical_path)
    assert dimmed["marker"]["opacity"] == charts.DIM
    spans = {s.name: s for s in req.spans}
    register, prefill = spans[sc.SPAN_KV_REGISTER], spans[sc.SPAN_PREFILL]
    assert not register.on_critical_path
    assert register.lane != prefill.lane
    assert prefill.start_ms < register.end_ms and register.start_ms < prefill.end_ms
    i = dimmed["text"].index(sc.SPAN_KV_REGISTER)
    assert dimmed["y"][i] == charts.lane_label(register.lane)
    assert dimmed["base"][i] == pytest.approx(register.start_ms)


def test_comparable_pull_request_shares_the_time_axis(app, traces, expected):
    req = _push_with_registration_first(traces, expected)
    at = app(traces=traces[0], page="views/timeline.py", query={"request": req.trace_id})
    fig = figure(at, "timeline")
    shown = fig["layout"]["meta"]["trace_ids"]
    assert shown[0] == req.trace_id
    other = expected.get(shown[1])
    assert other.mode == "pull"
    # nearest prompt length among pull requests (load breaks ties)
    best = min(abs((r.prompt_tokens or 0) - req.prompt_tokens) for r in expected.by_mode("pull"))
    assert abs(other.prompt_tokens - req.prompt_tokens) <= max(best * 2, 64)
    (critical,) = traces_of(fig, kind="critical", trace_id=other.trace_id)
    assert _segments(critical) == _expected(other.critical_path)
    assert {"relay", "READ"} <= set(critical["text"])
    assert fig["layout"]["xaxis"]["matches"] == "x2"  # one shared time axis


def test_clock_offsets_are_applied_and_shown(app, traces, expected):
    req = _push_with_registration_first(traces, expected)
    at = app(traces=traces[0], page="views/timeline.py", query={"request": req.trace_id})
    fig = figure(at, "timeline")
    offset = expected.clock_offsets["decode-0"]
    assert offset.offset_ms == pytest.approx(DECODE_SKEW_MS, abs=2 * offset.bound_ms + 0.5)
    axis_titles = " ".join(
        v["title"]["text"]
        for k, v in fig["layout"].items()
        if k.startswith("xaxis") and "title" in v
    )
    assert f"decode-0 {offset.offset_ms:+.2f} ms" in axis_titles
    frames = [df.value for df in at.dataframe]
    offsets = next(f for f in frames if "offset ms (subtracted)" in f.columns)
    row = offsets.set_index("instance").loc["decode-0"]
    assert row["offset ms (subtracted)"] == pytest.approx(offset.offset_ms)
    # decode spans are drawn on the proxy's clock: decode starts after proxy.decode does
    spans = {s.name: s for s in req.spans}
    assert spans[sc.SPAN_DECODE].start_ms >= spans[sc.SPAN_PROXY_DECODE].start_ms


def test_pick_by_id_and_by_slowest(app, traces, expected):
    at = app(traces=traces[0], page="views/timeline.py")
    no_exception(at)
    default = figure(at, "timeline")["layout"]["meta"]["trace_ids"]
    assert expected.get(default[0]).mode == "push"

    target = expected.by_mode("pull")[3]
    at.text_input(key="typed_request").set_value(target.request_id).run()
    no_exception(at)
    assert target.trace_id in figure(at, "timeline")["layout"]["meta"]["trace_ids"]
    # when it arrived, to find it in logs and dashboards (UTC: AppTest reports no zone)
    captions = " ".join(c.value for c in at.caption)
    assert f"`{target.trace_id}` · arrived {zones.moment(target.start_unix_ms)}" in captions
    assert zones.moment(target.start_unix_ms).endswith(" UTC")

    frames = [df.value for df in at.dataframe]
    table = next(f for f in frames if "TTFT ms" in f.columns)
    assert table["request"].tolist() == [r.request_id for r in expected.slowest(20)]


def test_unknown_request_id_is_a_message_not_an_error(app, traces):
    at = app(traces=traces[0], page="views/timeline.py")
    at.text_input(key="typed_request").set_value("no-such-request").run()
    no_exception(at)
    assert any("no-such-request" in w.value for w in at.warning)


def test_prefill_ranks_are_lanes_and_the_last_to_land_is_lit(app, traces, tp_request):
    """P at TP 2 (tests/console/conftest.py): each rank's KV spans on a lane of its own;
    the WRITE on the critical path is rank 0's, whose data landed last, though rank 1's
    was seen done last."""
    req = tp_request
    at = app(traces=traces[0], page="views/timeline.py", query={"request": req.trace_id})
    no_exception(at)
    fig = figure(at, "timeline")
    (dimmed,) = traces_of(fig, kind="spans-dimmed", trace_id=req.trace_id)
    (lit,) = traces_of(fig, kind="spans", trace_id=req.trace_id)
    lanes = {rank: charts.lane_label(f"{sc.SERVICE_PREFILL}/prefill-0/push_writer/tp{rank}")
             for rank in (0, 1)}  # fmt: skip
    assert lanes == {r: f"P prefill-0 · push_writer · tp{r}" for r in (0, 1)}
    drawn = [(name, y) for t in (dimmed, lit) for name, y in zip(t["text"], t["y"], strict=True)]
    for name in (sc.SPAN_KV_WRITE, sc.SPAN_KV_DESC_PREP):
        assert sorted(y for n, y in drawn if n == name) == [lanes[0], lanes[1]]
    lit_writes = [y for n, y in zip(lit["text"], lit["y"], strict=True) if n == sc.SPAN_KV_WRITE]
    assert lit_writes == [lanes[0]]
    axis = next(v for k, v in fig["layout"].items() if k.startswith("yaxis"))
    assert lanes[0] in axis["categoryarray"] and lanes[1] in axis["categoryarray"]
    i = lit["text"].index(sc.SPAN_KV_WRITE)
    assert "tp_rank=0" in lit["customdata"][i][4]
    (notify,) = [c[4] for t in (dimmed, lit) for n, c in zip(t["text"], t["customdata"],
                 strict=True) if n == sc.SPAN_KV_NOTIFY]  # fmt: skip
    assert "notify.expected=2" in notify and "notify.ranks=[1, 0]" in notify


def test_a_clock_that_stepped_is_shown_with_its_windows(app, tmp_path):
    """D's clock steps 25 ms mid-run: every page warns that it moved (the Overview
    here, with how many requests are off), and the Timeline lists its offset per
    stretch of the run, the run's one offset marked where it does not fit. A run whose
    clocks held (the `traces` fixture's) gets no such warning."""
    from tracedpush.testing import synthetic

    plain = synthetic.generate(120, seed=4)
    half = (plain.requests[-1].start_unix_ns - plain.requests[0].start_unix_ns) / 2e9
    gen = synthetic.generate(120, seed=4, clock_steps_ms={"decode-0": (half, 25.0)})
    gen.write(tmp_path / "stepped")
    at = app(traces=tmp_path / "stepped", page="views/timeline.py")
    no_exception(at)
    (warning,) = [w.value for w in at.warning if "moved during the run" in w.value]
    assert "decode-0" in warning
    frames = [df.value for df in at.dataframe]
    windows = next(f for f in frames if "decode-0 ms" in f.columns)
    cells = windows["decode-0 ms"].tolist()
    assert sum(c.endswith("!") for c in cells) >= 2  # before and at the step
    # the warning counts the requests of the marked windows
    off = int(windows["requests"][[c.endswith("!") for c in cells]].sum())
    assert 0 < off < int(windows["requests"].sum()) == 120
    assert f"for {off:,} of 120 requests" in warning
    assert windows["from"].str.endswith("UTC").all()
    overview = app(traces=tmp_path / "stepped")
    no_exception(overview)
    assert [w.value for w in overview.warning if "moved during the run" in w.value] == [warning]


def test_a_request_in_a_stretch_the_offset_does_not_fit_says_by_how_much(app, tmp_path):
    """D's clock steps 25 ms mid-run and its offset is the later stretches' (more
    pairs): a request from before the step is told its spans on D are off by about 25
    ms; one from after it is told nothing."""
    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.testing import synthetic

    plain = synthetic.generate(120, seed=4)
    half = (plain.requests[-1].start_unix_ns - plain.requests[0].start_unix_ns) / 2e9
    gen = synthetic.generate(120, seed=4, clock_steps_ms={"decode-0": (half, 25.0)})
    gen.write(tmp_path / "stepped")
    run = analyze(TraceStore.from_path(tmp_path / "stepped"))
    assert abs(run.clock_offsets["decode-0"].offset_ms - 25.0) < 1.5  # the later stretches'
    first, last = run.requests[0], run.requests[-1]
    said = {}
    for r in (first, last):
        at = app(traces=tmp_path / "stepped", page="views/timeline.py",
                 query={"request": r.trace_id})  # fmt: skip
        no_exception(at)
        mine = f"request {r.request_id} arrived"  # the other mode's request has its own
        said[r.trace_id] = [w.value for w in at.warning if mine in w.value]
    (early,) = said[first.trace_id]
    got = re.search(r"spans on decode-0 are off by about ([\d.]+) ms", early)
    assert got and abs(float(got.group(1)) - 25.0) < 1.5, early
    assert said[last.trace_id] == []


def test_steady_clocks_get_no_moved_warning(app, traces, expected):
    req = _push_with_registration_first(traces, expected)
    at = app(traces=traces[0], page="views/timeline.py", query={"request": req.trace_id})
    assert not [w for w in at.warning if "moved during the run" in w.value]
