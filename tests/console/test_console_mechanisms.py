"""Issue 8 in the console: the request timeline's engine-step lane and new phases, the
push-vs-pull mechanisms in words (Overview), "Where the TTFT / TPOT difference goes" per
load (Phases), contention findings, and calm pages for traces without steps.

Every expectation comes from the analysis of the same traces (`expected`), never from
the console's own code: the figures must draw what `analyze()` / `compare()` found."""

from __future__ import annotations

import time

import pytest

from tracedpush.analysis import TraceStore, analyze, compare
from tracedpush.analysis import phases as ph
from tracedpush.analysis.compare import ALL, explain_delta
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.results import LazySteps
from tracedpush.analysis.tpot import explain_tpot_delta, tpot_account
from tracedpush.console import charts, data
from tracedpush.console.source import Source
from tracedpush.testing.console import figure, messages, no_exception, traces_of
from tracedpush.testing.synthetic import generate


def _markdown(at) -> str:
    return "\n".join(str(e.value) for e in at.get("markdown"))


def _engine(req, service: str) -> str:
    return next(s.attributes.get("tracedpush.engine_id") or s.instance
                for s in req.spans if s.service == service)  # fmt: skip


def _steps_in_window(run, req, engine_id: str) -> list[tuple[float, float]]:
    """(start ms, duration ms) on the request's axis of the engine's worker steps that
    overlap the request's window, straight from the analysis' placed EngineSteps."""
    origin = req.start_unix_ms * 1e6
    t0 = min(s.start_ms for s in req.spans)
    t1 = max(max(s.start_ms + s.duration_ms for s in req.spans), req.ttft_ms or 0.0)
    out = []
    for st in run.engine_steps.steps[engine_id]:
        if st.duration_us is None:
            continue
        if st.end_ns > origin + t0 * 1e6 and st.start_ns <= origin + t1 * 1e6:
            out.append(((st.start_ns - origin) / 1e6, (st.end_ns - st.start_ns) / 1e6))
    return sorted(out)


def _bars(fig, req, role: str) -> list[dict]:
    return traces_of(fig, kind="steps", trace_id=req.trace_id, role=role)


def _long_push(expected):
    """A push request with a multi-chunk prefill (several P steps inside its compute)."""
    rs = [r for r in expected.by_mode("push") if r.complete and (r.prefill_steps or 0) >= 3]
    return max(rs, key=lambda r: r.prompt_tokens)


# ------------------------------------------------------------------ timeline


def _timeline(app, traces, req):
    at = app(traces=traces[0], page="views/timeline.py", query={"request": req.trace_id})
    no_exception(at)
    return at


def test_timeline_draws_p_and_d_engine_steps_over_the_request(app, traces, expected):
    req = _long_push(expected)
    at = _timeline(app, traces, req)
    fig = figure(at, "timeline")
    p_id = _engine(req, "vllm-prefill")
    d_id = _engine(req, "vllm-decode")
    for role, eid in (("prefill", p_id), ("decode", d_id)):
        drawn = sorted(
            (b, x) for t in _bars(fig, req, role) for b, x in zip(t["base"], t["x"], strict=True)
        )
        want = _steps_in_window(expected, req, eid)
        assert want, f"the synthetic run has no {role} steps over the request"
        assert drawn == [(pytest.approx(b, abs=1e-3), pytest.approx(x, abs=1e-3)) for b, x in want]
        lane = charts.STEP_LANES[role]
        assert all(set(t["y"]) == {lane} for t in _bars(fig, req, role))
        assert lane in fig["layout"]["yaxis"]["categoryarray"]
    # each bar is coloured and labelled by what the step computed
    for t in _bars(fig, req, "prefill") + _bars(fig, req, "decode"):
        kind = t["meta"]["step_kind"]
        assert t["marker"]["color"] == charts.STEP_KINDS[kind][1]
        for text, custom in zip(t["text"], t["customdata"], strict=True):
            tokens, decodes = custom[2], custom[3]
            if kind == "prefill":
                assert text == f"{tokens} tok" and decodes == "0"
            if kind == "decode":
                assert text == f"{decodes} dec" and tokens == "0"
    # the request's own prefill chunks sit inside its prefill compute (same clock)
    compute = next(s for s in req.critical_path if s.phase == ph.PREFILL_COMPUTE)
    inside = [
        (b, x)
        for t in _bars(fig, req, "prefill")
        if t["meta"]["step_kind"] == "prefill"
        for b, x in zip(t["base"], t["x"], strict=True)
        if b >= compute.start_ms - 0.5 and b + x <= compute.start_ms + compute.duration_ms + 0.5
    ]
    assert len(inside) == req.prefill_steps
    # D's steps on D's skewed clock were moved onto the proxy's: while it decodes, D
    # steps with a decode request cover the request's first decode step
    first = next(s for s in req.critical_path if s.phase == ph.FIRST_DECODE_STEP)
    decode_bars = [
        (b, x)
        for t in _bars(fig, req, "decode")
        if t["meta"]["step_kind"] in ("decode", "mixed")
        for b, x in zip(t["base"], t["x"], strict=True)
    ]
    assert any(b < first.start_ms + first.duration_ms and b + x > first.start_ms
               for b, x in decode_bars)  # fmt: skip


def test_timeline_legend_follows_the_phase_order_and_hover_explains(app, traces, expected):
    req = _long_push(expected)
    at = _timeline(app, traces, req)
    fig = figure(at, "timeline")
    shown = [expected.get(t) for t in fig["layout"]["meta"]["trace_ids"]]
    drawn = {s.phase for r in shown for s in [*r.critical_path, *r.hidden]}
    legend = traces_of(fig, kind="phase_legend")
    names = [t["name"] for t in legend]
    assert names == [p for p in ph.PHASES if p in drawn]
    assert [t["marker"]["color"] for t in legend] == [ph.COLORS[p] for p in names]
    assert {"step handoff", "writer queue", "api server"} <= set(names)
    kinds = {t["meta"]["step_kind"] for t in traces_of(fig, kind="step_legend")}
    assert kinds == {t["meta"]["step_kind"] for t in traces_of(fig, kind="steps")}
    (critical,) = traces_of(fig, kind="critical", trace_id=req.trace_id)
    for phase, custom in zip(critical["text"], critical["customdata"], strict=True):
        assert custom[3] == charts.phase_description(phase)
        assert custom[3].replace("<br>", " ") == ph.DESCRIPTIONS[phase]
        assert custom[-1] == req.trace_id  # clicks still find the request
    assert "%{customdata[3]}" in critical["hovertemplate"]


# ------------------------------------------------------------------ overview


def test_overview_states_the_mechanisms_in_words(app, traces, expected):
    at = app(traces=traces[0], page="views/overview.py")
    no_exception(at)
    text = _markdown(at)
    cmp = compare(expected)
    assert explain_delta(cmp.overall) in text
    by_load = cmp.by_load()
    assert len(by_load) > 1
    for g in by_load:
        assert explain_delta(g) in text
    timed = [r for r in expected.requests if r.ttft_ms is not None]
    acc = tpot_account({m: [r for r in timed if r.mode == m] for m in ("push", "pull")})
    assert acc is not None
    assert explain_tpot_delta(acc, where="over all requests") in text


# ------------------------------------------------------------------ phases


def test_phases_shows_where_the_ttft_difference_goes_per_load(app, traces, expected):
    at = app(traces=traces[0], page="views/phases.py")
    no_exception(at)
    cmp = compare(expected)

    def check(group):
        fig = figure(at, "ttft_account")
        (bars,) = traces_of(fig, kind="ttft_account")
        assert bars["meta"]["load"] == group.load
        want = {
            r.phase: r.mean_delta_ms for r in group.account.rows if abs(r.mean_delta_ms) >= 0.005
        }
        assert dict(zip(bars["y"], bars["x"], strict=True)) == pytest.approx(want)
        assert sum(bars["x"]) == pytest.approx(group.account.ttft_mean_delta_ms, abs=0.05)
        assert abs(bars["x"][-1]) == max(abs(v) for v in want.values())  # largest on top
        assert explain_delta(group) in _markdown(at)

    check(cmp.overall)
    box = at.selectbox(key="account_load")
    assert box.options == ["all loads", *[f"{g.load} in flight" for g in cmp.by_load()]]
    for g in cmp.by_load():
        at.selectbox(key="account_load").set_value(g.load).run()
        no_exception(at)
        check(g)


def test_phases_shows_where_the_tpot_difference_goes(app, traces, expected):
    at = app(traces=traces[0], page="views/phases.py")
    cmp = compare(expected)
    load = cmp.by_load()[-1].load
    at.selectbox(key="account_load").set_value(load).run()
    no_exception(at)
    timed = [r for r in expected.requests if r.ttft_ms is not None and r.load_bucket == load]
    acc = tpot_account({m: [r for r in timed if r.mode == m] for m in ("push", "pull")})
    assert acc is not None
    fig = figure(at, "tpot_account")
    (bars,) = traces_of(fig, kind="tpot_account")
    assert bars["meta"]["load"] == load
    assert dict(zip(bars["y"], bars["x"], strict=True)) == pytest.approx(
        {r.mechanism: r.mean_delta_ms for r in acc.rows}
    )
    assert sum(bars["x"]) == pytest.approx(acc.tpot_mean_delta_ms, abs=1e-6)
    assert explain_tpot_delta(acc, where=f"at {load} in flight") in _markdown(at)


# ------------------------------------------------------------------ contention


@pytest.fixture(scope="module")
def contended(tmp_path_factory):
    """P and D on one host, D's EngineCore free to run on P's core (issue 8's case)."""
    run = generate(
        60,
        seed=11,
        hosts={"prefill-0": "box", "decode-0": "box"},
        unpinned_decode=True,
        start_unix_s=time.time() - 600,
    )
    directory = tmp_path_factory.mktemp("contended")
    run.write(directory)
    return directory


def test_contention_from_the_index_does_not_read_the_steps_back(contended):
    """A console opened on a warm analysis index shows the contention kept beside the
    engine steps, and knows the run has steps: the steps themselves (600 MB at 200,000
    requests, 2 s to read) are not read back for either (the Overview's first visit
    read them to see whether there were any)."""
    idx = AnalysisIndex([contended])
    idx.update()
    idx.close()  # writes the steps and their contention
    snap = data.Feed(Source.traces([str(contended)])).snapshot()
    steps = snap.run.engine_steps
    assert isinstance(steps, LazySteps)
    found = snap.contention
    assert snap.engine_steps is steps  # the pages' "has steps?" (its kept summary)
    assert found is not None and steps._obj is None
    want = analyze(TraceStore.from_path(contended)).contention()
    assert found.to_json() == want.to_json() and any(
        f.kind == "cross_engine" for f in want.findings
    )


def test_overview_names_contention_findings(app, contended):
    found = analyze(TraceStore.from_path(contended)).contention()
    assert any(f.kind == "cross_engine" for f in found.findings)
    at = app(traces=contended, page="views/overview.py")
    no_exception(at)
    text = _markdown(at)
    assert "CPU contention" in text
    for f in found.findings:
        assert f.text in text


def test_overview_lists_the_threads_and_their_waits(app, contended):
    """The busiest threads with their CPU and their wait for one, as contention has
    them: the unpinned D EngineCore's wait is 0.6 of its CPU (the synthetic rule)."""
    found = analyze(TraceStore.from_path(contended)).contention()
    at = app(traces=contended, page="views/overview.py")
    no_exception(at)
    (table,) = [d.value for d in at.dataframe if "waiting s" in d.value.columns]
    core = next(t for t in found.threads if t.engine_role == "decode" and t.role == "engine_core")
    row = table[(table["pid"] == core.pid) & (table["role"] == "engine_core")].iloc[0]
    assert row["CPU s"] == round(core.cpu_ms / 1000.0, 2)
    assert row["waiting s"] == round(core.cpu_wait_ms / 1000.0, 2)
    assert row["waiting share"] == pytest.approx(0.6 / 1.6, abs=0.002)


# ------------------------------------------------------------------ old traces


@pytest.fixture(scope="module")
def old_traces(tmp_path_factory):
    """Traces from before issue 8: no engine.steps / engine.threads, no http_received."""
    run = generate(
        40, seed=5, engine_steps=False, http_received=False, start_unix_s=time.time() - 600
    )
    directory = tmp_path_factory.mktemp("old")
    run.write(directory)
    return directory


@pytest.mark.parametrize("page", ["views/overview.py", "views/timeline.py", "views/phases.py"])
def test_traces_without_steps_get_a_calm_message(app, old_traces, page):
    at = app(traces=old_traces, page=page)
    no_exception(at)
    said = messages(at)
    if page.endswith("timeline.py"):
        fig = figure(at, "timeline")
        assert not traces_of(fig, kind="steps")
        assert not traces_of(fig, kind="step_legend")
        assert traces_of(fig, kind="critical")
        assert "No engine-step lane" in said
    elif page.endswith("phases.py"):
        assert "TPOT is not attributed" in said
        assert figure(at, "ttft_account")
        assert not [f for f in at.get("plotly_chart") if "tpot_account" in f.proto.spec]
    else:
        assert "TPOT is not attributed" in said
        assert "CPU contention" not in _markdown(at)
        assert explain_delta(compare(analyze(TraceStore.from_path(old_traces))).overall) in (
            _markdown(at)
        )


def test_account_charts_without_a_comparison_are_placeholders(expected):
    """The chart helpers on their own: the overall account is tagged "all"; no group or
    no TPOT account gives a calm placeholder, not an error."""
    cmp = compare(expected)
    fig = charts.ttft_account(cmp.overall)
    assert fig.data[0].meta["load"] == ALL
    empty = charts.ttft_account(None)
    assert not empty.data and "needs both" in empty.layout.annotations[0].text
    assert not charts.tpot_account(None).data
