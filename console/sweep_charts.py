"""Plotly figures of a QPS x input-length sweep: pure functions, no Streamlit.

The seed article's two figures, TTFT and TPOT against QPS, one line per input length,
push solid and pull dashed: colour says the input length, dash says the mode, so a
length's two lines sit side by side in one colour. Values come from
`console.bench.cell_frame` (the client's own measurements) and, for the per-phase
difference, from `tracedpush.analysis.bench`'s join (its JSON); nothing is computed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from tracedpush.console.charts import _empty, phase_color, phase_description
from tracedpush.console.selection import mode_order

# Input lengths, shortest first; not the modes' blue and red, which mean push/pull elsewhere.
LENGTH_COLORS = (
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
)  # fmt: skip
MODE_DASH = {"push": "solid", "pull": "dash"}  # any other mode: dotted
STAT_NAMES = {"p50": "median", "p90": "p90", "p99": "p99", "mean": "mean"}
METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT"}


def length_color(input_len: int, lengths: Sequence[int]) -> str:
    """The colour of an input length: its rank among the sweep's lengths."""
    ranked = sorted(set(lengths))
    return LENGTH_COLORS[ranked.index(input_len) % len(LENGTH_COLORS)]


def dash_of(mode: str) -> str:
    return MODE_DASH.get(mode, "dot")


def sweep_figure(frame: pd.DataFrame, metric: str = "ttft", stat: str = "p50") -> go.Figure:
    """``metric`` (ttft | tpot) ``stat`` against QPS: one trace per (mode, input length),
    QPS ascending. Points carry ``[input_len, qps, mode]`` in customdata (a click picks
    the cell) and traces ``meta`` {kind: "sweep", metric, stat, mode, input_len}."""
    column = f"{metric}_{stat}"
    if frame is None or frame.empty or column not in frame:
        return _empty("no sweep cells")
    lengths = sorted(int(n) for n in frame["input_len"].unique())
    label = f"{METRIC_NAMES[metric]} {STAT_NAMES.get(stat, stat)} (ms)"
    fig = go.Figure()
    for n in lengths:
        for mode in mode_order(frame.loc[frame["input_len"] == n, "mode"]):
            rows = frame[(frame["input_len"] == n) & (frame["mode"] == mode)].sort_values("qps")
            fig.add_trace(
                go.Scatter(
                    x=rows["qps"].tolist(),
                    y=rows[column].tolist(),
                    mode="lines+markers",
                    name=f"{n:,} in · {mode}",
                    legendgroup=str(n),
                    line={"color": length_color(n, lengths), "dash": dash_of(mode), "width": 2},
                    marker={"size": 8, "symbol": "circle" if mode == "push" else "diamond"},
                    connectgaps=False,
                    customdata=[[n, q, mode, k]
                                for q, k in zip(rows["qps"], rows["ok"], strict=True)],
                    hovertemplate=(
                        f"<b>{n:,} input tokens, {mode}</b><br>%{{x:g}} QPS: "
                        f"%{{y:,.1f}} ms {STAT_NAMES.get(stat, stat)} "
                        "(%{customdata[3]} requests)<extra></extra>"
                    ),
                    meta={"kind": "sweep", "metric": metric, "stat": stat, "mode": mode,
                          "input_len": n},
                )
            )  # fmt: skip
    rates = sorted(float(q) for q in frame["qps"].unique())
    fig.update_xaxes(
        title_text="request rate (QPS)", tickvals=rates, ticktext=[f"{q:g}" for q in rates]
    )
    fig.update_yaxes(title_text=label, rangemode="tozero")
    fig.update_layout(
        height=420,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        legend={"title": {"text": "input tokens · mode<br>(push solid, pull dashed)"},
                "groupclick": "toggleitem", "tracegroupgap": 6},
        clickmode="event+select",
        meta={"kind": f"sweep_{metric}", "stat": stat},
    )  # fmt: skip
    return fig


def phase_delta_figure(
    account: Mapping[str, Any] | None, a: str = "push", b: str = "pull"
) -> go.Figure:
    """One cell's TTFT account (`TtftAccount.to_json()` from the join): a bar per phase,
    a - b (push - pull) mean ms on the critical path, largest on top; the bars add up to
    the cell's mean span-TTFT difference."""
    if not account:
        return _empty(f"needs joined {a} and {b} requests")
    rows = [r for r in account.get("phases") or () if abs(r.get("mean_delta_ms") or 0.0) >= 0.005]
    rows.sort(key=lambda r: (abs(r["mean_delta_ms"]), r["phase"]))
    if not rows:
        return _empty(f"{a} and {b} spend the same time in every phase")
    total = account.get("ttft_mean_delta_ms")
    fig = go.Figure(
        go.Bar(
            orientation="h",
            y=[r["phase"] for r in rows],
            x=[r["mean_delta_ms"] for r in rows],
            marker_color=[phase_color(r["phase"]) for r in rows],
            text=[f"{r['mean_delta_ms']:+,.1f}" for r in rows],
            textposition="outside",
            customdata=[
                [_ms(r.get("a_mean_ms")), _ms(r.get("b_mean_ms")), phase_description(r["phase"])]
                for r in rows
            ],
            hovertemplate=(
                f"<b>%{{y}}</b>: %{{x:+.2f}} ms ({a} − {b}, mean)"
                f"<br>{a} %{{customdata[0]}}, {b} %{{customdata[1]}} (mean)"
                "<br><i>%{customdata[2]}</i><extra></extra>"
            ),
            meta={"kind": "sweep_phase_delta"},
        )
    )
    title = f"mean ms on the critical path, {a} − {b}"
    if total is not None:
        title += f" (total {total:+,.1f} ms)"
    fig.update_layout(
        height=120 + 26 * len(rows),
        margin={"l": 10, "r": 40, "t": 30, "b": 10},
        xaxis_title=title,
        meta={"kind": "sweep_phase_delta", "total_ms": total},
    )
    return fig


def _ms(x: Any) -> str:
    return "–" if x is None else f"{x:,.2f} ms"
