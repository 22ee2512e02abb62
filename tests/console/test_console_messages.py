"""Calm failures: every page answers a bad or empty source with a message, never a
traceback."""

from __future__ import annotations

import json

import pytest

from tracedpush.testing.console import messages, no_exception
from tracedpush.testing.net import free_port
from tracedpush.testing.synthetic import generate

PAGES = [None, "views/timeline.py", "views/phases.py", "views/live.py", "views/export.py"]


@pytest.mark.parametrize("page", PAGES)
def test_empty_directory(app, tmp_path, page):
    at = app(traces=tmp_path, page=page)
    no_exception(at)
    assert "No traces in" in messages(at)
    assert not at.get("plotly_chart")


@pytest.mark.parametrize("page", [None, "views/live.py"])
def test_missing_directory(app, tmp_path, page):
    at = app(traces=tmp_path / "not-yet", page=page)
    no_exception(at)
    assert "does not exist" in messages(at)


@pytest.mark.parametrize("page", [None, "views/timeline.py"])
def test_no_source_configured(app, page):
    at = app(page=page)
    no_exception(at)
    assert "No trace source" in messages(at)


@pytest.mark.parametrize("page", PAGES)
def test_malformed_file(app, tmp_path, page):
    (tmp_path / "garbage.jsonl").write_text('{"resourceSpans": [{]}\nnot json at all\n')
    at = app(traces=tmp_path, page=page)
    no_exception(at)
    assert "malformed" in messages(at)


@pytest.mark.parametrize("page", PAGES)
def test_half_written_file_next_to_good_ones(app, tmp_path, page):
    generate(20, seed=5).write(tmp_path)
    doc = json.dumps(generate(2, seed=6).documents[0])
    (tmp_path / "still-writing.jsonl").write_text(doc[: len(doc) // 2])  # no newline yet
    at = app(traces=tmp_path, page=page)
    no_exception(at)
    text = messages(at)
    if page == "views/live.py":  # Live re-reads: a line that stopped growing is malformed
        assert "half-written" in text or "malformed" in text
    else:
        assert "half-written" in text
    if page != "views/export.py":
        assert at.get("plotly_chart")


@pytest.mark.parametrize("page", PAGES)
def test_unreachable_jaeger(app, page):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    at = app(jaeger=url, page=page)
    no_exception(at)
    text = messages(at)
    assert "Jaeger" in text and url in text
    assert not at.get("plotly_chart")


def test_empty_directory_fills_up(app, tmp_path):
    at = app(traces=tmp_path)
    assert "No traces in" in messages(at)
    generate(10, seed=8).write(tmp_path)
    at.run()  # no Reload needed: an empty source is re-read on every run
    no_exception(at)
    assert len(at.get("plotly_chart")) == 4


def test_incomplete_traces_are_drawn_and_flagged(app, tmp_path):
    from tracedpush.analysis import TraceStore, analyze

    generate(60, seed=9, drop_spans={"tracedpush.request": 0.15, "kv.write": 0.15}).write(tmp_path)
    run = analyze(TraceStore.from_path(tmp_path))
    rootless = next(r for r in run.requests if r.ttft_ms is None)
    for page, query in [
        (None, None),
        ("views/timeline.py", {"request": rootless.trace_id}),
        ("views/phases.py", None),
        ("views/live.py", None),
        ("views/export.py", None),
    ]:
        at = app(traces=tmp_path, page=page, query=query)
        no_exception(at)
        if page is None:
            assert "incomplete traces" in messages(at)
        if page == "views/timeline.py":
            assert "Incomplete trace" in messages(at)
            assert at.get("plotly_chart")


@pytest.mark.parametrize("page", PAGES)
def test_tuning_not_at_its_defaults_is_named(app, tmp_path, page, monkeypatch):
    """Results depend on the analysis' tuning knobs (`tracedpush.tuning`): every page
    names those not at their defaults, as the report's summary does, and none by default."""
    from tracedpush.analysis import skew

    generate(20, seed=5).write(tmp_path)
    at = app(traces=tmp_path, page=page)
    no_exception(at)
    assert "Analysis tuning" not in messages(at)
    monkeypatch.setattr(skew, "WINDOWS", 3)  # as TRACEDPUSH_SKEW_WINDOWS=3 makes it
    at = app(traces=tmp_path, page=page)
    no_exception(at)
    assert "Analysis tuning not at its defaults: TRACEDPUSH_SKEW_WINDOWS=3 (default 12)" in (
        messages(at)
    )


@pytest.mark.parametrize("page", PAGES)
def test_an_index_that_cannot_be_kept_is_said_with_the_way_out(app, tmp_path, page):
    """Traces whose analysis index cannot be kept beside them (a read-only directory; here
    a file where its directory goes, as this runs as root): every page draws the run read
    without one and says why and what to do; with TRACEDPUSH_INDEX_ROOT the index is kept
    in a directory of its own under that one, and nothing is said."""
    traces = tmp_path / "traces"
    generate(20, seed=5).write(traces)
    (traces / ".tracedpush-index").write_text("in the way")
    at = app(traces=traces, page=page)
    no_exception(at)
    text = messages(at)
    assert "No analysis index: it cannot be kept at" in text and "--index-dir DIR" in text
    assert "TRACEDPUSH_INDEX_ROOT" in text
    if page != "views/export.py":
        assert at.get("plotly_chart")  # the run is drawn all the same
    root = tmp_path / "indexes"
    traces = tmp_path / "again" / "traces"  # a source of its own (a feed is one per source)
    generate(20, seed=5).write(traces)
    (traces / ".tracedpush-index").write_text("in the way")
    at = app(traces=traces, page=page, index_root=root)
    no_exception(at)
    assert "No analysis index" not in messages(at)
    (kept,) = root.iterdir()
    assert kept.name.startswith("traces-") and (kept / "index.sqlite").is_file()
    if page != "views/export.py":
        assert at.get("plotly_chart")
