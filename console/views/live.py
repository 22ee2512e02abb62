"""Live: tail the trace directory (or poll Jaeger) and summarise the last N minutes."""

from __future__ import annotations

import time
from datetime import datetime

import pandas as pd
import streamlit as st

from tracedpush.analysis import compare
from tracedpush.console import charts, data, ui

st.title("Live")
left, right = st.columns(2)
minutes = left.slider("Window (minutes)", 1, 120, 5, key="live_minutes")
every = right.select_slider("Refresh every (s)", [1, 2, 5, 10, 30], value=2, key="live_every")
source = ui.current_source()


def _status(feed: data.Feed, snap: data.Snapshot) -> str:
    when = datetime.fromtimestamp(feed.last_refresh, ui.browser_zone()).strftime("%H:%M:%S")
    busy = " · re-analysing…" if feed.refreshing else ""
    return (
        f"{len(snap.run.requests):,} requests · refreshed {when} "
        f"(+{feed.last_new} spans){busy} · {source.label}"
    )


@st.fragment(run_every=every)
def live() -> None:
    feed = data.feed(source)
    try:
        feed.tick()
        snap = feed.snapshot()
    except data.SourceError as err:
        ui.show_error(err)
        st.caption(f"Retrying every {every} s.")
        return
    if feed.last_error is not None:
        ui.show_error(feed.last_error)
    st.caption(_status(feed, snap))
    ui.load_notes(snap)
    if not snap.run.requests:
        ui.no_requests(snap)
        return

    now_ms = time.time() * 1000.0
    since = now_ms - minutes * 60_000
    newest = snap.newest_unix_ms or 0.0
    if newest < since:
        ago = (now_ms - newest) / 60_000
        st.info(
            f"No request in the last {minutes} min (the newest arrived {ago:,.0f} min ago); "
            f"showing the {minutes} min up to it."
        )
        since = newest - minutes * 60_000
    window = snap.window(since)
    cmp = compare(window)
    overall = cmp.overall

    modes = charts.modes_of(cmp)
    cols = st.columns(max(len(modes), 1))
    for col, mode in zip(cols, modes, strict=False):
        ttft = (overall.ttft.get(mode) if overall else None) or {}
        col.metric(f"{mode} requests", f"{overall.n.get(mode, 0) if overall else 0:,}")
        col.markdown(
            " · ".join(
                f"TTFT {k} **{ttft[k]:,.1f} ms**" for k in ("p50", "p90", "p99") if ttft.get(k)
            )
            or "no TTFT yet"
        )

    columns = window.table_columns(charts.LIVE_COLUMNS) or window.table()
    scatter = charts.window_ttft(pd.DataFrame(columns), tz=ui.browser_zone())
    st.plotly_chart(scatter, key="live_ttft")
    if note := charts.drawn_note(scatter, "window_ttft"):
        st.caption(note.strip())
    table = data.phase_percentiles(overall)
    if not table.empty:
        st.caption(f"Critical-path phase percentiles (ms), last {minutes} min")
        st.dataframe(table, width="stretch")


live()
