"""A run's per-request numbers as columns (numpy), for the run-wide statistics.

`compare`, the report's summary, sampling and failure counts need a handful of numbers
of every request, not its critical path or spans. At 200,000 requests, walking the
`RequestAnalysis` objects in Python for them (and, from the analysis index, unpickling
every one first) costs more than the rest of a warm report, so they are kept as
columns: one row per request, in `RunAnalysis.requests` order. The analysis index
stores the per-request part (`Row`) and fills the run-wide part (load bucket, TPOT
breakdown) on each update; `RunColumns.from_requests` makes the same columns from
objects (the plain `analyze()` path), so both paths compute the statistics with the
same code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from tracedpush.analysis import sampling as sampling_mod
from tracedpush.analysis.tpot import KEYS as TPOT_KEYS

# what a request contributes to the run-wide statistics, besides its run-wide fields
# (load, load bucket, bucket, TPOT breakdown): kept per trace by the analysis index
Row = tuple[
    str,  # request_id
    str,  # mode
    "int | None",  # prompt_tokens
    "int | None",  # output_tokens
    "float | None",  # ttft_ms
    "float | None",  # tpot_ms
    float,  # start_unix_ms
    bool,  # complete
    "str | None",  # error
    bool,  # proxy_seen
    "str | None",  # sampler
    "float | None",  # sampling_ratio
    bool,  # failed (failure is not None)
    tuple,  # phase_ms() keys, in critical-path order
    tuple,  # phase_ms() values (same order)
    tuple,  # problems
]


def row_of(r: Any) -> Row:
    """The `Row` of one `RequestAnalysis`."""
    phases = r.phase_ms()
    return (
        r.request_id, r.mode, r.prompt_tokens, r.output_tokens, r.ttft_ms, r.tpot_ms,
        r.start_unix_ms, r.complete, r.error, r.proxy_seen, r.sampler, r.sampling_ratio,
        r.failure is not None, tuple(phases), tuple(phases.values()), tuple(r.problems),
    )  # fmt: skip


class SampleRow(NamedTuple):
    """What `sampling.summarize` reads of a request."""

    trace_id: str
    proxy_seen: bool
    sampler: str | None
    sampling_ratio: float | None


def _none(a: np.ndarray) -> list[float | None]:
    return [None if x != x else x for x in a.tolist()]  # NaN -> None


@dataclass
class RunColumns:
    """One row per request (see the module docstring). ``phase`` holds critical-path ms
    per phase (0 where the request has none) and ``has_phase`` whether it has it; ``bd``
    the TPOT breakdown per `tpot.KEYS` (0 where absent) and ``has_bd`` whether the
    request has a breakdown and a TPOT (what `tpot.tpot_account` counts)."""

    trace_id: list[str]
    request_id: list[str]
    mode: list[str]
    bucket: list[str]
    load_bucket: list[str]
    load: list[int]
    prompt: list[int | None]
    output: list[int | None]
    error: list[str | None]
    ttft: np.ndarray
    tpot: np.ndarray
    start: np.ndarray
    complete: np.ndarray
    proxy_seen: np.ndarray
    failed: np.ndarray
    recovered: np.ndarray  # no failure, but an error (a failed span the request survived)
    sampler: list[str | None]
    ratio: list[float | None]
    problems: list[tuple[str, ...]]
    phases: list[str]
    phase: np.ndarray
    has_phase: np.ndarray
    bd: np.ndarray
    has_bd: np.ndarray
    sampled: sampling_mod.Sampling | None = None  # `sampling()`, once asked (RunAnalysis)

    def __len__(self) -> int:
        return len(self.trace_id)

    @classmethod
    def build(
        cls,
        trace_ids: Sequence[str],
        rows: Sequence[Row],
        buckets: Sequence[str],
        load_buckets: Sequence[str],
        breakdowns: Sequence[dict[str, float] | None],
        loads: Sequence[int],
    ) -> RunColumns:
        n = len(rows)
        # rows by their phase names (a few shapes of critical path): one array each
        shapes: dict[tuple[str, ...], list[int]] = {}
        for i, row in enumerate(rows):
            shapes.setdefault(row[13], []).append(i)
        phases = {p: j for j, p in enumerate(dict.fromkeys(chain.from_iterable(shapes)))}
        phase = np.zeros((n, len(phases)))
        has = np.zeros((n, len(phases)), dtype=bool)
        for names, at in shapes.items():
            if names:
                where = np.ix_(at, [phases[p] for p in names])
                phase[where] = np.array([rows[i][14] for i in at], dtype=float)
                has[where] = True
        with_bd = [i for i, b in enumerate(breakdowns) if b and rows[i][5] is not None]
        has_bd = np.zeros(n, dtype=bool)
        has_bd[with_bd] = True
        bd = np.zeros((n, len(TPOT_KEYS)))
        if with_bd:
            got = [breakdowns[i] or {} for i in with_bd]
            bd[with_bd] = [[b.get(k, 0.0) for k in TPOT_KEYS] for b in got]
        failed = np.array([row[12] for row in rows], dtype=bool).reshape(n)
        return cls(
            trace_id=list(trace_ids),
            request_id=[row[0] for row in rows],
            mode=[row[1] for row in rows],
            bucket=list(buckets),
            load_bucket=list(load_buckets),
            load=list(loads),
            prompt=[row[2] for row in rows],
            output=[row[3] for row in rows],
            error=[row[8] for row in rows],
            ttft=np.array([row[4] for row in rows], dtype=float).reshape(n),  # None: NaN
            tpot=np.array([row[5] for row in rows], dtype=float).reshape(n),
            start=np.array([row[6] for row in rows], dtype=float).reshape(n),
            complete=np.array([row[7] for row in rows], dtype=bool).reshape(n),
            proxy_seen=np.array([row[9] for row in rows], dtype=bool).reshape(n),
            failed=failed,
            recovered=~failed & np.array([row[8] is not None for row in rows], bool).reshape(n),
            sampler=[row[10] for row in rows],
            ratio=[row[11] for row in rows],
            problems=[row[15] for row in rows],
            phases=list(phases),
            phase=phase,
            has_phase=has,
            bd=bd,
            has_bd=has_bd,
        )

    @classmethod
    def from_requests(cls, requests: Iterable[Any]) -> RunColumns:
        rs = list(requests)
        return cls.build(
            [r.trace_id for r in rs],
            [row_of(r) for r in rs],
            [r.bucket for r in rs],
            [r.load_bucket for r in rs],
            [r.tpot_breakdown_ms for r in rs],
            [r.load for r in rs],
        )

    def sampling(self) -> sampling_mod.Sampling:
        """`sampling.summarize` of these requests, over the columns."""
        seen = self.proxy_seen.tolist()
        ratios = Counter(
            x for x, ok in zip(self.ratio, seen, strict=True) if ok and x is not None and 0 < x <= 1
        )
        samplers = Counter(x for x, ok in zip(self.sampler, seen, strict=True) if ok and x)
        traces = sum(seen)
        unknown = traces - sum(ratios.values())
        out = sampling_mod.Sampling(traces, dict(ratios), unknown, dict(samplers))
        if len(ratios) > 1 or (ratios and unknown):
            out.common_ratio = min(ratios)
        out.used = int((self.kept(out) & self.proxy_seen).sum())
        return out

    def table(self) -> dict[str, list[Any]]:
        """`RunAnalysis.table()` by column (absent phases: None), for a data frame."""
        out: dict[str, list[Any]] = {
            "trace_id": self.trace_id,
            "request_id": self.request_id,
            "mode": self.mode,
            "prompt_tokens": self.prompt,
            "output_tokens": self.output,
            "ttft_ms": _none(self.ttft),
            "tpot_ms": _none(self.tpot),
            "start_unix_ms": self.start.tolist(),
            "load": self.load,
            "load_bucket": self.load_bucket,
            "bucket": self.bucket,
            "complete": self.complete.tolist(),
            "error": self.error,
        }
        for j, p in enumerate(self.phases):
            ms, has = self.phase[:, j].tolist(), self.has_phase[:, j].tolist()
            out[f"critical_ms.{p}"] = [v if h else None for v, h in zip(ms, has, strict=True)]
        return out

    def kept(self, sampling: sampling_mod.Sampling) -> np.ndarray:
        """Which rows `sampling.keeps` (every row unless the ratios are mixed)."""
        if sampling.common_ratio is None:
            return np.ones(len(self), dtype=bool)
        return np.fromiter(
            (
                sampling.keeps(SampleRow(t, True, s, x))
                for t, s, x in zip(self.trace_id, self.sampler, self.ratio, strict=True)
            ),
            dtype=bool,
            count=len(self),
        )


def columns_of(run: Any) -> RunColumns:
    """`run.columns()`, made from its requests (and kept on it) when not known."""
    cols = run.columns()
    if cols is None:
        cols = run._columns = RunColumns.from_requests(run.requests)
        run._columns_of = run.requests
    return cols
