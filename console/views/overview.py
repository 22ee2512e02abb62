"""Overview: push vs pull TTFT and TPOT by load and prompt length, where TTFT goes, and
where failed requests failed, and whether the traces are complete."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from tracedpush.analysis.compare import explain_delta
from tracedpush.console import charts, derived, ui

try:
    from tracedpush.analysis.tpot import explain_tpot_delta
except ImportError:  # pragma: no cover - an analysis without TPOT attribution
    explain_tpot_delta = None

FAILED_TABLE = "failed_requests"


def _counts(counts: dict[str, int]) -> str:
    return " · ".join(f"`{name}` {n:,}" for name, n in counts.items())


def failed_requests(found: Any, frame: pd.DataFrame) -> None:
    """Where requests failed: counts by leg and type, and the first failures, each
    linking to its timeline (`FailureSummary`, `Snapshot.failure_examples`)."""
    st.subheader(f"Failed requests: {found.total:,} of {found.requests:,}")
    st.markdown(f"By leg: {_counts(found.by_leg())}  \nBy type: {_counts(found.by_type())}")
    ids = frame["trace_id"].tolist()
    shown = frame.assign(timeline="timeline?" + ui.REQUEST_KEY + "=" + frame["trace_id"])
    st.dataframe(
        shown[["request", "mode", "leg", "type", "span", "message", "timeline"]],
        hide_index=True,
        column_config={
            "timeline": st.column_config.LinkColumn("timeline", display_text="open"),
            "message": st.column_config.TextColumn("message", width="large"),
        },
        on_select=lambda: ui.follow_row(FAILED_TABLE, ids),
        selection_mode="single-row",
        key=FAILED_TABLE,
    )
    st.caption(
        f"Showing {len(frame):,} of {found.total:,} failed requests (the first of each leg "
        "and type first); select a row or open its timeline. Also: "
        f"{found.recovered:,} answered despite a failed span, {found.incomplete:,} seen by "
        "the proxy with an incomplete trace. `tracedpush report --format json` lists every "
        "failure (`requests[].failure`)."
    )


def trace_completeness(health: Any) -> None:
    """What the processes' own export records say (`ExportHealth`): the report's
    lines, shown as a warning when spans were lost or an exporter fails."""
    st.subheader("Trace completeness")
    if not health:
        st.caption(
            "These traces hold no export records (`engine.export`): whether spans were "
            "dropped is not known (a tracedpush older than them, or a source without them)."
        )
        return
    said = "\n".join(health.lines())
    if health.lossy or health.failing:
        st.warning(said)
    else:
        st.markdown(said)
    st.caption(
        "From each engine process's and the proxy's own cumulative export counters "
        "(`engine.export`). "
        "A process with no final record is still running or was killed before it flushed "
        "(vLLM's default `--shutdown-timeout 0` does that); `tracedpush report` says the same."
    )


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

st.page_link(
    "views/requests.py",
    label="Every request as a point (TTFT, TPOT or a phase, against prompt length, arrival "
    "or load): click one for its timeline",
    icon=":material/scatter_plot:",
)

untimed = snap.table["ttft_ms"].isna().sum()
incomplete = (~snap.table["complete"].astype(bool)).sum()
if untimed or incomplete:
    st.caption(
        f"{incomplete:,} of {len(snap.table):,} requests have incomplete traces; {untimed:,} "
        "have no TTFT and are left out of the charts (Export has the full table)."
    )
failed = snap.failures
if failed is not None and failed.total:
    failed_requests(failed, snap.failure_examples)

stat = (
    st.segmented_control(
        "Statistic", charts.STATS, default=derived.DEFAULT_STAT, key="overview_stat"
    )
    or derived.DEFAULT_STAT
)
figures = derived.overview_figures(snap, stat)  # kept per snapshot, warmed at start
st.subheader(f"TTFT and TPOT by load ({stat})")
st.plotly_chart(figures["by_load"], key="by_load")
st.subheader(f"TTFT and TPOT by prompt length ({stat}, all loads)")
st.plotly_chart(figures["by_prompt"], key="by_prompt")

left, right = st.columns([3, 2])
with left:
    st.subheader("Where TTFT goes: critical path by phase (mean ms)")
    st.plotly_chart(figures["critical_stack"], key="critical_stack")
with right:
    total = overall.ttft_mean_delta_ms if overall is not None else None
    st.subheader(
        f"Why {cmp.b} differs from {cmp.a}"
        + ("" if total is None else f": {total:+,.1f} ms mean TTFT")
    )
    st.plotly_chart(figures["ttft_delta"], key="ttft_delta")
    st.caption("Per-phase mean differences; they add up to the mean TTFT difference.")

if overall is not None and overall.account is not None:
    st.subheader(f"{cmp.a} vs {cmp.b} in words")
    st.markdown("**TTFT.** " + explain_delta(overall, cmp.a, cmp.b))
    by_load = cmp.by_load()
    if len(by_load) > 1:
        st.markdown(
            "\n".join(f"- {explain_delta(g, cmp.a, cmp.b)}" for g in by_load),
        )
    if snap.engine_steps is not None and explain_tpot_delta is not None:
        st.markdown(
            "**TPOT.** "
            + explain_tpot_delta(
                snap.tpot_accounts.get("all"), cmp.a, cmp.b, where="over all requests"
            )
        )
    else:
        st.caption(
            "TPOT is not attributed: these traces have no `engine.steps` spans from D "
            "(older traces, or step tracing off)."
        )
    st.caption("Details per load, phase by phase, on the Phases page.")

found = snap.contention
if found is not None and found.findings:
    st.markdown("**CPU contention** (from the engines' thread samples):")
    st.markdown("\n".join(f"- {f.text}" for f in found.findings))
elif found is not None:
    st.caption(f"No CPU contention found in {found.samples:,} thread samples.")
threads = derived.thread_table(snap)
if threads is not None:
    with st.expander("Engine threads: on a CPU and waiting for one, over the run"):
        st.dataframe(
            threads,
            hide_index=True,
            column_config={
                "waiting share": st.column_config.NumberColumn(
                    "waiting share",
                    help="waiting / (CPU + waiting): the share of the time the thread was "
                    "runnable that it had no CPU",
                    format="percent",
                )
            },
        )

health = snap.export_health
if health is not None:
    trace_completeness(health)
