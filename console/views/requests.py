"""Requests: every request as a point, any measure against prompt length, arrival or load,
and the requests with the largest values; a click opens a request's timeline.

The scatter was the Overview's last chart. On its own page the Overview draws four small
charts, and this one can plot what a user is chasing (a phase's time, TPOT, over time)."""

from __future__ import annotations

import streamlit as st

from tracedpush.console import charts, derived, ui, zones

LARGEST_TABLE = "largest_requests"


ui.goto_timeline_if_clicked()
snap = ui.snapshot()
st.title("Requests")
ui.load_notes(snap)
table = snap.table
if not len(table):
    st.info(f"No requests in {snap.source.label} yet.")
    st.stop()

measures = derived.request_measures(snap)
tz = ui.browser_zone()
left, right, scale = st.columns([2, 2, 1], vertical_alignment="bottom")
y = left.selectbox("Measure (y)", list(measures), format_func=measures.get, key="requests_y")
x = right.selectbox(
    "Against (x)",
    list(derived.REQUEST_AXES),
    format_func=lambda x: derived.axis_label(x, tz),
    key="requests_x",
)
log_y = scale.toggle("Log scale (y)", key="requests_log", help="0 ms is not drawn on it")
scatter = derived.requests_figure(snap, x, y, log_y, tz)
st.plotly_chart(
    scatter,
    key="requests",
    on_select=lambda: ui.follow_click("requests"),
    selection_mode="points",
)
have = int(table[y].notna().sum())
st.caption(
    f"{have:,} of {len(table):,} requests from {snap.source.label} have a {measures[y]}"
    + ("" if have == len(table) else " (the rest are left out)")
    + ". Load is the number of requests in flight at the proxy when a request arrived. "
    "Click a point for its timeline." + charts.drawn_note(scatter, "requests")
)

n = st.slider("How many of the largest", 5, derived.LARGEST_MAX, 20, key="largest_n")
top = derived.largest(snap, y).head(n)
ids = top["trace_id"].tolist()
shown = top.assign(
    timeline="timeline?" + ui.REQUEST_KEY + "=" + top["trace_id"],
    **{charts.ARRIVAL: zones.aware_times(top[charts.ARRIVAL], tz)},
)
columns = dict.fromkeys(["request_id", "mode", y, "prompt_tokens", "output_tokens", "load"])
if x not in columns:
    columns[x] = None
st.subheader(f"The {len(top):,} largest by {measures[y]}")
st.dataframe(
    shown[[*columns, "timeline"]],
    hide_index=True,
    column_config={
        "request_id": "request",
        y: st.column_config.NumberColumn(measures[y], format="%.2f"),
        "prompt_tokens": "prompt tokens",
        "output_tokens": "output tokens",
        charts.ARRIVAL: st.column_config.DatetimeColumn(
            derived.axis_label(charts.ARRIVAL, tz), format="YYYY-MM-DD HH:mm:ss.SSS"
        ),
        "timeline": st.column_config.LinkColumn("timeline", display_text="open"),
    },
    on_select=lambda: ui.follow_row(LARGEST_TABLE, ids),
    selection_mode="single-row",
    key=LARGEST_TABLE,
)
st.caption("Select a row or open its timeline.")
