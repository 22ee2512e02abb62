"""Export: the per-request table as CSV, and traces as Perfetto (Chrome trace-event) JSON."""

from __future__ import annotations

import streamlit as st

from tracedpush.console import export, ui

snap = ui.snapshot()
run = snap.run
st.title("Export")
ui.load_notes(snap)

st.subheader("Per-request table (CSV)")
st.caption(
    "One row per request, as `RunAnalysis.table()` returns it: ids, mode, tokens, TTFT, "
    "TPOT, arrival, load, buckets and `critical_ms.<phase>` per critical-path phase."
)
st.dataframe(snap.table.head(200), hide_index=True, height=260)
st.download_button(
    f"Download CSV ({len(snap.table):,} requests)",
    data=lambda: export.table_csv(snap.table),
    file_name="tracedpush-requests.csv",
    mime="text/csv",
    icon=":material/table:",
    key="csv",
)

st.subheader("Perfetto trace")
st.caption(
    "Open in https://ui.perfetto.dev: one track per instance and lane, skew-corrected, "
    "flow arrows for the prefill → decode handoff, and a critical-path track."
)
choice = st.radio(
    "Requests",
    ["selected request", "slowest 50", "all"],
    horizontal=True,
    key="perfetto_scope",
)
selected = ui.selected_request(snap)
if choice == "selected request":
    ids = [selected.trace_id] if selected is not None else []
    if not ids:
        st.info("No request selected: pick one on the Request timeline page.")
elif choice == "slowest 50":
    ids = [r.trace_id for r in run.slowest(50)]
else:
    ids = None  # every request
count = len(run.requests) if ids is None else len(ids)
st.download_button(
    f"Download Perfetto JSON ({count:,} requests)",
    data=lambda: export.perfetto_json(snap.perfetto_run(ids), ids),
    file_name="tracedpush-perfetto.json",
    mime="application/json",
    icon=":material/timeline:",
    disabled=count == 0,
    key="perfetto",
)
if ids is None and count > 2000:
    st.caption("All requests make a large file; it is built when you click.")
