"""Phases: each phase's duration distribution per mode; outliers open their timeline."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tracedpush.analysis.compare import describe_group, explain_delta
from tracedpush.console import charts, data, derived, ui

try:
    from tracedpush.analysis.tpot import explain_tpot_delta
except ImportError:  # pragma: no cover - an analysis without TPOT attribution
    explain_tpot_delta = None

ui.goto_timeline_if_clicked()
snap = ui.snapshot()
st.title("Phases")
ui.load_notes(snap)

what = st.radio(
    "Measure",
    list(derived.PHASE_MEASURES),
    horizontal=True,
    key="phases_measure",
    help="Critical path: the analysis' phases (a hidden phase counts 0 ms). "
    "Span durations: every span as recorded, whether or not it delayed the first token.",
)
modes = st.multiselect("Modes", snap.modes, default=snap.modes, key="phases_modes")
if not derived.phase_boxes(snap, what, modes).parts:  # kept per snapshot, warmed at start
    st.info("No phases for the chosen modes.")
    st.stop()

st.subheader(f"{what.capitalize()} per phase (ms)")
st.plotly_chart(
    derived.phase_boxes_figure(snap, what, modes),
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


def _load_name(load: str) -> str:
    return "all loads" if load == data.ALL_LOADS else f"{load} in flight"


st.subheader("Where the TTFT difference goes")
groups = [g for g in [overall, *cmp.by_load()] if g is not None and g.account is not None]
if not groups:
    st.info(
        f"Needs both {cmp.a} and {cmp.b} requests with a TTFT: run both modes "
        "(`tracedpush demo`) to compare them."
    )
else:
    loads = [g.load for g in groups]
    load = st.selectbox(
        "Load (requests in flight at the proxy when a request arrived)",
        loads,
        format_func=_load_name,
        key="account_load",
    )
    group = groups[loads.index(load)]
    st.markdown(explain_delta(group, cmp.a, cmp.b))
    st.plotly_chart(charts.ttft_account(group, cmp.a, cmp.b), key="ttft_account")
    st.caption(
        f"Mean ms each phase spent on the critical path, {cmp.a} − {cmp.b}, "
        f"{describe_group(group)}; the bars add up to the mean TTFT difference. Hover "
        "for each phase's meaning and the p50s (medians do not add up)."
    )
    if len(groups) > 2:
        with st.expander("Every load in words", expanded=False):
            st.dataframe(
                pd.DataFrame(
                    {
                        "load": [_load_name(g.load) for g in groups],
                        f"{cmp.a} n": [g.n.get(cmp.a, 0) for g in groups],
                        f"{cmp.b} n": [g.n.get(cmp.b, 0) for g in groups],
                        "mean TTFT Δ ms": [g.account.ttft_mean_delta_ms for g in groups],
                        "p50 TTFT Δ ms": [g.account.ttft_p50_delta_ms for g in groups],
                        "top mechanisms": [explain_delta(g, cmp.a, cmp.b) for g in groups],
                    }
                ),
                hide_index=True,
            )

    st.subheader("Where the TPOT difference goes")
    acc = snap.tpot_accounts.get(load)
    if snap.engine_steps is None or explain_tpot_delta is None:
        st.info(
            "TPOT is not attributed: these traces have no `engine.steps` spans "
            "(recorded by tracedpush's connector since issue 8; older traces, or step "
            "tracing off)."
        )
    elif acc is None:
        st.info(
            f"No TPOT breakdown {describe_group(group)}: needs {cmp.a} and {cmp.b} "
            "requests with more than one output token and D's engine steps."
        )
    else:
        st.markdown(explain_tpot_delta(acc, cmp.a, cmp.b, where=describe_group(group)))
        st.plotly_chart(charts.tpot_account(acc, cmp.a, cmp.b, load), key="tpot_account")
        st.caption(
            "Mean ms per output token, from D's engine steps in each request's decode "
            f"window ({acc.n.get(cmp.a, 0)} {cmp.a}, {acc.n.get(cmp.b, 0)} {cmp.b} "
            "requests): model forward (the step's solo cost), batch sharing (forward "
            "beyond it), connector calls on D's engine thread, scheduling and other."
        )

st.subheader("Outliers")
found = derived.outliers(snap, what, modes)  # kept per snapshot, warmed at start
left, right = st.columns(2)
phase = left.selectbox(
    "Phase", found.phases, index=found.phases.index(found.biggest), key="outlier_phase"
)
n = right.slider("How many", 5, derived.OUTLIERS_MAX, 10, key="outlier_n")
worst = found.worst(phase, n)
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
