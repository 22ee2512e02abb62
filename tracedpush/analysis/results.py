"""What `analyze()` returns: one `RequestAnalysis` per request, in a `RunAnalysis`.

Data only: the JSON format is rendered by `report_json`, the text report by `report`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from tracedpush.analysis import forked
from tracedpush.analysis.failures import Failure, FailureSummary, _missing_spans, summarize
from tracedpush.analysis.model import ClockOffset, LoadStats, OffsetWindow, Segment, SpanView
from tracedpush.analysis.sampling import Sampling
from tracedpush.analysis.sampling import summarize as summarize_sampling

if TYPE_CHECKING:
    from tracedpush.analysis.contention import Contention
    from tracedpush.analysis.export_health import ExportHealth
    from tracedpush.analysis.steps import EngineSteps

T = TypeVar("T")


@dataclass(slots=True)
class RequestAnalysis:
    """One request: its TTFT cut into phases, its spans on lanes, what went wrong.

    Times are milliseconds relative to the proxy's receipt of the request, after clock
    correction. ``critical_path`` segments are consecutive from 0 and sum to
    ``ttft_ms``; ``hidden`` holds phases that ran inside the TTFT window without
    delaying the first token (push's registration during prefill, for instance).
    """

    trace_id: str
    request_id: str
    mode: str  # "push", "pull" or "unknown"
    prompt_tokens: int | None
    output_tokens: int | None
    ttft_ms: float | None  # receipt -> first token sent to the client (None: not known)
    tpot_ms: float | None  # (last token - first token) / (output tokens - 1)
    start_unix_ms: float  # proxy receipt, Unix epoch milliseconds
    load: int  # requests in flight at the proxy at receipt (this one included)
    bucket: str  # prompt-length bucket label, e.g. "<=1024"
    critical_path: list[Segment]
    hidden: list[Segment]
    spans: list[SpanView]
    complete: bool  # every span the mode requires is present and the path is whole
    # (a failed phase does not make a trace incomplete: see `error`)
    problems: list[str]
    load_bucket: str = ""  # load bucket label, e.g. "3-4"
    rendezvous_first: str | None = None  # push: "registration" or "prefill"
    error: str | None = None  # "<span>: <error.type>" of the failure the others followed
    lanes: list[str] = field(default_factory=list)  # lane names in display order
    ttft_attr_ms: float | None = None  # the proxy's own tracedpush.ttft_ms attribute
    # every phase each engine measured, on its own clock, on the critical path or not:
    # {"prefill": {phase: ms}, "decode": {phase: ms}} (critical_path.engine_phases)
    engine_phases_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    prefill_steps: int | None = None  # engine steps that computed the prefill (on P)
    # TPOT split over D's engine steps in the decode window (tpot.breakdown): {"model
    # forward", "batch sharing", "connector", "scheduling and other": ms}, sums to tpot_ms
    tpot_breakdown_ms: dict[str, float] | None = None
    # where the request failed (leg, error type, message), when the client did not get a
    # whole answer; None for a request answered, even despite a failed span (`failures`)
    failure: Failure | None = None
    proxy_seen: bool = True  # the trace has the proxy's root span (tracedpush.request)
    # how the proxy sampled it (root span's tracedpush.sampler / .sampler.ratio); the
    # ratio is None when a client's traceparent decided, or none was recorded (sampling.py)
    sampler: str | None = None
    sampling_ratio: float | None = None

    def phase_ms(self) -> dict[str, float]:
        """Critical-path milliseconds per phase (a phase can occur more than once)."""
        out: dict[str, float] = {}
        for seg in self.critical_path:
            out[seg.phase] = out.get(seg.phase, 0.0) + seg.duration_ms
        return out

    def row(self) -> dict[str, Any]:
        """One flat row (see `RunAnalysis.table`)."""
        row: dict[str, Any] = {
            "trace_id": self.trace_id,
            "request_id": self.request_id,
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "start_unix_ms": self.start_unix_ms,
            "load": self.load,
            "load_bucket": self.load_bucket,
            "bucket": self.bucket,
            "complete": self.complete,
            "error": self.error,
        }
        for phase, ms in self.phase_ms().items():
            row[f"critical_ms.{phase}"] = ms
        return row


class LazyRequests(Sequence["RequestAnalysis"]):
    """A run's requests made on first use (the analysis index keeps them on disk: a warm
    report reads the few it prints, and `RunColumns` for the rest). ``load(positions)``
    returns the requests at those positions; each is made once. ``passing(positions)``,
    if given, makes them for `stream` without the loader keeping them either (the
    index keeps what `load` makes for its later snapshots). ``step``: how many `stream`
    makes at a time (fewer for requests with their spans, which are larger)."""

    def __init__(
        self,
        n: int,
        load: Callable[[list[int]], list[RequestAnalysis]],
        passing: Callable[[list[int]], list[RequestAnalysis]] | None = None,
        step: int = 20_000,
    ) -> None:
        self._items: list[RequestAnalysis | None] = [None] * n
        self._load = load
        self._passing = passing or load
        self._step = step

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> RequestAnalysis: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestAnalysis]: ...
    def __getitem__(self, i: int | slice) -> RequestAnalysis | list[RequestAnalysis]:
        if isinstance(i, slice):
            return self.some(range(len(self._items))[i])
        got = self._items[i]
        return got if got is not None else self.some([range(len(self._items))[i]])[0]

    def some(self, positions: Sequence[int]) -> list[RequestAnalysis]:
        """The requests at `positions` (loaded together)."""
        todo = [i for i in positions if self._items[i] is None]
        if todo:
            for i, r in zip(todo, self._load(todo), strict=True):
                self._items[i] = r
        return [self._items[i] for i in positions]  # type: ignore[misc]

    def __iter__(self) -> Iterator[RequestAnalysis]:
        step = 20_000  # loaded in batches: one read of the index each
        for lo in range(0, len(self._items), step):
            yield from self.some(range(lo, min(lo + step, len(self._items))))

    def stream(self, step: int | None = None) -> Iterator[RequestAnalysis]:
        """Every request in order, a batch at a time, keeping none it makes: for an
        export of the whole run, which iterating (`__iter__` keeps each) would hold at
        once (200,000 results: gigabytes). `step`: as many at a time (default: the
        constructor's)."""
        for positions in self._batches(step or self._step):
            yield from self.passed(positions)

    def mapped(
        self, fn: Callable[[list[RequestAnalysis]], T], workers: int, step: int | None = None
    ) -> Iterator[tuple[int, T]]:
        """(how many, ``fn(batch)``) for every batch of `step` requests, in order, as
        `stream` makes them; batches are made and mapped in `workers` forked processes
        (`forked.ordered_map`; this one when `workers` <= 1). For an export of the whole
        run that only needs what `fn` returns (its text), on every core."""

        def job(positions: range) -> tuple[int, T]:
            return len(positions), fn(self.passed(positions))

        return forked.ordered_map(job, self._batches(step or self._step), workers)

    def _batches(self, step: int) -> list[range]:
        n = len(self._items)
        return [range(lo, min(lo + step, n)) for lo in range(0, n, step)]

    def passed(self, positions: Sequence[int]) -> list[RequestAnalysis]:
        """The requests at `positions`, those not loaded made by `passing` (not kept)."""
        todo = [i for i in positions if self._items[i] is None]
        made = dict(zip(todo, self._passing(todo), strict=True)) if todo else {}
        return [made[i] if i in made else self._items[i] for i in positions]  # type: ignore[misc]

    @property
    def loaded(self) -> int:
        return sum(r is not None for r in self._items)

    def view(self, positions: Sequence[int]) -> LazyRequests:
        """The requests at `positions` as a sequence of their own, read through this one
        (each still made once)."""
        at = list(positions)
        return LazyRequests(len(at), lambda ps: self.some([at[i] for i in ps]))


def made_with(
    requests: Sequence[RequestAnalysis],
    make: Callable[[list[RequestAnalysis]], Sequence[RequestAnalysis]],
    step: int = 1_000,
) -> LazyRequests:
    """`requests` as `make` remakes them (e.g. with their span views), `step` at a time
    as they are read; a report that streams them (`LazyRequests.stream`) keeps none."""
    pick = (
        requests.some
        if isinstance(requests, LazyRequests)
        else (lambda ps: [requests[i] for i in ps])
    )
    return LazyRequests(len(requests), lambda ps: list(make(pick(ps))), step=step)


class LazySteps:
    """A run's `EngineSteps` read on first use (from the analysis index: a warm report
    prints their summary and contention, kept beside them, without reading them)."""

    def __init__(self, load: Callable[[], EngineSteps], truthy: bool, derived: dict) -> None:
        self._load = load
        self._obj: EngineSteps | None = None
        self._truthy = truthy
        self.derived = derived  # {"summary": ..., "contention": ...} of the steps

    def get(self) -> EngineSteps:
        if self._obj is None:
            self._obj = self._load()
        return self._obj

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def __bool__(self) -> bool:
        return self._truthy


@dataclass(slots=True)
class RunAnalysis:
    """Every request of a run plus what was estimated across them (clock offsets)."""

    requests: list[RequestAnalysis]
    clock_offsets: dict[str, ClockOffset]
    stats: LoadStats = field(default_factory=LoadStats)
    # the offsets estimated again per stretch of the run (`skew.over_time`; reported only)
    clock_windows: list[OffsetWindow] = field(default_factory=list)
    skew_corrected: bool = True
    buckets: tuple[int, ...] = ()
    load_buckets: tuple[int, ...] = ()
    source: str = ""
    skew_policy: str = "midpoint"
    # per-process step traces (engine.steps / engine.threads), placed on the proxy clock
    engine_steps: EngineSteps | None = field(default=None, repr=False)
    # position by request id and trace id, made on the first `get` (a Live refresh of a
    # 200,000-request run would otherwise build it in Python for nothing)
    _index: dict[str, int] | None = field(default=None, repr=False, compare=False)
    # `columns.RunColumns` of `requests` (given by the analysis index, or `columns_of`)
    _columns: Any = field(default=None, repr=False, compare=False)
    _columns_of: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._columns is not None:
            self._columns_of = self.requests

    def with_requests(self, requests: Sequence[RequestAnalysis]) -> None:
        """The same requests in the same order, made another way (with their span views):
        the columns, if they were this run's, stay its."""
        if self._columns_of is self.requests:
            self._columns_of = requests
        self.requests = requests  # type: ignore[assignment]
        self._reindex()

    def _reindex(self) -> None:
        """Forget the positions (the requests were replaced): `get` makes them again."""
        self._index = None

    def _positions(self) -> dict[str, int]:
        """Position of each request by request id (the first) and trace id."""
        if self._index is not None:
            return self._index
        cols = self._lazy()
        if cols is not None:
            tids, rids = cols.trace_id, cols.request_id
        else:
            tids = [r.trace_id for r in self.requests]
            rids = [r.request_id for r in self.requests]
        index: dict[str, int] = {}
        for i, rid in enumerate(rids):
            index.setdefault(rid, i)
        index.update(zip(tids, range(len(tids)), strict=True))
        self._index = index
        return index

    def columns(self) -> Any | None:
        """The requests' numbers as columns (`columns.RunColumns`) when known: given by
        the analysis index, or made by `columns.columns_of` (which makes them)."""
        return self._columns if self._columns_of is self.requests else None

    def _lazy(self) -> Any | None:
        """The columns, when the requests are read on demand (the analysis index)."""
        return self.columns() if isinstance(self.requests, LazyRequests) else None

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestAnalysis]:
        return iter(self.requests)

    def get(self, key: str) -> RequestAnalysis | None:
        """A request by trace id or by base request id."""
        index = self._positions()
        i = index.get(key)
        if i is None:
            i = index.get(key.lower())
        return None if i is None else self.requests[i]

    def positions(self, keys: Iterable[str]) -> list[int]:
        """The positions of the requests `keys` names (trace ids, any case, or request
        ids: every request with one), in run order. By column when known."""
        keep = {k for key in keys for k in (key, key.lower())}
        cols = self._lazy()
        if cols is not None:
            pairs: Iterable[tuple[str, str]] = zip(cols.trace_id, cols.request_id, strict=True)
        else:
            pairs = ((r.trace_id, r.request_id) for r in self.requests)
        return [i for i, (t, q) in enumerate(pairs) if t in keep or q in keep]

    def arrived(self, since_ms: float | None, until_ms: float | None) -> list[int]:
        """The positions of the requests received from `since_ms` (included) until
        `until_ms` (excluded), unix ms on the proxy's clock (None: no bound), in run
        order. By column when known: no request is read."""
        import numpy as np

        cols = self.columns()
        start = (
            np.asarray(cols.start, dtype="float64")
            if cols is not None
            else np.array([r.start_unix_ms for r in self.requests], dtype="float64")
        )
        keep = np.isfinite(start)
        if since_ms is not None:
            keep &= start >= since_ms
        if until_ms is not None:
            keep &= start < until_ms
        return np.flatnonzero(keep).tolist()

    def by_mode(self, mode: str) -> list[RequestAnalysis]:
        return [r for r in self.requests if r.mode == mode]

    def modes(self) -> list[str]:
        return sorted({r.mode for r in self.requests})

    def slowest(self, n: int = 10, mode: str | None = None) -> list[RequestAnalysis]:
        cols = self._lazy()
        if cols is None:
            rs = [r for r in self.requests if r.ttft_ms is not None and mode in (None, r.mode)]
            return sorted(rs, key=lambda r: r.ttft_ms or 0.0, reverse=True)[:n]
        import numpy as np

        timed = ~np.isnan(cols.ttft)
        if mode is not None:
            timed &= np.array([m == mode for m in cols.mode], dtype=bool)
        rows = np.flatnonzero(timed)
        # longest first, ties in run order (a stable sort, as `sorted(reverse=True)`)
        top = rows[np.argsort(-cols.ttft[rows], kind="stable")[:n]].tolist()
        return self.at(top)

    def subset(self, positions: list[int]) -> RunAnalysis:
        """The requests at `positions` as a run of their own (`of`): a time window, a
        selection. From the analysis index the subset keeps its columns and reads
        requests on demand, so its statistics cost numpy over its rows, not a read of
        each request."""
        cols = self._lazy()
        if cols is None:
            return self.of(self.at(positions))
        return self.of(self.requests.view(positions), cols.take(positions))  # type: ignore[attr-defined]

    def of(self, requests: Sequence[RequestAnalysis], columns: Any = None) -> RunAnalysis:
        """`requests` (and their `columns`, if known) as a run with this run's clock
        offsets, stats, buckets and source, for `compare` and the rest."""
        return RunAnalysis(
            requests=requests,  # type: ignore[arg-type]
            clock_offsets=self.clock_offsets,
            clock_windows=self.clock_windows,
            stats=self.stats,
            skew_corrected=self.skew_corrected,
            buckets=self.buckets,
            load_buckets=self.load_buckets,
            source=self.source,
            skew_policy=self.skew_policy,
            _columns=columns,
        )

    def at(self, positions: list[int]) -> list[RequestAnalysis]:
        """The requests at `positions` (from the analysis index, read together)."""
        if isinstance(self.requests, LazyRequests):
            return self.requests.some(positions)
        return [self.requests[i] for i in positions]

    def engine_phase_totals(
        self, *, counts: bool = False
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Sum of ``engine_phases_ms`` over every request: {mode: {engine role: {phase:
        total ms}}} (``counts=True``: how many requests measured each phase). Compare
        with the growth of each engine's vLLM counters over the run, e.g. P's queue wait
        with vllm:request_queue_time_seconds_sum, prefill compute with
        vllm:request_prefill_time_seconds_sum, WRITE / READ with
        vllm:nixl_xfer_time_seconds_sum."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for r in self.requests:
            per_mode = out.setdefault(r.mode, {})
            for role, phases in r.engine_phases_ms.items():
                acc = per_mode.setdefault(role, {})
                for p, v in phases.items():
                    acc[p] = acc.get(p, 0) + (1 if counts else v)
        return out

    def table(self) -> list[dict[str, Any]]:
        """One flat row per request: ids, mode, tokens, TTFT/TPOT, start, load, bucket,
        and ``critical_ms.<phase>`` per phase on the critical path (absent: 0 ms)."""
        return [r.row() for r in self.requests]

    def table_columns(self, names: Collection[str] | None = None) -> dict[str, list[Any]] | None:
        """`table()` by column when the columns are known (reads no request of the
        analysis index), only the columns `names` if given; None otherwise."""
        cols = self.columns()
        return None if cols is None else cols.table(names)

    def sampling(self) -> Sampling:
        """The ratios the traces were sampled at, and which traces the comparison's
        statistics use so that they stay unbiased (`sampling`)."""
        cols = self._lazy()
        if cols is not None:
            if cols.sampled is None:  # once: the report and compare both ask
                cols.sampled = cols.sampling()
            return cols.sampled
        return summarize_sampling(self.requests)

    def failures(self) -> FailureSummary:
        """Failed requests by leg and type, and the requests answered despite a failed
        span, incomplete, or without the proxy's span (`failures.summarize`)."""
        cols = self._lazy()
        if cols is None:
            return summarize(self.requests)
        where = cols.failed.nonzero()[0].tolist()
        fine = ~cols.failed
        lost = fine & cols.proxy_seen & ~cols.complete
        missing: Counter[str] = Counter()
        for i in lost.nonzero()[0].tolist():
            missing.update(_missing_spans(cols.problems[i]))
        return FailureSummary(
            requests=len(cols),
            failed=self.at(where),
            recovered=int(cols.recovered.sum()),
            incomplete=int(lost.sum()),
            missing_spans=dict(missing.most_common()),
            no_proxy_span=int((fine & ~cols.proxy_seen).sum()),
        )

    def contention(self, *, event_cost_us: float | None = None) -> Contention:
        """CPU per engine process and thread, cores, findings (`contention`)."""
        from tracedpush.analysis.contention import contention

        store = self.engine_steps
        if isinstance(store, LazySteps):
            if event_cost_us is None:
                if "contention" not in store.derived:  # made once, kept with the steps
                    store.derived["contention"] = contention(store.get() or [])
                return store.derived["contention"]
            store = store.get()
        return contention(store or [], event_cost_us=event_cost_us)

    def export_health(self) -> ExportHealth:
        """What each engine process's own export records say (`export_health`)."""
        from tracedpush.analysis.export_health import ExportHealth

        store = self.engine_steps
        if isinstance(store, LazySteps):
            if "exports" not in store.derived:  # made once, kept with the steps
                none = ExportHealth([])
                store.derived["exports"] = store.get().export_health() if store else none
            return store.derived["exports"]
        return store.export_health() if store is not None else ExportHealth([])

    def steps_summary(self) -> dict[str, dict[str, Any]]:
        """`EngineSteps.summary` of the run's engine steps ({} without any)."""
        store = self.engine_steps
        if isinstance(store, LazySteps):
            if "summary" not in store.derived:  # made once, kept with the steps
                store.derived["summary"] = store.get().summary() if store else {}
            return store.derived["summary"]
        return store.summary() if store else {}
