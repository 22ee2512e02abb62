"""Phases: each phase's duration distribution per mode; outliers open their timeline."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tracedpush.console import charts, data, ui

ui.goto_timeline_if_clicked()
snap = ui.snapshot()
st.title("Phases")
ui.load_notes(snap)

SOURCES = {
    "time on the critical path": "phase_frame",
    "span durations": "span_frame",
}
what = st.radio(
    "Measure",
    list(SOURCES),
    horizontal=True,
    key="phases_measure",
    help="Critical path: the analysis' phases (a hidden phase counts 0 ms). "
    "Span durations: every span as recorded, whether or not it delayed the first token.",
)
frame: pd.DataFrame = getattr(snap, SOURCES[what])
modes = st.multiselect("Modes", snap.modes, default=snap.modes, key="phases_modes")
frame = frame[frame["mode"].isin(modes)]
if frame.empty:
    st.info("No phases for the chosen modes.")
    st.stop()

st.subheader(f"{what.capitalize()} per phase (ms)")
st.plotly_chart(
    charts.phase_boxes(frame),
    key="phase_boxes",
    on_select=lambda: ui.follow_click("phase_boxes"),
    selection_mode="points",
)
st.caption("Circles: the 10 largest values of each box. Click one to open its timeline.")

cmp = snap.comparison
overall = cmp.overall
if what == "time on the critical path":
    table = data.phase_percentiles(overall, modes)
    if not table.empty:
        st.caption("Percentiles from the analysis, ms (all prompt lengths and loads)")
        st.dataframe(table, width="stretch")

st.subheader("Outliers")
left, right = st.columns(2)
names = charts.phase_order(frame["phase"].unique())
biggest = frame.loc[frame["ms"].idxmax(), "phase"]
phase = left.selectbox("Phase", names, index=names.index(biggest), key="outlier_phase")
n = right.slider("How many", 5, 50, 10, key="outlier_n")
worst = frame[frame["phase"] == phase].nlargest(n, "ms")
ids = worst["trace_id"].tolist()


def _open(key: str) -> None:
    rows = st.session_state[key].selection.rows
    if rows:
        st.session_state["_goto_timeline"] = ids[rows[0]]


st.dataframe(
    worst.assign(timeline="timeline?" + ui.REQUEST_KEY + "=" + worst["trace_id"])[
        ["request_id", "mode", "ms", "timeline"]
    ].rename(columns={"ms": f"{phase} ms"}),
    hide_index=True,
    column_config={"timeline": st.column_config.LinkColumn("timeline", display_text="open")},
    on_select=lambda: _open("outliers"),
    selection_mode="single-row",
    key="outliers",
)
st.caption("Select a row (or click a circle above) to open its timeline.")
