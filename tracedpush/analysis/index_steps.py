"""The run's engine steps inside the analysis index: parsed once per process span and
kept between updates, and what TPOT breakdowns need of them.

A Live refresh of a long run gets new ``engine.steps`` spans every time. Parsing every
process span again, and splitting every request's TPOT over the steps again, cost the
refresh the whole run. Here:

* `StepDelta` holds the process spans that arrived since the steps were made: an update
  parses only those and joins them into the kept steps (`EngineSteps.extended`);
  where an engine's offsets moved, its kept steps are placed again first. `StepCache` keeps
  each process trace's parsed parts for when everything must be joined again (no steps
  kept, a process trace replaced, new records older than the engine's recent ones);
* `changed_windows` compares D's step arrays before and after: where they differ (new
  steps, a scheduler record joined to a worker one, every step of an engine whose clock
  moved, steps whose epoch's solo forward cost moved), per engine and in time. Only
  requests whose decode window meets a changed stretch of their engine need their
  breakdown again (and those analysed again). The solo cost is per epoch of D's steps
  (`steps_columns.step_solo_us`): new steps move only the latest epochs' (one cost for
  the run moved with almost every refresh and split every breakdown again);
* `TpotSteps` made from the last ones (steps extended, their engine's offsets
  unchanged) computes only the steps after each engine's unchanged head: its arrays
  are the old head plus the new tail (the solo costs from the last unchanged step's
  epoch on), the engine's run-wide solo cost (its summary's) the median of a sorted
  array kept up to date, and `changed_windows` does not compare the head again. At
  200,000 requests (4.7 M steps) that was 0.4 s of every refresh, now 0.03 s; what
  stays proportional to the run is a copy of the steps' columns (`steps_columns.extend`)
  and the run's columns.
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
    """One engine's steps as arrays, in `EngineSteps.steps` order (sorted by start).
    `was`: the arrays of steps whose first `same` are these ones' first, unchanged (an
    extension, `EngineSteps.extended`): only the rest is computed, so a Live refresh
    costs what is new plus a copy, not a pass over every step of the run.

    ``solo_us``: each step's solo forward cost (`steps_columns.step_solo_us`). Extended,
    only the epochs from the last unchanged step's on are computed again (``same``
    becomes the first step of that epoch: `changed_windows` compares from there)."""

    def __init__(self, c: cols.Columns, was: StepArrays | None = None, same: int = 0) -> None:
        self.start = c[cols.START]  # views: the steps' columns are never changed
        self.end = c[cols.END]
        self.same, self.solo_us, self.first_solo = _epoch_solo(c, was, same)
        k = self.same  # 0 without `was`
        tail = c[:, k:]
        conn = tail[cols.CONNECTOR]
        conn_us = np.where(conn == cols.NONE, 0, conn).astype(float)
        max_end = np.maximum.accumulate(tail[cols.END]) if tail.shape[1] else tail[cols.END]
        if was is None or not k:
            self.worker, self.conn_us, self.max_end = cols.has_worker(tail), conn_us, max_end
        else:  # the running maximum goes on from the unchanged steps'
            self.worker = np.concatenate([was.worker[:k], cols.has_worker(tail)])
            self.conn_us = np.concatenate([was.conn_us[:k], conn_us])
            self.max_end = np.concatenate(
                [was.max_end[:k], np.maximum(max_end, was.max_end[k - 1])]
            )
        s = self.start[max(k - 1, 0) :]
        if not np.all(s[1:] >= s[:-1]):  # pragma: no cover
            raise ValueError("engine steps not sorted by start")  # `EngineSteps` sorts them


def _epoch_solo(c: cols.Columns, was: StepArrays | None, same: int) -> tuple[int, np.ndarray, int]:
    """(steps known unchanged, `steps_columns.step_solo_us` of every step, the first
    step of the first epoch with a solo cost of its own or -1). From `was` (whose first
    `same` steps are these'): the epochs before the last unchanged step's are kept; the
    rest computed again, carrying the cost before them. Everything again when no epoch
    before them has a cost of its own (theirs came from a later epoch, or from the
    engine's run-wide fallback)."""
    start = c[cols.START]
    if was is not None and same > 0:
        epoch = start[same - 1] // cols.SOLO_EPOCH_NS * cols.SOLO_EPOCH_NS
        k = int(np.searchsorted(start, epoch, side="left"))
        if 0 <= was.first_solo < k:
            tail, _ = cols.solo_by_epoch(c[:, k:], carry=float(was.solo_us[k - 1]))
            return k, np.concatenate([was.solo_us[:k], tail]), was.first_solo
    solo_us, first = cols.solo_by_epoch(c)
    return 0, solo_us, first


class _Solo:
    """One engine's `steps_columns.solo_candidates` per step and each kind sorted: its
    run-wide solo forward cost (the steps' summary) is then a median of a sorted array,
    kept up to date in place of a partition of every step (`resorted`)."""

    def __init__(self, c: cols.Columns, was: _Solo | None = None, same: int = 0) -> None:
        solo, busy = cols.solo_candidates(c[:, same:] if was is not None else c)
        if was is None:
            self.solo, self.busy = solo, busy
            self.solo_bag = np.sort(solo[~np.isnan(solo)])
            self.busy_bag = np.sort(busy[~np.isnan(busy)])
        else:
            self.solo_bag = cols.resorted(was.solo_bag, was.solo[same:], solo)
            self.busy_bag = cols.resorted(was.busy_bag, was.busy[same:], busy)
            self.solo = np.concatenate([was.solo[:same], solo])
            self.busy = np.concatenate([was.busy[:same], busy])

    def forward_us(self) -> float | None:
        """`steps_columns.solo_forward_us`, exactly."""
        if len(self.solo_bag):
            return float(cols.sorted_median(self.solo_bag))
        return float(self.busy_bag[0]) if len(self.busy_bag) else None


class TpotSteps:
    """What TPOT breakdowns need of a run's engine steps: D's steps as arrays (with each
    step's solo forward cost), each engine's run-wide one (its summary's), the decode
    engines. Kept beside the steps, so the TPOT of a few new requests does not read
    every step back.

    `was`: the TpotSteps of the steps `store` extended (`EngineSteps.grown_from`), if at
    hand: then each engine's unchanged first steps are not computed again, and
    `changed_windows` compares only what follows them."""

    def __init__(self, store: EngineSteps, was: TpotSteps | None = None) -> None:
        self.token = store.token
        grown = store.grown_from
        if was is None or grown is None or grown[0] != was.token:
            was, grown = None, None
        # per engine, how many first steps are `was`'s (its token: `base`)
        self.base, self.same = (None, {}) if grown is None else (grown[0], grown[1])
        self.decode = [e for e, info in store.engines.items() if info.role == "decode"]
        self.arrays: dict[str, StepArrays | None] = {}
        self.solo: dict[str, float | None] = {}
        self._solo: dict[str, _Solo] = {}  # made once a Live refresh extends the steps
        for eid, c in store.columns.items():
            k = self.same.get(eid, 0)
            old_arr = None if was is None else was.arrays.get(eid)
            old_solo = None if was is None else was._solo.get(eid)
            if was is not None and old_solo is None:  # the first refresh: sorted once
                old_solo = _Solo(c[:, :k])
            if old_solo is None:
                self.solo[eid] = store.solo_forward_us(eid)
            else:
                self._solo[eid] = got = _Solo(c, old_solo, k)
                self.solo[eid] = got.forward_us()
                store.know_solo(eid, self.solo[eid])  # its summary's too
            arr = StepArrays(c, old_arr, k)
            self.arrays[eid] = arr if arr.worker.any() else None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_solo": {}}  # made again on the next extension


def split_tpot(
    requests: Iterable[tuple[str, tuple, TraceFacts]],
    off: Sequence[int],
    steps: Callable[[], TpotSteps],
) -> dict[str, dict[str, float] | None]:
    """The TPOT breakdown of each (trace id, kept row, facts), None where it has none:
    its decode window from the row and from its root's start on the proxy clock (ns
    offsets `off` per resource), split over D's steps. `steps` is asked only when a
    request has a proxy root. The index's updates and its build workers both use it.

    `tpot.attach_facts` over arrays: the same requests, windows and breakdowns
    (`tpot.windows`' rules, each engine's windows split at once by `breakdowns`),
    without a Python object or a pass over steps per request. A split of every request
    (as when the solo cost was one per run and moved) took 2.0 s at 200,000 requests
    with one object a request; it took 11 s of a 23 s Live refresh with a step walk each."""
    out: dict[str, dict[str, float] | None] = {}
    tids: list[str] = []
    origin: list[int] = []
    engine: list[str | None] = []
    tokens: list[int] = []
    ttft: list[float] = []
    tpot_ms: list[float] = []
    for tid, row, f in requests:
        out[tid] = None
        if f.root_iv is None or f.root_res is None:
            continue
        n, first, per = row[3], row[4], row[5]  # output tokens, TTFT, TPOT (`columns.Row`)
        if per is None or not n or n < 2 or first is None:  # `tpot.windows`' test
            continue
        tids.append(tid)
        origin.append(f.root_iv[0] - off[f.root_res])
        engine.append(f.engine)
        tokens.append(n)
        ttft.append(first)
        tpot_ms.append(per)
    if not tids:
        return out
    got = steps()
    arrays = got.arrays
    by_engine: dict[str, list[int]] = {}
    only = got.decode[0] if len(got.decode) == 1 and got.decode[0] in arrays else None
    for i, eid in enumerate(engine):
        if eid not in arrays:  # `tpot.windows`: the only decode engine, if any
            if only is None:
                continue
            eid = only
        if arrays[eid] is not None:  # no worker records: no breakdown
            by_engine.setdefault(eid, []).append(i)
    n = np.array(tokens, dtype=np.int64)
    per = np.array(tpot_ms, dtype=float)
    # `tpot.windows`' rounding: Python's round and rint both round half to even
    t0 = np.array(origin, dtype=np.int64) + np.rint(np.array(ttft) * 1e6).astype(np.int64)
    t1 = t0 + np.rint(per * (n - 1) * 1e6).astype(np.int64)
    for eid, rows in by_engine.items():
        arr = arrays[eid]
        assert arr is not None
        at = np.array(rows)
        split = breakdowns(arr, t0[at], t1[at], per[at], n[at] - 1)
        for i, bd in zip(rows, split, strict=True):
            out[tids[i]] = bd
    return out


BLOCK = 1 << 18  # steps per padded block of `breakdowns` (each array of it: 2 MB)


def breakdowns(
    arr: StepArrays,
    t0: Sequence[int],
    t1: Sequence[int],
    tpot_ms: Sequence[float],
    tokens: Sequence[int],
    block: int = BLOCK,
) -> list[dict[str, float]]:
    """`tpot.breakdown` of many windows on one engine, to the last bit.

    Its loop keeps a cursor (the end of the last step counted): the running maximum of
    the clipped ends of the earlier steps that end after they start. Its sums are
    sequential. Here each window's steps are a row of a padded block (windows of like
    length together), and a step a window does not count is held at values that move
    neither the cursor (its t0) nor a sum (+0.0), so the row's running maximum and its
    sequential sum along the row (`accumulate`) are the loop's."""
    lo = np.asarray(t0, dtype=np.int64)
    hi = np.asarray(t1, dtype=np.int64)
    sums = np.zeros((3, len(lo)))
    i = np.searchsorted(arr.max_end, lo, side="right")
    j = np.searchsorted(arr.start, hi, side="right")
    n = np.where(hi > lo, np.maximum(j - i, 0), 0)
    width = np.zeros_like(n)  # each window's row width: n rounded up to a power of two
    has = n > 0
    width[has] = 1 << np.ceil(np.log2(n[has])).astype(np.int64)
    for w in np.unique(width[has]).tolist():
        rows = np.flatnonzero(width == w)
        w = int(n[rows].max())
        step = max(block // w, 1)
        for k in range(0, len(rows), step):
            sel = rows[k : k + step]
            sums[:, sel] = _block_sums(arr, lo[sel], hi[sel], i[sel], n[sel], w)
    return shares(0.0 + sums[0], 0.0 + sums[1], 0.0 + sums[2], tpot_ms, tokens)


def shares(
    fwd: np.ndarray,
    extra: np.ndarray,
    conn: np.ndarray,
    tpot_ms: Sequence[float] | np.ndarray,
    tokens: Sequence[int] | np.ndarray,
) -> list[dict[str, float]]:
    """`tpot.shares` of many windows, to the last bit: the same IEEE operations in the
    same order, elementwise (its ``sum`` starts at int 0, its ``max`` keeps the first
    of equals: both written out)."""
    tp = np.asarray(tpot_ms, dtype=float)
    n = np.maximum(np.asarray(tokens, dtype=np.int64), 1)
    a, b, c = fwd / n / 1e6, extra / n / 1e6, conn / n / 1e6
    used = 0.0 + a + b + c
    over = (used > tp) & (tp > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = tp / np.where(over, used, 1.0)
    a, b, c = (np.where(over, v * k, v) for v in (a, b, c))
    rest = tp - np.where(over, tp, used)
    rest = np.where(rest < 0.0, 0.0, rest)  # `max(x, 0.0)`: x unless below
    keys = tpot.KEYS
    return [
        dict(zip(keys, v, strict=True))
        for v in zip(a.tolist(), b.tolist(), c.tolist(), rest.tolist(), strict=True)
    ]


def _block_sums(
    arr: StepArrays,
    lo: np.ndarray,
    hi: np.ndarray,
    i: np.ndarray,
    n: np.ndarray,
    w: int,
) -> np.ndarray:
    """(forward, batch sharing, connector) ns summed per window of one padded block:
    row r holds steps i[r] .. i[r] + n[r] - 1, padded to w."""
    col = np.arange(w)
    idx = np.minimum(i[:, None] + col, len(arr.start) - 1)
    t0, t1 = lo[:, None], hi[:, None]
    start, end = arr.start[idx], arr.end[idx]
    keep = (col < n[:, None]) & arr.worker[idx] & (end > t0)
    b = np.minimum(end, t1)
    counted = np.where(keep & (b > start), b, t0)
    cursor = np.empty_like(counted)
    cursor[:, 0] = lo
    cursor[:, 1:] = np.maximum(np.maximum.accumulate(counted, axis=1)[:, :-1], t0)
    a = np.maximum(start, cursor)
    ok = keep & (b > a)
    dur = end - start
    f = np.where(ok, (b - a) / np.where(ok, dur, 1), 0.0)
    c_ns = np.minimum(arr.conn_us[idx] * 1000.0, dur.astype(float))
    fw_ns = dur - c_ns
    solo_ns = arr.solo_us[idx] * 1000.0
    solo = np.where(np.isnan(solo_ns), fw_ns, np.minimum(fw_ns, solo_ns))
    out = np.empty((3, len(lo)))
    for k, part in enumerate((solo, fw_ns - solo, c_ns)):
        out[k] = np.add.accumulate(np.where(ok, f * part, 0.0), axis=1)[:, -1]
    return out


def changed_windows(old: TpotSteps | None, new: TpotSteps) -> list[tuple[str, int, int]] | None:
    """Where TPOT breakdowns may differ between two versions of the run's steps: (engine
    id, start, end) on the reference clock, or None for "anywhere" (no old steps, other
    engines). A step whose epoch's solo forward cost moved differs too.

    A request's breakdown reads the steps of its engine that end after its window starts
    and start before it ends, so only requests whose window meets one of these on their
    engine can change (`TraceSlots.meeting`). An engine whose steps all moved (its
    clock's offset did) differs over its whole run: its requests, not the others."""
    if old is None or old.decode != new.decode or old.arrays.keys() != new.arrays.keys():
        return None
    extends = new.base == old.token  # then each engine's first `arr.same` steps are old's
    out: list[Window] = []
    for eid, arr in new.arrays.items():
        was = old.arrays[eid]
        if (arr is None) != (was is None):
            return None
        if arr is None or was is None:
            continue
        got = _differing(was, arr, arr.same if extends else 0)
        if got is not None:
            out.append((eid, *got))
    return out


def _differing(a: StepArrays, b: StepArrays, known: int = 0) -> Window | None:
    """The time span of the steps that differ between `a` and `b` (each sorted by start):
    after their common head and before their common tail. None when they are equal.
    `known`: how many first steps are known to be equal (not compared again)."""
    n = min(len(a.start), len(b.start))
    known = min(known, n)

    def same(x: slice, y: slice) -> np.ndarray:
        return (
            (a.start[x] == b.start[y])
            & (a.end[x] == b.end[y])
            & (a.worker[x] == b.worker[y])
            & (a.conn_us[x] == b.conn_us[y])
            & ((a.solo_us[x] == b.solo_us[y]) | (np.isnan(a.solo_us[x]) & np.isnan(b.solo_us[y])))
        )

    head = same(slice(known, n), slice(known, n))
    p = known + int(np.argmin(head)) if not head.all() else n
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
