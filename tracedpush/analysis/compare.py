"""Push vs pull, per prompt-length bucket and load: percentiles and where the gap goes.

The phase-by-phase account uses means, because means add up: for every request the
critical-path phases sum to its TTFT, so the mean TTFT difference between the modes is
exactly the sum of the per-phase mean differences. Percentiles (p50/p90/p99) are
reported alongside but do not decompose.

`TtftAccount` (``ComparisonGroup.account``) is the same account the other way round,
a - b (push - pull), with p50s beside the means and `unattributed` always listed; it is
computed for every group where both modes have requests, so per load bucket too, and
`explain_delta(group)` says it in one sentence.

Sampled runs: with one trace-id ratio every kept request stands for 1/ratio requests
alike, so these statistics are unbiased estimates over every request; with several
ratios only their common sample counts (`sampling`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracedpush.analysis import phases as ph
from tracedpush.analysis.columns import TPOT_KEYS, RunColumns, columns_of
from tracedpush.analysis.model import round_ms
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis
from tracedpush.analysis.timeline import bucket_labels, load_labels
from tracedpush.analysis.tpot import TpotAccount, TpotRow
from tracedpush.analysis.words import delta_sentence

ALL = "all"


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default) of already sorted values."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return sorted_values[0]
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summary(values: Iterable[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """Percentiles (`percentile`), mean and count of `values`. The mean adds them in the
    order given, as the report's columns do (`_summary`): one definition of a mean."""
    return _summary(np.fromiter(values, dtype=float), qs)


@dataclass(slots=True)
class PhaseDelta:
    """How much of the TTFT difference one phase explains (means over requests)."""

    phase: str
    a_ms: float  # mean critical ms in mode a (push by default)
    b_ms: float  # mean critical ms in mode b (pull by default)
    delta_ms: float  # b - a: positive means mode b spends longer here

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "a_ms": round(self.a_ms, 4),
            "b_ms": round(self.b_ms, 4),
            "delta_ms": round(self.delta_ms, 4),
        }


@dataclass(slots=True)
class PhaseAccount:
    """One phase's share of the TTFT difference a - b (push - pull by default)."""

    phase: str
    a_mean_ms: float
    b_mean_ms: float
    mean_delta_ms: float  # a - b; over phases these sum to the mean TTFT difference
    a_p50_ms: float | None
    b_p50_ms: float | None
    p50_delta_ms: float | None  # a - b of the phase's p50s (medians do not add up)

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "a_mean_ms": round(self.a_mean_ms, 4),
            "b_mean_ms": round(self.b_mean_ms, 4),
            "mean_delta_ms": round(self.mean_delta_ms, 4),
            "a_p50_ms": round_ms(self.a_p50_ms),
            "b_p50_ms": round_ms(self.b_p50_ms),
            "p50_delta_ms": round_ms(self.p50_delta_ms),
        }


@dataclass(slots=True)
class TtftAccount:
    """Where the TTFT difference a - b goes in one group, phase by phase (pipeline
    order; `unattributed` always present). ``sum(r.mean_delta_ms for r in rows) ==
    ttft_mean_delta_ms`` up to float rounding; p50s are beside it, with what the phase
    p50s leave over (``p50_remainder_ms``), because medians do not add up."""

    rows: list[PhaseAccount]
    ttft_mean_delta_ms: float  # mean TTFT a - b
    ttft_p50_delta_ms: float | None  # p50 TTFT a - b
    p50_remainder_ms: float | None  # ttft_p50_delta_ms - sum of phase p50 deltas

    def row(self, phase: str) -> PhaseAccount | None:
        return next((r for r in self.rows if r.phase == phase), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "direction": "a - b",
            "ttft_mean_delta_ms": round(self.ttft_mean_delta_ms, 4),
            "ttft_p50_delta_ms": round_ms(self.ttft_p50_delta_ms),
            "p50_remainder_ms": round_ms(self.p50_remainder_ms),
            "phases": [r.to_json() for r in self.rows],
        }


@dataclass(slots=True)
class ComparisonGroup:
    """One (prompt bucket, load bucket) cell; "all" aggregates a dimension."""

    bucket: str
    load: str
    n: dict[str, int]
    ttft: dict[str, dict[str, float | None]]  # mode -> p50/p90/p99/mean/n
    tpot: dict[str, dict[str, float | None]]
    phases: dict[str, dict[str, dict[str, float | None]]]  # mode -> phase -> p50/p90/mean
    delta: list[PhaseDelta] = field(default_factory=list)  # largest |delta| first
    ttft_mean_delta_ms: float | None = None  # mean TTFT b - a (= sum of delta)
    ttft_p50_delta_ms: float | None = None
    account: TtftAccount | None = None  # a - b, per phase (both modes present)
    tpot_account: TpotAccount | None = None  # a - b, per TPOT mechanism (tpot.py)

    def to_json(self) -> dict[str, Any]:
        def rnd(d: dict[str, float | None]) -> dict[str, float | None]:
            return {k: (None if v is None else round(v, 4)) for k, v in d.items()}

        return {
            "bucket": self.bucket,
            "load": self.load,
            "n": self.n,
            "ttft_ms": {m: rnd(s) for m, s in self.ttft.items()},
            "tpot_ms": {m: rnd(s) for m, s in self.tpot.items()},
            "phases_ms": {m: {p: rnd(s) for p, s in d.items()} for m, d in self.phases.items()},
            "ttft_mean_delta_ms": None
            if self.ttft_mean_delta_ms is None
            else round(self.ttft_mean_delta_ms, 4),
            "ttft_p50_delta_ms": None
            if self.ttft_p50_delta_ms is None
            else round(self.ttft_p50_delta_ms, 4),
            "delta": [d.to_json() for d in self.delta],
            "ttft_account": None if self.account is None else self.account.to_json(),
            "tpot_account": None if self.tpot_account is None else self.tpot_account.to_json(),
        }


@dataclass(slots=True)
class Comparison:
    """Mode a vs mode b (push vs pull) in every bucket x load cell that has requests."""

    a: str
    b: str
    groups: list[ComparisonGroup]
    buckets: list[str]
    loads: list[str]

    def group(self, bucket: str = ALL, load: str = ALL) -> ComparisonGroup | None:
        for g in self.groups:
            if g.bucket == bucket and g.load == load:
                return g
        return None

    @property
    def overall(self) -> ComparisonGroup | None:
        return self.group(ALL, ALL)

    def by_load(self) -> list[ComparisonGroup]:
        """One group per load bucket (all prompt lengths) present in both modes, in
        load order: where "Where the TTFT difference goes" is told per load."""
        return [g for g in self.groups if g.bucket == ALL and g.load != ALL and g.account]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "buckets": self.buckets,
            "loads": self.loads,
            "groups": [g.to_json() for g in self.groups],
        }


def group(
    bucket: str, load: str, by_mode: dict[str, list[RequestAnalysis]], a: str, b: str
) -> ComparisonGroup:
    """Compare the requests of each mode as one group (a sweep cell, a bucket, ...)."""
    rows: list[RequestAnalysis] = []
    idx: dict[str, np.ndarray] = {}
    for m, rs in by_mode.items():
        idx[m] = np.arange(len(rows), len(rows) + len(rs))
        rows += rs
    return _group(RunColumns.from_requests(rows), idx, bucket, load, a, b)


def _mean(values: np.ndarray) -> float | None:
    """The mean of `values` added in their order one at a time, as a plain loop adds
    floats (``acc = 0.0; acc += v``): ``np.cumsum`` adds sequentially, where ``np.sum``
    pairs terms and Python 3.12's ``sum`` compensates, each with other last bits."""
    if not len(values):
        return None
    return (float(np.cumsum(values)[-1]) + 0.0) / len(values)  # + 0.0: as 0.0 + -0.0


def _ranked(values: np.ndarray, ranks: Iterable[int]) -> dict[int, float]:
    """The values at these ranks of `values` in sorted order: a partition, not a sort."""
    kth = sorted(set(ranks))
    part = np.partition(values, kth)
    return {k: float(part[k]) for k in kth}


def _percentiles(values: np.ndarray, qs: Sequence[int]) -> dict[str, float | None]:
    """`percentile` of each of `qs` over `values` (any order), the same arithmetic on
    the same order statistics, found by one partition."""
    n = len(values)
    if n <= 1:
        one = float(values[0]) if n else None
        return {f"p{q}": one for q in qs}
    at = {}
    for q in qs:
        pos = (n - 1) * q / 100.0
        lo = math.floor(pos)
        at[q] = (lo, min(lo + 1, n - 1), pos - lo)
    v = _ranked(values, (k for lo, hi, _ in at.values() for k in (lo, hi)))
    return {f"p{q}": v[lo] + (v[hi] - v[lo]) * frac for q, (lo, hi, frac) in at.items()}


def _summary(values: np.ndarray, qs: Sequence[int]) -> dict[str, float | None]:
    """`summary` over a column: the percentiles of `percentile`, the mean of `_mean` (in
    the requests' order)."""
    out = _percentiles(values, qs)
    out["mean"] = _mean(values)
    out["n"] = len(values)
    return out


def _group(
    cols: RunColumns, by_mode: dict[str, np.ndarray], bucket: str, load: str, a: str, b: str
) -> ComparisonGroup:
    """`group` over rows of `cols` (row numbers per mode, in request order): percentiles
    from partitioned columns, means summed in request order (`_summary`), so the
    figures equal a plain loop over the requests."""
    n = {m: len(ix) for m, ix in by_mode.items()}
    ttft: dict[str, dict[str, float | None]] = {}
    tpot: dict[str, dict[str, float | None]] = {}
    phases: dict[str, dict[str, dict[str, float | None]]] = {}
    means: dict[str, dict[str, float]] = {}
    order = {p: k for k, p in enumerate(ph.PHASES)}
    for m, ix in by_mode.items():
        t = cols.ttft[ix]
        ttft[m] = _summary(t[~np.isnan(t)], (50, 90, 99))
        t = cols.tpot[ix]
        tpot[m] = _summary(t[~np.isnan(t)], (50, 90, 99))
        per: dict[str, np.ndarray] = {}
        if len(ix):
            # a phase some request of the mode had counts 0 ms for those without it
            for j in np.flatnonzero(cols.has_phase[ix].any(axis=0)).tolist():
                per[cols.phases[j]] = cols.phase[ix, j]
        phases[m] = {
            p: _summary(per[p], (50, 90)) for p in sorted(per, key=lambda p: (order.get(p, 99), p))
        }
        means[m] = {p: got["mean"] for p, got in phases[m].items()}  # type: ignore[misc]
    g = ComparisonGroup(bucket, load, n, ttft, tpot, phases)
    if n.get(a) and n.get(b):
        names = set(means[a]) | set(means[b])
        g.delta = sorted(
            (
                PhaseDelta(
                    p,
                    means[a].get(p, 0.0),
                    means[b].get(p, 0.0),
                    means[b].get(p, 0.0) - means[a].get(p, 0.0),
                )
                for p in names
            ),
            key=lambda d: (-abs(d.delta_ms), d.phase),
        )
        ta, tb = ttft[a], ttft[b]
        if ta["mean"] is not None and tb["mean"] is not None:
            g.ttft_mean_delta_ms = tb["mean"] - ta["mean"]
        if ta["p50"] is not None and tb["p50"] is not None:
            g.ttft_p50_delta_ms = tb["p50"] - ta["p50"]
        g.account = _account(phases, means, ttft, a, b)
        g.tpot_account = _tpot_account(cols, by_mode, a, b)
    return g


def _median(values: np.ndarray) -> float | None:
    """`tpot._median` of `values` (any order), from one partition."""
    n = len(values)
    if not n:
        return None
    v = _ranked(values, (n // 2,) if n % 2 else (n // 2 - 1, n // 2))
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def _tpot_account(
    cols: RunColumns, by_mode: dict[str, np.ndarray], a: str, b: str
) -> TpotAccount | None:
    """`tpot.tpot_account` over rows of `cols` (same sums in the same order)."""
    empty = np.zeros(0, dtype=int)
    sel = {m: by_mode.get(m, empty) for m in (a, b)}
    sel = {m: ix[cols.has_bd[ix]] for m, ix in sel.items()}
    if not len(sel[a]) or not len(sel[b]):
        return None
    means: dict[str, list[float]] = {}
    p50s: dict[str, list[float | None]] = {}
    tpot_mean: dict[str, float] = {}
    tpot_p50: dict[str, float | None] = {}
    for m, ix in sel.items():
        bd = cols.bd[ix]
        means[m] = [_mean(bd[:, j]) or 0.0 for j in range(len(TPOT_KEYS))]
        p50s[m] = [_median(bd[:, j]) for j in range(len(TPOT_KEYS))]
        t = cols.tpot[ix]
        tpot_mean[m] = _mean(t) or 0.0
        tpot_p50[m] = _median(t)
    rows = []
    for j, k in enumerate(TPOT_KEYS):
        pa, pb = p50s[a][j], p50s[b][j]
        delta = None if pa is None or pb is None else pa - pb
        rows.append(TpotRow(k, means[a][j], means[b][j], means[a][j] - means[b][j], pa, pb, delta))
    ta, tb = tpot_p50[a], tpot_p50[b]
    p50 = None if ta is None or tb is None else ta - tb
    rest = None if p50 is None else p50 - sum(r.p50_delta_ms or 0.0 for r in rows)
    n = {a: len(sel[a]), b: len(sel[b])}
    mean_a, mean_b = tpot_mean[a], tpot_mean[b]
    return TpotAccount(rows, n, mean_a, mean_b, mean_a - mean_b, p50, rest)


def _account(
    phases: dict[str, dict[str, dict[str, float | None]]],
    means: dict[str, dict[str, float]],
    ttft: dict[str, dict[str, float | None]],
    a: str,
    b: str,
) -> TtftAccount | None:
    ta, tb = ttft[a], ttft[b]
    if ta["mean"] is None or tb["mean"] is None:
        return None
    order = {p: k for k, p in enumerate(ph.PHASES)}
    names = sorted(
        set(means[a]) | set(means[b]) | {ph.UNATTRIBUTED}, key=lambda p: (order.get(p, 99), p)
    )
    rows = []
    for p in names:
        pa, pb = phases[a].get(p, {}).get("p50"), phases[b].get(p, {}).get("p50")
        pa = 0.0 if pa is None else pa  # a phase no request of the mode had: 0 ms
        pb = 0.0 if pb is None else pb
        ma, mb = means[a].get(p, 0.0), means[b].get(p, 0.0)
        rows.append(PhaseAccount(p, ma, mb, ma - mb, pa, pb, pa - pb))
    p50 = None if ta["p50"] is None or tb["p50"] is None else ta["p50"] - tb["p50"]
    rest = None if p50 is None else p50 - sum(r.p50_delta_ms or 0.0 for r in rows)
    return TtftAccount(rows, ta["mean"] - tb["mean"], p50, rest)


def describe_group(g: ComparisonGroup) -> str:
    """ "over all requests", "at 5-8 in flight", "for prompts <=1024 at 2 in flight"."""
    parts = []
    if g.bucket != ALL:
        parts.append(f"for prompts {g.bucket}")
    if g.load != ALL:
        parts.append(f"at {g.load} in flight")
    return " ".join(parts) if parts else "over all requests"


def explain_delta(
    g: ComparisonGroup | None, a: str = "push", b: str = "pull", *, top: int = 3
) -> str:
    """The TTFT difference of one group in words, largest mechanisms first, e.g.
    "push is 812.0 ms slower than pull at 5-8 in flight (mean TTFT; p50 +790.1 ms):
    step handoff +640.0 ms, writer queue +120.0 ms, queue wait +40.0 ms; other phases
    +12.0 ms." Uses the means, which add up to the TTFT difference."""
    if g is None or g.account is None:
        return f"No comparison: needs both {a} and {b} requests."
    acc = g.account
    total = acc.ttft_mean_delta_ms
    where = describe_group(g)
    p50 = "" if acc.ttft_p50_delta_ms is None else f"; p50 {acc.ttft_p50_delta_ms:+.1f} ms"
    if abs(total) < 0.05:
        head = f"{a} and {b} have the same mean TTFT {where} (within 0.05 ms{p50})"
    else:
        verb = "slower" if total > 0 else "faster"
        head = f"{a} is {abs(total):.1f} ms {verb} than {b} {where} (mean TTFT{p50})"
    deltas = [(r.phase, r.mean_delta_ms) for r in acc.rows]
    return delta_sentence(head, deltas, total, top=top, eps=0.05, digits=1, rest="other phases")


def compare(run: RunAnalysis, a: str = "push", b: str = "pull") -> Comparison:
    """Mode `a` vs mode `b` overall, per prompt bucket, per load bucket, and per cell.

    Only requests with a known TTFT count. Other modes present in the run (e.g.
    "unknown") are summarised too but get no delta. In a run sampled at several ratios,
    only the common sample counts (`sampling`), so every statistic stays unbiased.
    """
    sampling = run.sampling()
    cols = columns_of(run)
    rows = np.flatnonzero(~np.isnan(cols.ttft) & cols.kept(sampling))
    mode_of = [cols.mode[i] for i in rows.tolist()]
    modes = sorted(set(mode_of) | {a, b}, key=lambda m: (m not in (a, b), m != a, m))
    bucket_order = bucket_labels(run.buckets) if run.buckets else []
    load_order = load_labels(run.load_buckets) if run.load_buckets else []
    bk_of = [cols.bucket[i] for i in rows.tolist()]
    ld_of = [cols.load_bucket[i] for i in rows.tolist()]
    b_present = sorted(set(bk_of), key=lambda x: _order(bucket_order, x))
    l_present = sorted(set(ld_of), key=lambda x: _order(load_order, x))

    def codes(labels: list[str], names: list[str]) -> np.ndarray:
        at = {x: i for i, x in enumerate(names)}
        return np.array([at[x] for x in labels], dtype=int)

    m_code = codes(mode_of, modes)
    b_code = codes(bk_of, b_present)
    l_code = codes(ld_of, l_present)
    cells: dict[tuple[str, str], np.ndarray] = {(ALL, ALL): np.ones(len(rows), dtype=bool)}
    for i, bk in enumerate(b_present):
        cells[(bk, ALL)] = b_code == i
    for j, ld in enumerate(l_present):
        cells[(ALL, ld)] = l_code == j
    pairs = np.unique(b_code * len(l_present) + l_code) if len(rows) else []
    for x in pairs:
        i, j = divmod(int(x), len(l_present))
        cells[(b_present[i], l_present[j])] = (
            cells[(b_present[i], ALL)] & cells[(ALL, l_present[j])]
        )
    if not len(rows):
        cells = {}
    keys = sorted(
        cells,
        key=lambda k: (
            (k[0] != ALL) + (k[1] != ALL) * 2 if not (k[0] != ALL and k[1] != ALL) else 3,
            _order(bucket_order, k[0]),
            _order(load_order, k[1]),
        ),
    )
    groups = []
    for bk, ld in keys:
        inside = cells[(bk, ld)]
        by_mode = {m: rows[inside & (m_code == c)] for c, m in enumerate(modes)}
        groups.append(_group(cols, by_mode, bk, ld, a, b))
    return Comparison(a, b, groups, b_present, l_present)


def _order(order: list[str], label: str) -> tuple[int, str]:
    if label == ALL:
        return (-1, label)
    return (order.index(label), label) if label in order else (len(order), label)
