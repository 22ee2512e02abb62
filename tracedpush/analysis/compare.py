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

from tracedpush.analysis import phases as ph
from tracedpush.analysis.model import round_ms
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis
from tracedpush.analysis.timeline import bucket_labels, load_labels
from tracedpush.analysis.tpot import TpotAccount, tpot_account
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
    vs = sorted(values)
    out: dict[str, float | None] = {f"p{q}": percentile(vs, q) for q in qs}
    out["mean"] = sum(vs) / len(vs) if vs else None
    out["n"] = len(vs)
    return out


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
    n = {m: len(rs) for m, rs in by_mode.items()}
    ttft = {m: summary(r.ttft_ms for r in rs if r.ttft_ms is not None) for m, rs in by_mode.items()}
    tpot = {m: summary(r.tpot_ms for r in rs if r.tpot_ms is not None) for m, rs in by_mode.items()}
    phases: dict[str, dict[str, dict[str, float | None]]] = {}
    means: dict[str, dict[str, float]] = {}
    for m, rs in by_mode.items():
        per: dict[str, list[float]] = {}
        for i, r in enumerate(rs):
            for p, v in r.phase_ms().items():
                lst = per.get(p)
                if lst is None:
                    lst = per[p] = [0.0] * i  # earlier requests had 0 ms of it
                lst.append(v)
            for lst in per.values():
                if len(lst) < i + 1:
                    lst.append(0.0)
        order = {p: k for k, p in enumerate(ph.PHASES)}
        phases[m] = {
            p: summary(per[p], (50, 90)) for p in sorted(per, key=lambda p: (order.get(p, 99), p))
        }
        means[m] = {p: (sum(v) / len(v) if v else 0.0) for p, v in per.items()}
    g = ComparisonGroup(bucket, load, n, ttft, tpot, phases)
    if by_mode.get(a) and by_mode.get(b):
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
        g.tpot_account = tpot_account(by_mode, a, b)
    return g


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
    rs = [r for r in run.requests if r.ttft_ms is not None and sampling.keeps(r)]
    modes = sorted({r.mode for r in rs} | {a, b}, key=lambda m: (m not in (a, b), m != a, m))
    bucket_order = bucket_labels(run.buckets) if run.buckets else []
    load_order = load_labels(run.load_buckets) if run.load_buckets else []
    b_present = sorted({r.bucket for r in rs}, key=lambda x: _order(bucket_order, x))
    l_present = sorted({r.load_bucket for r in rs}, key=lambda x: _order(load_order, x))

    cells: dict[tuple[str, str], dict[str, list[RequestAnalysis]]] = {}

    def add(key: tuple[str, str], r: RequestAnalysis) -> None:
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = {m: [] for m in modes}
        cell[r.mode].append(r)

    for r in rs:
        add((ALL, ALL), r)
        add((r.bucket, ALL), r)
        add((ALL, r.load_bucket), r)
        add((r.bucket, r.load_bucket), r)
    keys = sorted(
        cells,
        key=lambda k: (
            (k[0] != ALL) + (k[1] != ALL) * 2 if not (k[0] != ALL and k[1] != ALL) else 3,
            _order(bucket_order, k[0]),
            _order(load_order, k[1]),
        ),
    )
    groups = [group(bk, ld, cells[(bk, ld)], a, b) for bk, ld in keys]
    return Comparison(a, b, groups, b_present, l_present)


def _order(order: list[str], label: str) -> tuple[int, str]:
    if label == ALL:
        return (-1, label)
    return (order.index(label), label) if label in order else (len(order), label)
