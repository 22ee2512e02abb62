"""Plotly figures built from analysis objects: pure functions, no Streamlit.

Every number drawn here comes from `tracedpush.analysis` (RequestAnalysis, Comparison,
RunAnalysis.table()); these functions only choose marks, colours and layout, so they can
be tested on their own. Traces carry ``meta`` (``{"kind": ..., "mode": ..., ...}``) so tests
and click handlers can find them without relying on legend text.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tracedpush import semconv as sc
from tracedpush.analysis import phases as ph
from tracedpush.analysis import skew
from tracedpush.console import zones
from tracedpush.console.selection import mode_order

MODE_COLORS = {"push": "#1f77b4", "pull": "#d62728", "unknown": "#7f7f7f"}
DIM = 0.3  # opacity of spans and phases that did not delay the first token

CRITICAL_LANE = "critical path"
HIDDEN_LANE = "overlapped (hidden)"
STEP_LANES = {"prefill": "P engine steps", "decode": "D engine steps"}
# What an engine step computed (console.data.step_kind), legend order and colours.
STEP_KINDS = {  # kind: (legend name, colour)
    "prefill": ("step: prefill", "#2ca02c"),  # prompt tokens; = prefill compute
    "mixed": ("step: prefill + decode", "#8c6d31"),
    "decode": ("step: decode only", "#393b79"),  # 1-token requests; = first decode step
    "idle": ("step: idle (connector)", "#c7c7c7"),  # nothing scheduled
    "unknown": ("step: unknown", "#9e9e9e"),  # no scheduler record of the step
}
_SERVICE_SHORT = {sc.SERVICE_PROXY: "proxy", sc.SERVICE_PREFILL: "P", sc.SERVICE_DECODE: "D"}


def phase_color(phase: str) -> str:
    """A phase's colour (analysis.phases.COLORS); a span name takes its phase's colour."""
    if phase in ph.COLORS:
        return ph.COLORS[phase]
    if phase in ph.SPAN_PHASE:
        return ph.COLORS[ph.SPAN_PHASE[phase]]
    palette = tuple(ph.COLORS.values())
    return palette[sum(map(ord, phase)) % len(palette)]


def phase_description(phase: str, width: int = 70) -> str:
    """The phase's meaning (analysis.phases.DESCRIPTIONS), wrapped for a hover box."""
    text = ph.DESCRIPTIONS.get(phase, "")
    return "<br>".join(textwrap.wrap(text, width)) if text else ""


def phase_order(names: Iterable[str]) -> list[str]:
    """Phases in pipeline order (analysis.phases.PHASES), unknown ones last."""
    rank = {p: i for i, p in enumerate(ph.PHASES)}
    return sorted(set(names), key=lambda p: (rank.get(p, len(rank)), p))


def lane_label(lane: str) -> str:
    """'vllm-prefill/prefill-0/scheduler' -> 'P prefill-0 · scheduler'."""
    parts = lane.split("/")
    if len(parts) >= 2:
        service = _SERVICE_SHORT.get(parts[0], parts[0])
        if parts[0] == sc.SERVICE_PROXY:
            return "proxy" if len(parts) < 3 else f"proxy · {parts[2]}"
        rest = " · ".join(parts[1:])
        return f"{service} {rest}"
    return lane


def _fmt_ms(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.1f} ms"


def _empty(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, height=200)
    return fig


# --------------------------------------------------------------------------- timeline


def request_title(req: Any) -> str:
    tokens = f"{req.prompt_tokens} prompt tokens" if req.prompt_tokens is not None else "?"
    return (
        f"{req.mode} · {req.request_id or req.trace_id[:12]} · {tokens} · load {req.load}"
        f" · TTFT {_fmt_ms(req.ttft_ms)}"
    )


def offset_windows(run: Any, moved: Sequence[str], tz: tzinfo = UTC) -> list[dict[str, Any]]:
    """A row per window of `run.clock_windows` (`skew.over_time`): its start in `tz`,
    and each instance of `moved`'s offset there, "!" where the run's one offset is
    outside that window's evidence (or the evidence contradicts itself)."""
    rows = []
    for w in run.clock_windows:
        row: dict[str, Any] = {
            "from": zones.moment(w.start_unix_ms, tz),
            "to": zones.moment(w.end_unix_ms, tz),
            "requests": w.requests,
        }
        for x in moved:
            row[f"{x} ms"] = skew.window_cell(w.offsets.get(x), run.clock_offsets[x].offset_ms, "±")
        rows.append(row)
    return rows


def offsets_note(requests: Sequence[Any], offsets: Mapping[str, Any]) -> str:
    """'clock offsets applied: decode-0 +50.02 ms (±0.31, 212 pairs)' for the instances
    the requests' spans ran on (the reference clock is left out)."""
    instances = sorted({s.instance for r in requests for s in r.spans})
    parts = []
    for inst in instances:
        off = offsets.get(inst)
        if off is None or getattr(off, "reference", False):
            continue
        bound = "±?" if math.isinf(off.bound_ms) else f"±{off.bound_ms:.2f}"
        parts.append(f"{inst} {off.offset_ms:+.2f} ms ({bound}, {off.pairs} pairs)")
    if not parts:
        return "clock offsets: none (one clock)"
    return "clock offsets applied: " + "; ".join(parts)


def _lanes(req: Any) -> list[str]:
    lanes = list(getattr(req, "lanes", None) or [])
    for s in req.spans:
        if s.lane not in lanes:
            lanes.append(s.lane)
    return lanes


def _segment_bar(
    segments: Sequence[Any], lane: str, req: Any, kind: str, *, opacity: float, name: str
) -> go.Bar:
    return go.Bar(
        orientation="h",
        name=name,
        y=[lane] * len(segments),
        base=[s.start_ms for s in segments],
        x=[s.duration_ms for s in segments],
        text=[s.phase for s in segments],
        textposition="inside",
        insidetextanchor="middle",
        marker={
            "color": [phase_color(s.phase) for s in segments],
            "opacity": opacity,
            "line": {"width": 1 if kind == "critical" else 0, "color": "#222"},
        },
        customdata=[
            [s.phase, s.service, s.span, phase_description(s.phase), req.trace_id] for s in segments
        ],
        hovertemplate=(
            "<b>%{customdata[0]}</b> (%{customdata[1]})<br>start %{base:.2f} ms"
            "<br>duration %{x:.2f} ms<br>span %{customdata[2]}"
            "<br><i>%{customdata[3]}</i><extra></extra>"
        ),
        meta={"kind": kind, "mode": req.mode, "trace_id": req.trace_id},
        showlegend=False,
    )


def _span_bar(spans: Sequence[Any], req: Any, *, critical: bool) -> go.Bar:
    labels = [lane_label(s.lane) for s in spans]
    return go.Bar(
        orientation="h",
        name="spans on the critical path" if critical else "other spans",
        y=labels,
        base=[s.start_ms for s in spans],
        x=[s.duration_ms for s in spans],
        text=[s.name for s in spans],
        textposition="inside",
        insidetextanchor="middle",
        marker={
            "color": [phase_color(s.name) for s in spans],
            "opacity": 1.0 if critical else DIM,
            "line": {
                "width": [2 if s.status == "error" else (1 if critical else 0) for s in spans],
                "color": ["#d00" if s.status == "error" else "#222" for s in spans],
            },
        },
        customdata=[
            [s.name, s.instance, s.status, s.error or "", _attrs_line(s.attributes), s.span_id]
            for s in spans
        ],
        hovertemplate=(
            "<b>%{customdata[0]}</b> on %{customdata[1]}<br>start %{base:.2f} ms"
            "<br>duration %{x:.2f} ms<br>status %{customdata[2]} %{customdata[3]}"
            "<br>%{customdata[4]}<extra></extra>"
        ),
        meta={"kind": "spans" if critical else "spans-dimmed", "mode": req.mode,
              "trace_id": req.trace_id},
        showlegend=False,
    )  # fmt: skip


_HOVER_ATTRS = (
    sc.TP_RANK,
    sc.KV_BLOCKS,
    sc.KV_BYTES,
    sc.KV_DESCRIPTORS,
    sc.NIXL_XFER_US,
    sc.POLL_LAG_US,
    sc.RENDEZVOUS_FIRST,
    sc.NOTIFY_EXPECTED,
    sc.NOTIFY_RECEIVED,
    sc.NOTIFY_RANKS,
    sc.ERROR_TYPE,
)


def _attrs_line(attrs: Mapping[str, Any]) -> str:
    shown = [f"{k.removeprefix('tracedpush.')}={attrs[k]}" for k in _HOVER_ATTRS if k in attrs]
    return "<br>".join(shown)


def _step_label(row: Any) -> str:
    parts = []
    if row.prefill_tokens:
        parts.append(f"{int(row.prefill_tokens)} tok")
    if row.decode_reqs:
        parts.append(f"{int(row.decode_reqs)} dec")
    return " + ".join(parts)


def _num(x: Any, fmt: str = "{:,.0f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return fmt.format(x)


def _step_bars(frame: Any, req: Any) -> list[go.Bar]:
    """One bar per engine step (its duration), one trace per (engine, what it computed)."""
    out = []
    for role, lane in STEP_LANES.items():
        rows = frame[frame["role"] == role]
        for kind, (label, color) in STEP_KINDS.items():
            part = rows[rows["kind"] == kind]
            if part.empty:
                continue
            items = list(part.itertuples(index=False))
            out.append(
                go.Bar(
                    orientation="h",
                    name=label,
                    y=[lane] * len(items),
                    base=[r.start_ms for r in items],
                    x=[r.duration_ms for r in items],
                    text=[_step_label(r) for r in items],
                    textposition="inside",
                    insidetextanchor="middle",
                    marker={"color": color, "opacity": 0.55 if kind == "idle" else 0.9,
                            "line": {"width": 0.5, "color": "#fff"}},
                    customdata=[
                        [r.engine_id, r.seq, _num(r.prefill_tokens), _num(r.decode_reqs),
                         _num(r.num_reqs), _num(r.forward_ms, "{:,.2f}"),
                         _num(r.connector_ms, "{:,.2f}"), _num(r.loads_started),
                         _num(r.loads_finished), req.trace_id]
                        for r in items
                    ],
                    hovertemplate=(
                        "<b>%{customdata[0]} step %{customdata[1]}</b>"
                        "<br>start %{base:.2f} ms<br>duration %{x:.2f} ms"
                        "<br>prefill tokens %{customdata[2]}, decode requests %{customdata[3]}"
                        " (%{customdata[4]} scheduled)"
                        "<br>forward %{customdata[5]} ms, connector %{customdata[6]} ms"
                        "<br>KV loads started %{customdata[7]}, finished %{customdata[8]}"
                        f"<extra>{label}</extra>"
                    ),
                    meta={"kind": "steps", "mode": req.mode, "trace_id": req.trace_id,
                          "role": role, "step_kind": kind},
                    showlegend=False,
                )
            )  # fmt: skip
    return out


def _legend(requests: Sequence[Any], steps: Mapping[str, Any]) -> list[go.Scatter]:
    """Legend-only entries: the phases drawn, in analysis.phases.PHASES order, then what
    the engine steps computed."""
    drawn = {s.phase for r in requests for s in [*r.critical_path, *r.hidden]}
    out = []
    for phase in phase_order(drawn):
        out.append(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=phase,
                marker={"symbol": "square", "size": 11, "color": phase_color(phase)},
                hoverinfo="skip", meta={"kind": "phase_legend", "phase": phase},
            )
        )  # fmt: skip
    kinds = set()
    for r in requests:
        frame = steps.get(r.trace_id)
        if frame is not None and len(frame):
            kinds |= set(frame["kind"])
    for kind, (label, color) in STEP_KINDS.items():
        if kind in kinds:
            out.append(
                go.Scatter(
                    x=[None], y=[None], mode="markers", name=label,
                    marker={"symbol": "square", "size": 11, "color": color},
                    hoverinfo="skip", meta={"kind": "step_legend", "step_kind": kind},
                )
            )  # fmt: skip
    return out


def timeline(
    requests: Sequence[Any],
    offsets: Mapping[str, Any] | None = None,
    steps: Mapping[str, Any] | None = None,
) -> go.Figure:
    """Gantt of one or more requests, one row each, on one shared time axis (ms since the
    proxy received the request). Per request: the critical path (analysis segments, in
    full colour), the hidden (overlapped) phases dimmed, P's and D's engine steps over
    the request's window (``steps``: trace id -> `console.data.request_steps` frame;
    a bar per step, coloured by what it computed), then one lane per
    service/instance/thread with its spans; spans off the critical path are dimmed."""
    requests = [r for r in requests if r is not None]
    if not requests:
        return _empty("no request selected")
    offsets = offsets or {}
    steps = steps or {}

    def step_lanes(req: Any) -> list[str]:
        frame = steps.get(req.trace_id)
        if frame is None or not len(frame):
            return []
        return [lane for role, lane in STEP_LANES.items() if (frame["role"] == role).any()]

    fig = make_subplots(
        rows=len(requests),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12 if len(requests) > 1 else 0.05,
        subplot_titles=[request_title(r) for r in requests],
        row_heights=[len(_lanes(r)) + 2 + len(step_lanes(r)) for r in requests],
    )
    for i, req in enumerate(requests, start=1):
        lanes = [CRITICAL_LANE, HIDDEN_LANE, *step_lanes(req)]
        lanes += [lane_label(lane) for lane in _lanes(req)]
        fig.add_trace(
            _segment_bar(req.critical_path, CRITICAL_LANE, req, "critical", opacity=1.0,
                         name="critical path"),
            row=i, col=1,
        )  # fmt: skip
        fig.add_trace(
            _segment_bar(req.hidden, HIDDEN_LANE, req, "hidden", opacity=DIM,
                         name="overlapped (hidden)"),
            row=i, col=1,
        )  # fmt: skip
        frame = steps.get(req.trace_id)
        if frame is not None and len(frame):
            for bar in _step_bars(frame, req):
                fig.add_trace(bar, row=i, col=1)
        on = [s for s in req.spans if s.on_critical_path]
        off = [s for s in req.spans if not s.on_critical_path]
        fig.add_trace(_span_bar(off, req, critical=False), row=i, col=1)
        fig.add_trace(_span_bar(on, req, critical=True), row=i, col=1)
        fig.update_yaxes(
            categoryorder="array",
            categoryarray=list(reversed(lanes)),
            row=i,
            col=1,
        )
        if req.ttft_ms is not None:
            fig.add_vline(
                x=req.ttft_ms, line_dash="dash", line_color="#444", row=i, col=1,
                annotation_text=f"first token {req.ttft_ms:.1f} ms",
                annotation_position="top right",
            )  # fmt: skip
    fig.update_xaxes(
        title_text="ms since the proxy received the request (skew-corrected)<br>"
        + offsets_note(requests, offsets),
        row=len(requests),
    )
    legend = _legend(requests, steps)
    for entry in legend:
        fig.add_trace(entry, row=1, col=1)
    legend_rows = -(-len(legend) // 5)  # a horizontal legend under the axis title
    ttfts = [r.ttft_ms for r in requests if r.ttft_ms is not None]
    if ttfts:  # the TTFT window is the subject; the response stream can be zoomed out to
        fig.update_xaxes(range=[-0.02 * max(ttfts), 1.1 * max(ttfts)])
    fig.update_layout(
        barmode="overlay",
        height=160
        + sum(26 * (len(_lanes(r)) + 2 + len(step_lanes(r))) for r in requests)
        + 60 * len(requests)
        + 22 * legend_rows,
        margin={"l": 10, "r": 10, "t": 60, "b": 95 + 22 * legend_rows},
        meta={"kind": "timeline", "trace_ids": [r.trace_id for r in requests]},
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "x": 0,
            "groupclick": "toggleitem",
            "font": {"size": 11},
        },
        uniformtext={"minsize": 8, "mode": "hide"},
    )
    return fig


# --------------------------------------------------------------------------- overview

STATS = ("p50", "p90", "p99", "mean")
METRIC_TITLES = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)"}
ALL = "all"


def modes_of(cmp: Any) -> list[str]:
    present: set[str] = set()
    for g in cmp.groups:
        present |= {m for m, n in g.n.items() if n}
    first = [m for m in (cmp.a, cmp.b) if m in present]
    return first + sorted(present - set(first))


def stat_of(group: Any, metric: str, mode: str, stat: str) -> float | None:
    if group is None:
        return None
    values = getattr(group, metric).get(mode) or {}
    return values.get(stat)


def _line(x: list[str], y: list[float | None], mode: str, **kw: Any) -> go.Scatter:
    return go.Scatter(
        x=x,
        y=y,
        name=mode,
        mode="lines+markers",
        connectgaps=False,
        line={"color": MODE_COLORS.get(mode, "#7f7f7f")},
        legendgroup=mode,
        **kw,
    )


def latency_by_load(cmp: Any, stat: str = "p50") -> go.Figure:
    """The seed article's charts from our runs: TTFT (top) and TPOT (bottom) against load,
    push vs pull, one column per prompt-length bucket ("all" first). Values are
    Comparison cells (bucket, load); load is requests in flight at the proxy."""
    buckets = [ALL, *cmp.buckets]
    loads = list(cmp.loads)
    if not loads:
        return _empty("no requests with a TTFT")
    fig = make_subplots(
        rows=2,
        cols=len(buckets),
        shared_yaxes="rows",
        shared_xaxes=True,
        column_titles=["all prompts" if b == ALL else f"prompt {b}" for b in buckets],
        row_titles=[METRIC_TITLES["ttft"], METRIC_TITLES["tpot"]],
        horizontal_spacing=0.02,
        vertical_spacing=0.08,
    )
    for row, metric in enumerate(("ttft", "tpot"), start=1):
        for col, bucket in enumerate(buckets, start=1):
            for mode in modes_of(cmp):
                y = [stat_of(cmp.group(bucket, ld), metric, mode, stat) for ld in loads]
                n = [(cmp.group(bucket, ld).n.get(mode, 0) if cmp.group(bucket, ld) else 0)
                     for ld in loads]  # fmt: skip
                fig.add_trace(
                    _line(loads, y, mode, showlegend=row == 1 and col == 1,
                          customdata=n,
                          hovertemplate=f"{mode} load %{{x}}: %{{y:.1f}} ms {stat}"
                          " (%{customdata} requests)<extra></extra>",
                          meta={"kind": "latency_by_load", "metric": metric, "mode": mode,
                                "bucket": bucket, "stat": stat}),
                    row=row, col=col,
                )  # fmt: skip
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=loads)
    fig.update_xaxes(title_text="requests in flight", row=2)
    fig.update_layout(
        height=520,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.06, "xanchor": "left", "x": 0},
    )
    return fig


def latency_by_prompt(cmp: Any, stat: str = "p50") -> go.Figure:
    """TTFT and TPOT against prompt length (all loads), push vs pull."""
    buckets = list(cmp.buckets)
    if not buckets:
        return _empty("no requests with a TTFT")
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=[METRIC_TITLES["ttft"], METRIC_TITLES["tpot"]]
    )
    for col, metric in enumerate(("ttft", "tpot"), start=1):
        for mode in modes_of(cmp):
            y = [stat_of(cmp.group(b, ALL), metric, mode, stat) for b in buckets]
            fig.add_trace(
                _line(buckets, y, mode, showlegend=col == 1,
                      hovertemplate=f"{mode} prompt %{{x}}: %{{y:.1f}} ms {stat}<extra></extra>",
                      meta={"kind": "latency_by_prompt", "metric": metric, "mode": mode,
                            "stat": stat}),
                row=1, col=col,
            )  # fmt: skip
    fig.update_xaxes(type="category", title_text="prompt tokens")
    fig.update_layout(
        height=340,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
    )
    return fig


def critical_path_stack(cmp: Any) -> go.Figure:
    """Mean critical-path milliseconds per phase, stacked, for each mode and prompt
    bucket. Means add up: each bar's height is that group's mean TTFT."""
    cells = [(b, m) for b in [ALL, *cmp.buckets] for m in modes_of(cmp)
             if (g := cmp.group(b, ALL)) is not None and g.n.get(m)]  # fmt: skip
    if not cells:
        return _empty("no requests with a critical path")
    phase_names = phase_order(p for b, m in cells for p in (cmp.group(b, ALL).phases.get(m) or {}))
    x = [["all prompts" if b == ALL else b for b, _ in cells], [m for _, m in cells]]
    fig = go.Figure()
    for phase in phase_names:
        y = [
            ((cmp.group(b, ALL).phases.get(m) or {}).get(phase) or {}).get("mean") or 0.0
            for b, m in cells
        ]
        if not any(y):
            continue
        fig.add_trace(
            go.Bar(
                x=x,
                y=y,
                name=phase,
                marker_color=phase_color(phase),
                hovertemplate=f"{phase}: %{{y:.2f}} ms (mean)<extra>%{{x}}</extra>",
                meta={"kind": "critical_stack", "phase": phase},
            )
        )
    fig.update_layout(
        barmode="stack",
        height=420,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        yaxis_title="mean ms on the critical path",
        legend={"traceorder": "normal"},
        xaxis={"tickangle": 0},
    )
    return fig


def ttft_delta(cmp: Any, bucket: str = ALL, load: str = ALL) -> go.Figure:
    """Per-phase mean difference (b - a, pull - push by default): the bars sum to the
    mean TTFT difference."""
    g = cmp.group(bucket, load)
    if g is None or not g.delta:
        return _empty(f"needs both {cmp.a} and {cmp.b} requests")
    deltas = [d for d in g.delta if abs(d.delta_ms) > 1e-9]
    deltas.sort(key=lambda d: d.delta_ms)
    fig = go.Figure(
        go.Bar(
            orientation="h",
            y=[d.phase for d in deltas],
            x=[d.delta_ms for d in deltas],
            marker_color=[phase_color(d.phase) for d in deltas],
            customdata=[[d.a_ms, d.b_ms] for d in deltas],
            hovertemplate=(
                f"%{{y}}: %{{x:+.2f}} ms<br>{cmp.a} %{{customdata[0]:.2f}} ms, "
                f"{cmp.b} %{{customdata[1]:.2f}} ms<extra></extra>"
            ),
            meta={"kind": "ttft_delta", "bucket": bucket, "load": load},
        )
    )
    fig.update_layout(
        height=120 + 24 * len(deltas),
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        xaxis_title=f"mean ms, {cmp.b} − {cmp.a}",
    )
    return fig


# Points per mode a request scatter draws (overview and Live). Each point carries its
# ids (click -> timeline): 200,000 requests were megabytes of JSON for the browser to
# parse and draw (Chromium took 5.9 s for the overview), and beyond some thousands more
# points add no picture. Overview in Chromium at 200,000 requests, median of 8 visits,
# ABBA: 20,000 points a mode 3.1 / 3.5 s, 10,000 2.5 / 2.7 s, 5,000 2.6 / 2.3 s, 2,000
# 2.0 / 2.2 s. The Live page draws its window again at every refresh (2 s by default).
MAX_POINTS = 5_000
SLOWEST = 1_000  # of those, the largest values are always drawn: the points users click
LIVE_COLUMNS = ("mode", "ttft_ms", "start_unix_ms", "request_id")  # what `window_ttft` reads


def drawn(rows: Any, y: str, cap: int = MAX_POINTS, slowest: int = SLOWEST) -> Any:
    """The rows a scatter draws: all of them up to `cap`; beyond, the `slowest` largest
    `y` values and an even sample of the rest (every k-th in the table's order, so
    every stretch of the run keeps its share), `cap` in all, in the table's order."""
    if len(rows) <= cap:
        return rows
    top = rows[y].nlargest(min(slowest, cap)).index
    rest = rows.drop(index=top)
    step = len(rest) / (cap - len(top))
    keep = rest.iloc[(np.arange(cap - len(top)) * step).astype(np.int64)].index
    return rows.loc[rows.index.isin(top.union(keep))]


def drawn_note(fig: go.Figure, kind: str) -> str:
    """What a scatter of `kind` left out, for its caption ("Drawn: 5,000 of 100,020
    push requests ..."); empty when it drew every request."""
    parts = [
        f"{len(t.customdata):,} of {t.meta['of']:,} {t.meta['mode']}"
        for t in fig.data
        if isinstance(t.meta, dict)
        and t.meta.get("kind") == kind
        and len(t.customdata) < t.meta["of"]
    ]
    if not parts:
        return ""
    return (
        f" Drawn: {', '.join(parts)} requests (the {SLOWEST:,} slowest of each mode and an "
        "even sample of the rest)."
    )


ARRIVAL = "start_unix_ms"  # the x axis that is a time: drawn on a date axis (`zones`)


def requests_scatter(
    table: Any,
    x: str = "prompt_tokens",
    y: str = "ttft_ms",
    x_title: str | None = None,
    y_title: str | None = None,
    log_y: bool = False,
    tz: tzinfo = UTC,
) -> go.Figure:
    """One point per request with a `y` value (click one to open its timeline), at most
    `MAX_POINTS` a mode (`drawn`). ``table`` is RunAnalysis.table() as a DataFrame; points
    carry their trace id in customdata. `x` `ARRIVAL` (unix ms) is drawn as dates in `tz`;
    `log_y`: y on a log axis (latencies span decades; Plotly leaves out values <= 0)."""
    fig = go.Figure()
    if table is None or len(table) == 0 or y not in table or x not in table:
        return _empty("no requests")
    x_title, y_title = x_title or x.replace("_", " "), y_title or y.replace("_", " ")
    for mode in mode_order(table["mode"].unique()):
        every = table[(table["mode"] == mode) & table[y].notna()]
        rows = drawn(every, y)
        fig.add_trace(
            go.Scattergl(
                x=zones.wall_times(rows[x], tz) if x == ARRIVAL else rows[x].to_numpy(),
                y=rows[y].to_numpy(),
                mode="markers",
                name=str(mode),
                marker={"color": MODE_COLORS.get(str(mode), "#7f7f7f"), "size": 5,
                        "opacity": 0.6},
                customdata=rows[["request_id", "load", "trace_id"]].to_numpy(),
                hovertemplate=(
                    "%{customdata[0]}<br>" + x_title + " %{x}<br>" + y_title + " %{y:.1f}"
                    "<br>load %{customdata[1]}<extra>" + str(mode) + "</extra>"
                ),
                meta={"kind": "requests", "mode": str(mode), "of": len(every)},
            )
        )  # fmt: skip
    fig.update_layout(
        height=420,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        xaxis_title=x_title,
        yaxis_title=y_title,
        clickmode="event+select",
        dragmode="zoom",
    )
    if x == ARRIVAL:
        fig.update_xaxes(type="date")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


# --------------------------------------------------------------------------- phases


def box_stats(values: Any) -> dict[str, float]:
    """A box's statistics as Plotly computes them from a sample (its default "linear"
    quartiles are Hyndman and Fan's method 5, numpy's "hazen"), the fences at the
    smallest and largest value, and ``n``; for `go.Box`'s q1/median/q3 signature."""
    v = np.asarray(values, dtype="float64")
    v = v[np.isfinite(v)]  # as Plotly skips what is not a number
    if not len(v):
        return {"n": 0}
    q1, median, q3 = np.percentile(v, [25, 50, 75], method="hazen")
    return {
        "q1": float(q1),
        "median": float(median),
        "q3": float(q3),
        "lowerfence": float(v.min()),
        "upperfence": float(v.max()),
        "mean": float(v.mean()),
        "n": len(v),
    }


@dataclass(frozen=True)
class BoxPart:
    """One phase's box for one mode: its statistics (`box_stats`) and its ``top``
    largest values with their (request id, trace id)."""

    phase: str
    mode: str
    stats: dict[str, float]
    top_ms: np.ndarray
    top_ids: np.ndarray


@dataclass(frozen=True)
class PhaseBoxes:
    """What `draw_phase_boxes` draws, computed from a frame of every request's phases
    (`phase_box_parts`): kept apart from the figure so a page can keep it per snapshot."""

    order: list[str]  # phases, in `phase_order`
    modes: list[str]
    parts: list[BoxPart]
    top: int


def phase_box_parts(frame: Any, value: str = "ms", top: int = 10) -> PhaseBoxes:
    """Each (phase, mode)'s box statistics and its ``top`` largest values, from a frame
    with columns phase, mode, `value`, request_id, trace_id: the work behind
    `draw_phase_boxes` (0.6 s over the 3 million rows of 200,000 requests)."""
    if frame is None or len(frame) == 0:
        return PhaseBoxes([], [], [], top)
    order = phase_order(frame["phase"].unique())
    modes = mode_order(frame["mode"].unique())
    groups = dict(iter(frame.groupby(["phase", "mode"], sort=False)))
    parts = []
    for phase in order:
        for mode in modes:
            part = groups.get((phase, mode))
            if part is None:
                continue
            stats = box_stats(part[value].to_numpy(dtype="float64"))
            if not stats["n"]:
                continue
            worst = part.nlargest(top, value)
            ids = worst[["request_id", "trace_id"]].to_numpy()
            parts.append(BoxPart(phase, mode, stats, worst[value].to_numpy(), ids))
    return PhaseBoxes(order, modes, parts, top)


def draw_phase_boxes(boxes: PhaseBoxes, columns: int = 4) -> go.Figure:
    """Distribution of each phase's duration per mode, from `phase_box_parts`: one small
    box plot per phase (own y scale, since prefill dwarfs the rest), and each box's
    largest values as points that carry their request (click one to open its timeline).

    Each box travels as its statistics (`box_stats`), not its values: at 200,000
    requests a page of boxes was 3.4 million values that the browser sorted to draw
    them (11 s in Chromium, against a 3 s target). The whiskers reach the smallest and
    largest value."""
    if not boxes.parts:
        return _empty("no phases")
    order, modes = boxes.order, boxes.modes
    rows = -(-len(order) // columns)
    fig = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=order,
        horizontal_spacing=0.05,
        vertical_spacing=0.3 / rows,
    )
    first = {p.mode: p.phase for p in reversed(boxes.parts)}  # a legend entry per mode
    for p in boxes.parts:
        i = order.index(p.phase)
        cell = {"row": i // columns + 1, "col": i % columns + 1}
        color = MODE_COLORS.get(p.mode, "#7f7f7f")
        fig.add_trace(
            go.Box(
                x=[p.mode],
                **{k: [v] for k, v in p.stats.items() if k != "n"},
                name=p.mode,
                legendgroup=p.mode,
                showlegend=first[p.mode] == p.phase,
                marker_color=color,
                meta={"kind": "phase_box", "mode": p.mode, "phase": p.phase, "n": p.stats["n"]},
            ),
            **cell,
        )
        fig.add_trace(
            go.Scatter(
                x=[p.mode] * len(p.top_ms),
                y=p.top_ms,
                mode="markers",
                name=f"{p.mode} slowest",
                legendgroup=p.mode,
                showlegend=False,
                marker={"color": color, "size": 6, "symbol": "circle-open"},
                customdata=p.top_ids,
                hovertemplate="%{customdata[0]}: %{y:.2f} ms<extra>" + p.phase + "</extra>",
                meta={"kind": "phase_top", "mode": p.mode, "phase": p.phase},
            ),
            **cell,
        )
    fig.update_xaxes(showticklabels=False, type="category", categoryorder="array",
                     categoryarray=modes)  # fmt: skip
    fig.update_yaxes(rangemode="tozero", tickfont={"size": 10})
    fig.update_annotations(font_size=12)
    fig.update_layout(
        height=max(260, 210 * rows),
        margin={"l": 10, "r": 10, "t": 70, "b": 10},
        legend={"orientation": "h", "yref": "container", "y": 1, "yanchor": "top", "x": 0},
        clickmode="event+select",
        meta={"kind": "phase_boxes", "top": boxes.top},
    )
    return fig


def window_ttft(table: Any, cap: int = MAX_POINTS, tz: tzinfo = UTC) -> go.Figure:
    """TTFT of each request in a time window against its arrival time in `tz` (Live
    page), at most `cap` points per mode (`drawn`). ``table``: the columns of
    `LIVE_COLUMNS`. Points carry only the request id, for the hover (nothing on this
    chart opens a timeline), as a list: Plotly deep-copies an object array element by
    element."""
    fig = go.Figure()
    if table is None or len(table) == 0:
        return _empty("no requests in this window")
    for mode in mode_order(table["mode"].unique()):
        every = table[(table["mode"] == mode) & table["ttft_ms"].notna()]
        rows = drawn(every, "ttft_ms", cap)
        fig.add_trace(
            go.Scattergl(
                x=zones.wall_times(rows["start_unix_ms"], tz),
                y=rows["ttft_ms"].to_numpy(),
                mode="markers",
                name=str(mode),
                marker={"color": MODE_COLORS.get(str(mode), "#7f7f7f"), "size": 6},
                customdata=rows["request_id"].tolist(),
                hovertemplate="%{customdata}: TTFT %{y:.1f} ms<extra>%{x}</extra>",
                meta={"kind": "window_ttft", "mode": str(mode), "of": len(every)},
            )
        )
    fig.update_layout(
        height=320,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis_title=f"arrival ({zones.zone_name(tz)})",
        yaxis_title="TTFT (ms)",
    )
    return fig


# --------------------------------------------------------------------------- accounts

TPOT_COLORS = {
    "model forward": "#393b79",
    "batch sharing": "#9467bd",
    "connector": "#e377c2",
    "scheduling and other": "#c7c7c7",
}


def ttft_account(group: Any, a: str = "push", b: str = "pull") -> go.Figure:
    """Where the TTFT difference goes in one comparison group: one bar per phase of its
    `TtftAccount` (mean ms, a - b: push - pull), largest first; the bars add up to the
    group's mean TTFT difference. Hover: both modes' means and p50s, the phase's meaning."""
    acc = getattr(group, "account", None)
    if acc is None:
        return _empty(f"needs both {a} and {b} requests")
    rows = [r for r in acc.rows if abs(r.mean_delta_ms) >= 0.005]
    rows.sort(key=lambda r: (abs(r.mean_delta_ms), r.phase))  # largest at the top
    if not rows:
        return _empty(f"{a} and {b} spend the same time in every phase")
    fig = go.Figure(
        go.Bar(
            orientation="h",
            y=[r.phase for r in rows],
            x=[r.mean_delta_ms for r in rows],
            marker_color=[phase_color(r.phase) for r in rows],
            text=[f"{r.mean_delta_ms:+,.1f}" for r in rows],
            textposition="outside",
            customdata=[
                [r.a_mean_ms, r.b_mean_ms, _num(r.a_p50_ms, "{:,.2f}"),
                 _num(r.b_p50_ms, "{:,.2f}"), phase_description(r.phase)]
                for r in rows
            ],
            hovertemplate=(
                f"<b>%{{y}}</b>: %{{x:+.2f}} ms ({a} − {b}, mean)"
                f"<br>{a} %{{customdata[0]:.2f}} ms, {b} %{{customdata[1]:.2f}} ms (mean)"
                f"<br>p50: {a} %{{customdata[2]}} ms, {b} %{{customdata[3]}} ms"
                "<br><i>%{customdata[4]}</i><extra></extra>"
            ),
            meta={"kind": "ttft_account", "bucket": group.bucket, "load": group.load},
        )
    )  # fmt: skip
    fig.update_layout(
        height=120 + 26 * len(rows),
        margin={"l": 10, "r": 40, "t": 30, "b": 10},
        xaxis_title=f"mean ms on the critical path, {a} − {b} "
        f"(total {acc.ttft_mean_delta_ms:+,.1f} ms)",
        meta={"kind": "ttft_account", "total_ms": acc.ttft_mean_delta_ms},
    )
    return fig


def tpot_account(acc: Any, a: str = "push", b: str = "pull", load: str = ALL) -> go.Figure:
    """Where the TPOT difference goes: one bar per mechanism of a `tpot.TpotAccount`
    (mean ms per output token, a - b); the bars add up to the mean TPOT difference of
    the requests with a breakdown."""
    if acc is None:
        return _empty(f"needs {a} and {b} requests with D's engine steps")
    rows = sorted(acc.rows, key=lambda r: (abs(r.mean_delta_ms), r.mechanism))
    fig = go.Figure(
        go.Bar(
            orientation="h",
            y=[r.mechanism for r in rows],
            x=[r.mean_delta_ms for r in rows],
            marker_color=[TPOT_COLORS.get(r.mechanism, "#7f7f7f") for r in rows],
            text=[f"{r.mean_delta_ms:+,.2f}" for r in rows],
            textposition="outside",
            customdata=[
                [r.a_mean_ms, r.b_mean_ms, _num(r.a_p50_ms, "{:,.2f}"),
                 _num(r.b_p50_ms, "{:,.2f}")]
                for r in rows
            ],
            hovertemplate=(
                f"<b>%{{y}}</b>: %{{x:+.3f}} ms per token ({a} − {b}, mean)"
                f"<br>{a} %{{customdata[0]:.3f}} ms, {b} %{{customdata[1]:.3f}} ms (mean)"
                f"<br>p50: {a} %{{customdata[2]}} ms, {b} %{{customdata[3]}} ms<extra></extra>"
            ),
            meta={"kind": "tpot_account", "load": load},
        )
    )  # fmt: skip
    fig.update_layout(
        height=120 + 30 * len(rows),
        margin={"l": 10, "r": 40, "t": 30, "b": 10},
        xaxis_title=f"mean ms per output token, {a} − {b} "
        f"(total {acc.tpot_mean_delta_ms:+,.2f} ms)",
        meta={"kind": "tpot_account", "total_ms": acc.tpot_mean_delta_ms, "load": load},
    )
    return fig
