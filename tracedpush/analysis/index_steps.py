"""The run's engine steps inside the analysis index: parsed once per process span and
kept between updates, and what TPOT breakdowns need of them.

A Live refresh of a long run gets new ``engine.steps`` spans every time. Parsing every
process span again, and splitting every request's TPOT over the steps again, cost the
refresh the whole run. Here:

* `StepDelta` holds the process spans that arrived since the steps were made: an update
  parses only those and joins them into the kept steps (`EngineSteps.extended`);
  where the offsets moved, the kept steps are placed again first. `StepCache` keeps
  each process trace's parsed parts for when everything must be joined again (no steps
  kept, a process trace replaced, an engine joined record by record);
* `TpotSteps.changed` compares D's step arrays before and after: where they differ (new
  steps, a scheduler record joined to a worker one), in time, and whether an engine's
  solo forward cost moved. Only requests whose decode window meets a changed stretch
  need their breakdown again; a moved solo cost changes every breakdown on its engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from tracedpush.analysis import steps_columns as cols
from tracedpush.analysis import tpot
from tracedpush.analysis.index_store import TraceFacts
from tracedpush.analysis.model import Span
from tracedpush.analysis.steps import EngineSteps, StepParts

Window = tuple[int, int]  # [start, end] ns on the reference clock


class TpotRequest:
    """What `tpot.attach_facts` reads and sets of a request, from its kept row."""

    __slots__ = ("output_tokens", "tpot_breakdown_ms", "tpot_ms", "trace_id", "ttft_ms")

    def __init__(self, trace_id: str, row: tuple) -> None:
        self.trace_id = trace_id
        self.output_tokens, self.ttft_ms, self.tpot_ms = row[3], row[4], row[5]
        self.tpot_breakdown_ms: dict[str, float] | None = None


class StepCache:
    """Each process trace's parsed steps and samples, kept between updates (made for a
    trace the first time every step must be joined again after opening). Spans that
    arrive for a parsed trace wait until then: a refresh that extends the kept steps
    (`StepDelta`) has parsed them already, and most refreshes do."""

    def __init__(self) -> None:
        self._table = StepParts()  # every trace's parts number origins alike
        self.parts: dict[str, StepParts] = {}
        self._waiting: dict[str, list[Span]] = {}

    def add(self, tid: str, spans: Iterable[Span]) -> None:
        """New process spans of a trace already parsed (else it is parsed when needed)."""
        if tid in self.parts:
            self._waiting.setdefault(tid, []).extend(spans)

    def drop(self, tid: str) -> None:
        self.parts.pop(tid, None)
        self._waiting.pop(tid, None)

    def merged(self, tids: Sequence[str], load: Callable[[str], Iterable[Span]]) -> StepParts:
        """The parts of `tids`, in that order (`load` reads a trace not parsed yet)."""
        out = StepParts(self._table)
        for tid in tids:
            parts = self.parts.get(tid)
            if parts is None:
                parts = self.parts[tid] = StepParts(self._table).extend(load(tid))
            parts.extend(self._waiting.pop(tid, ()))
            out.merge(parts, lambda r: r)
        return out


class StepDelta:
    """The process spans that arrived since the run's steps were last made (at process
    version `base`): what `EngineSteps.extended` joins into them, so a Live refresh
    neither parses nor joins the rest again. Spoiled when a process trace the steps
    hold is replaced rather than grown (its old steps would have to go)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.spans: list[Span] | None = []

    def add(self, spans: Iterable[Span]) -> None:
        if self.spans is not None:
            self.spans.extend(spans)

    def spoil(self) -> None:
        self.spans = None

    def parts(self) -> StepParts:
        """The spans parsed (call only when not spoiled)."""
        assert self.spans is not None
        return StepParts().extend(self.spans)


class StepArrays:
    """One engine's steps as arrays, in `EngineSteps.steps` order (sorted by start)."""

    def __init__(self, c: cols.Columns) -> None:
        self.start = c[cols.START]  # views: the steps' columns are never changed
        self.end = c[cols.END]
        self.worker = cols.has_worker(c)
        conn = c[cols.CONNECTOR]
        self.conn_us = np.where(conn == cols.NONE, 0, conn).astype(float)
        self.max_end = np.maximum.accumulate(self.end) if len(self.end) else self.end
        if not np.all(self.start[1:] >= self.start[:-1]):  # pragma: no cover
            raise ValueError("engine steps not sorted by start")  # `EngineSteps` sorts them


class TpotSteps:
    """What TPOT breakdowns need of a run's engine steps: D's steps as arrays, each
    engine's solo forward cost, the decode engines. Kept beside the steps, so the TPOT
    of a few new requests does not read every step back."""

    def __init__(self, store: EngineSteps) -> None:
        self.decode = [e for e, info in store.engines.items() if info.role == "decode"]
        self.solo = {eid: store.solo_forward_us(eid) for eid in store.columns}
        self.arrays = {
            eid: StepArrays(c) if store.has_worker_steps(eid) else None
            for eid, c in store.columns.items()
        }


def split_tpot(
    requests: Iterable[tuple[str, tuple, TraceFacts]],
    off: Sequence[int],
    steps: Callable[[], TpotSteps],
) -> dict[str, dict[str, float] | None]:
    """The TPOT breakdown of each (trace id, kept row, facts), None where it has none:
    its decode window from the row and from its root's start on the proxy clock (ns
    offsets `off` per resource), split over D's steps. `steps` is asked only when a
    request has a proxy root. The index's updates and its build workers both use it."""
    out: dict[str, dict[str, float] | None] = {}
    todo: list[TpotRequest] = []
    where: dict[str, tuple[int, str | None]] = {}
    for tid, row, f in requests:
        out[tid] = None
        if f.root_iv is not None and f.root_res is not None:
            where[tid] = (f.root_iv[0] - off[f.root_res], f.engine)
            todo.append(TpotRequest(tid, row))
    if todo:
        attach_tpot(todo, where, steps())
    for q in todo:
        out[q.trace_id] = q.tpot_breakdown_ms
    return out


def attach_tpot(
    requests: Sequence[TpotRequest], facts: dict[str, tuple[int, str | None]], steps: TpotSteps
) -> None:
    """`tpot.attach_facts`, each window split over D's steps as arrays (`breakdown`):
    the same breakdowns, without walking a long decode's steps one by one in Python
    (0.7 ms per synthetic request: 7 s of CPU at 20,000 requests)."""
    arrays = steps.arrays
    if not arrays:
        return
    for r, eid, t0, t1 in tpot.windows(requests, facts, arrays, steps.decode):
        arr = arrays[eid]
        if arr is None:  # no worker records: no breakdown
            continue
        tokens = r.output_tokens - 1
        r.tpot_breakdown_ms = breakdown(arr, t0, t1, r.tpot_ms, tokens, steps.solo[eid])


def breakdown(
    arr: StepArrays, t0: int, t1: int, tpot_ms: float, tokens: int, solo_us: float | None
) -> dict[str, float]:
    """`tpot.breakdown` over arrays, to the last bit: its loop keeps a cursor (the end of
    the last step counted), which is the running maximum of the clipped ends of the
    earlier steps that end after they start; its sums are sequential (`accumulate`)."""
    solo_ns = None if solo_us is None else solo_us * 1000.0
    fwd = extra = conn = 0.0
    if t1 > t0:
        i = int(np.searchsorted(arr.max_end, t0, side="right"))
        j = int(np.searchsorted(arr.start, t1, side="right"))
        if j > i:
            keep = arr.worker[i:j] & (arr.end[i:j] > t0)
            start, end = arr.start[i:j][keep], arr.end[i:j][keep]
            conn_us = arr.conn_us[i:j][keep]
            b = np.minimum(end, t1)
            counted = np.where(b > start, b, t0)
            cursor = np.empty_like(b)
            if len(b):
                cursor[0] = t0
                cursor[1:] = np.maximum(np.maximum.accumulate(counted)[:-1], t0)
            a = np.maximum(start, cursor)
            ok = b > a
            if ok.any():
                dur = (end - start)[ok]
                f = (b - a)[ok] / dur
                c_ns = np.minimum(conn_us[ok] * 1000.0, dur.astype(float))
                fw_ns = dur - c_ns
                solo = fw_ns if solo_ns is None else np.minimum(fw_ns, solo_ns)
                fwd = 0.0 + float(np.add.accumulate(f * solo)[-1])
                extra = 0.0 + float(np.add.accumulate(f * (fw_ns - solo))[-1])
                conn = 0.0 + float(np.add.accumulate(f * c_ns)[-1])
    n = max(tokens, 1)
    out = {
        tpot.MODEL_FORWARD: fwd / n / 1e6,
        tpot.BATCH_SHARING: extra / n / 1e6,
        tpot.CONNECTOR: conn / n / 1e6,
    }
    used = sum(out.values())
    if used > tpot_ms > 0:  # as `tpot.breakdown`: scale, keep the sum
        k = tpot_ms / used
        out = {key: v * k for key, v in out.items()}
        used = tpot_ms
    out[tpot.SCHEDULING] = max(tpot_ms - used, 0.0)
    return out


def changed_windows(old: TpotSteps | None, new: TpotSteps) -> list[Window] | None:
    """Where TPOT breakdowns may differ between two versions of the run's steps: time
    windows on the reference clock, or None for "anywhere" (no old steps, other engines,
    or an engine's solo forward cost moved: it scales every breakdown on that engine).

    A request's breakdown reads the steps that end after its window starts and start
    before it ends, so only requests whose window meets one of these can change."""
    if old is None or old.decode != new.decode or old.arrays.keys() != new.arrays.keys():
        return None
    out: list[Window] = []
    for eid, arr in new.arrays.items():
        was = old.arrays[eid]
        if (arr is None) != (was is None) or old.solo.get(eid) != new.solo.get(eid):
            return None
        if arr is None or was is None:
            continue
        got = _differing(was, arr)
        if got is not None:
            out.append(got)
    return out


def _differing(a: StepArrays, b: StepArrays) -> Window | None:
    """The time span of the steps that differ between `a` and `b` (each sorted by start):
    after their common head and before their common tail. None when they are equal."""
    n = min(len(a.start), len(b.start))

    def same(x: slice, y: slice) -> np.ndarray:
        return (
            (a.start[x] == b.start[y])
            & (a.end[x] == b.end[y])
            & (a.worker[x] == b.worker[y])
            & (a.conn_us[x] == b.conn_us[y])
        )

    head = same(slice(0, n), slice(0, n))
    p = int(np.argmin(head)) if not head.all() else n
    if p == n and len(a.start) == len(b.start):
        return None
    m = n - p  # the tail may not reach into the head
    tail = same(slice(len(a.start) - m, None), slice(len(b.start) - m, None))[::-1]
    q = int(np.argmin(tail)) if not tail.all() else m
    lo, hi = [], []
    for arr in (a, b):
        part = slice(p, len(arr.start) - q)
        if part.stop > part.start:
            lo.append(int(arr.start[part].min()))
            hi.append(int(arr.end[part].max()))
    return (min(lo), max(hi)) if lo else None
