"""Trace completeness in the console: the processes' own export records
(`engine.export`) say whether spans were dropped and whether each process flushed as it
shut down. The Overview shows what `tracedpush report` says; every page warns when
spans were lost, since the figures on it may then be biased.

Expectations come from `analyze()` of the same traces (`ExportHealth`), never from the
console's code. The synthetic runs write export records as the engines' pipeline does
(`synthetic.steps._emit_exports`); their shape is checked against the real pipeline's in
tests/unit/test_telemetry_export.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis.export_health import ExportHealth
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.results import LazySteps
from tracedpush.console import data
from tracedpush.console.source import Source
from tracedpush.testing.console import messages, no_exception
from tracedpush.testing.synthetic import generate

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _written(tmp: Path, **kw) -> tuple[Path, ExportHealth]:
    run = generate(30, seed=12, start_unix_s=time.time() - 600, **kw)
    run.write(tmp)
    return tmp, analyze(TraceStore.from_path(tmp)).export_health()


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExportHealth]:
    """D's worker dropped spans (its queue full); P's scheduler never flushed."""
    tmp = tmp_path_factory.mktemp("lossy")
    return _written(tmp, export_dropped={"d_work": 7}, unflushed=("p_sched",))


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExportHealth]:
    return _written(tmp_path_factory.mktemp("whole"))


def _markdown(at) -> str:
    return "\n".join(str(e.value) for e in at.get("markdown"))


def _warnings(at) -> list[str]:
    return [str(e.value) for e in at.get("warning")]


def test_overview_names_the_processes_that_lost_spans_or_did_not_flush(app, lossy):
    directory, health = lossy
    assert len(health.lossy) == 2 and len(health.unflushed) == 2  # one per mode
    at = app(traces=directory)
    no_exception(at)
    said = "\n".join(_warnings(at))
    assert health.warning() in said  # the page's banner
    for line in health.lines():  # the section: the report's own lines
        assert line in said
    assert health.warning().startswith("2 of 8 processes lost 14 spans")


@pytest.mark.parametrize("page", ["views/phases.py", "views/requests.py", "views/live.py"])
def test_every_page_warns_when_spans_were_lost(app, lossy, page):
    directory, health = lossy
    at = app(traces=directory, page=page)
    no_exception(at)
    assert any(health.warning() in w for w in _warnings(at)), _warnings(at)


def test_a_whole_run_says_so_quietly(app, whole):
    directory, health = whole
    assert not health.lossy and not health.unflushed and len(health.accounts) == 8
    at = app(traces=directory)
    no_exception(at)
    assert not [w for w in _warnings(at) if "processes lost" in w]
    text = _markdown(at)
    assert "- 8 of 8 flushed their last spans as they shut down" in text
    assert "- 8 processes dropped no span" in text


def test_traces_without_export_records_say_it_is_not_known(app, tmp_path):
    directory, health = _written(tmp_path, engine_steps=False)
    assert not health
    at = app(traces=directory)
    no_exception(at)
    assert "hold no export records" in messages(at)


def test_from_a_warm_index_the_steps_are_not_read_back(lossy, tmp_path):
    """The completeness is kept beside the engine steps in the analysis index, as the
    contention is: a console on a warm index does not read every step back for it."""
    directory, health = lossy
    idx = AnalysisIndex([directory], index_dir=tmp_path / "index")
    idx.update()
    idx.close()
    source = Source.traces([str(directory)], index_dir=str(tmp_path / "index"))
    snap = data.Feed(source).snapshot()
    steps = snap.run.engine_steps
    assert isinstance(steps, LazySteps)
    assert snap.export_health.to_json() == health.to_json()
    assert steps._obj is None
