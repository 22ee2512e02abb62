"""Overview: push vs pull TTFT and TPOT by load and prompt length, and where TTFT goes."""

from __future__ import annotations

import streamlit as st

from tracedpush.console import charts, ui

ui.goto_timeline_if_clicked()
snap = ui.snapshot()
cmp = snap.comparison
st.title("Push vs pull")
ui.load_notes(snap)

modes = charts.modes_of(cmp)
overall = cmp.overall
cols = st.columns(max(len(modes), 1) + 1)
for col, mode in zip(cols, modes, strict=False):
    p50 = charts.stat_of(overall, "ttft", mode, "p50")
    col.metric(
        f"{mode}: TTFT p50",
        "–" if p50 is None else f"{p50:,.1f} ms",
        help=f"{overall.n.get(mode, 0) if overall else 0} requests",
    )
if overall is not None and overall.ttft_p50_delta_ms is not None:
    cols[-1].metric(f"TTFT p50, {cmp.b} − {cmp.a}", f"{overall.ttft_p50_delta_ms:+,.1f} ms")
if len(modes) < 2:
    st.info(
        f"Only {', '.join(modes) or 'no'} requests so far: run both modes (`tracedpush demo`) "
        "to compare them."
    )

untimed = snap.table["ttft_ms"].isna().sum()
incomplete = (~snap.table["complete"].astype(bool)).sum()
if untimed or incomplete:
    st.caption(
        f"{incomplete:,} of {len(snap.table):,} requests have incomplete traces; {untimed:,} "
        "have no TTFT and are left out of the charts (Export has the full table)."
    )

stat = st.segmented_control("Statistic", charts.STATS, default="p50", key="overview_stat") or "p50"
st.subheader(f"TTFT and TPOT by load ({stat})")
st.plotly_chart(charts.latency_by_load(cmp, stat), key="by_load")
st.subheader(f"TTFT and TPOT by prompt length ({stat}, all loads)")
st.plotly_chart(charts.latency_by_prompt(cmp, stat), key="by_prompt")

left, right = st.columns([3, 2])
with left:
    st.subheader("Where TTFT goes: critical path by phase (mean ms)")
    st.plotly_chart(charts.critical_path_stack(cmp), key="critical_stack")
with right:
    total = overall.ttft_mean_delta_ms if overall is not None else None
    st.subheader(
        f"Why {cmp.b} differs from {cmp.a}"
        + ("" if total is None else f": {total:+,.1f} ms mean TTFT")
    )
    st.plotly_chart(charts.ttft_delta(cmp), key="ttft_delta")
    st.caption("Per-phase mean differences; they add up to the mean TTFT difference.")

st.subheader("Every request")
st.plotly_chart(
    charts.requests_scatter(snap.table),
    key="requests",
    on_select=lambda: ui.follow_click("requests"),
    selection_mode="points",
)
st.caption(
    f"{len(snap.run.requests):,} requests from {snap.source.label}. Load is the number of "
    "requests in flight at the proxy when a request arrived. Click a point for its timeline."
)
