"""Clock offsets per stretch of the run (`skew.over_time`): where a clock stepped.

The run's one offset per instance cannot fit a clock that was set mid-run; estimated
again from each window's pairs alone, the offsets before and after the step are found,
and the report and console say which instance moved and when. Synthetic runs (the
generator steps D's clock); the index's windows are checked against `analyze`'s, also
when the step arrives in a Live update.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tracedpush.analysis import TraceStore, analyze, skew
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.model import Resource
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
    text = render(run)
    assert f"The clock of {DECODE_INSTANCE} moved during the run" in text
    assert f"{DECODE_INSTANCE} ms" in text and " !" in text
    doc = run_json(run)["clock_offsets_over_time"]
    assert len(doc) == len(windows)
    assert doc[-1]["offsets_ms"][DECODE_INSTANCE]["offset_ms"] == pytest.approx(STEP_MS, abs=1.0)


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
            moved = skew.outside(run.clock_offsets, run.clock_windows)
            assert moved == ({DECODE_INSTANCE} if i else set()), i
        warm = AnalysisIndex([d], index_dir=tmp_path / "index")
        assert [w.to_json() for w in warm.update().clock_windows] == [
            w.to_json() for w in want.clock_windows
        ]
        warm.close()
    finally:
        idx.close()
