"""A run's per-request numbers as columns (numpy), for the run-wide statistics.

`compare`, the report's summary, sampling and failure counts need a handful of numbers
of every request, not its critical path or spans. At 200,000 requests, walking the
`RequestAnalysis` objects in Python for them (and, from the analysis index, unpickling
every one first) costs more than the rest of a warm report, so they are kept as
columns: one row per request, in `RunAnalysis.requests` order. The analysis index
stores the per-request part (`Row`) and fills the run-wide part (load bucket, TPOT
breakdown) on each update; `RunColumns.from_requests` makes the same columns from
objects (the plain `analyze()` path), so both paths compute the statistics with the
same code. `SlotColumns` keeps the rows by slot (one per trace, in the index), so an
update writes the rows it (re)analysed and takes the run's columns with numpy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
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
        """The columns of `rows`, in this order (through `SlotColumns`: one code for the
        plain path and the index)."""
        slots = SlotColumns()
        at = range(len(rows))
        slots.write(at, trace_ids, rows, buckets)
        slots.write_breakdowns(at, breakdowns)
        return slots.take(np.arange(len(rows)), loads, load_buckets)

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

    def take(self, rows: Sequence[int]) -> RunColumns:
        """These rows, in this order: the columns of a part of the run (a time window),
        as `from_requests` would make them of those requests."""
        at = np.asarray(rows, dtype=np.intp)
        keep = np.flatnonzero(self.has_phase[at].any(axis=0)) if len(at) else at[:0]

        def pick(xs: list[Any]) -> list[Any]:
            return [xs[i] for i in rows]

        return RunColumns(
            trace_id=pick(self.trace_id),
            request_id=pick(self.request_id),
            mode=pick(self.mode),
            bucket=pick(self.bucket),
            load_bucket=pick(self.load_bucket),
            load=pick(self.load),
            prompt=pick(self.prompt),
            output=pick(self.output),
            error=pick(self.error),
            ttft=self.ttft[at],
            tpot=self.tpot[at],
            start=self.start[at],
            complete=self.complete[at],
            proxy_seen=self.proxy_seen[at],
            failed=self.failed[at],
            recovered=self.recovered[at],
            sampler=pick(self.sampler),
            ratio=pick(self.ratio),
            problems=pick(self.problems),
            phases=[self.phases[j] for j in keep.tolist()],
            phase=self.phase[np.ix_(at, keep)],
            has_phase=self.has_phase[np.ix_(at, keep)],
            bd=self.bd[at],
            has_bd=self.has_bd[at],
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

    def table(self, names: Collection[str] | None = None) -> dict[str, list[Any]]:
        """`RunAnalysis.table()` by column (absent phases: None), for a data frame.
        `names`: only those columns (the Live page draws 4 of its 30-odd
        from every refresh's window: the phases' lists were most of 0.15 s at 40,000
        requests)."""
        made = self._makers()
        return {k: make() for k, make in made.items() if names is None or k in names}

    def frame_columns(self) -> dict[str, Any]:
        """`table()` for a data frame: its numeric columns as the arrays they are, NaN
        where `table` says None, which a frame makes NaN too. The same frame, made 3x
        quicker (the console's request table at 200,000 requests: 1.85 s -> 0.64 s)."""
        made: dict[str, Callable[[], Any]] = self._makers()  # a new dict each call
        made.update(
            ttft_ms=lambda: self.ttft,
            tpot_ms=lambda: self.tpot,
            start_unix_ms=lambda: self.start,
            complete=lambda: self.complete,
        )
        for j, p in enumerate(self.phases):
            made[f"critical_ms.{p}"] = lambda j=j: np.where(
                self.has_phase[:, j], self.phase[:, j], np.nan
            )
        return {k: make() for k, make in made.items()}

    def _makers(self) -> dict[str, Callable[[], list[Any]]]:
        """`table()`'s columns, each made when asked, in its order."""
        made: dict[str, Callable[[], list[Any]]] = {
            "trace_id": lambda: self.trace_id,
            "request_id": lambda: self.request_id,
            "mode": lambda: self.mode,
            "prompt_tokens": lambda: self.prompt,
            "output_tokens": lambda: self.output,
            "ttft_ms": lambda: _none(self.ttft),
            "tpot_ms": lambda: _none(self.tpot),
            "start_unix_ms": lambda: self.start.tolist(),
            "load": lambda: self.load,
            "load_bucket": lambda: self.load_bucket,
            "bucket": lambda: self.bucket,
            "complete": lambda: self.complete.tolist(),
            "error": lambda: self.error,
        }
        for j, p in enumerate(self.phases):
            made[f"critical_ms.{p}"] = lambda j=j: self._phase_column(j)
        return made

    def _phase_column(self, j: int) -> list[float | None]:
        ms, has = self.phase[:, j].tolist(), self.has_phase[:, j].tolist()
        return [v if h else None for v, h in zip(ms, has, strict=True)]

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


# `RunColumns` fields read off a `Row` (field: position in the row)
_OBJECTS = {"request_id": 0, "mode": 1, "prompt": 2, "output": 3, "error": 8, "sampler": 10,
            "ratio": 11, "problems": 15}  # fmt: skip
_FLOATS = {"ttft": 4, "tpot": 5, "start": 6}  # None: NaN
_BOOLS = {"complete": 7, "proxy_seen": 9, "failed": 12}


class SlotColumns:
    """`RunColumns` rows by slot (the analysis index gives each trace one, its first-seen
    seq): `write` sets the rows of the requests (re)analysed, `take` makes the columns
    of any slots in any order with numpy, equal to `RunColumns.build` of those rows. So a
    Live refresh writes its few new rows instead of rebuilding every request's."""

    def __init__(self) -> None:
        self._rows = 0  # capacity
        self._obj = {k: np.empty(0, dtype=object) for k in ("trace_id", "bucket", *_OBJECTS)}
        self._num = {
            **{k: np.empty(0) for k in _FLOATS},
            **{k: np.empty(0, bool) for k in (*_BOOLS, "recovered", "has_bd")},
        }
        self._shape = np.empty(0, dtype=np.intp)  # the row's phase names (`_shapes`)
        self._has_tpot = np.empty(0, dtype=bool)
        self._phase = np.zeros((0, 0))  # ms per phase (`_phases`' columns)
        self._has_phase = np.zeros((0, 0), dtype=bool)
        self._bd = np.zeros((0, len(TPOT_KEYS)))
        self._shapes: dict[tuple[str, ...], int] = {}
        self._phases: dict[str, int] = {}

    def start(self, at: np.ndarray) -> np.ndarray:
        """``start_unix_ms`` of the rows at `at` (the run's order goes by it)."""
        return self._num["start"][at]

    def decode_times(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(TTFT ms, TPOT ms, output tokens) of the rows at `at`, NaN where None: what a
        request's decode window is made of (`tpot.windows`)."""
        out = np.array([np.nan if x is None else x for x in self._obj["output"][at]], float)
        return self._num["ttft"][at], self._num["tpot"][at], out

    def write(
        self,
        slots: Iterable[int],
        trace_ids: Sequence[str],
        rows: Sequence[Row],
        buckets: Sequence[str],
    ) -> None:
        """Set these slots' rows; their TPOT breakdowns are unset until
        `write_breakdowns` (they depend on the row's TPOT)."""
        at = np.fromiter(slots, dtype=np.intp, count=len(rows))
        n = len(rows)
        if not n:
            return
        self._fit(int(at.max()) + 1)
        field = list(zip(*rows, strict=True))  # the rows by field
        self._obj["trace_id"][at] = _objects(trace_ids, n)
        self._obj["bucket"][at] = _objects(buckets, n)
        for name, k in _OBJECTS.items():
            self._obj[name][at] = _objects(field[k], n)
        num = self._num
        for name, k in _FLOATS.items():
            num[name][at] = np.array(field[k], dtype=float)  # None: NaN
        for name, k in _BOOLS.items():
            num[name][at] = np.array(field[k], dtype=bool)
        error = np.fromiter((e is not None for e in field[8]), dtype=bool, count=n)
        num["recovered"][at] = ~num["failed"][at] & error
        self._has_tpot[at] = np.fromiter((t is not None for t in field[5]), dtype=bool, count=n)
        num["has_bd"][at] = False
        self._bd[at] = 0.0
        # rows by their phase names (a few shapes of critical path), written shape by shape
        shapes: dict[tuple[str, ...], list[int]] = {}
        for i, row in enumerate(rows):
            shapes.setdefault(row[13], []).append(i)
        self._phase[at] = 0.0
        self._has_phase[at] = False
        for names, idx in shapes.items():
            where = at[idx]
            self._shape[where] = self._shape_id(names)
            values = chain.from_iterable(rows[i][14] for i in idx)
            ms = np.fromiter(values, dtype=float, count=len(idx) * len(names))
            for j, p in enumerate(names):
                self._phase[where, self._phases[p]] = ms[j :: len(names)]
                self._has_phase[where, self._phases[p]] = True

    def write_breakdowns(
        self, slots: Iterable[int], breakdowns: Sequence[dict[str, float] | None]
    ) -> None:
        """Set these slots' TPOT breakdowns (a request counts one only with a TPOT)."""
        n = len(breakdowns)
        at = np.fromiter(slots, dtype=np.intp, count=n)
        if not n:
            return
        self._fit(int(at.max()) + 1)
        has = np.array([bool(b) for b in breakdowns], dtype=bool) & self._has_tpot[at]
        self._num["has_bd"][at] = has
        self._bd[at] = 0.0
        with_bd = np.flatnonzero(has).tolist()
        if with_bd:
            got = (breakdowns[i] or {} for i in with_bd)
            values = (b.get(k, 0.0) for b in got for k in TPOT_KEYS)
            n_values = len(with_bd) * len(TPOT_KEYS)
            bd = np.fromiter(values, dtype=float, count=n_values).reshape(len(with_bd), -1)
            self._bd[at[with_bd]] = bd

    def take(
        self, order: np.ndarray, loads: Sequence[int], load_buckets: Sequence[str]
    ) -> RunColumns:
        """The columns of the rows at `order`, in that order, with their run-wide load
        and load bucket. Phases are listed as `build` lists them: in order of first
        appearance, shape by shape."""
        at = np.asarray(order, dtype=np.intp)
        shape_ids, first = np.unique(self._shape[at], return_index=True)
        names = list(self._shapes)
        seen = (names[i] for i in shape_ids[np.argsort(first)].tolist())
        phases = list(dict.fromkeys(chain.from_iterable(seen)))
        cols = np.array([self._phases[p] for p in phases], dtype=np.intp)
        return RunColumns(
            **{name: a[at].tolist() for name, a in self._obj.items()},
            **{name: a[at] for name, a in self._num.items()},
            load_bucket=list(load_buckets),
            load=list(loads),
            phases=phases,
            phase=self._phase.take(at, axis=0).take(cols, axis=1),
            has_phase=self._has_phase.take(at, axis=0).take(cols, axis=1),
            bd=self._bd[at],
        )

    def _shape_id(self, names: tuple[str, ...]) -> int:
        """The id of one shape of critical path (its phase names), its phases given a
        column each on first sight."""
        sid = self._shapes.get(names)
        if sid is None:
            sid = self._shapes[names] = len(self._shapes)
            for p in names:
                if p not in self._phases:
                    self._phases[p] = len(self._phases)
            width = len(self._phases)
            if width > self._phase.shape[1]:
                self._phase = _resized(self._phase, self._rows, width)
                self._has_phase = _resized(self._has_phase, self._rows, width)
        return sid

    def _fit(self, rows: int) -> None:
        """Room for `rows` slots (doubling, so appends cost amortised O(1) each)."""
        if rows <= self._rows:
            return
        rows = max(rows, 2 * self._rows, 1024)
        self._rows = rows
        self._obj = {k: _resized(a, rows) for k, a in self._obj.items()}
        self._num = {k: _resized(a, rows) for k, a in self._num.items()}
        self._shape = _resized(self._shape, rows)
        self._has_tpot = _resized(self._has_tpot, rows)
        self._phase = _resized(self._phase, rows, self._phase.shape[1])
        self._has_phase = _resized(self._has_phase, rows, self._has_phase.shape[1])
        self._bd = _resized(self._bd, rows, self._bd.shape[1])


def _objects(values: Iterable[Any], n: int) -> np.ndarray:
    """`values` as an object array, each value one element (tuples too)."""
    return np.fromiter(values, dtype=object, count=n)


def _resized(a: np.ndarray, rows: int, cols: int | None = None) -> np.ndarray:
    """`a` with `rows` rows (and `cols` columns), the rest zero (None for objects)."""
    out = np.zeros((rows,) if cols is None else (rows, cols), dtype=a.dtype)
    if a.dtype == object:
        out.fill(None)
    out[tuple(slice(0, k) for k in a.shape)] = a
    return out


def columns_of(run: Any) -> RunColumns:
    """`run.columns()`, made from its requests (and kept on it) when not known."""
    cols = run.columns()
    if cols is None:
        cols = run._columns = RunColumns.from_requests(run.requests)
        run._columns_of = run.requests
    return cols
