"""Sweep: the seed article's two figures from a `tracedpush bench sweep`, TTFT and TPOT
against QPS per input length, push solid and pull dashed; pick a cell to see why push
and pull differ there (its results joined with the traces, `analysis.bench.join`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from tracedpush.analysis.bench_results import BenchFormatError
from tracedpush.console import bench, sweep_charts, ui
from tracedpush.console.source import Source, bench_traces

log = logging.getLogger(__name__)
LEN_KEY, QPS_KEY, STAT_KEY = "sweep_input_len", "sweep_qps", "sweep_stat"
HOW_TO = (
    "Run a sweep, `tracedpush bench sweep --profile quick --results runs/sweep` (QPS x "
    "input length, push and pull; `--qps 1,2,4 --input-len 1024,4096` for your own grid), "
    "then open it: `tracedpush console --bench runs/sweep`. `--bench` also takes one "
    "`vllm bench serve --save-result --save-detailed` file, or type a path above."
)


def _open_typed() -> None:
    """Open typed results; a sweep's own traces (``<dir>/traces``) become the trace
    source too, so the cells are explained by the requests they sent."""
    typed = (st.session_state.get("sweep_path") or "").strip()
    if not typed:
        return
    path = str(Path(typed).expanduser().resolve())
    st.session_state[ui.BENCH_KEY] = path
    st.session_state.pop(LEN_KEY, None)
    st.session_state.pop(QPS_KEY, None)
    beside = bench_traces(path)
    if beside is not None:
        st.session_state[ui.SOURCE_KEY] = Source.traces([beside])
        st.session_state.pop(ui.REQUEST_KEY, None)


def _pick_clicked(key: str) -> None:
    """A click on a point of either figure picks its cell (customdata [len, qps, ...])."""
    for point in ui.selected_points(st.session_state.get(key)):
        custom = point.get("customdata") if isinstance(point, Mapping) else None
        if isinstance(custom, list | tuple) and len(custom) >= 2:
            st.session_state[LEN_KEY] = int(custom[0])
            st.session_state[QPS_KEY] = float(custom[1])
            return


def _load(path: str) -> bench.BenchLoad:
    """The results, or a calm message and stop."""
    try:
        return bench.loaded(path)
    except FileNotFoundError:
        st.info(f"`{path}` does not exist (yet). " + HOW_TO)
    except BenchFormatError as err:
        st.warning(f"Not a benchmark result: {err}")
    except Exception as err:  # a bad file must not become a traceback
        log.exception("reading %s failed", path)
        st.warning(f"Cannot read benchmark results from `{path}`: {err}")
    st.stop()


def _client_table(cells: pd.DataFrame, modes: list[str]) -> pd.DataFrame:
    """TTFT/TPOT p50/p90/p99/mean per mode of one cell (ms), and push − pull."""
    by_mode = {m: cells[cells["mode"] == m].iloc[0] for m in modes}
    rows = []
    for metric in bench.METRICS:
        for stat in bench.STATS:
            col = f"{metric}_{stat}"
            row: dict[str, Any] = {"client": f"{sweep_charts.METRIC_NAMES[metric]} {stat}"}
            row.update({m: by_mode[m][col] for m in modes})
            if {"push", "pull"} <= set(modes):
                a, b = by_mode["push"][col], by_mode["pull"][col]
                row["push − pull"] = None if pd.isna(a) or pd.isna(b) else a - b
            rows.append(row)
    return pd.DataFrame(rows).set_index("client")


def _phase_table(account: dict[str, Any]) -> pd.DataFrame:
    """The cell's TTFT account as rows: each phase's mean (and p50) ms per mode, push − pull."""
    rows = [
        {
            "phase": r["phase"],
            "push mean ms": r.get("a_mean_ms"),
            "pull mean ms": r.get("b_mean_ms"),
            "push − pull ms": r.get("mean_delta_ms"),
            "push p50 ms": r.get("a_p50_ms"),
            "pull p50 ms": r.get("b_p50_ms"),
        }
        for r in account.get("phases") or ()
    ]
    return pd.DataFrame(rows)


def _agreement(cell: dict[str, Any]) -> pd.DataFrame:
    """Per mode: how many requests joined their traces, and client vs span TTFT."""
    rows = []
    for mode, m in (cell.get("modes") or {}).items():
        ag = m.get("agreement") or {}
        frac = m.get("joined_fraction")
        rows.append(
            {
                "mode": mode,
                "sent": m.get("sent"),
                "joined to a trace": m.get("joined"),
                "joined %": None if frac is None else round(100 * frac, 1),
                "client TTFT p50 ms": (m.get("client_ttft_ms") or {}).get("p50"),
                "span TTFT p50 ms": (m.get("span_ttft_ms") or {}).get("p50"),
                "median (client − span) / client %": ag.get("median_gap_pct"),
                "median |client − span| ms": ag.get("median_abs_gap_ms"),
                "median send ms": ag.get("median_send_ms"),
                "median receive ms": ag.get("median_receive_ms"),
                "outside the client's window": ag.get("outside") if ag.get("legs_n") else None,
            }
        )
    return pd.DataFrame(rows)


def _typical_links(cell: dict[str, Any]) -> None:
    """A link per mode to its typical request's timeline (the one nearest the median
    client TTFT); the timeline puts the other mode's nearest request beside it."""
    modes = cell.get("modes") or {}
    cols = st.columns(max(len(modes), 1))
    for col, (mode, m) in zip(cols, modes.items(), strict=False):
        typ = m.get("typical")
        if not typ:
            col.caption(f"{mode}: no request joined to a trace")
            continue
        col.page_link(
            ui.TIMELINE_PAGE,
            label=f"{mode}: {typ['request_id']}",
            icon=":material/view_timeline:",
            help=f"client TTFT {_plain(typ.get('client_ttft_ms'))}, span TTFT "
            f"{_plain(typ.get('span_ttft_ms'))}; trace {typ['trace_id']}",
            query_params={ui.REQUEST_KEY: typ["trace_id"]},
        )


def why(got: bench.BenchLoad, input_len: int, qps: float) -> None:
    """The traces' side of one cell: phase account, sentence, agreement, typical requests."""
    snap, problem = ui.snapshot_or_message()
    if snap is None:
        st.info(
            "Why push and pull differ here needs the sweep's traces (`<results>/traces`, "
            "or `--traces DIR`): " + (problem or "")
        )
        return
    try:
        doc = bench.joined(got, snap)
    except Exception as err:  # the figures above stay
        log.exception("joining %s with %s failed", got.path, snap.source.label)
        st.warning(f"Cannot join the results with the traces in {snap.source.label}: {err}")
        return
    cell = bench.cell_of(doc, input_len, qps)
    if cell is None:
        st.info(f"The join has no cell for {input_len:,} tokens at {qps:g} QPS.")
        return
    st.markdown(cell.get("explanation") or "")
    if cell.get("tpot_explanation"):
        st.markdown(cell["tpot_explanation"])
    account = cell.get("ttft_account")
    if account:
        st.plotly_chart(sweep_charts.phase_delta_figure(account), key="sweep_phase_delta")
        st.caption(
            "Mean ms each phase spent on the critical path, push − pull, over this cell's "
            "requests joined to their traces; the bars add up to the mean span-TTFT "
            f"difference ({account.get('ttft_mean_delta_ms'):+,.1f} ms; the client saw "
            f"{_signed(cell.get('client_ttft_mean_delta_ms'))})."
        )
        st.markdown("**Phase by phase** (ms on the critical path)")
        table = _phase_table(account)
        st.dataframe(
            table,
            hide_index=True,
            column_config={
                c: st.column_config.NumberColumn(format="%.2f") for c in table.columns[1:]
            },
            height=min(35 * (len(table) + 1) + 3, 700),  # every phase without scrolling
            key="sweep_phases",
        )
    st.markdown("**Typical requests** (nearest the median client TTFT): open the timeline")
    _typical_links(cell)
    st.markdown("**Client vs traces**")
    st.dataframe(_agreement(cell), hide_index=True)
    st.caption(
        "The client's TTFT includes the network both ways, its own HTTP stack and any wait "
        "for a CPU, so it is a little above the proxy's (receipt -> first token sent). "
        "When the client ran on the proxy's host, the gap is measured in two parts: send "
        "(client sent -> proxy received) and receive (proxy sent the first token -> client "
        "had it); a request outside the client's window is joined to the wrong trace. "
        "Requests not joined to a trace are in the client's numbers only."
    )
    for note in doc.get("notes") or ():
        st.caption(f"Join: {note}")


def _signed(x: float | None) -> str:
    return "–" if x is None else f"{x:+,.1f} ms"


def _plain(x: float | None) -> str:
    return "–" if x is None else f"{x:,.1f} ms"


st.title("Sweep")
path = ui.current_bench()
with st.expander("Open results", expanded=path is None):
    st.text_input(
        "Sweep directory or result file (a sweep's `traces/` become the trace source)",
        key="sweep_path",
        placeholder="runs/sweep",
        on_change=_open_typed,
    )
if path is None:
    st.info("No benchmark results. " + HOW_TO)
    st.stop()

got = _load(path)
st.caption(f"Results: `{path}`")
if got.skipped:
    st.warning(
        f"Skipped {len(got.skipped)} file(s) that are not `vllm bench serve --save-detailed` "
        "results; the rest is drawn:\n" + "\n".join(f"- {msg}" for msg in got.skipped)
    )
if got.notes:
    st.warning(
        f"{len(got.notes)} result file(s) name no sweep cell and are not drawn:\n"
        + "\n".join(f"- {msg}" for msg in got.notes)
    )
cells = got.cells
if cells.empty:
    st.info(f"No sweep cells in `{path}` yet. " + HOW_TO)
    st.stop()

stat = (
    st.segmented_control(
        "Statistic",
        bench.STATS,
        default="p50",
        format_func=lambda s: sweep_charts.STAT_NAMES[s],
        key=STAT_KEY,
    )
    or "p50"
)
left, right = st.columns(2)
for col, metric in ((left, "ttft"), (right, "tpot")):
    with col:
        st.subheader(f"{sweep_charts.METRIC_NAMES[metric]} against QPS")
        key = f"sweep_{metric}"
        st.plotly_chart(
            sweep_charts.sweep_figure(cells, metric, stat),
            key=key,
            on_select=lambda key=key: _pick_clicked(key),
            selection_mode="points",
        )
st.caption(
    f"The client's {sweep_charts.STAT_NAMES[stat]} over each cell's successful requests "
    "(as `vllm bench serve` reports it); one colour per input length, push solid, pull "
    "dashed. Click a point to pick its cell."
)

st.subheader("One cell")
lengths = sorted(int(n) for n in cells["input_len"].unique())
c1, c2 = st.columns(2)
if st.session_state.get(LEN_KEY) not in lengths:
    st.session_state[LEN_KEY] = lengths[-1]
input_len = c1.selectbox(
    "Input length", lengths, format_func=lambda n: f"{n:,} tokens", key=LEN_KEY
)
rates = sorted(float(q) for q in cells.loc[cells["input_len"] == input_len, "qps"].unique())
if st.session_state.get(QPS_KEY) not in rates:
    st.session_state[QPS_KEY] = rates[-1]
qps = c2.selectbox("QPS", rates, format_func=lambda q: f"{q:g}", key=QPS_KEY)
here = cells[(cells["input_len"] == input_len) & (cells["qps"] == qps)]
modes = here["mode"].tolist()
st.markdown(f"**{input_len:,}-token prompts at {qps:g} QPS**: the client's numbers (ms)")
st.dataframe(
    _client_table(here, modes),
    column_config={
        c: st.column_config.NumberColumn(format="%.2f") for c in [*modes, "push − pull"]
    },
    key="sweep_client",
)
st.caption(
    "Requests ok / sent: "
    + "; ".join(
        f"{r.mode} {r.ok} / {r.requests} (`{r.file}`)" for r in here.itertuples(index=False)
    )
)
if not {"push", "pull"} <= set(modes):
    st.info(f"Only {', '.join(modes)} was measured in this cell: the comparison needs both.")
else:
    st.subheader("Why they differ here")
    why(got, input_len, qps)
