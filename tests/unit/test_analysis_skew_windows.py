"""Clock offsets per stretch of the run (`skew.over_time`): where a clock stepped.

The run's one offset per instance cannot fit a clock that was set mid-run; estimated
again from each window's pairs alone, the offsets before and after the step are found,
and the report and console say which instance moved and when. The moved instance's
offset is then that of the stretches with the most pairs (`skew.settle`), so most
requests are placed right. Synthetic runs (the generator steps D's clock); the index's
windows and offsets are checked against `analyze`'s, also when the step arrives in a
Live update.
"""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tracedpush.analysis import TraceStore, analyze, skew
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.model import ClockOffset, OffsetWindow, Resource
from tracedpush.analysis.report import render
from tracedpush.analysis.report_json import run_json
from tracedpush.testing import synthetic
from tracedpush.testing.synthetic import DECODE_INSTANCE, PREFILL_INSTANCE

N, SEED, STEP_MS, START_S = 240, 8, 25.0, 1_760_000_000.0


def _span_s(gen: synthetic.SyntheticRun) -> float:
    starts = [r.start_unix_ns for r in gen.requests]
    return (max(starts) - min(starts)) / 1e9


@pytest.fixture(scope="module")
def stepped() -> tuple[synthetic.SyntheticRun, float]:
    """D's clock steps forward by 25 ms halfway through the run (same arrivals as
    without the step: it draws nothing from the generator)."""
    half = _span_s(synthetic.generate(N, seed=SEED)) / 2
    steps = {DECODE_INSTANCE: (half, STEP_MS)}
    return synthetic.generate(N, seed=SEED, clock_steps_ms=steps), (START_S + half) * 1e3


def test_a_clock_step_is_found_and_placed_in_time(stepped) -> None:
    gen, step_ms = stepped
    run = analyze(TraceStore.from_documents(gen.documents))
    assert not run.clock_offsets[DECODE_INSTANCE].consistent  # no one offset fits
    windows = run.clock_windows
    assert len(windows) >= 3
    assert all(b.start_unix_ms == a.end_unix_ms for a, b in pairwise(windows))
    before = [w for w in windows if w.end_unix_ms <= step_ms - 5_000]
    after = [w for w in windows if w.start_unix_ms >= step_ms]
    assert before and after
    for ws, truth in ((before, 0.0), (after, STEP_MS)):
        for w in ws:
            o = w.offsets[DECODE_INSTANCE]
            assert o.consistent and o.pairs > 0
            assert abs(o.offset_ms - truth) <= o.bound_ms + 1e-9, (w.start_unix_ms, o)
            assert o.lo_ms <= truth <= o.hi_ms
    # the reference is in every window; P's clock did not move
    assert all(w.offsets[next(k for k, o in w.offsets.items() if o.reference)] for w in windows)
    assert skew.outside(run.clock_offsets, windows) == {DECODE_INSTANCE}
    # more pairs after the step than before: D's offset is theirs, the windows before flagged
    pairs_before = sum(w.offsets[DECODE_INSTANCE].pairs for w in before)
    pairs_after = sum(w.offsets[DECODE_INSTANCE].pairs for w in after)
    assert pairs_after > pairs_before
    d = run.clock_offsets[DECODE_INSTANCE]
    assert d.stretch_pairs == pairs_after
    assert d.lo_ms <= STEP_MS <= d.hi_ms and abs(d.offset_ms - STEP_MS) <= d.bound_ms
    # exactly the offset of those stretches' requests analysed alone
    store = TraceStore.from_documents(gen.documents)
    alone = analyze(
        {
            r.trace_id: list(store.traces[r.trace_id].values())
            for r in run.requests
            if r.start_unix_ms >= after[0].start_unix_ms
        }
    ).clock_offsets[DECODE_INSTANCE]
    assert (d.offset_ms, d.bound_ms, d.lo_ms, d.hi_ms) == (
        alone.offset_ms,
        alone.bound_ms,
        alone.lo_ms,
        alone.hi_ms,
    )
    # every request counted in its window; those before the step and at it are off
    assert sum(w.requests for w in windows) == N
    marked = {
        w.start_unix_ms: w.requests
        for w in windows
        if not w.offsets[DECODE_INSTANCE].consistent
        or not w.offsets[DECODE_INSTANCE].lo_ms <= d.offset_ms <= w.offsets[DECODE_INSTANCE].hi_ms
    }
    assert {w.start_unix_ms for w in before} <= marked.keys()
    assert not {w.start_unix_ms for w in after} & marked.keys()
    off = sum(marked.values())
    assert skew.misplaced(run.clock_offsets, windows) == (off, N)
    text = render(run)
    assert f"the {off:,} of {N:,} requests ({100 * off / N:.1f}%) where marked" in text
    assert f"moved: from the stretches with most pairs ({pairs_after})" in text
    assert f"The clock of {DECODE_INSTANCE} moved during the run" in text
    assert f"{DECODE_INSTANCE} ms" in text and " !" in text
    doc = run_json(run)["clock_offsets_over_time"]
    assert len(doc) == len(windows)
    assert doc[-1]["offsets_ms"][DECODE_INSTANCE]["offset_ms"] == pytest.approx(STEP_MS, abs=1.0)


def _by_phase(r) -> dict[str, float]:
    out: dict[str, float] = {}
    for seg in r.critical_path:
        out[seg.phase] = out.get(seg.phase, 0.0) + seg.duration_ms
    return out


def test_requests_on_the_stretches_with_most_pairs_read_as_without_the_step(stepped) -> None:
    """The same arrivals without the step are the truth: after the step (the stretches
    with the most pairs) every request's phases match it to within the offsets' bounds;
    before it they are off by about the step. With the run's midpoint (about 9 ms, as
    before `settle`) no request matched."""
    gen, step_ms = stepped
    run = analyze(TraceStore.from_documents(gen.documents))
    truth = analyze(TraceStore.from_documents(synthetic.generate(N, seed=SEED).documents))
    want = {r.trace_id: r for r in truth.requests}
    after = [w.offsets[DECODE_INSTANCE] for w in run.clock_windows if w.start_unix_ms >= step_ms]
    # the error each run's D offset can have: the stretches' evidence, the truth's
    tol = max(o.bound_ms for o in after) + truth.clock_offsets[DECODE_INSTANCE].bound_ms
    assert tol < STEP_MS / 8
    late = [r for r in run.requests if r.start_unix_ms >= step_ms + 1_000]
    early = [r for r in run.requests if r.start_unix_ms <= step_ms - 1_000]
    assert len(late) > 50 and len(early) > 50
    for r in late:
        got, exp = _by_phase(r), _by_phase(want[r.trace_id])
        assert r.ttft_ms == pytest.approx(want[r.trace_id].ttft_ms)
        for phase in got.keys() | exp.keys():
            assert abs(got.get(phase, 0.0) - exp.get(phase, 0.0)) <= 2 * tol, (r.trace_id, phase)
    off = [
        min(abs(s.start_ms - t.start_ms) for t in want[r.trace_id].spans if t.name == s.name)
        for r in early
        for s in r.spans
        if s.instance == DECODE_INSTANCE
    ]
    assert min(off) >= STEP_MS - 2 * tol  # every D span before the step is off by the step


def test_a_small_moved_stretch_does_not_set_the_whole_runs_offset(tmp_path: Path) -> None:
    """The 205,560-request bench run's case: D's clock 3 ms behind for a few requests
    appended at the end. The pair graph then contradicts itself, D is judged by its
    direct pairs with the proxy, and the moved requests set one bound: the run's
    estimate was -4.92 ms (consistent, applied to all) where nine windows of ten say
    about 0. Now D gets the offset of the stretches with the most pairs, the one the run
    had before the moved requests."""
    first = synthetic.generate(240, seed=1)
    second = synthetic.generate(
        30,
        seed=2,
        start_unix_s=START_S + _span_s(first) + 30.0,
        clock_offsets_ms={DECODE_INSTANCE: -3.0},
    )
    first.write(tmp_path / "first")
    before = analyze(TraceStore.from_paths([tmp_path])).clock_offsets[DECODE_INSTANCE]
    second.write(tmp_path / "second")
    run = analyze(TraceStore.from_paths([tmp_path]))
    d = run.clock_offsets[DECODE_INSTANCE]
    # the offset the run had before the moved requests came: nothing else moves
    assert (d.offset_ms, d.bound_ms, d.lo_ms, d.hi_ms) == (
        before.offset_ms,
        before.bound_ms,
        before.lo_ms,
        before.hi_ms,
    )
    moved_from = second.requests[0].start_unix_ns / 1e6
    ws = [w.offsets[DECODE_INSTANCE] for w in run.clock_windows if w.end_unix_ms <= moved_from]
    assert len(ws) >= 5 and all(o.consistent for o in ws)
    assert d.stretch_pairs == sum(o.pairs for o in ws)
    assert all(o.lo_ms <= d.offset_ms <= o.hi_ms for o in ws)
    assert abs(d.offset_ms) <= d.bound_ms < 1.5  # the truth (0) within the bound
    late = [w for w in run.clock_windows if w.start_unix_ms >= moved_from]
    assert late and all(w.offsets[DECODE_INSTANCE].hi_ms < d.lo_ms for w in late)
    assert skew.outside(run.clock_offsets, run.clock_windows) == {DECODE_INSTANCE}


INF = float("inf")
HAND = {Resource("svc", x, f"{x}-host", "1"): x for x in ("ref", "x", "y")}  # `settle`'s dom


def _offset(lo: float, hi: float, pairs: int, *, consistent: bool = True) -> ClockOffset:
    return ClockOffset("x", (lo + hi) / 2, (hi - lo) / 2, pairs, "", lo, hi, consistent=consistent)


def _windows(*offsets: ClockOffset) -> list[OffsetWindow]:
    """A window per offset of "x", with the edges its [lo, hi] says (θ_x in [lo, hi]:
    θ_x − θ_ref <= hi, θ_ref − θ_x <= −lo)."""
    out = []
    for i, o in enumerate(offsets):
        edges = {}
        if o.hi_ms != INF:
            edges["ref", "x"] = round(o.hi_ms * 1e6)
        if o.lo_ms != -INF:
            edges["x", "ref"] = round(-o.lo_ms * 1e6)
        out.append(OffsetWindow(i * 1e4, (i + 1) * 1e4, {"x": o}, edges))
    return out


def _settle(offsets: dict[str, ClockOffset], windows: list[OffsetWindow]) -> dict:
    return skew.settle(offsets, windows, HAND, "ref")


def test_settle_takes_the_point_most_pairs_allow() -> None:
    """`settle` on hand-made windows: the set of windows whose intervals share a point
    with the most pairs (not the most windows), their common interval, ties to the
    lowest point; windows contradicting themselves do not count; an instance tied to
    its host's clock, or without a consistent window, keeps the run's offset."""
    run = {"x": ClockOffset("x", 5.0, 6.0, 100, "", -1.0, 11.0, consistent=False)}
    three_small = _windows(_offset(0, 2, 10), _offset(1, 3, 10), _offset(0.5, 2.5, 10))
    one_big = _windows(_offset(9, 10, 40))
    got = _settle(run, three_small + one_big)["x"]
    assert (got.lo_ms, got.hi_ms, got.offset_ms, got.stretch_pairs) == (9, 10, 9.5, 40)
    got = _settle(run, three_small)["x"]
    assert (got.lo_ms, got.hi_ms, got.stretch_pairs) == (1, 2, 30)
    assert got.offset_ms == 1.5 and got.bound_ms == 0.5 and not got.consistent
    tie = _windows(_offset(0, 1, 20), _offset(4, 6, 20), _offset(-9, 9, 5, consistent=False))
    got = _settle(run, tie)["x"]
    assert (got.lo_ms, got.hi_ms, got.stretch_pairs) == (0, 1, 20)
    half_open = _windows(_offset(2.0, INF, 30), _offset(-5, -4, 10))
    got = _settle(run, half_open)["x"]
    assert (got.offset_ms, got.bound_ms, got.stretch_pairs) == (2.0, INF, 30)
    tied = {"x": dataclasses.replace(run["x"], host_clock=True)}
    assert _settle(tied, three_small) == tied
    only_bad = _windows(_offset(-9, 9, 5, consistent=False))
    assert _settle(run, only_bad) == run
    fits = {"x": ClockOffset("x", 1.5, 0.5, 30, "", 1.0, 2.0)}  # inside every window
    assert skew.outside(fits, three_small) == set() and _settle(fits, three_small) == fits


def test_settle_where_the_picked_windows_contradict_each_other() -> None:
    """Two windows, each consistent, whose pairs between x and y contradict each other
    merged (y's clock moved by less than a window shows): no estimate on the merged
    pairs holds, so x gets what both windows allow, [1, 1.5] (the windows' own
    intervals, tighter than x's direct pairs with the reference, [0, 2])."""
    a = _windows(_offset(0.5, 1.5, 20))[0]
    b = _windows(_offset(1.0, 2.0, 20))[0]
    for w, (lo, hi) in ((a, (0, 1)), (b, (-2, -1))):  # θ_y − θ_x in [lo, hi] ms
        w.edges.update({("x", "ref"): 0, ("ref", "x"): 2_000_000})
        w.edges.update({("x", "y"): hi * 10**6, ("y", "x"): -lo * 10**6})
    run = {"x": ClockOffset("x", 5.0, 6.0, 100, "", -1.0, 11.0, consistent=False)}
    got = _settle(run, [a, b])["x"]
    assert (got.lo_ms, got.hi_ms, got.offset_ms, got.bound_ms) == (1.0, 1.5, 1.25, 0.25)
    assert got.stretch_pairs == 40


def test_a_steady_clock_fits_every_window() -> None:
    """Without a step every window's evidence holds the run's offset (the run's
    interval is within each window's), and the report says nothing more."""
    gen = synthetic.generate(N, seed=SEED, clock_offsets_ms={PREFILL_INSTANCE: 7.0})
    run = analyze(TraceStore.from_documents(gen.documents))
    assert len(run.clock_windows) >= 3
    for w in run.clock_windows:
        for x, o in w.offsets.items():
            v = run.clock_offsets[x].offset_ms
            assert o.consistent and o.lo_ms <= v <= o.hi_ms, (x, o)
    assert skew.outside(run.clock_offsets, run.clock_windows) == set()
    assert skew.misplaced(run.clock_offsets, run.clock_windows) == (0, N)
    assert "moved during the run" not in render(run)


def test_windows_are_whole_seconds_at_least_ten_and_at_most_twelve() -> None:
    """`over_time` on hand-made pairs: 98 s of pairs make 10 windows of 10 s; 998 s
    make 12 of 84 s; pairs within one domain and windows without pairs are left out."""
    dom = {Resource("svc", x, f"{x}-host", "1"): x for x in ("ref", "x")}
    names = ["ref", "x"]
    for span_s, want_n, want_w in ((100, 10, 10), (1_000, 12, 84)):
        t = [int(i * 1e9) for i in range(0, span_s, 2)]
        n = len(t)
        times = np.array(t, dtype=np.int64)
        a = np.zeros(n, dtype=np.int64)
        b = np.ones(n, dtype=np.int64)
        slack = np.full(n, 1_000_000, dtype=np.int64)
        got = skew.over_time(times, a, b, slack, names, dom, "ref")
        assert len(got) == want_n
        assert {round((w.end_unix_ms - w.start_unix_ms) / 1e3) for w in got} == {want_w}
        assert all(w.offsets["x"].pairs > 0 for w in got)
        # one direction only (x's events at most 1 ms after ref's): the smallest correction
        assert all(w.offsets["x"].offset_ms == 0.0 for w in got)
    same_domain = skew.over_time(times, a, a, slack, names, dom, "ref")
    assert same_domain == []


def test_the_index_gives_analyzes_windows_also_when_a_step_arrives_live(tmp_path: Path) -> None:
    """A Live index: a first run, then a later one whose D clock is 25 ms ahead (a
    step between them). After each update its windows equal `analyze`'s of the same
    files, and after the second D is found to have moved."""
    first = synthetic.generate(120, seed=1)
    later_s = START_S + _span_s(first) + 30.0
    second = synthetic.generate(
        120, seed=2, start_unix_s=later_s, clock_offsets_ms={DECODE_INSTANCE: STEP_MS}
    )
    d = tmp_path / "traces"
    first.write(d / "first")
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    try:
        for i, gen in enumerate((None, second)):
            if gen is not None:
                gen.write(d / "second")
            run = idx.update()
            want = analyze(TraceStore.from_paths([d]), spans=False)
            assert [w.to_json() for w in run.clock_windows] == [
                w.to_json() for w in want.clock_windows
            ], i
            assert run.clock_offsets == want.clock_offsets, i  # settled alike
            assert list(run.requests) == list(want.requests), i
            moved = skew.outside(run.clock_offsets, run.clock_windows)
            assert moved == ({DECODE_INSTANCE} if i else set()), i
        warm = AnalysisIndex([d], index_dir=tmp_path / "index")
        assert [w.to_json() for w in warm.update().clock_windows] == [
            w.to_json() for w in want.clock_windows
        ]
        warm.close()
    finally:
        idx.close()
