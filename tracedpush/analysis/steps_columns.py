"""Engine steps as columns: one int64 row per field, one column per step.

A 200,000-request run has about 4.7 million engine steps. As `EngineStep` objects they
cost the analysis index's build tens of seconds of CPU in one process and GBs of memory.
Here each ``engine.steps`` span's arrays become numpy rows at once, scheduler and worker
records are joined on seq with array operations, and `EngineStep` objects are made only
for what a caller reads (a request's window, one engine's list).

`steps.join` stays the reference, and `join` equals it for every input. The join is
per seq. Where no two records of one side with a seq lie within twice the join slack
of each other, each worker record has at most one scheduler candidate and the pairs
are neighbours in (seq, start) order: array operations join those seqs. The seqs with
closer records (TP ranks, an engine restarted under its id while its earlier step
numbers are recent, two short runs of one engine id) take `steps.join`'s greedy rule,
in Python over plain ints, those seqs' records only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from tracedpush import semconv as sc
from tracedpush import tuning
from tracedpush.analysis.model import Resource

NONE = int(np.iinfo(np.int64).min)  # a field the step's record did not carry (None)
_MAX = int(np.iinfo(np.int64).max)
FIELDS = (
    "seq", "start_ns", "end_ns", "scheduled_ns", "prefill_tokens", "decode_reqs", "num_reqs",
    "duration_us", "connector_us", "bind_us", "load_us", "save_us", "results_us",
    "loads_started", "loads_finished",
    "origin",  # index into `StepBuilder.origins`: (the emitting resource, the engine's role)
)  # fmt: skip
F = {name: i for i, name in enumerate(FIELDS)}
SEQ, START, END, SCHED = F["seq"], F["start_ns"], F["end_ns"], F["scheduled_ns"]
DURATION, CONNECTOR, ORIGIN = F["duration_us"], F["connector_us"], F["origin"]
NUM_REQS, DECODE_REQS, PREFILL = F["num_reqs"], F["decode_reqs"], F["prefill_tokens"]
FROM_SCHEDULER = [SCHED, PREFILL, DECODE_REQS, NUM_REQS]  # what a join takes of that side
_WORKER_ARRAYS = (
    (sc.STEP_CONNECTOR_US, "connector_us"),
    (sc.STEP_BIND_US, "bind_us"),
    (sc.STEP_LOAD_US, "load_us"),
    (sc.STEP_SAVE_US, "save_us"),
    (sc.STEP_RESULTS_US, "results_us"),
    (sc.STEP_LOADS_STARTED, "loads_started"),
    (sc.STEP_LOADS_FINISHED, "loads_finished"),
)
_SCHEDULER_ARRAYS = (
    (sc.STEP_PREFILL_TOKENS, "prefill_tokens"),
    (sc.STEP_DECODE_REQS, "decode_reqs"),
    (sc.STEP_NUM_REQS, "num_reqs"),
)
Columns = np.ndarray  # shape (len(FIELDS), steps), int64
RANK_SLACK_NS = 10**9  # other TP ranks record the same step within this
# raw records kept beside the joined steps, per engine (`recent`), for `extend`: in join
# slacks before the latest start (80 s: new records may come that much later than the
# latest, less the 20 s they look back, before every record is joined again)
RECENT_SLACKS = 8
# TPOT's solo forward cost is a median per minute (`step_solo_us`); a minute's own needs
# this many one-request steps: the median of fewer is noise (one step beside a GC pause),
# and such a minute takes its neighbours' (60 s, 8; `tuning`: TRACEDPUSH_TPOT_SOLO_EPOCH_S,
# TRACEDPUSH_TPOT_SOLO_MIN_STEPS)
SOLO_EPOCH_NS = tuning.SOLO_EPOCH_NS
SOLO_MIN_STEPS = tuning.SOLO_MIN_STEPS


def empty() -> Columns:
    return np.empty((len(FIELDS), 0), np.int64)


def int_column(values: list[Any], n: int, ints: Callable[[], list[int | None]]) -> np.ndarray:
    """Elements 0..n-1 of an array attribute as int64, `NONE` where absent or not an int.
    Plain int arrays (every exporter's) convert at once; anything else goes element by
    element through `ints` (`steps._ints`, the object path's conversion)."""
    if n == 0:
        return np.empty(0, np.int64)
    if len(values) >= n:
        try:
            arr = np.array(values[:n])
        except (ValueError, OverflowError, TypeError):
            arr = None
        if arr is not None and arr.dtype == np.int64 and arr.ndim == 1:
            return arr
    out = np.full(n, NONE, np.int64)
    for i, v in enumerate(ints()):
        if v is not None and NONE < v <= _MAX:  # beyond int64: not a step's number
            out[i] = v
    return out


def block(
    side: str,
    column: Callable[[str, int], np.ndarray],
    n: int,
    seq: np.ndarray,
    origin: int,
) -> Columns:
    """One span's steps (as `steps.steps_from_span` makes them) as columns; `column(key,
    n)` reads one array attribute. Records without a seq or a start are dropped."""
    start = column(sc.STEP_START_NS, n)
    b = np.full((len(FIELDS), n), NONE, np.int64)
    b[SEQ], b[START], b[ORIGIN] = seq, start, origin
    if side == "worker":
        d = column(sc.STEP_DURATION_US, n)
        d[d == NONE] = 0
        b[DURATION] = d
        b[END] = start + d * 1000
        for key, name in _WORKER_ARRAYS:
            b[F[name]] = column(key, n)
    else:
        b[END] = start
        b[SCHED] = start
        for key, name in _SCHEDULER_ARRAYS:
            b[F[name]] = column(key, n)
    keep = (seq != NONE) & (start != NONE)
    return b if keep.all() else b[:, keep]


def close_seqs(c: Columns, slack_ns: int) -> np.ndarray:
    """The seqs of which two records of `c` (one side) start within ``2 * slack_ns`` of
    each other: where the array join would not be exact (see the module)."""
    if c.shape[1] < 2:
        return np.empty(0, np.int64)
    o = np.lexsort((c[START], c[SEQ]))
    seq, start = c[SEQ][o], c[START][o]
    close = (seq[1:] == seq[:-1]) & (start[1:] - start[:-1] < 2 * slack_ns)
    return np.unique(seq[1:][close])


def join(
    sched: Columns, work: Columns, slack_ns: int, domains: np.ndarray | None = None
) -> Columns:
    """`steps.join` on columns: every worker record takes the scheduler record of its
    seq within `slack_ns`; the records are sorted by (start, seq). `domains`: the clock
    domain (emitting process) of each origin, which tells TP ranks apart (None: each
    origin its own)."""
    return join_table(np.concatenate([work, sched], axis=1), work.shape[1], slack_ns, domains)


def join_table(
    u: Columns, n_work: int, slack_ns: int, domains: np.ndarray | None = None
) -> Columns:
    """`join` of one table: the worker records, then the scheduler records (`stacked`,
    so an engine's records are in memory once, not also as two sides: at 200,000
    requests a decode engine's are 500 MB)."""
    hard = np.union1d(close_seqs(u[:, :n_work], slack_ns), close_seqs(u[:, n_work:], slack_ns))
    easy = None
    if len(hard):
        in_hard = np.isin(u[SEQ], hard)
        easy, hard_ix = np.flatnonzero(~in_hard), np.flatnonzero(in_hard)
    # the output's columns of `u` (merged records are their worker's) and, for a merged
    # one, its scheduler record's column (else -1)
    src, frm = _array_pairs(u, n_work, slack_ns, easy)
    if easy is not None:
        dom = u[ORIGIN] if domains is None else domains[u[ORIGIN]]
        h_src, h_frm = _greedy_pairs(u, n_work, slack_ns, hard_ix, dom)
        src, frm = np.concatenate([src, h_src]), np.concatenate([frm, h_frm])
    # in output order (ties keep the order above: each seq's is the reference's); one
    # gather of the whole table (gathers of a big table cost more than the sorts)
    order = np.lexsort((u[SEQ][src], u[START][src]))
    out = u[:, src[order]]
    frm = frm[order]
    took = np.flatnonzero(frm >= 0)
    out[np.ix_(FROM_SCHEDULER, took)] = u[np.ix_(FROM_SCHEDULER, frm[took])]
    return out


def _array_pairs(
    u: Columns, n_work: int, slack_ns: int, ix: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(columns, scheduler columns) of the joined records of the columns `ix` of `u`
    (None: all), whose seqs are spread: pairs are neighbours in (seq, start) order."""
    seq, start = u[SEQ], u[START]
    if ix is None:
        ix = np.arange(u.shape[1])
    else:
        seq, start = seq[ix], start[ix]
    w = ix < n_work
    o = np.lexsort((start, seq))
    seq, start, w = seq[o], start[o], w[o]
    pair = (seq[1:] == seq[:-1]) & (w[1:] != w[:-1]) & (np.abs(start[1:] - start[:-1]) < slack_ns)
    left = np.nonzero(pair)[0]
    wi = np.where(w[left], o[left], o[left + 1])
    si = np.where(w[left], o[left + 1], o[left])
    alone = np.ones(len(ix), bool)
    alone[wi] = alone[si] = False
    src = np.concatenate([ix[wi], ix[alone]])
    frm = np.concatenate([ix[si], np.full(int(alone.sum()), -1, np.int64)])
    return src, frm


def _greedy_pairs(
    u: Columns, n_work: int, slack_ns: int, ix: np.ndarray, dom: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`_array_pairs` for the columns `ix` by `steps.join`'s rule, one seq at a time: in
    start order, a worker record within `RANK_SLACK_NS` of a kept one of its seq from
    another domain is another TP rank's record of that step (dropped); a kept one takes
    the nearest scheduler record of its seq left, if within the slack. Then the
    scheduler records left. The reference's order, which ties keep."""
    o = ix[np.lexsort((u[START][ix], u[SEQ][ix]))]  # by seq, start, then column
    cols_, seqs, starts = o.tolist(), u[SEQ][o].tolist(), u[START][o].tolist()
    doms = dom[o].tolist()
    src: list[int] = []
    frm: list[int] = []
    i, n = 0, len(cols_)
    while i < n:
        j = i
        while j < n and seqs[j] == seqs[i]:
            j += 1
        cands = [(starts[k], cols_[k]) for k in range(i, j) if cols_[k] >= n_work]
        kept: list[tuple[int, int]] = []
        for k in range(i, j):
            col, ws, wd = cols_[k], starts[k], doms[k]
            if col >= n_work:
                continue
            if any(kd != wd and abs(ws - ks) < RANK_SLACK_NS for ks, kd in kept):
                continue
            kept.append((ws, wd))
            took = -1
            if cands:
                best = min(range(len(cands)), key=lambda q: abs(cands[q][0] - ws))
                if abs(cands[best][0] - ws) < slack_ns:
                    took = cands.pop(best)[1]
            src.append(col)
            frm.append(took)
        for _start, col in cands:
            src.append(col)
            frm.append(-1)
        i = j
    return np.array(src, np.int64), np.array(frm, np.int64)


def place(c: Columns, offsets: np.ndarray, *, own: bool = False) -> Columns:
    """Steps moved onto the reference clock (t - their origin's offset), re-sorted by
    (start, seq) keeping the order of ties, as `EngineSteps.place` did. `own`: `c` is
    the caller's to spend (moved in place, not copied first)."""
    if not c.shape[1]:
        return c
    out = _shifted(c, offsets, -1, copy=not own)
    return out[:, np.lexsort((out[SEQ], out[START]))]


def moved(c: Columns, was: np.ndarray, now: np.ndarray) -> Columns:
    """Steps `join` made and `place` placed with offsets `was`, placed with `now`
    instead: `join` sorts by (start, seq), with no ties but between records of one seq
    starting at the same ns (which no two clocks make), so the raw times sorted again
    are its output, and `place` sorts those by (start, seq) on the new clock.

    One sort does both: by (new start, seq, raw start), ties in `c`'s order. Where
    every step moves by the same time (an engine's processes share a clock, the usual
    case) and `c` is in strict (start, seq) order (no ties for the raw start to break),
    that is `c`'s order, and no sort is needed: at 200,000 requests the two sorts were
    2.4 s of a Live refresh whose offsets moved."""
    if not c.shape[1]:
        return c
    shift = (was - now)[c[ORIGIN]]
    out = _shifted(c, shift, 1, per_step=True)
    start, seq = c[START], c[SEQ]
    ordered = (start[1:] > start[:-1]) | ((start[1:] == start[:-1]) & (seq[1:] > seq[:-1]))
    if (shift == shift[0]).all() and ordered.all():
        return out
    return out[:, np.lexsort((start + was[c[ORIGIN]], out[SEQ], out[START]))]


def _shifted(
    c: Columns, offsets: np.ndarray, sign: int, *, copy: bool = True, per_step: bool = False
) -> Columns:
    """Start, end and scheduled time moved by `sign` * their origin's offset (in a copy,
    else in `c`); `per_step`: `offsets` are already each step's."""
    out = c.copy(order="K") if copy else c  # in its layout: see `_head_then`
    d = (offsets if per_step else offsets[c[ORIGIN]]) * sign
    out[START] += d
    out[END] += d
    has = out[SCHED] != NONE
    out[SCHED][has] += d[has]
    return out


def recent(table: Columns, slack_ns: int) -> tuple[Columns, int]:
    """(the records of `table`, raw as `block` made them, from `RECENT_SLACKS` join
    slacks before its latest start on, that time; `NONE` for no records, all of them):
    what `extend` needs of an engine's records besides its joined steps."""
    if not table.shape[1]:
        return empty(), NONE
    since = int(table[START].max()) - RECENT_SLACKS * slack_ns
    return table[:, table[START] >= since], since


def extend(
    placed: Columns,
    kept: tuple[Columns, int] | None,
    sched: Columns,
    work: Columns,
    offsets: np.ndarray,
    slack_ns: int,
    domains: np.ndarray | None = None,
) -> tuple[Columns, int, tuple[Columns, int]] | None:
    """`place(join(every scheduler record, every worker record), offsets)` of an engine
    whose earlier records made `placed` (by `join`, with these offsets) and which has
    `sched` and `work` since, joining again only the records of the new ones' seqs near
    them. `kept`: `recent` of the earlier records (None: unknown). With the steps, how
    many of the first ones are `placed`'s, unchanged (what follows them is new or joined
    again), and `recent` of every record. None where that would not be exact (the caller
    joins every record again): two records of one seq and side start at the same ns (the
    reference orders those by reading order), or the new records reach back past what
    `kept` holds and their seqs' records there are not spread (`_extend_spread`).

    The join is per seq, so steps of other seqs stay as they were. For the new ones'
    seqs, let lo be the earliest new start, moved back while a record of those seqs
    starts less than twice the slack before it. Records of one seq more than twice the
    slack apart never meet in `steps.join` (a pair is within the slack, another TP
    rank's record within `RANK_SLACK_NS`, a candidate too far to pair changes nothing),
    so those seqs' steps before lo stay too, and their records from lo on (every one in
    `kept`, raw, with its origin: a joined step lost its scheduler half's, and a dropped
    rank's is gone) and the new ones are joined again, placed, and replace their steps
    from lo on. Steps placed earlier than lo minus the largest offset are untouched; the
    stretch after is sorted again, old steps first among ties, as in the joined order."""
    if kept is None:
        return None
    new = np.concatenate([work, sched], axis=1)
    if not new.shape[1]:
        return placed, placed.shape[1], kept
    old, since = kept
    seqs = np.unique(new[SEQ])
    pool = np.concatenate([old, new], axis=1)
    ours = pool[:, np.isin(pool[SEQ], seqs)]
    lo = int(new[START].min())
    while True:  # back while a record of these seqs is within twice the slack before lo
        near = ours[START][(ours[START] < lo) & (ours[START] >= lo - 2 * slack_ns)]
        if not len(near):
            break
        lo = int(near.min())
    if lo - 2 * slack_ns < since:  # older than the records kept: without them
        got = _extend_spread(placed, sched, work, offsets, slack_ns)
        return None if got is None else (*got, recent_after(pool, since, slack_ns))
    again = ours[:, ours[START] >= lo]
    o = np.lexsort((again[START], again[DURATION] != NONE, again[SEQ]))
    key = again[:, o][[SEQ, START]]
    w = (again[DURATION] != NONE)[o]
    if ((key[0, 1:] == key[0, :-1]) & (key[1, 1:] == key[1, :-1]) & (w[1:] == w[:-1])).any():
        return None
    is_w = again[DURATION] != NONE
    joined = join(again[:, ~is_w], again[:, is_w], slack_ns, domains)
    fresh = _shifted(joined, offsets, -1)
    k = int(np.searchsorted(placed[START], lo - int(offsets.max()), side="left"))
    tail = placed[:, k:]
    raw_start = tail[START] + offsets[tail[ORIGIN]]
    stays = ~(np.isin(tail[SEQ], seqs) & (raw_start >= lo))
    region = np.concatenate([tail[:, stays], fresh], axis=1)
    region = region[:, np.lexsort((region[SEQ], region[START]))]
    return _head_then(placed, k, region), k, recent_after(pool, since, slack_ns)


def recent_after(pool: Columns, since: int, slack_ns: int) -> tuple[Columns, int]:
    """`recent` of an engine's records once `pool` (what it kept, then the new ones) is
    all of them from `since` on."""
    got, since_now = recent(pool, slack_ns)
    return got, max(since, since_now)


def unjoin(c: Columns) -> tuple[Columns, Columns]:
    """(scheduler, worker) records as `block` made them, back from `join`'s output: a
    merged record (a duration and a scheduled time) splits in two. Its scheduler half
    gets the worker's origin, which `_extend_spread` never places (see there)."""
    work = c[DURATION] != NONE
    merged = c[:, work & (c[SCHED] != NONE)]
    w = c[:, work]
    w[FROM_SCHEDULER] = NONE
    s = np.full_like(merged, NONE)
    s[SEQ], s[START], s[END], s[ORIGIN] = merged[SEQ], merged[SCHED], merged[SCHED], merged[ORIGIN]
    s[FROM_SCHEDULER] = merged[FROM_SCHEDULER]
    return np.concatenate([c[:, ~work], s], axis=1), w


def _extend_spread(
    placed: Columns, sched: Columns, work: Columns, offsets: np.ndarray, slack_ns: int
) -> tuple[Columns, int] | None:
    """`extend` without the records kept raw, for new records older than those: exact
    where no seq has records of one side within twice the slack of each other near the
    new ones (else None).

    Let t be the earliest new start. A pair is two records of one seq less than the
    slack apart. Where the records of one side and seq that start from t - 4 slack on
    are more than twice the slack apart (checked), no worker step from t - slack on
    competes with another for a scheduler record, and none is another TP rank's: each
    takes the one record within the slack, if any, as the array join does; and no
    worker step before t - slack can take a new record. So only records from t - 2
    slack on need joining again, and every step before t - slack stays as it was. The
    records from t - 2 slack on come back from `placed` (`unjoin`), are joined with the
    new ones, and replace the steps from t - slack on. A scheduler half given its
    worker's origin by `unjoin` pairs with that worker again, before t - slack, so it
    is never placed. With different offsets per origin, the old steps just before
    t - slack and the new ones may interleave: that stretch is sorted again, old steps
    first among ties, as in the joined order. With the steps, how many of the first
    ones are `placed`'s, unchanged (what follows them is new or joined again).

    A TP rank's record that `join` dropped is not in `placed`, but the one that made it
    drop is: the check sees the seq's records close, so dropped records need not
    come back."""
    if not (sched.shape[1] or work.shape[1]):
        return placed, placed.shape[1]
    t = int(min(sched[START].min(initial=_MAX), work[START].min(initial=_MAX)))
    lo, cut = t - 2 * slack_ns, t - slack_ns
    top = int(offsets.max())
    if not _spread_near(placed, sched, work, offsets, slack_ns, lo - 2 * slack_ns, top):
        return None
    # every step before k started (raw clock) more than a slack before lo
    k = int(np.searchsorted(placed[START], lo - slack_ns - top, side="left"))
    tail = placed[:, k:]
    raw = _shifted(tail, offsets, 1)
    old_s, old_w = unjoin(raw)
    joined = join(
        np.concatenate([old_s[:, old_s[START] >= lo], sched], axis=1),
        np.concatenate([old_w[:, old_w[START] >= lo], work], axis=1),
        slack_ns,
    )
    fresh = joined[:, int(np.searchsorted(joined[START], cut, side="left")) :]
    region = np.concatenate([tail[:, raw[START] < cut], _shifted(fresh, offsets, -1)], axis=1)
    region = region[:, np.lexsort((region[SEQ], region[START]))]
    return _head_then(placed, k, region), k


def _head_then(placed: Columns, k: int, region: Columns) -> Columns:
    """The first `k` steps of `placed`, then `region`, in a new table laid out step by
    step (Fortran order), as the joined and placed steps are: numpy lays out a gather
    (`x[:, ix]`: `join`, `place`) with the gathered axis first in memory. A concatenate
    lays its output out field by field, so copying the kept steps transposed every
    one: 0.2-0.8 s for a decode engine's 2 million steps at 200,000 requests, where a
    copy in their own layout takes 0.02 s; and every extension copies them."""
    out = np.empty((len(FIELDS), k + region.shape[1]), np.int64, order="F")
    out[:, :k] = placed[:, :k]
    out[:, k:] = region
    return out


def _spread_near(
    placed: Columns,
    sched: Columns,
    work: Columns,
    offsets: np.ndarray,
    slack_ns: int,
    since: int,
    top: int,
) -> bool:
    """No seq has two records of one side within twice the slack among the new ones
    and the old ones that start (raw clock) from `since` on. `top`: the largest
    offset (a scheduler half starts up to a slack before its merged step)."""
    k = int(np.searchsorted(placed[START], since - slack_ns - top, side="left"))
    old_s, old_w = unjoin(_shifted(placed[:, k:], offsets, 1))
    return not any(
        len(close_seqs(np.concatenate([old[:, old[START] >= since], new], axis=1), slack_ns))
        for old, new in ((old_s, sched), (old_w, work))
    )


def has_worker(c: Columns) -> np.ndarray:
    return c[DURATION] != NONE


def forward_us(c: Columns) -> np.ndarray:
    """duration - connector, at least 0 (`EngineStep.forward_us`); meaningful where
    `has_worker`."""
    return np.maximum(c[DURATION] - _zero(c[CONNECTOR]), 0)


def _zero(x: np.ndarray) -> np.ndarray:
    """A field with None read as 0 (the objects' ``x or 0``)."""
    return np.where(x == NONE, 0, x)


def median(values: np.ndarray) -> float | int:
    """`statistics.median` of the values, to the bit (ints stay exact)."""
    n = len(values)
    mid = n // 2
    if n % 2:
        return np.partition(values, mid)[mid].item()
    part = np.partition(values, [mid - 1, mid])
    return (part[mid - 1].item() + part[mid].item()) / 2


def solo_forward_us(c: Columns) -> float | None:
    """`steps._solo` on columns: the median forward of one-decode-request steps, else
    the smallest forward of steps that computed anything."""
    return _run_wide(*solo_candidates(c))


def _run_wide(solo: np.ndarray, busy: np.ndarray) -> float | None:
    """`solo_forward_us` of the candidates (`solo_candidates`)."""
    ok = ~np.isnan(solo)
    if ok.any():
        return float(median(solo[ok]))
    ok = ~np.isnan(busy)
    return float(busy[ok].min()) if ok.any() else None


def step_solo_us(
    c: Columns,
    carry: float | None = None,
    candidates: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Per step of columns sorted by start, the solo forward cost (µs, NaN: none) TPOT
    caps its forward at (`solo_by_epoch`'s first half)."""
    return solo_by_epoch(c, carry, candidates)[0]


def solo_by_epoch(
    c: Columns,
    carry: float | None = None,
    candidates: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, int]:
    """(per step of columns sorted by start, the solo forward cost in µs (NaN: none);
    the first step of the first epoch with a cost of its own, -1 without one).

    An epoch's own cost is the median forward of the one-decode-request steps that start
    in the same `SOLO_EPOCH_NS` (on the clock of the starts), when it has at least
    `SOLO_MIN_STEPS` of them. An epoch without (none, or too few for a median that is not
    noise) takes the last earlier epoch's, else the first later one's; when no epoch has
    its own, every step takes the median of all one-request steps (the engine's run-wide
    `solo_forward_us`), and an engine with none at all its smallest forward of a step
    that computed anything (`solo_forward_us`'s fallback).

    Per epoch, not per run: a Live refresh moves only the solo cost of the epochs its
    new steps fall in, so only requests decoding there are split again (one cost for
    the run moved with almost every refresh and split every request again), and a cost
    that drifts over a long run (other load on the host, a warmer cache) is followed.
    `carry`: the solo cost before these steps (they continue an engine's steps, a
    refresh's tail): epochs without their own before any with one take it.
    `candidates`: `solo_candidates(c)`, when the caller has them."""
    n = c.shape[1]
    solo, busy = solo_candidates(c) if candidates is None else candidates
    if not n:
        return np.full(0, np.nan), -1
    epoch = c[START] // SOLO_EPOCH_NS
    cut = np.flatnonzero(epoch[1:] != epoch[:-1]) + 1
    lo, hi = np.concatenate([[0], cut]), np.concatenate([cut, [n]])
    per = np.full(len(lo), np.nan)
    for k, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        v = solo[a:b]
        v = v[~np.isnan(v)]
        if len(v) >= SOLO_MIN_STEPS:
            per[k] = median(v)
    have = ~np.isnan(per)
    first = int(lo[int(np.argmax(have))]) if have.any() else -1
    if have.any():
        last = np.maximum.accumulate(np.where(have, np.arange(len(per)), -1))
        per = np.where(last >= 0, per[np.maximum(last, 0)], per[int(np.argmax(have))])
        if carry is not None:  # before the first epoch with one: the earlier steps' cost
            per[last < 0] = carry
    elif carry is not None:
        per[:] = carry
    else:
        run_wide = _run_wide(solo, busy)
        if run_wide is not None:
            per[:] = run_wide
    return np.repeat(per, hi - lo), first


def solo_candidates(c: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Per step, its forward (as float) where it counts towards `solo_forward_us`, else
    NaN: as a one-decode-request step (the median's), and as a step that computed
    anything (the fallback minimum's)."""
    work = has_worker(c)
    fwd = forward_us(c)
    nr = c[NUM_REQS]
    solo = work & (c[DECODE_REQS] == 1) & (_zero(c[PREFILL]) == 0) & ((nr == NONE) | (nr == 1))
    busy = work & (((nr != NONE) & (nr > 0)) | ((nr == NONE) & (fwd > 0)))
    as_float = fwd.astype(float)
    return np.where(solo, as_float, np.nan), np.where(busy, as_float, np.nan)


def sorted_median(values: np.ndarray) -> float:
    """`median` of values already sorted."""
    n = len(values)
    mid = n // 2
    if n % 2:
        return values[mid].item()
    return (values[mid - 1].item() + values[mid].item()) / 2


def resorted(bag: np.ndarray, gone: np.ndarray, new: np.ndarray) -> np.ndarray:
    """A sorted multiset `bag` without the values `gone` (each once per occurrence; all
    in it) and with the values `new` (NaN: none), still sorted: a memmove, not a sort."""
    gone = np.sort(gone[~np.isnan(gone)])
    if len(gone):
        rank = np.arange(len(gone)) - np.searchsorted(gone, gone, "left")  # among equals
        bag = np.delete(bag, np.searchsorted(bag, gone, "left") + rank)
    new = np.sort(new[~np.isnan(new)])
    return np.insert(bag, np.searchsorted(bag, new, "left"), new) if len(new) else bag


def summary(c: Columns, role: str, host: str, solo: float | None) -> dict[str, Any]:
    """`EngineSteps.summary` of one engine's columns (same keys, same numbers), given
    its `solo_forward_us`."""
    work = has_worker(c)
    durs = c[DURATION][work]
    nr = c[NUM_REQS][work]
    busy = durs[(nr == NONE) | (nr > 0)]
    conn = int(_zero(c[CONNECTOR][work]).sum())
    total = int(durs.sum())

    def ms(name: str) -> float:
        return int(_zero(c[F[name]][work]).sum()) / 1000.0

    sched = c[NUM_REQS] != NONE
    return {
        "role": role,
        "host": host,
        "steps": int(c.shape[1]),
        "worker_steps": int(work.sum()),
        "scheduler_steps": int(sched.sum()),
        "joined_steps": int((sched & work).sum()),
        "busy_steps": len(busy),
        "median_step_ms": _r(median(durs) / 1000.0) if len(durs) else None,
        "median_busy_step_ms": _r(median(busy) / 1000.0) if len(busy) else None,
        "solo_forward_ms": None if solo is None else _r(solo / 1000.0),
        "step_ms_total": _r(total / 1000.0),
        "connector_ms_total": _r(conn / 1000.0),
        "connector_share": _r(conn / total) if total else None,
        "connector_parts_ms": {
            "bind": _r(ms("bind_us")),
            "start_load_kv": _r(ms("load_us")),
            "wait_for_save": _r(ms("save_us")),
            "results": _r(ms("results_us")),
        },
        "prefill_tokens": int(_zero(c[PREFILL]).sum()),
        "loads_started": int(_zero(c[F["loads_started"]][work]).sum()),
        "loads_finished": int(_zero(c[F["loads_finished"]][work]).sum()),
    }


def _r(x: float) -> float:
    return round(x, 4)


def rows(c: Columns, positions: Sequence[int] | np.ndarray | slice) -> list[list[int | None]]:
    """The steps at `positions` as lists of Python values in `FIELDS` order (None for
    `NONE`), for making `EngineStep` objects."""
    out = c[:, positions].T.tolist()
    for r in out:
        for i, v in enumerate(r):
            if v == NONE:
                r[i] = None
    return out


def origin_offsets(
    origins: Sequence[tuple[Resource, str]], offset_ns: Callable[[Resource], int]
) -> np.ndarray:
    return np.array([offset_ns(res) for res, _role in origins] or [0], np.int64)


def stacked(*sides: list[Columns]) -> Columns:
    """The blocks of every side in one new table, in order, each let go as it is copied
    (the lists are emptied): never the blocks and their copy whole at once."""
    out = np.empty((len(FIELDS), sum(b.shape[1] for side in sides for b in side)), np.int64)
    at = 0
    for side in sides:
        side.reverse()
        while side:
            b = side.pop()
            out[:, at : at + b.shape[1]] = b
            at += b.shape[1]
    return out


def concat(blocks: Iterable[Columns]) -> Columns:
    blocks = list(blocks)
    if len(blocks) == 1:
        return blocks[0]
    return np.concatenate(blocks, axis=1) if blocks else empty()
