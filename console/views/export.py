"""Export: the chosen requests (one, the slowest, a time window or all) as the per-request
table in CSV and as Perfetto (Chrome trace-event) JSON."""

from __future__ import annotations

import streamlit as st

from tracedpush.console import export, ui, zones

SCOPES = ["selected request", "slowest 50", "a time window", "all"]

snap = ui.snapshot()
run = snap.run
st.title("Export")
ui.load_notes(snap)

selected = ui.selected_request(snap)
choice = st.radio(
    "Requests",
    SCOPES,
    index=0 if selected is not None else SCOPES.index("all"),
    horizontal=True,
    key="export_scope",
    help="Both downloads below take these requests.",
)
ids: list[str] | None
window: tuple[int, int] | None = None  # a time window's [from, to), unix s
if choice == "selected request":
    ids = [selected.trace_id] if selected is not None else []
    if not ids:
        st.info("No request selected: pick one on the Request timeline or Requests page.")
elif choice == "slowest 50":
    ids = [r.trace_id for r in run.slowest(50)]
elif choice == "a time window":
    width, starts = export.window_buckets(snap.table)
    tz = ui.browser_zone()
    if starts:
        first = last = starts[0]  # a run within one bucket: no slider to slide
        if len(starts) > 1:
            first, last = st.select_slider(
                f"Arrived ({zones.zone_name(tz)}, by {export.WINDOW_WIDTHS_S[width]})",
                options=starts,
                value=(starts[-1], starts[-1]),  # the run's last bucket
                format_func=lambda s: export.bucket_label(s, width, tz),
                key="export_window",
            )
        window = (first, last + width)
        ids = export.window_ids(snap.table, *window)
        st.caption(
            f"{len(ids):,} requests arrived from {export.bucket_label(first, width, tz)} to "
            f"{export.bucket_label(last + width, width, tz)} {zones.zone_name(tz)} (the end "
            "excluded)."
        )
    else:
        ids = []
        st.info("No request has an arrival time.")
else:
    ids = None  # every request
count = len(run.requests) if ids is None else len(ids)
rows = export.rows_of(snap.table, ids)

st.subheader("Per-request table (CSV)")
st.caption(
    "One row per request, as `RunAnalysis.table()` returns it: ids, mode, tokens, TTFT, "
    "TPOT, arrival, load, buckets and `critical_ms.<phase>` per critical-path phase."
)
st.dataframe(rows.head(200), hide_index=True, height=260)
st.download_button(
    f"Download CSV ({len(rows):,} requests)",
    data=lambda: export.table_csv(rows),
    file_name="tracedpush-requests.csv",
    mime="text/csv",
    icon=":material/table:",
    disabled=not len(rows),
    key="csv",
)

st.subheader("Perfetto trace")
st.caption(
    "Open in https://ui.perfetto.dev: one track per instance and lane, skew-corrected, "
    "flow arrows for the prefill → decode handoff, and a critical-path track."
)
too_many = count > export.PERFETTO_MAX
if too_many:
    command = export.perfetto_command(snap.source, window)
    st.warning(
        f"{count:,} requests make a file of about {count * 10 / 1e6:,.1f} GB, which the "
        f"console would hold in memory: it offers at most {export.PERFETTO_MAX:,} in one "
        "file. Choose a shorter time window"
        + (
            f", or write them with the CLI, which streams them to disk:\n\n```\n{command}\n```"
            if command
            else "."
        )
    )
st.download_button(
    f"Download Perfetto JSON ({count:,} requests)",
    data=lambda: export.perfetto_json(snap.perfetto_run(ids)),
    file_name=export.PERFETTO_FILE,
    mime="application/json",
    icon=":material/timeline:",
    disabled=count == 0 or too_many,
    key="perfetto",
)
if not too_many and count > 2000:
    st.caption(f"{count:,} requests make a large file; it is built when you click.")
