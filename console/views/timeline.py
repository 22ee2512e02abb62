"""Request timeline: one request's spans on lanes, its critical path, and a comparable
request of the other mode on the same time axis."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from tracedpush.analysis import skew
from tracedpush.console import charts, selection, ui, zones

snap = ui.snapshot()
run = snap.run
st.title("Request timeline")
ui.load_notes(snap)


def _pick_row(key: str, ids: list[str]) -> None:
    rows = st.session_state[key].selection.rows
    if rows:
        ui.select(ids[rows[0]])


def _pick_typed(key: str) -> None:
    typed = (st.session_state.get(key) or "").strip()
    if typed and run.get(typed) is not None:
        ui.select(run.get(typed).trace_id)


with st.expander("Pick a request", expanded=ui.selected_request(snap) is None):
    by_id, slowest = st.tabs(["By id", "Slowest"])
    with by_id:
        typed = st.text_input(
            "Trace id or request id",
            key="typed_request",
            on_change=_pick_typed,
            args=("typed_request",),
        )
        if typed.strip() and run.get(typed.strip()) is None:
            st.warning(f"No request {typed.strip()!r} in {snap.source.label}.")
    with slowest:
        left, right = st.columns(2)
        mode = left.selectbox("Mode", ["any", *snap.modes], key="slowest_mode")
        n = right.slider("How many", 5, 100, 20, key="slowest_n")
        worst = run.slowest(n, None if mode == "any" else mode)
        ids = [r.trace_id for r in worst]
        st.dataframe(
            pd.DataFrame(
                {
                    "request": [r.request_id for r in worst],
                    "mode": [r.mode for r in worst],
                    "TTFT ms": [r.ttft_ms for r in worst],
                    "prompt tokens": [r.prompt_tokens for r in worst],
                    "load": [r.load for r in worst],
                }
            ),
            hide_index=True,
            on_select=lambda: _pick_row("slowest_table", ids),
            selection_mode="single-row",
            key="slowest_table",
        )


_WHERE = {"proxy": "at the proxy", "client": "at the client"}  # else "in the <leg> leg"


def _code(text: str) -> str:
    """`text` as inline code: an error message is shown as it is, never as markdown."""
    return "`" + " ".join(text.replace("`", "'").split()) + "`"


def failure_banner(r: Any) -> str:
    """Where a failed request failed: leg, error type, span, when, and the message."""
    f = r.failure
    return (
        f"**{r.mode} request** {_code(r.request_id)} **failed "
        f"{_WHERE.get(f.leg, f'in the {f.leg} leg')}**: "
        f"{_code(f.type)} on "
        f"{_code(f.span)} ({f.service}), {f.at_ms:,.1f} ms after the proxy received it."
        + (f"  \nMessage: {_code(f.message)}" if f.message else "")
        + ("" if r.ttft_ms is None else "  \nThe client got its first token before it failed.")
    )


def _clock_warning(r: Any, run: Any) -> None:
    """Where this request arrived, the offset applied to an instance its spans ran on
    does not fit that stretch's evidence (a clock step or drift): say by how much."""
    on = {s.instance for s in r.spans}
    misfits = skew.misfit_at(run.clock_offsets, run.clock_windows, r.start_unix_ms)
    for inst, o in sorted(misfits.items()):
        if inst not in on:
            continue
        applied = run.clock_offsets[inst].offset_ms
        if o.consistent:
            how = (
                f"that stretch's pairs say {o.offset_ms:+.2f} ± {o.bound_ms:.2f} ms where "
                f"{applied:+.2f} ms is applied: its spans on {inst} are off by about "
                f"{abs(applied - o.offset_ms):,.1f} ms."
            )
        else:
            how = (
                "that stretch's pairs contradict each other (the clock moved within it): "
                f"its spans on {inst} may be off by up to the move."
            )
        who = r.request_id or r.trace_id
        st.warning(f"{inst}'s clock moved: request {who} arrived in a stretch of the run "
                   f"where {how}")  # fmt: skip


def _segments_table(segments: list, title: str) -> None:
    st.dataframe(
        pd.DataFrame(
            [(s.phase, s.service, s.start_ms, s.duration_ms) for s in segments],
            columns=[title, "service", "start ms", "ms"],
        ),
        hide_index=True,
        height=min(35 * (len(segments) + 1) + 3, 700),
    )


req = ui.selected_request(snap)
if req is None:
    req = snap.typical(snap.modes[0] if snap.modes else None) or run.requests[0]
    st.caption(
        f"Showing a typical (median TTFT) {req.mode} request; pick another above or click "
        "one in Overview or Phases."
    )

others = [m for m in snap.modes if m != req.mode]
other = None
if others:
    other = snap.counterpart(req, others[0])
    override = st.text_input(
        f"Compare with ({others[0]} request id; default: nearest prompt length and load)",
        key="compare_with",
    ).strip()
    if override:
        chosen = run.get(override)
        if chosen is None:
            st.warning(f"No request {override!r}; showing the nearest instead.")
        else:
            other = chosen
shown = selection.in_mode_order([req, other])
shown = snap.with_spans(shown)  # span views, made for these two alone

for r in shown:
    if getattr(r, "failure", None) is not None:
        st.error(failure_banner(r))

steps = {r.trace_id: snap.request_steps(r) for r in shown}
st.plotly_chart(charts.timeline(shown, run.clock_offsets, steps), key="timeline")
if snap.engine_steps is None:
    st.caption(
        "No engine-step lane: these traces have no `engine.steps` spans (recorded by "
        "tracedpush's connector since issue 8; older traces, or step tracing off)."
    )
elif not any(len(f) for f in steps.values()):
    st.caption(
        "No engine steps of these requests' engines over their windows (their engines' "
        "step traces are missing or cover another time)."
    )
else:
    st.caption(
        "Engine steps: one bar per step of P and D over the request's window, its length "
        "the step's duration (forward + connector calls), coloured by what it computed; "
        "the label says how many prompt tokens (tok) and decode requests (dec). Hover "
        "for the forward / connector split. Steps are placed on the proxy's clock with "
        "the offsets below."
    )
tz = ui.browser_zone()
offsets = [
    {
        "instance": o.instance,
        "host": o.host,
        "offset ms (subtracted)": o.offset_ms,
        "± bound ms": o.bound_ms,
        "causal pairs": o.pairs,
        "moved: from pairs": o.stretch_pairs or None,
        "reference clock": o.reference,
    }
    for inst, o in sorted(run.clock_offsets.items())
    if inst in {s.instance for r in shown for s in r.spans}
]
if offsets:
    st.caption(
        "Clock offsets estimated across the run and applied to every span above"
        + ("" if run.skew_corrected else " (estimated only: correction is off)")
    )
    st.dataframe(pd.DataFrame(offsets), hide_index=True)
    moved = sorted(
        skew.outside(run.clock_offsets, run.clock_windows) & {o["instance"] for o in offsets}
    )
    if moved:
        off, total = skew.misplaced(run.clock_offsets, run.clock_windows)
        st.caption(
            f"The clock of {', '.join(moved)} moved: its offset estimated from each stretch "
            "of the run alone (requests by arrival). The offset applied is that of the "
            "stretches with the most pairs; where marked !, it is outside that stretch's "
            f"evidence: the {off:,} of {total:,} requests there are off by about the "
            "difference; look for a clock step (NTP) at that time."
        )
        st.dataframe(pd.DataFrame(charts.offset_windows(run, moved, tz)), hide_index=True)

for r, col in zip(shown, st.columns(len(shown)), strict=True):
    with col:
        st.subheader(f"{r.mode} · {r.request_id}")
        if r.problems or not r.complete:
            st.warning("Incomplete trace: " + "; ".join(r.problems or ["spans missing"]))
        _clock_warning(r, run)
        _segments_table(r.critical_path, "critical path phase")
        if r.hidden:
            _segments_table(r.hidden, "overlapped (hidden) phase")
        arrived = f" · arrived {zones.moment(r.start_unix_ms, tz)}" if r.start_unix_ms else ""
        st.caption(f"trace id `{r.trace_id}`{arrived}")
