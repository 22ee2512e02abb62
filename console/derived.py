"""What pages derive from a snapshot once for every session, and the warm-up that
derives it before anyone asks.

A page's first visit after a load used to pay for the run-wide frames and statistics
its snapshot had not computed yet (at 200,000 requests the Overview's first script run
took 7.5 s, of which the load 2.9 s; a later visit's script 0.6 s). `warm` computes them
where no visitor waits: the server's warm-up thread at start (`console.server`).

Figures are kept per snapshot too (`figure`): building the Overview's five (four since
the request scatter moved to the Requests page) took 0.25 s
of each visit at 200,000 requests, the Phases page's boxes 0.2 s. Streamlit only reads a
figure it is given (`st.plotly_chart` serialises it), so one figure serves every session;
pages must not change a figure they get from here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any

import numpy as np
import pandas as pd

from tracedpush.analysis.results import LazySteps
from tracedpush.console import charts, zones
from tracedpush.console.data import Snapshot

# the Phases page's measures: label -> the Snapshot frame it reads (the first is the default)
PHASE_MEASURES = {
    "time on the critical path": "phase_frame",
    "span durations": "span_frame",
}
DEFAULT_STAT = "p50"  # the Overview's statistic until a visitor picks another
# the Requests page's x axes (table column -> label) and default axes
REQUEST_AXES = {
    "prompt_tokens": "prompt tokens",
    charts.ARRIVAL: "arrival",  # in the visitor's time zone (`axis_label`)
    "load": "load (requests in flight)",
    "output_tokens": "output tokens",
}
DEFAULT_X, DEFAULT_Y = "prompt_tokens", "ttft_ms"
LARGEST_MAX = 100  # the most requests the Requests page lists by its measure
OUTLIERS_MAX = 50  # the most outliers of one phase the Phases page lists
# what every page's first visit reads of a snapshot (`warm`)
SHARED = (
    "table",
    "comparison",
    "failures",
    "failure_examples",
    "tpot_accounts",
    "contention",
    "export_health",
)


def figure(snap: Snapshot, key: Hashable, make: Callable[[], Any]) -> Any:
    """The Plotly figure ``make()`` builds from `snap`, once per snapshot and `key` (which
    must name everything the figure depends on besides the snapshot)."""
    return snap.memo(("figure", key), make)


def overview_figures(snap: Snapshot, stat: str) -> dict[str, Any]:
    """The Overview's figures by chart key, for statistic `stat`."""
    cmp = snap.comparison
    return {
        "by_load": figure(snap, ("by_load", stat), lambda: charts.latency_by_load(cmp, stat)),
        "by_prompt": figure(snap, ("by_prompt", stat), lambda: charts.latency_by_prompt(cmp, stat)),
        "critical_stack": figure(snap, "critical_stack", lambda: charts.critical_path_stack(cmp)),
        "ttft_delta": figure(snap, "ttft_delta", lambda: charts.ttft_delta(cmp)),
    }


def requests_figure(snap: Snapshot, x: str, y: str, log_y: bool = False, tz: tzinfo = UTC) -> Any:
    """The Requests page's scatter of `y` against `x` (table columns), `y` on a log axis
    if `log_y`, times in `tz`, once per snapshot."""
    return figure(
        snap,
        ("requests", x, y, log_y, zones.zone_name(tz) if x == charts.ARRIVAL else None),
        lambda: charts.requests_scatter(
            snap.table, x, y, axis_label(x, tz), request_measures(snap).get(y), log_y, tz
        ),
    )


def axis_label(x: str, tz: tzinfo = UTC) -> str:
    """The label of the Requests page's x axis `x`; a time says its zone."""
    label = REQUEST_AXES.get(x, x.replace("_", " "))
    return f"{label} ({zones.zone_name(tz)})" if x == charts.ARRIVAL else label


def request_measures(snap: Snapshot) -> dict[str, str]:
    """The Requests page's y axes: table column -> label (TTFT, TPOT, then each phase's
    time on the critical path, in pipeline order)."""
    table = snap.table
    phases = charts.phase_order(c.split(".", 1)[1] for c in table if c.startswith("critical_ms."))
    return {
        "ttft_ms": "TTFT ms",
        "tpot_ms": "TPOT ms",
        **{f"critical_ms.{p}": f"{p} ms on the critical path" for p in phases},
    }


def largest(snap: Snapshot, y: str) -> pd.DataFrame:
    """The `LARGEST_MAX` requests with the largest `y`, largest first, once per snapshot."""
    return snap.memo(("largest", y), lambda: snap.table.nlargest(LARGEST_MAX, y))


THREADS_MAX = 20  # the most threads the Overview lists


def thread_table(snap: Snapshot) -> pd.DataFrame | None:
    """The busiest engine threads over the run: CPU, the wait for a CPU (None where the
    traces do not say) and that wait's share of the time each was runnable; None
    without thread samples."""

    def make() -> pd.DataFrame | None:
        found = snap.contention
        if not found:
            return None
        rows = [
            {
                "engine": t.engine_id,
                "process": t.process,
                "pid": t.pid,
                "thread": t.name,
                "role": t.role,
                "CPU s": round(t.cpu_ms / 1000.0, 2),
                "waiting s": round(t.cpu_wait_ms / 1000.0, 2) if t.wait_known else None,
                "waiting share": round(t.wait_share(), 3) if t.wait_known else None,
            }
            for t in found.threads[:THREADS_MAX]
            if t.cpu_ms > 0
        ]
        return pd.DataFrame(rows) if rows else None

    return snap.memo("thread_table", make)


def phase_boxes(snap: Snapshot, measure: str, modes: list[str]) -> Any:
    """The Phases page's box statistics of `measure` over `modes` (`charts.phase_box_parts`),
    once per snapshot (`Snapshot.memo`)."""

    def make() -> Any:
        return charts.phase_box_parts(_of_modes(snap, measure, modes))

    return snap.memo(("phase_boxes", measure, tuple(modes)), make)


def phase_boxes_figure(snap: Snapshot, measure: str, modes: list[str]) -> Any:
    """`charts.draw_phase_boxes` of `phase_boxes`, once per snapshot."""
    return figure(
        snap,
        ("phase_boxes", measure, tuple(modes)),
        lambda: charts.draw_phase_boxes(phase_boxes(snap, measure, modes)),
    )


@dataclass(frozen=True)
class Outliers:
    """The largest values of each phase in a measure's frame (the Phases page's list)."""

    phases: list[str]  # in `charts.phase_order`
    biggest: str  # the phase of the largest value (the first, on a tie)
    top: dict[str, pd.DataFrame]  # phase -> its `OUTLIERS_MAX` largest rows, largest first

    def worst(self, phase: str, n: int) -> pd.DataFrame:
        """`phase`'s `n` largest rows: ``frame[frame.phase == phase].nlargest(n, "ms")``."""
        return self.top[phase].head(n)


def outliers(snap: Snapshot, measure: str, modes: list[str]) -> Outliers:
    """`Outliers` of `measure` over `modes`, once per snapshot: each visit used to filter
    the 3-million-row frame twice more (0.1-0.26 s at 200,000 requests)."""

    def make() -> Outliers:
        frame = _of_modes(snap, measure, modes)
        # one phase's values at a time, by position: grouping the frame copied every row
        # (1 s at 200,000 requests); the same rows, as the frame's `nlargest` orders them
        codes, phases = pd.factorize(frame["phase"])
        ms = frame["ms"].to_numpy(dtype="float64")
        if not np.isfinite(ms).any():  # no box either: the page says so and stops
            return Outliers(phases=[], biggest="", top={})
        chosen = []  # each phase's rows, by position in the frame
        for code in range(len(phases)):
            at = np.flatnonzero(codes == code)
            chosen.append(at[pd.Series(ms[at]).nlargest(OUTLIERS_MAX).index.to_numpy()])
        rows = frame.iloc[np.concatenate(chosen)]  # one take: each costs 10 ms on 3M rows
        ends = np.cumsum([len(c) for c in chosen])
        return Outliers(
            phases=charts.phase_order(list(phases)),
            biggest=str(phases[codes[np.nanargmax(ms)]]),
            top={
                str(phase): rows.iloc[end - len(c) : end]
                for phase, c, end in zip(phases, chosen, ends, strict=True)
            },
        )

    return snap.memo(("outliers", measure, tuple(modes)), make)


def _of_modes(snap: Snapshot, measure: str, modes: list[str]) -> pd.DataFrame:
    frame = getattr(snap, PHASE_MEASURES[measure])
    keep = frame["mode"].isin(modes)
    return frame if keep.all() else frame[keep]  # no copy of every row for every mode


def warm(snap: Snapshot) -> None:
    """Compute what every page's first visit reads of `snap` (its `SHARED` properties, the
    Overview's figures, the Requests page's default scatter, the Phases page's default
    boxes and outliers, and the engine steps the Timeline draws, which the analysis
    index reads back on first use: 0.7 s at 200,000 requests), so that visit only sends
    them."""
    for name in SHARED:
        getattr(snap, name)
    if snap.run.requests:
        steps = snap.engine_steps
        if isinstance(steps, LazySteps):  # the Timeline draws them: read back here, once
            steps.get()
        measure = next(iter(PHASE_MEASURES))
        overview_figures(snap, DEFAULT_STAT)
        requests_figure(snap, DEFAULT_X, DEFAULT_Y)
        if phase_boxes(snap, measure, snap.modes).parts:  # else the page stops before these
            phase_boxes_figure(snap, measure, snap.modes)
            outliers(snap, measure, snap.modes)
