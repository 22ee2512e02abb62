"""What pages derive from a snapshot once for every session, and the warm-up that
derives it before anyone asks.

A page's first visit after a load used to pay for the run-wide frames and statistics
its snapshot had not computed yet (at 200,000 requests the Overview's first script run
took 7.5 s, of which the load 2.9 s; a later visit's script 0.6 s). `warm` computes them
where no visitor waits: the server's warm-up thread at start (`console.server`).
"""

from __future__ import annotations

from typing import Any

from tracedpush.console import charts
from tracedpush.console.data import Snapshot

# the Phases page's measures: label -> the Snapshot frame it reads (the first is the default)
PHASE_MEASURES = {
    "time on the critical path": "phase_frame",
    "span durations": "span_frame",
}
# what every page's first visit reads of a snapshot (`warm`)
SHARED = ("table", "comparison", "failures", "failure_examples", "tpot_accounts", "contention")


def phase_boxes(snap: Snapshot, measure: str, modes: list[str]) -> Any:
    """The Phases page's box statistics of `measure` over `modes` (`charts.phase_box_parts`),
    once per snapshot (`Snapshot.memo`)."""

    def make() -> Any:
        frame = getattr(snap, PHASE_MEASURES[measure])
        return charts.phase_box_parts(frame[frame["mode"].isin(modes)])

    return snap.memo(("phase_boxes", measure, tuple(modes)), make)


def warm(snap: Snapshot) -> None:
    """Compute what every page's first visit reads of `snap` (its `SHARED` properties and
    the Phases page's default boxes), so that visit only draws."""
    for name in SHARED:
        getattr(snap, name)
    if snap.run.requests:
        phase_boxes(snap, next(iter(PHASE_MEASURES)), snap.modes)
