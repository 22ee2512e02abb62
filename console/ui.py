"""Streamlit pieces every page shares: the current source, its snapshot (or a calm
message), and the selected request that links pages together.

A request is selected by trace id in ``st.session_state["request"]`` and mirrored in the
``?request=`` query parameter, so a timeline can be bookmarked or shared.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from datetime import tzinfo
from typing import Any

import streamlit as st

from tracedpush.analysis import skew
from tracedpush.analysis.report_json import tuning_changed
from tracedpush.console import data, zones
from tracedpush.console.source import Source, bench_from_args, from_args

REQUEST_KEY = "request"  # session state and query parameter: selected trace id
SOURCE_KEY = "source"  # session state: a Source chosen in the sidebar
BENCH_KEY = "bench"  # session state: benchmark results typed on the Sweep page
TIMELINE_PAGE = "views/timeline.py"
AUTO_REFRESH_S = 10.0
BUILD_POLL_S = 0.5  # how often a page waiting for another visit's load says how far it is


def current_source() -> Source:
    chosen = st.session_state.get(SOURCE_KEY)
    if isinstance(chosen, Source):
        return chosen
    return from_args(sys.argv[1:])


def current_bench() -> str | None:
    """The benchmark results the Sweep page shows: typed on the page, else --bench or
    ``TRACEDPUSH_BENCH``."""
    chosen = st.session_state.get(BENCH_KEY)
    if isinstance(chosen, str) and chosen:
        return chosen
    return bench_from_args(sys.argv[1:])


def browser_zone() -> tzinfo:
    """The visitor's time zone (their browser's); UTC if it reports none."""
    return zones.zone(st.context.timezone)


def show_error(err: data.SourceError) -> None:
    (st.info if err.level == "info" else st.warning)(str(err))


def _wait_for_load(feed: data.Feed) -> None:
    """While another visit (or the server's warm-up) loads the run, say what it is doing
    instead of a bare spinner: how far the first index build is (a minute at 200,000
    requests), then for how long the index has been opening; the page draws once it is
    done. (Only another thread's load is waited for: this one's starts after.)"""
    if feed.building is None and feed.loading_since is None:
        return
    box = st.empty()
    while True:
        line, since = feed.building, feed.loading_since
        if line is not None:
            box.info(f"Building the analysis index of this run (once; later visits open it "
                     f"warm): {line}", icon="⏳")  # fmt: skip
        elif since is not None:
            box.info(f"Opening this run's analysis: {time.monotonic() - since:.0f} s", icon="⏳")
        else:
            break
        time.sleep(BUILD_POLL_S)
    box.empty()


def _fresh_snapshot() -> data.Snapshot:
    """The current source's analysis, refreshed at most every ``AUTO_REFRESH_S`` (at once
    while there is nothing yet); raises `data.SourceError`."""
    feed = data.feed(current_source())
    _wait_for_load(feed)
    snap = feed.snapshot()
    if not snap.run.requests or time.time() - feed.last_refresh > AUTO_REFRESH_S:
        feed.tick()
        snap = feed.snapshot()
    return snap


def snapshot() -> data.Snapshot:
    """The current source's analysis; stops the page with a message if there is none.

    Pages pick up new traces on their own, at most every ``AUTO_REFRESH_S`` (at once
    while there is nothing yet): a refresh is cheap when nothing arrived, and a slow
    re-analysis runs in the background (``Feed.tick``)."""
    try:
        snap = _fresh_snapshot()
    except data.SourceError as err:
        show_error(err)
        st.stop()
    if not snap.run.requests:
        no_requests(snap)
        st.stop()
    return snap


def snapshot_or_message() -> tuple[data.Snapshot | None, str | None]:
    """`snapshot`, or None and why not, without stopping the page (for a page that
    draws something without traces)."""
    try:
        snap = _fresh_snapshot()
    except data.SourceError as err:
        return None, str(err)
    if not snap.run.requests:
        return None, f"No requests in the traces at {snap.source.label} yet."
    return snap, None


def no_requests(snap: data.Snapshot) -> None:
    level, text = data.no_requests_message(snap)
    (st.warning if level == "warning" else st.info)(text)


def load_notes(snap: data.Snapshot) -> None:
    """Half-written or malformed input: say so once, quietly, without stopping."""
    if snap.index_unavailable:
        st.warning(snap.index_unavailable)
    health = snap.export_health
    lost = health.warning() if health is not None else ""
    if lost:
        st.warning(f"{lost} The Overview's *Trace completeness* names them.")
    stats = snap.stats
    if stats is None:
        return
    if stats.malformed:
        last = stats.errors[-1] if stats.errors else ""
        st.warning(f"Skipped {stats.malformed} malformed trace lines/documents. {last}")
    if stats.partial:
        st.caption(
            f"{stats.partial} trace file(s) end in a half-written line; it is read once "
            "the writer finishes it (Reload or the Live page). A writer killed meanwhile "
            "never does: its last spans are lost."
        )
    if snap.behind:
        st.caption(
            f"The clock offsets moved: {snap.behind:,} older requests are still analysed "
            f"with the previous ones; Reload or the Live page analyses them again, "
            f"{data.REANALYSE_PER_REFRESH:,} a refresh, newest first."
        )
    changed = tuning_changed()
    if changed:
        st.caption(
            f"Analysis tuning not at its defaults: {', '.join(changed)}, from the flags or "
            "the environment the console started with (`tracedpush console --help`)."
        )
    run = snap.run
    moved = [] if run is None else sorted(skew.outside(run.clock_offsets, run.clock_windows))
    if run is not None and moved:
        off, total = skew.misplaced(run.clock_offsets, run.clock_windows)
        st.warning(
            f"The clock of {', '.join(moved)} moved during the run (a clock step or drift): "
            "one offset per instance does not fit the whole run. Its offset is that of the "
            "stretches with the most pairs, so phases measured across that clock are off "
            f"by up to the move for {off:,} of {total:,} requests. A request's Timeline "
            "shows the offsets per stretch of the run; so does `tracedpush report`."
        )


# ------------------------------------------------------------------ selection


def selected_request(snap: data.Snapshot) -> Any | None:
    """The selected request: query parameter first (links), then session state."""
    key = st.query_params.get(REQUEST_KEY) or st.session_state.get(REQUEST_KEY)
    return snap.run.get(key) if key else None


def select(trace_id: str) -> None:
    st.session_state[REQUEST_KEY] = trace_id
    st.query_params[REQUEST_KEY] = trace_id


def open_timeline(trace_id: str) -> None:
    """Select a request and go to its timeline."""
    st.session_state[REQUEST_KEY] = trace_id
    st.switch_page(TIMELINE_PAGE, query_params={REQUEST_KEY: trace_id})


def selected_points(event: Any) -> list[Any]:
    """The points of a plotly selection event (st.plotly_chart on_select state)."""
    return list(_get(_get(event, "selection"), "points") or [])


def picked_trace_id(event: Any) -> str | None:
    """The trace id of the first clicked point in a plotly selection event, if any.

    Figures put the trace id last in each point's ``customdata`` (see charts.py).
    """
    for point in selected_points(event):
        custom = _get(point, "customdata")
        if isinstance(custom, list | tuple) and custom:
            return str(custom[-1])
        if isinstance(custom, str):
            return custom
    return None


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def follow_click(key: str) -> None:
    """on_select callback for a chart whose points carry trace ids: open the timeline."""
    trace_id = picked_trace_id(st.session_state.get(key))
    if trace_id:
        st.session_state[REQUEST_KEY] = trace_id
        st.session_state["_goto_timeline"] = trace_id


def follow_row(key: str, ids: list[str]) -> None:
    """on_select callback for a table whose rows are the requests `ids`: open the
    selected row's timeline."""
    rows = st.session_state[key].selection.rows
    if rows:
        st.session_state["_goto_timeline"] = ids[rows[0]]


def goto_timeline_if_clicked() -> None:
    """Switch pages after a click (st.switch_page cannot run inside a callback)."""
    trace_id = st.session_state.pop("_goto_timeline", None)
    if trace_id:
        open_timeline(trace_id)
