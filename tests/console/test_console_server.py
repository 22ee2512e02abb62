"""The console server loads its source while it starts (`console.server`): one line says
when it is ready, the pages then read what the warm-up derived, and a source that cannot
be read is reported without taking the server down. Real `streamlit run` processes."""

from __future__ import annotations

import urllib.request

import pandas as pd
import pytest

from tracedpush.analysis.results import LazySteps
from tracedpush.console import charts, data, derived, zones
from tracedpush.console.server import FAILED, READY, app_args
from tracedpush.console.source import Source
from tracedpush.testing.console_server import ConsoleServer
from tracedpush.testing.net import free_port


def test_the_server_is_ready_with_the_whole_run_before_anyone_visits(traces, expected, tmp_path):
    with ConsoleServer(["--traces", str(traces[0])], log_path=tmp_path / "server.log") as server:
        line = server.wait_ready()
        assert line.startswith(READY)
        assert f"{len(expected.requests):,} requests from {traces[0]}" in line
        with urllib.request.urlopen(server.url, timeout=10) as page:
            assert page.status == 200


def test_the_server_keeps_the_index_where_it_is_told(tmp_path):
    """`--index-dir` after the separator (what `tracedpush console --index-dir` passes): the
    real server's warm-up builds the index there, nothing beside the traces, and is ready
    with the whole run."""
    from tracedpush.analysis.index import INDEX_DIRNAME
    from tracedpush.testing.synthetic import generate

    traces, where = tmp_path / "traces", tmp_path / "index"
    generate(12, seed=4).write(traces)
    argv = ["--traces", str(traces), "--index-dir", str(where)]
    with ConsoleServer(argv, log_path=tmp_path / "server.log") as server:
        line = server.wait_ready()
        assert line.startswith(READY) and f"12 requests from {traces}" in line, line
        assert line.endswith(f"; analysis index in {where}"), line
    assert (where / "index.sqlite").is_file()
    assert not (traces / INDEX_DIRNAME).exists()


def test_a_source_that_cannot_be_read_is_reported_and_the_server_serves(tmp_path):
    jaeger = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with ConsoleServer(["--jaeger", jaeger], log_path=tmp_path / "server.log") as server:
        line = server.wait_ready()
        assert line.startswith(f"{FAILED}: Cannot read traces from Jaeger {jaeger}")
        with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=10) as health:
            assert health.status == 200


def test_warm_derives_what_every_first_visit_reads(traces):
    snap = data.Feed(Source.traces([str(traces[0])])).snapshot()
    steps = snap.run.engine_steps
    assert isinstance(steps, LazySteps) and steps._obj is None  # the index's, unread
    derived.warm(snap)
    assert steps._obj is not None  # read back for the Timeline's first visit
    for name in derived.SHARED:
        assert name in snap.__dict__, name  # a cached_property computed
    default = next(iter(derived.PHASE_MEASURES))
    warmed = derived.phase_boxes(snap, default, snap.modes)
    assert snap.memo(("phase_boxes", default, tuple(snap.modes)), lambda: None) is warmed
    again = charts.phase_box_parts(snap.phase_frame)  # every mode: the whole frame
    assert (warmed.order, warmed.modes) == (again.order, again.modes) and warmed.parts
    for a, b in zip(warmed.parts, again.parts, strict=True):
        assert (a.phase, a.mode, a.stats) == (b.phase, b.mode, b.stats)
        assert (a.top_ms == b.top_ms).all() and (a.top_ids == b.top_ids).all()
    # the first visits' figures and outliers too, each made once and then shared
    figures = derived.overview_figures(snap, derived.DEFAULT_STAT)
    assert figures == derived.overview_figures(snap, derived.DEFAULT_STAT)
    assert all(
        a is b
        for a, b in zip(
            figures.values(),
            derived.overview_figures(snap, derived.DEFAULT_STAT).values(),
            strict=True,
        )
    )
    key = ("figure", ("requests", derived.DEFAULT_X, derived.DEFAULT_Y, False, None))
    warmed = snap.memo(key, lambda: None)  # None: the warm-up did not make it
    assert warmed is not None
    assert warmed is derived.requests_figure(snap, derived.DEFAULT_X, derived.DEFAULT_Y)
    # a visitor in another time zone shares it too: its axes have no time
    kolkata = zones.zone("Asia/Kolkata")
    assert warmed is derived.requests_figure(snap, derived.DEFAULT_X, derived.DEFAULT_Y, tz=kolkata)
    boxes = derived.phase_boxes_figure(snap, default, snap.modes)
    assert boxes is derived.phase_boxes_figure(snap, default, snap.modes)
    assert derived.outliers(snap, default, snap.modes) is derived.outliers(
        snap, default, snap.modes
    )


@pytest.mark.parametrize("measure", list(derived.PHASE_MEASURES))
def test_outliers_are_each_phase_largest_rows_as_the_frame_gives_them(traces, measure):
    """`derived.outliers` keeps each phase's largest rows once per snapshot; what the
    Phases page lists from it must be what it filtered from the whole frame before,
    ties (a hidden phase's 0 ms) in the frame's order."""
    snap = data.Feed(Source.traces([str(traces[0])])).snapshot()
    for modes in (snap.modes, snap.modes[:1]):
        frame = getattr(snap, derived.PHASE_MEASURES[measure])
        frame = frame[frame["mode"].isin(modes)]
        found = derived.outliers(snap, measure, modes)
        assert found.phases == charts.phase_order(frame["phase"].unique())
        assert found.biggest == frame.loc[frame["ms"].idxmax(), "phase"]
        tied = 0
        for phase in found.phases:
            rows = frame[frame["phase"] == phase]
            tied += int(rows["ms"].duplicated().any())
            for n in (5, 10, derived.OUTLIERS_MAX):
                pd.testing.assert_frame_equal(found.worst(phase, n), rows.nlargest(n, "ms"))
        assert tied  # the comparison covers ties


def test_one_feed_per_source_and_the_least_recent_goes_first(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "_feeds", type(data._feeds)())
    first = data.feed(Source.traces([str(tmp_path / "0")]))
    assert data.feed(Source.traces([str(tmp_path / "0")])) is first
    for i in range(1, data.MAX_FEEDS):
        data.feed(Source.traces([str(tmp_path / str(i))]))
    assert data.feed(Source.traces([str(tmp_path / "0")])) is first  # now the most recent
    data.feed(Source.traces([str(tmp_path / "new")]))  # evicts "1", the least recent
    assert len(data._feeds) == data.MAX_FEEDS
    assert Source.traces([str(tmp_path / "1")]) not in data._feeds
    assert data.feed(Source.traces([str(tmp_path / "0")])) is first


@pytest.mark.parametrize(
    ("argv", "args"),
    [(["x", "run", "app.py", "--", "--traces", "d"], ["--traces", "d"]), (["x", "run"], [])],
)
def test_the_app_arguments_are_those_after_the_separator(argv, args):
    assert app_args(argv) == args


def test_tpot_accounts_of_an_indexed_run_read_no_result_back(traces, monkeypatch):
    """Whether any request has a TPOT breakdown comes from the index's columns: asking the
    requests read every result back until one had (1.5 s at 200,000 requests, on every
    new snapshot's first Overview). The accounts equal those of the run in memory."""
    from tracedpush.analysis import TraceStore, analyze

    feed = data.Feed(Source.traces([str(traces[0])]))
    snap = feed.snapshot()
    assert feed._index is not None and snap.comparison is not None  # indexed; compared

    def read_back(*args: object) -> None:
        raise AssertionError("a result was read back")

    monkeypatch.setattr(feed._index, "_load_results", read_back)
    got = snap.tpot_accounts
    assert got and "all" in got
    mem = data.Snapshot(snap.source, 0, analyze(TraceStore.from_paths([traces[0]])), None)
    want = mem.tpot_accounts
    assert {k: v.to_json() for k, v in got.items()} == {k: v.to_json() for k, v in want.items()}


def test_outliers_of_a_frame_without_values_are_empty():
    """A measure with no finite value has no boxes (the page stops there) and no outliers,
    rather than an error in the warm-up. A stand-in snapshot: only the frame matters."""

    class Frames:
        phase_frame = pd.DataFrame(
            {"trace_id": ["t"], "request_id": ["r"], "mode": ["push"], "phase": ["queue"],
             "ms": [float("nan")]}
        )  # fmt: skip

        def memo(self, key, make):
            return make()

    found = derived.outliers(Frames(), next(iter(derived.PHASE_MEASURES)), ["push"])
    assert (found.phases, found.top) == ([], {})
