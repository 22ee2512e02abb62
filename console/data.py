"""Loading and caching: one TraceStore and its latest analysis per source, for all sessions.

Why a shared, mutable ``Feed`` (one per source for the server process, `feed`) rather
than ``st.cache_data``: a RunAnalysis of 10,000 requests is large, and ``cache_data``
would pickle it on every rerun. The feed keeps the store open, so a refresh reads only
what was appended since (``TraceStore.refresh``) and re-analyses only when new spans
arrived. Pages get an immutable ``Snapshot`` and never mutate it. Nothing here computes
analysis results: it calls ``tracedpush.analysis`` and reshapes its output for drawing.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from tracedpush import analysis
from tracedpush import semconv as sc
from tracedpush.analysis import build_progress, index_cache, index_child
from tracedpush.analysis import index as index_mod
from tracedpush.analysis.results import LazySteps, made_with
from tracedpush.console import selection
from tracedpush.console.selection import mode_order

try:  # TPOT attribution (engine steps); the console draws without it
    from tracedpush.analysis import tpot as _tpot
except ImportError:  # pragma: no cover - an analysis without TPOT attribution
    _tpot = None  # type: ignore[assignment]
from tracedpush.console.source import Source

log = logging.getLogger(__name__)
PHASE_PREFIX = "critical_ms."  # RunAnalysis.table(): critical-path ms of one phase
ALL_LOADS = "all"  # Comparison's label for "every load bucket"
_MISSING = object()  # `Snapshot.memo`: nothing kept yet
# requests a refresh analyses again when the clock offsets move (the rest in the next
# refreshes, newest first; `AnalysisIndex.update`)
REANALYSE_PER_REFRESH = index_mod.LIVE_REANALYSE
MAX_STEPS = 4000  # engine steps drawn per engine and request (a long decode has many)
PERFETTO_BATCH = 1_000  # requests made with their spans at a time for a Perfetto download
STEP_COLUMNS = [
    "role", "engine_id", "seq", "start_ms", "duration_ms", "prefill_tokens", "decode_reqs",
    "num_reqs", "connector_ms", "forward_ms", "loads_started", "loads_finished", "kind",
]  # fmt: skip


FAILURE_EXAMPLES = 10  # failed requests the Overview lists
FAILURE_COLUMNS = [
    "request", "mode", "leg", "type", "span", "at ms", "message", "trace_id",
]  # fmt: skip


class SourceError(Exception):
    """A source that cannot be read now; the message is shown to the user as is."""

    def __init__(self, message: str, *, level: str = "warning") -> None:
        super().__init__(message)
        self.level = level  # "info" (nothing wrong yet) | "warning"


@dataclass(frozen=True)
class Snapshot:
    """The analysis of everything a source held at one refresh."""

    source: Source
    generation: int
    run: Any  # tracedpush.analysis.RunAnalysis
    stats: Any  # the store's LoadStats (live: later refreshes update it)
    loaded_at: float = field(default_factory=time.time)
    # from the analysis index, requests come without span views (`AnalysisIndex`): this
    # makes them for the few a page draws (None: the requests have them already)
    expand: Callable[[list[Any]], list[Any]] | None = field(default=None, compare=False)
    # (trace id, request id, mode, span name, ms) of every span, from the index's facts
    durations: Callable[[], list[tuple[str, str, str, str, float]]] | None = field(
        default=None, compare=False
    )
    # requests whose result was still made with the clock offsets before their last
    # move (`AnalysisIndex.behind`: refreshes catch up `REANALYSE_PER_REFRESH` at a time)
    behind: int = 0
    # trace files read without an analysis index, as it could not be opened: why, and
    # what to do (each load and refresh then reads and analyses every span again)
    index_unavailable: str = ""

    @cached_property
    def _full(self) -> dict[str, Any]:
        return {}

    @cached_property
    def _memo(self) -> dict[Hashable, Any]:
        return {}

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()``, once per snapshot and `key`: what pages derive from a snapshot
        (the phase boxes' statistics over 3 million rows took 0.6 s of every visit at
        200,000 requests) is shared by every session and rerun until a refresh brings
        the next snapshot. Two sessions asking at once may both make it; one is kept."""
        got = self._memo.get(key, _MISSING)
        if got is _MISSING:
            got = self._memo.setdefault(key, make())
        return got

    def full(self, req: Any) -> Any:
        """`req` with its span views (timeline, Perfetto): as is when it has them."""
        if req is None or req.spans or self.expand is None:
            return req
        got = self._full.get(req.trace_id)
        if got is None:
            got = self._full[req.trace_id] = self.expand([req])[0]
        return got

    def perfetto_run(self, trace_ids: list[str] | None) -> Any:
        """The requests `trace_ids` names (all: None) as a run, with their span views,
        for `analysis.write_perfetto`. From the analysis index their span views are made
        `PERFETTO_BATCH` at a time as the export reads them, and kept by no one
        (`LazyRequests.stream`): thousands of requests with their spans are gigabytes."""
        run = self.run
        chosen = run if trace_ids is None else run.subset(run.positions(trace_ids))
        if self.expand is None:  # the requests have their span views already
            return chosen
        return run.of(made_with(chosen.requests, self.expand, PERFETTO_BATCH))

    def with_spans(self, requests: list[Any]) -> list[Any]:
        """`full` for many requests at once (one read of the index)."""
        if self.expand is None:
            return requests
        todo = [r for r in requests if not r.spans and r.trace_id not in self._full]
        for r in self.expand(todo) if todo else ():
            self._full[r.trace_id] = r
        return [self._full.get(r.trace_id, r) if not r.spans else r for r in requests]

    @cached_property
    def table(self) -> pd.DataFrame:
        """RunAnalysis.table() as a frame (one row per request), in arrival order."""
        cols = self._columns()
        # by column from the analysis index: no request is read
        frame = pd.DataFrame(cols.frame_columns() if cols is not None else self.run.table())
        if not frame.empty and "start_unix_ms" in frame:
            frame = frame.sort_values("start_unix_ms", kind="stable", ignore_index=True)
        return frame

    @cached_property
    def phase_frame(self) -> pd.DataFrame:
        """Critical-path ms per (request, phase): RunAnalysis.table()'s ``critical_ms.*``
        columns, long form. As in ``analysis.compare``: only requests with a TTFT count,
        and a phase a request skipped counts 0 ms when other requests of its mode have it."""
        cols = [c for c in self.table.columns if c.startswith(PHASE_PREFIX)]
        parts = []
        timed = self.table[self.table["ttft_ms"].notna()] if cols else self.table
        for _mode, rows in timed.groupby("mode", sort=True):
            present = [c for c in cols if rows[c].notna().any()]
            if not present:
                continue
            # the prefix off the column names, not off 3 million rows (1.3 s at 200,000)
            names = {c: c.removeprefix(PHASE_PREFIX) for c in present}
            long = rows[["trace_id", "request_id", "mode", *present]].rename(columns=names)
            long = long.melt(
                id_vars=["trace_id", "request_id", "mode"], var_name="phase", value_name="ms"
            )
            parts.append(long)
        if not parts:
            return pd.DataFrame(columns=["trace_id", "request_id", "mode", "phase", "ms"])
        frame = pd.concat(parts, ignore_index=True)
        frame["ms"] = frame["ms"].fillna(0.0)
        return frame

    @cached_property
    def span_frame(self) -> pd.DataFrame:
        """Every span's duration (ms) with its request and mode, long form."""
        if self.durations is not None:
            rows = self.durations()
        else:
            rows = [
                (r.trace_id, r.request_id, r.mode, s.name, s.duration_ms)
                for r in self.run.requests
                for s in r.spans
            ]
        return pd.DataFrame(rows, columns=["trace_id", "request_id", "mode", "phase", "ms"])

    @cached_property
    def comparison(self) -> Any:
        return analysis.compare(self.run)

    def window(self, since_unix_ms: float) -> Any:
        """The requests that arrived at or after ``since_unix_ms`` as a RunAnalysis (same
        clock offsets and buckets), so ``analysis.compare`` can summarise just them."""
        cols = self._columns()
        if cols is None:
            starts = (r.start_unix_ms for r in self.run.requests)
            recent = [i for i, t in enumerate(starts) if t >= since_unix_ms]
        else:
            recent = (cols.start >= since_unix_ms).nonzero()[0].tolist()
        return self.run.subset(recent)

    @property
    def engine_steps(self) -> Any | None:
        """The run's per-process step records (`analysis.steps.EngineSteps`), placed on
        the proxy clock by `analyze()`; None for traces without ``engine.steps`` spans."""
        store = getattr(self.run, "engine_steps", None)
        if isinstance(store, LazySteps):  # the index's: its kept summary says, unread
            return store if self.run.steps_summary() else None
        return store if store is not None and getattr(store, "steps", None) else None

    def request_steps(self, req: Any) -> pd.DataFrame:
        """The engine steps of the request's P and D over its window, as ms since the
        proxy received it (the request's time axis): one row per worker-recorded step
        (see `STEP_COLUMNS`). Empty when the run has no steps for its engines."""
        return request_steps(self.engine_steps, req)

    @cached_property
    def tpot_accounts(self) -> dict[str, Any]:
        """Where the TPOT difference goes: load label ("all" first) -> `tpot.TpotAccount`
        of push - pull over the requests with a breakdown (those with a TTFT, as in
        `compare`); empty without engine steps. Uses the comparison's own account when
        the analysis provides one (``ComparisonGroup.tpot_account``)."""
        cols = self._columns()
        if cols is not None:  # not `requests`: from the index, each would be read back
            has = bool(cols.has_bd.any())  # (100,000 of them, 1.5 s, in a run of 200,000)
        else:
            has = any(getattr(r, "tpot_breakdown_ms", None) for r in self.run.requests)
        if _tpot is None or not has:
            return {}
        cmp = self.comparison
        groups = [g for g in [cmp.overall, *cmp.by_load()] if g is not None]
        out: dict[str, Any] = {}
        for g in groups:
            acc = getattr(g, "tpot_account", None)
            if acc is None:
                timed = [r for r in self.run.requests if r.ttft_ms is not None]
                rs = [r for r in timed if g.load == ALL_LOADS or r.load_bucket == g.load]
                by_mode = {m: [r for r in rs if r.mode == m] for m in (cmp.a, cmp.b)}
                acc = _tpot.tpot_account(by_mode, cmp.a, cmp.b)
            if acc is not None:
                out[g.load] = acc
        return out

    @cached_property
    def contention(self) -> Any | None:
        """`analysis.contention.Contention` from the engines' thread samples, or None
        (no ``engine.threads`` spans, or an analysis without it)."""
        # no look at the steps' samples first: from the analysis index that reads every
        # step back (0.7 s at 200,000 requests), where its contention is kept beside them;
        # a run without samples has a contention that is falsy
        if getattr(self.run, "engine_steps", None) is None:
            return None
        found = self._optional("contention", "contention analysis")
        return found if found else None

    def _optional(self, method: str, what: str) -> Any | None:
        """``self.run.<method>()``, or None from an analysis without it or when it fails
        (logged as `what`): a new analysis module must not break the page."""
        if not hasattr(self.run, method):
            return None
        try:
            return getattr(self.run, method)()
        except Exception:
            log.exception("%s failed", what)
            return None

    @cached_property
    def export_health(self) -> Any | None:
        """`analysis.export_health.ExportHealth`: what the processes' own export records
        say of the run's completeness (empty without records), or None from an analysis
        without it."""
        return self._optional("export_health", "trace completeness")

    @cached_property
    def failures(self) -> Any | None:
        """`analysis.failures.FailureSummary` (failed requests by leg and type, requests
        answered despite a failed span, incomplete traces), or None from an analysis
        without it."""
        return self._optional("failures", "failure accounting")

    @cached_property
    def failure_examples(self) -> pd.DataFrame:
        """Up to `FAILURE_EXAMPLES` failed requests (the first of each leg and type
        first), one row each (`FAILURE_COLUMNS`), for the Overview's table."""
        found, n = self.failures, FAILURE_EXAMPLES
        rows = [
            (r.request_id, r.mode, r.failure.leg, r.failure.type, r.failure.span,
             r.failure.at_ms, r.failure.message, r.trace_id)
            for r in (found.examples(n) if found is not None else [])
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=FAILURE_COLUMNS)

    def _columns(self) -> Any | None:
        """The run's `RunColumns` when the analysis index gave them (else None: the
        requests are in memory, and a loop over them is as quick)."""
        get = getattr(self.run, "columns", None)
        return get() if get is not None else None

    def typical(self, mode: str | None) -> Any | None:
        """`selection.typical` of the run's requests, chosen over its columns (reads
        only the request chosen from the analysis index)."""
        cols = self._columns()
        if cols is None:
            return selection.typical(self.run.requests, mode)
        ttft = cols.ttft.tolist()
        pool = [i for i, t in enumerate(ttft) if t == t and (mode is None or cols.mode[i] == mode)]
        complete = [i for i in pool if cols.complete[i]] or pool
        if not complete:
            return None
        return self.run.at([sorted(complete, key=lambda i: ttft[i])[len(complete) // 2]])[0]

    def counterpart(self, req: Any, mode: str | None) -> Any | None:
        """`selection.counterpart` of `req` among the run's requests, over its columns."""
        cols = self._columns()
        if cols is None:
            return selection.counterpart(req, self.run.requests, mode)
        ttft = cols.ttft.tolist()
        pool = [
            i
            for i, m in enumerate(cols.mode)
            if m != req.mode and (mode is None or m == mode) and ttft[i] == ttft[i]
        ]
        if not pool:
            return None
        start = cols.start.tolist()

        def key(i: int) -> tuple[bool, float, float]:
            other = _Like(cols.prompt[i], cols.load[i])
            return (not cols.complete[i], selection.distance(req, other), start[i])

        return self.run.at([min(pool, key=key)])[0]

    @property
    def newest_unix_ms(self) -> float | None:
        return self.run.requests[-1].start_unix_ms if self.run.requests else None

    @property
    def modes(self) -> list[str]:
        cols = self._columns()
        if cols is not None:
            return mode_order(m for m in cols.mode if m)
        return mode_order(r.mode for r in self.run.requests if r.mode)


@dataclass(frozen=True)
class _Like:
    """What `selection.distance` reads of a candidate request."""

    prompt_tokens: int | None
    load: int


def no_requests_message(snap: Snapshot) -> tuple[str, str]:
    """Why a snapshot has no request, as ("warning" | "info", text): the pages show it,
    and the server's warm-up prints it (`console.server`)."""
    stats = snap.stats
    where = snap.source.label
    last = stats.errors[-1] if stats is not None and stats.errors else "?"
    if stats is not None and stats.fetch_errors and not stats.spans:
        return "warning", f"Cannot read traces from {where}: {last}"
    if stats is not None and stats.malformed and not stats.spans:
        return "warning", (
            f"No readable traces in {where}: {stats.malformed} malformed lines/documents "
            f"skipped. Last problem: {last}"
        )
    if stats is not None and stats.spans:
        return "info", (
            f"{stats.spans} spans in {where}, but none forms a request yet (a request needs "
            "its tracedpush spans). If a run is in progress, the Live page picks requests "
            "up as they complete."
        )
    return "info", (
        f"No traces in {where} yet. Run `tracedpush demo`, or send requests through "
        "`tracedpush proxy` with tracing on; the Live page shows them as they arrive."
    )


def step_kind(prefill_tokens: int | None, decode_reqs: int | None, num_reqs: int | None) -> str:
    """What a step computed: "prefill" (prompt tokens only), "decode" (1-token requests
    only), "mixed" (both), "idle" (nothing scheduled: connector work only), "unknown" (no
    scheduler record for the step)."""
    if prefill_tokens is None and decode_reqs is None and num_reqs is None:
        return "unknown"
    p, d = prefill_tokens or 0, decode_reqs or 0
    if p and d:
        return "mixed"
    if p:
        return "prefill"
    if d:
        return "decode"
    return "idle" if not num_reqs else "unknown"


def engines_of(req: Any) -> dict[str, str]:
    """{"prefill": engine id, "decode": engine id} the request's engine spans name
    (``tracedpush.engine_id``, else the span's instance)."""
    out: dict[str, str] = {}
    for s in req.spans:
        role = {sc.SERVICE_PREFILL: "prefill", sc.SERVICE_DECODE: "decode"}.get(s.service)
        if role is None or role in out:
            continue
        eid = (s.attributes or {}).get(sc.ENGINE_ID) or s.instance
        if eid:
            out[role] = str(eid)
    return out


def request_steps(store: Any | None, req: Any) -> pd.DataFrame:
    """See `Snapshot.request_steps`: steps of the request's engines that overlap its
    window (first span start -> last span end), on the request's time axis."""
    if store is None or not req.spans:
        return pd.DataFrame(columns=STEP_COLUMNS)
    origin_ns = req.start_unix_ms * 1e6
    t0 = min(s.start_ms for s in req.spans)
    t1 = max(s.start_ms + s.duration_ms for s in req.spans)
    if req.ttft_ms is not None:
        t1 = max(t1, req.ttft_ms)
    lo, hi = round(origin_ns + t0 * 1e6), round(origin_ns + t1 * 1e6)
    named = engines_of(req)
    rows = []
    for role in ("prefill", "decode"):
        eid = named.get(role)
        if eid not in store.steps:  # one engine of the role: the request ran there
            ids = [e for e, info in store.engines.items() if info.role == role and e in store.steps]
            eid = ids[0] if len(ids) == 1 else None
        if eid is None:
            continue
        for st_ in store.overlapping(eid, lo, hi)[:MAX_STEPS]:
            dur = (st_.end_ns - st_.start_ns) / 1e6
            conn = None if st_.connector_us is None else st_.connector_us / 1000.0
            fwd = st_.forward_us
            rows.append(
                (role, eid, st_.seq, (st_.start_ns - origin_ns) / 1e6, dur, st_.prefill_tokens,
                 st_.decode_reqs, st_.num_reqs, conn, None if fwd is None else fwd / 1000.0,
                 st_.loads_started, st_.loads_finished,
                 step_kind(st_.prefill_tokens, st_.decode_reqs, st_.num_reqs))
            )  # fmt: skip
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def phase_percentiles(group: Any, modes: list[str] | None = None) -> pd.DataFrame:
    """A Comparison group's per-phase statistics as a phase x "<mode> <stat>" table."""
    if group is None:
        return pd.DataFrame()
    rows = [
        {"phase": phase, "mode": mode, **{k: v for k, v in stats.items() if k != "n"}}
        for mode, per in group.phases.items()
        if modes is None or mode in modes
        for phase, stats in per.items()
    ]
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).pivot(index="phase", columns="mode")
    rank = {p: i for i, p in enumerate(analysis.phases.PHASES)}
    table = table.reindex(sorted(table.index, key=lambda p: (rank.get(p, len(rank)), p)))
    stat_rank = {"p50": 0, "p90": 1, "p99": 2, "mean": 3}
    pairs = sorted(
        table.columns, key=lambda sm: (mode_order(table.columns.levels[1]).index(sm[1]),
                                       stat_rank.get(sm[0], 9), sm[0]),
    )  # fmt: skip
    table = table[pairs]
    table.columns = [f"{mode} {stat}" for stat, mode in pairs]
    return table


def _open_store(source: Source) -> Any:
    if source.kind == "none":
        raise SourceError(
            "No trace source. Start the console with `tracedpush console --traces DIR` "
            "or `--jaeger URL`, or enter one in the sidebar.",
            level="info",
        )
    if source.kind == "traces":
        paths = [Path(p) for p in source.trace_paths]
        if not any(path.exists() for path in paths):
            raise SourceError(
                f"{source.location} does not exist (yet). Run `tracedpush demo` or point the "
                "console at a directory of tracedpush traces.",
                level="info",
            )
        return analysis.TraceStore.from_paths(paths)
    kwargs: dict[str, Any] = {"lookback": source.lookback}
    if source.service:
        kwargs["service"] = source.service
    return analysis.TraceStore.from_jaeger(source.location, **kwargs)


def _no_index(source: Source, exc: Exception) -> str:
    """What a page says when trace files are read without their analysis index."""
    where = source.index_dir or str(index_mod.default_dir(source.trace_paths))
    return (
        f"No analysis index: it cannot be kept at `{where}` ({exc}). Every load and refresh "
        "reads and analyses every span again, in memory: slow, and memory-hungry, for a "
        "big run. Start the console with `--index-dir DIR` naming a directory it can write, "
        "or set `TRACEDPUSH_INDEX_ROOT=DIR` to keep every run's index under one."
    )


def _describe(source: Source, exc: Exception) -> SourceError:
    if source.kind == "jaeger":
        return SourceError(
            f"Cannot read traces from Jaeger at {source.location}: {exc}. "
            "Is Jaeger running and its query port (16686) reachable?"
        )
    return SourceError(f"Cannot read traces from {source.location}: {exc}")


class Feed:
    """A source's open TraceStore plus its latest Snapshot; shared by every session.

    Readers never wait for a refresh: ``snapshot()`` returns the last complete analysis
    while a refresh (store read + re-analysis) runs under ``_work``, which serialises
    everything that touches the store.
    """

    def __init__(self, source: Source) -> None:
        self.source = source
        self._work = threading.Lock()
        self._store: Any = None
        self._index: Any = None  # analysis.index.AnalysisIndex for trace files
        self._snapshot: Snapshot | None = None
        self._generation = 0
        self._thread: threading.Thread | None = None
        self.analysis_seconds = 0.0  # how long the last analysis took
        self.last_refresh = 0.0  # time.time() of the last successful refresh
        self.last_new = 0  # spans the last refresh brought
        self.last_error: SourceError | None = None
        self.index_unavailable = ""  # trace files read without an index: why, and what to do
        # while a cold index build runs in its child: how far it is (a page shows it)
        self.building: str | None = None
        # while a visit loads the source (`snapshot`: the build, then opening the index
        # and the first analysis): since when (time.monotonic()), for the others' pages
        self.loading_since: float | None = None
        # when a Live refresh that grew the index next checks the root's size cap
        self._cap_next = 0.0

    def _analyse(self) -> Snapshot:
        started = time.perf_counter()
        idx = self._index
        self._generation += 1
        if idx is None:
            run = analysis.analyze(self._store)
            self.analysis_seconds = time.perf_counter() - started
            return Snapshot(
                self.source,
                self._generation,
                run,
                self._store.stats,
                index_unavailable=self.index_unavailable,
            )
        run = idx.run
        return Snapshot(
            self.source,
            self._generation,
            run,
            idx.stats,
            expand=self._expand,
            durations=lambda: self._durations(run),
            behind=idx.behind,
        )

    @property
    def index_dir(self) -> Path | None:
        """Where the analysis index of the source's trace files is (None: read without)."""
        return None if self._index is None else self._index.dir

    def _expand(self, requests: list[Any]) -> list[Any]:
        with self._work:
            return self._index.with_spans(requests)

    def _durations(self, run: Any) -> list[tuple[str, str, str, str, float]]:
        with self._work:
            return self._index.span_durations(run.requests)

    def _open(self) -> None:
        """Trace files through the analysis index (a warm start reads its results, not
        the spans); Jaeger, or an index that cannot be written, through a TraceStore."""
        if self.source.kind == "traces":
            paths = [Path(p) for p in self.source.trace_paths]
            if all(p.exists() for p in paths):
                try:
                    # no forked build workers inside Streamlit's threaded server: a
                    # big run's cold build runs in a process of its own (`index_child`)
                    where = self.source.index_dir
                    idx = index_mod.AnalysisIndex(
                        paths, index_dir=where, threads=True, parallel=False
                    )
                    if idx.needs_build() and idx.parallel_pays():
                        failed = self._build_in_child(paths, where)
                        if failed:
                            log.warning("%s; building it in this process", failed)
                    cold = idx.needs_build()  # (the child's build removed what it had to)
                    started = time.perf_counter()
                    if cold:  # built here: its progress shown as the child's
                        hear = self._hearing()
                        idx.progress = lambda *a: hear(
                            build_progress.counted(*a, time.perf_counter() - started)
                        )
                    try:
                        idx.update(reanalyse_at_most=REANALYSE_PER_REFRESH)
                    finally:
                        idx.progress, self.building = None, None
                    self.analysis_seconds = time.perf_counter() - started
                    if cold:
                        index_cache.after_growth(idx.dir, log.warning)
                    self._index, self._store = idx, idx
                    return
                except (OSError, sqlite3.Error) as exc:
                    log.warning("no analysis index for %s (%s)", self.source.label, exc)
                    self.index_unavailable = _no_index(self.source, exc)
        self._store = _open_store(self.source)

    def _build_in_child(self, paths: list[Path], where: str | None) -> str | None:
        """`index_child.build`, its progress kept for the pages (`building`) and said on
        the server's terminal as each stage starts."""
        self.building = "starting"
        try:
            return index_child.build(paths, index_dir=where, progress=self._hearing())
        finally:
            self.building = None

    def _hearing(self) -> Callable[[str], None]:
        """What takes a build's progress lines: the last kept for the pages (`building`),
        each stage's first said on the server's terminal."""
        said: list[str | None] = [None]

        def heard(line: str) -> None:
            self.building = line
            stage = build_progress.stage_of(line)
            if stage != said[0]:
                said[0] = stage
                print(f"{index_child.PROGRESS_PREFIX}: {line}", file=sys.stderr, flush=True)

        return heard

    def snapshot(self) -> Snapshot:
        """The current snapshot, loading the source on first use."""
        snap = self._snapshot
        if snap is not None:
            return snap
        with self._work:
            if self._snapshot is None:
                self.loading_since = time.monotonic()
                try:
                    self._open()
                    self._snapshot = self._analyse()
                except SourceError:
                    raise
                except Exception as exc:  # a bad source must not become a traceback
                    log.exception("loading %s failed", self.source.label)
                    raise _describe(self.source, exc) from exc
                finally:
                    self.loading_since = None
                self.last_refresh = time.time()
            return self._snapshot

    def refresh(self) -> int:
        """Read what arrived since the last refresh; re-analyse if anything did.
        Returns the number of new spans (0 also when the source failed: see last_error)."""
        self.snapshot()
        with self._work:
            stats = self._store.stats
            failed_before = stats.fetch_errors
            try:
                idx = self._index
                redone = False
                if idx is not None:
                    started = time.perf_counter()
                    behind = idx.behind
                    idx.update(reanalyse_at_most=REANALYSE_PER_REFRESH)
                    new = idx.last_new
                    redone = bool(behind and idx.last_reanalysed)  # catching up
                    if new or redone:
                        self.analysis_seconds = time.perf_counter() - started
                    if new and time.monotonic() >= self._cap_next:  # it grew
                        self._cap_next = time.monotonic() + index_cache.CAP_EVERY_S
                        index_cache.after_growth(idx.dir, log.warning)
                else:
                    new = int(self._store.refresh() or 0)
                if new or redone:
                    self._snapshot = self._analyse()
            except Exception as exc:
                log.warning("refreshing %s failed: %s", self.source.label, exc)
                self.last_error = _describe(self.source, exc)
                return 0
            if stats.fetch_errors > failed_before and not new:  # Jaeger down: keep old data
                last = stats.errors[-1] if stats.errors else "fetch failed"
                self.last_error = SourceError(f"{last}; showing what was read before.")
                return 0
            self.last_error = None
            self.last_new = new
            self.last_refresh = time.time()
            return new

    @property
    def refreshing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def tick(self, *, inline_below_s: float = 0.5) -> None:
        """Refresh for the Live page: inline when analysis is quick, else in a background
        thread (one at a time) so a 10,000-request re-analysis never blocks a page."""
        self.snapshot()
        if self.refreshing:
            return
        if self.analysis_seconds < inline_below_s:
            self.refresh()
            return
        self._thread = threading.Thread(target=self.refresh, name="console-refresh", daemon=True)
        self._thread.start()


MAX_FEEDS = 8  # sources a server keeps loaded (the least recently used goes first)
_feeds: OrderedDict[Source, Feed] = OrderedDict()
_feeds_lock = threading.Lock()


def feed(source: Source) -> Feed:
    """The shared feed for ``source``: one per source for the whole server process.

    A plain registry rather than ``st.cache_resource``: the server's warm-up thread
    (`console.server`), which has no script run, fills it before the first visitor."""
    with _feeds_lock:
        got = _feeds.get(source)
        if got is None:
            got = _feeds[source] = Feed(source)
            while len(_feeds) > MAX_FEEDS:
                _feeds.popitem(last=False)
        _feeds.move_to_end(source)
        return got
