"""The analysis index: a run's spans and per-request results kept beside its trace files.

Why: a report on 200,000 requests spends almost all its time decoding OTLP JSON and
walking critical paths, and a second report on the same files (or a console refresh
after a few more lines) did it all again. The index does each once:

* **Files** are read from where the last update stopped (per file: offset, pending
  tail, size, inode; `load.FileSource`'s rules). A file that shrank, was replaced or
  vanished, or other trace paths, rebuild the index from scratch.
* **Spans** go, as plain tuples (`marshal`), to SQLite tables keyed by trace id
  (stdlib; two shards, one per cold-build process, `index_build`): a trace that gets
  new spans is re-read alone.
* **Per trace facts** (first-seen order, resources, the root's raw interval, its causal
  pairs for the clock-skew estimate, decode engine) and **per request results** (the
  `RequestAnalysis` of `analyze(spans=False)`; those the parallel cold build made are
  not stored but made again from their spans when read) are kept with the clock offsets
  they were computed with. Each update re-estimates the offsets from the kept pairs (no span is
  read for that), then re-analyses only the traces that got spans or whose offsets
  moved; load, buckets and TPOT breakdowns, which depend on the whole run, are redone
  from the facts (TPOT breakdowns only when the engine steps or offsets changed). So
  results equal `analyze()` of the same spans request by request
  (tests/unit/test_analysis_index.py).
* **Between updates** the run-wide parts (the skew evidence per resource pair, each
  trace's facts and each request's columns, by slot) stay in memory (`index_live`): an
  update writes the traces it touched and derives order, load and columns with numpy,
  so it costs time in proportion to the new spans while the offsets hold still.
* **When the offsets move**, every request with a span on a moved clock must be
  analysed again: at 200,000 requests a minute of one core. ``update(reanalyse_at_most=
  N)`` (the console's Live refresh) analyses the new spans and at most N of those,
  newest first, and leaves the rest for the next updates (`behind` says how many),
  TPOT breakdowns included (the steps placed anew split only the requests not left
  behind); ``update()`` (a report) analyses them all. Results equal `analyze()`'s once
  `behind` is 0.

``spans=True`` results (span views, for Perfetto and the console's timeline) are made
on demand for the requests asked (`AnalysisIndex.request`).
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import os
import pickle
import sqlite3
import sys
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tracedpush import envs
from tracedpush.analysis import code_digest, skew, tpot
from tracedpush.analysis import steps as steps_mod
from tracedpush.analysis._gc import paused_gc
from tracedpush.analysis.analyze import PROCESS_SPANS, request_analysis
from tracedpush.analysis.build_progress import ANALYSE, OFFSETS, READ, STORE, Throttled
from tracedpush.analysis.columns import row_of
from tracedpush.analysis.forked import can_fork
from tracedpush.analysis.index_lease import Lease
from tracedpush.analysis.index_live import TraceSlots
from tracedpush.analysis.index_steps import (
    StepCache,
    StepDelta,
    TpotSteps,
    changed_windows,
    split_tpot,
)
from tracedpush.analysis.index_store import (
    SHARDS,
    Kept,
    TraceFacts,
    db_files,
    dump_result,
    load_result,
    open_span_db,
    pack,
    shard_of,
    unpack,
    wal,
)
from tracedpush.analysis.load import FileSource, _FileState
from tracedpush.analysis.model import ClockOffset, LoadStats, Resource, Span
from tracedpush.analysis.otlp import Decoder
from tracedpush.analysis.report_json import tuning_in_force
from tracedpush.analysis.results import (
    LazyRequests,
    LazySteps,
    RequestAnalysis,
    RunAnalysis,
    made_with,
)
from tracedpush.analysis.timeline import (
    DEFAULT_BUCKETS,
    DEFAULT_LOAD_BUCKETS,
    LoadCounter,
    TraceIndex,
)

INDEX_DIRNAME = ".tracedpush-index"
_NO_LOAD = LoadCounter(())  # a request analysed alone: its load is set run-wide afterwards
FORMAT = 2  # bump when what is stored changes: an index of another format is rebuilt
_DB = "index.sqlite"
# kept beside the database as files (0.8 s to write at 200,000 requests where a blob in
# it took 2-3 s: a Live index writes them on every pause), their keys in its meta table
_FILES = {"steps": "steps.pickle", "steps_tpot": "steps-tpot.pickle", "skew": "skew.pickle"}
# what reading a torn or foreign index database raises (a TPOT segment of a trace no
# kept segment has: KeyError): the index is built again
_UNREADABLE = (sqlite3.DatabaseError, ValueError, EOFError, TypeError, KeyError)
NO_INDEX_YET = "none there yet"  # `build_reason` of a directory without an index
PARALLEL_BYTES = 64 << 20  # trace bytes from which a cold build uses every core
_TELL_EVERY = 1024  # spans, traces or requests between two looks at the clock (`Throttled`)
_COMPACT_AFTER = 16  # record segments before they are merged into one
# a Live index writes its engine steps (and their contention) when an update brings
# nothing, and at least this often while spans keep coming (`close` writes them too)
STEPS_WRITE_S = 300.0
# Every index of this process, for `_forget_connections` in a forked child.
_OPEN: weakref.WeakSet[AnalysisIndex] = weakref.WeakSet()
_INHERITED: list[Any] = []  # a forked child's inherited connections, never used nor closed


def _forget_connections() -> None:
    """In a forked child (`forked.ordered_map`, the cold build's workers): every index
    opens its own SQLite connections again, on first use. One carried across a fork
    must not be used (sqlite.org/howtocorrupt.html, 2.6), nor closed: closing what it
    takes for the last connection may checkpoint and remove the WAL the parent still
    reads. Each is kept, untouched, until the child exits (`os._exit`: no finalizer)."""
    for idx in list(_OPEN):
        _INHERITED.append((idx._db, idx._span_dbs))
        idx._db, idx._span_dbs = None, {}


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing forks
    os.register_at_fork(after_in_child=_forget_connections)

# what a Live refresh (the console's) analyses again at most when the clock offsets move
# (`AnalysisIndex.update`): 1-2 s of one core, where all of a 200,000-request run's took
# a minute and more
LIVE_REANALYSE = 2_000
# the modules whose code decides what a kept result holds (`format_key`); `contention`
# too: the steps' contention is kept with them (`steps_derived`), objects of its classes
_RESULT_MODULES = (
    "analyze", "columns", "contention", "critical_path", "export_health", "failures", "index",
    "index_build", "index_live", "index_steps", "index_store", "load", "model", "otlp",
    "otlp_fast", "phases", "results", "sampling", "skew", "steps", "steps_columns", "timeline",
    "tpot",
)  # fmt: skip


@dataclass
class _State:
    paths: list[str]
    files: dict[str, tuple[int, int, bytes, int, int, bool, int]] = field(default_factory=dict)
    resources: list[Resource] = field(default_factory=list)
    stats: LoadStats = field(default_factory=LoadStats)
    segments: int = 0
    next_seq: int = 0
    process_version: int = 0  # bumped when per-process spans arrive
    facts_version: int = 0  # bumped when kept facts change: the kept skew evidence's key
    tpot_key: Any = None  # the engine steps the kept TPOT breakdowns were split over
    # (skew policy, offsets, labels, offsets over time) of the last update: they hold
    # while no trace changes
    offsets: Any = None
    off: list[int] | None = None  # ns offset per resource the kept results were made with
    behind: int = 0  # kept results still made with older offsets than `off` (see `update`)


def format_key() -> tuple[int, str]:
    """`FORMAT`, a digest of the analysis code and the `tuning` values in force: kept
    results are only as right as the code and the knobs that made them, so an index made
    by other code, or with other values, is rebuilt."""
    knobs = tuning_in_force().values()
    return FORMAT, _code_digest() + " " + " ".join(map(str, knobs))


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """What the result modules do (`code_digest`: a docstring or comment edit keeps it)."""
    here = Path(__file__).resolve().parent
    files = [*(here / f"{m}.py" for m in _RESULT_MODULES), here.parent / "semconv.py"]
    return code_digest.digest(files, f"{sys.version_info[:2]} {marshal.version}")


def own_files(directory: Path) -> list[Path]:
    """The files an index keeps in `directory` that are there: what `_reset` deletes,
    and all `index_cache` removes."""
    names = [directory / _DB, *(directory / f"spans-{s}.sqlite" for s in range(SHARDS))]
    files = [f for db in names for f in db_files(db)]
    files += [directory / name for name in _FILES.values()]
    return [f for f in files if f.is_file()]


def default_dir(paths: Sequence[str | os.PathLike[str]]) -> Path:
    """``.tracedpush-index/`` in the first trace directory (beside a trace file); with
    ``TRACEDPUSH_INDEX_ROOT`` set, a directory of its own under that one, per set of trace
    paths (named for the first, with a digest of them all): one setting for traces this
    user cannot write beside, and no run's index rebuilt for another's."""
    first = Path(paths[0])
    root = envs.env_str(envs.INDEX_ROOT)
    if root:
        key = "\n".join(str(Path(p).resolve()) for p in paths)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return Path(root).expanduser().resolve() / f"{first.resolve().name or 'root'}-{digest}"
    return (first if first.is_dir() else first.parent) / INDEX_DIRNAME


class AnalysisIndex:
    """The index of one set of trace paths (see the module docstring).

    ``AnalysisIndex(paths).update()`` reads what is new and returns the `RunAnalysis`
    `analyze(store, spans=False)` would; call it again to follow growing files.
    """

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        index_dir: str | os.PathLike[str] | None = None,
        correct_skew: bool = True,
        skew_policy: str = "midpoint",
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        load_buckets: Sequence[int] = DEFAULT_LOAD_BUCKETS,
        parallel: bool | None = None,
        threads: bool = False,
    ) -> None:
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("no trace paths given")
        self.dir = Path(index_dir) if index_dir is not None else default_dir(self.paths)
        self._lease = Lease(self.dir)  # who has it open, for other hosts (`index_lease`)
        self.correct_skew = correct_skew
        self.skew_policy = skew_policy
        self.buckets = tuple(buckets)
        self.load_buckets = tuple(load_buckets)
        # cold builds on every core (`index_build`): None = when there are several and
        # the files are big enough for the processes to pay for themselves
        self.parallel = parallel
        self.threads = threads  # used from several threads (the console; callers lock)
        self._db: sqlite3.Connection | None = None
        self._span_dbs: dict[int, sqlite3.Connection] = {}
        self._state: _State | None = None
        self._kept: dict[str, Kept] = {}
        self._res_ix: dict[int, int] = {}  # id(resource) -> position in state.resources
        self._res_key: dict[tuple[str, str, str, str], int] = {}
        self._off_ns: list[int] = []
        # the last update's lazy requests, and what makes them with their spans (`with_spans`)
        self._spanned_of: (
            tuple[LazyRequests, Callable[[list[int]], list[RequestAnalysis]]] | None
        ) = None
        self._steps: tuple[Any, steps_mod.EngineSteps] | None = None
        self._tpot: tuple[Any, TpotSteps] | None = None
        self._step_cache = StepCache()  # process traces' parsed steps, between updates
        self._delta = StepDelta(0)  # process spans that arrived since the steps were made
        self.last_steps = ""  # how the last update had the run's steps: kept/extended/joined
        self._ids: dict[str, set[str]] = {}  # span ids of process traces that grow
        self._steps_unsaved = False  # `_steps` is newer than the index's copy (`close`)
        self._steps_written = time.monotonic()
        self._skew_written: tuple[int, float] | None = None  # (facts version, when)
        self._derived: tuple[Any, bool, dict[str, Any]] | None = None  # their summaries
        self.run: RunAnalysis | None = None
        self.last_new = 0  # spans the last update added
        self.last_reanalysed = 0  # requests the last update analysed anew
        self.last_tpot_redone = 0  # requests whose TPOT breakdown the last update made
        self.rebuilt = False  # the last update started from an empty index
        self._why_built = NO_INDEX_YET  # why it did (`build_reason`)
        self.last_error: str | None = None  # why the last read missed a path
        self._stale_saved: list[str] = []
        self._tpot_saved: list[str] = []  # requests the last update made a breakdown for
        self._kept_durations: dict[str, bytes] | None = None  # `TraceFacts.durations`
        self._save_all = False  # every TPOT breakdown redone (`_save`)
        self._slots: TraceSlots | None = None  # kept between updates (`index_live`)
        self.last_rows_written = 0  # traces whose facts, row or TPOT the last update wrote
        self._budget: int | None = None  # `update`'s reanalyse_at_most
        self._left: set[str] = set()  # the traces the last update left behind
        # a cold build's progress, when set: progress(stage, done, total), stages and
        # units in `build_progress` (on every core or in this process alike)
        self.progress: Callable[[str, int, int], None] | None = None
        _OPEN.add(self)

    # ------------------------------------------------------------------ storage
    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.dir / _DB, isolation_level=None, check_same_thread=not self.threads
            )
            wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB)")
            db.execute("CREATE TABLE IF NOT EXISTS kept (seg INTEGER PRIMARY KEY, v BLOB)")
            # each kept segment's span durations (read only for the console's span view)
            db.execute("CREATE TABLE IF NOT EXISTS durations (seg INTEGER PRIMARY KEY, v BLOB)")
            # TPOT breakdowns only, of traces whose kept row did not change otherwise
            # (`_save`): a segment applies after the kept segment of its number
            db.execute("CREATE TABLE IF NOT EXISTS tpots (seg INTEGER PRIMARY KEY, v BLOB)")
            self._db = db
            self._lease.hold()
        return self._db

    def span_db(self, shard: int) -> sqlite3.Connection:
        db = self._span_dbs.get(shard)
        if db is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            db = open_span_db(self.dir, shard, threads=self.threads)
            # the spans a process trace gets after it was stored, in arrival order: a
            # long run's per-process traces grow all run, too big to write again
            db.execute("CREATE TABLE IF NOT EXISTS more (id INTEGER PRIMARY KEY, tid TEXT, v BLOB)")
            db.execute("CREATE INDEX IF NOT EXISTS more_tid ON more (tid)")
            self._span_dbs[shard] = db
        return db

    def close(self) -> None:
        if self._db is not None:
            if self._steps_unsaved:
                self._write_steps()
            self._write_skew()
        self._close_dbs()
        self._lease.release()

    def _close_dbs(self) -> None:
        """Close the database connections (each reopens on its next use)."""
        if self._db is not None:
            self._db.close()
            self._db = None
        for db in self._span_dbs.values():
            db.close()
        self._span_dbs = {}

    def _open(self) -> None:
        """Load the kept state (once per process), or start empty. With the collector
        paused (`paused_gc`): 200,000 traces' kept tuples took 6.7 s to load with it
        running, as callers (`stats`) may open the index outside `update`."""
        if self._state is not None:
            return
        with paused_gc():
            try:
                self._load_state()
            except _UNREADABLE as exc:
                # a torn or foreign file (disk full, a copy cut short): built again
                self._reset()
                assert self._state is not None
                self._state.stats.note(f"analysis index unreadable, built again: {exc}")

    def needs_build(self) -> bool:
        """Whether the next `update` builds the index from nothing (`build_reason`)."""
        return bool(self.build_reason())

    def parallel_pays(self) -> bool:
        """Whether a cold build of these paths pays for a worker per core."""
        return parallel_pays(FileSource(*self.paths).files())

    def build_reason(self) -> str:
        """Why the next `update` builds the index from nothing, in words ("" when it
        does not): none yet, or one of other paths, of other code, or over a file that
        shrank or was replaced; the line saying a build starts says which. A look at its
        database, nothing loaded or reset, and no connection left open (another process
        may build it meanwhile, as the console has it done: `index_child`)."""
        if self._state is not None:  # opened: the reset said why
            return self._why_built if self.rebuilt and not self._state.files else ""
        try:
            return self._saved()[1]
        except _UNREADABLE:
            return "the one there was unreadable"
        finally:
            self._close_dbs()

    def _saved(self) -> tuple[_State | None, str]:
        """The state the database holds if it is still this index's, else None and why
        not (`build_reason`)."""
        row = self._connect().execute("SELECT v FROM meta WHERE k = 'state'").fetchone()
        if row is None:
            return None, NO_INDEX_YET
        try:
            fmt, state = pickle.loads(row[0])
        except Exception:  # an unreadable index is rebuilt, never fatal
            return None, "the one there was unreadable"
        if fmt != format_key():
            return None, "the one there was made by another version of the analysis or other tuning"
        if state.paths != self._path_key():
            return None, f"the one there was of other traces: {', '.join(state.paths)}"
        if self._stale(state):
            return None, "a trace file it had read shrank, vanished or was replaced"
        return state, ""

    def _load_state(self) -> None:
        db = self._connect()
        state, why = self._saved()
        if state is None:
            self._reset()
            self._why_built = why
            return
        kept: dict[str, Kept] = {}
        load = Kept.load
        q = "SELECT seg, v, 0 FROM kept UNION ALL SELECT seg, v, 1 FROM tpots ORDER BY 1, 3"
        for _seg, blob, only_tpot in db.execute(q):
            if only_tpot:
                for tid, tpot in marshal.loads(blob).items():
                    kept[tid].tpot = tpot
            else:
                kept.update({tid: load(t) for tid, t in marshal.loads(blob).items()})
        self._state, self._kept = state, kept
        self._slots = None
        kept_skew = self._stored_key("skew") == state.facts_version
        self._skew_written = (state.facts_version, time.monotonic()) if kept_skew else None
        self._delta = StepDelta(state.process_version)
        self._index_resources()
        self.rebuilt = False
        try:  # "last used" for `tracedpush index` (a warm open may write nothing)
            os.utime(self.dir / _DB)
        except OSError:  # not ours to stamp: its files' times tell
            pass

    def _reset(self) -> None:
        """Start empty: every file of the index goes (deleting the rows of 200,000
        traces took 4-7 s; and a cold build interrupted leaves span databases written
        without a journal, `index_store.open_span_db`)."""
        self._close_dbs()
        for f in own_files(self.dir):
            f.unlink(missing_ok=True)
        self._state = _State(self._path_key())
        self._kept = {}
        self._steps = None
        self._tpot = None
        self._step_cache = StepCache()
        self._delta = StepDelta(0)
        self._ids = {}
        self._steps_unsaved = False
        self._steps_written = time.monotonic()
        self._derived = None
        self._slots = None
        self._skew_written = None
        self._index_resources()
        self.rebuilt = True
        self._why_built = NO_INDEX_YET  # `build_reason` (`_load_state` may say more)

    def _path_key(self) -> list[str]:
        return [str(p.resolve()) for p in self.paths]

    @staticmethod
    def _stale(state: _State) -> bool:
        """A known file shrank, vanished or was replaced: its old spans may be gone."""
        for name, (ino, _offset, _pend, size, _mt, _whole, _ok) in state.files.items():
            try:
                info = os.stat(name)
            except OSError:
                return True
            if info.st_ino != ino or info.st_size < size:
                return True
        return False

    def _index_resources(self) -> None:
        assert self._state is not None
        res = self._state.resources
        self._res_ix = {id(r): i for i, r in enumerate(res)}
        self._res_key = {(r.service, r.instance, r.host, r.pid): i for i, r in enumerate(res)}

    def _resource(self, r: Resource) -> int:
        """Position of `r` (by `Decoder`'s interning key) in the kept resources; only
        the kept objects are remembered by id (a later decoder's may reuse a freed id)."""
        assert self._state is not None
        kept = self._state.resources
        i = self._res_ix.get(id(r))
        if i is not None and kept[i] is r:
            return i
        key = (r.service, r.instance, r.host, r.pid)
        i = self._res_key.get(key)
        if i is None:
            i = len(kept)
            kept.append(r)
            self._res_key[key] = i
            self._res_ix[id(r)] = i
        return i

    def _load_spans(self, tids: Sequence[str]) -> dict[str, list[Span]]:
        """Each trace's spans in arrival order: its stored ones, then any it got later."""
        assert self._state is not None
        res = self._state.resources
        out: dict[str, list[Span]] = {}
        for some, db in self._shard_dbs(tids):
            for tid, blob in _select(db, "spans", some):
                out[tid] = unpack(tid, blob, res)
            for tid, blob in _select(db, "more", some, order="id"):
                out.setdefault(tid, []).extend(unpack(tid, blob, res))
        return out

    def _shard_dbs(self, tids: Iterable[str]) -> list[tuple[list[str], sqlite3.Connection]]:
        return [(some, self.span_db(shard)) for shard, some in _by_shard(tids).items()]

    def _load_results(
        self, want: dict[str, Kept], resources: list[Resource]
    ) -> dict[str, RequestAnalysis]:
        """The results of `want` (trace id -> its `Kept`), each shard read with its own
        connection (the console's pages read them from their own threads, also after
        `close`). The cold build stores none (`index_build`): such a result is made
        again from the trace's stored spans with the offsets its row was made with
        (`Kept.offsets`), which is the result the build made. `resources`: the state's
        when the snapshot asking was made (a stored span names its resource by place)."""
        out: dict[str, RequestAnalysis] = {}
        number = {id(r): i for i, r in enumerate(resources)}
        for shard, some in _by_shard(want).items():
            db = open_span_db(self.dir, shard)
            try:
                out.update((tid, load_result(blob)) for tid, blob in _select(db, "results", some))
                # a request's spans are one row (only per-process traces get `more`)
                rows = list(_select(db, "spans", [t for t in some if t not in out]))
            finally:
                db.close()
            for tid, blob in rows:
                k = want[tid]
                off = dict(zip(k.facts.res, k.offsets or (), strict=True))
                out[tid] = self._analysed(tid, unpack(tid, blob, resources), off, number)
        return out

    def _analysed(
        self,
        tid: str,
        spans: Iterable[Span],
        offsets: Sequence[int] | Mapping[int, int],
        position: Mapping[int, int],
        with_spans: bool = False,
    ) -> RequestAnalysis:
        """Trace `tid`'s request analysed on its own (the run-wide fields, load first, are
        set afterwards), each resource's clock moved by `offsets[position[id(resource)]]`
        ns. What every path that makes a result does: update, cold build, reads."""
        req = [s for s in spans if s.name not in PROCESS_SPANS]
        off_ns = {id(s.resource): offsets[position[id(s.resource)]] for s in req}
        ix = TraceIndex(tid, req)
        return request_analysis(ix, off_ns, _NO_LOAD, self.buckets, self.load_buckets, with_spans)

    # ------------------------------------------------------------------ reading
    def _read(self, tell: Throttled | None = None) -> list[Span]:
        """New spans at the source, read from where the last update stopped. `tell`: a
        sequential build's progress, in bytes read of the files' sizes."""
        assert self._state is not None
        src = FileSource(*self.paths)
        for name, (_ino, offset, pend, size, mtime, whole, ok) in self._state.files.items():
            src._states[Path(name)] = _FileState(offset, pend, size, mtime, whole, ok)
        new: list[Span] = []
        stats = self._state.stats
        sink = new.append
        if tell is not None:
            total, before = sum(f.stat().st_size for f in src.files()), stats.bytes_read
            tell(READ, 0, total, last=True)

            def sink(span: Span, keep: Callable[[Span], None] = new.append) -> None:
                keep(span)
                if len(new) % _TELL_EVERY == 0:
                    tell(READ, min(stats.bytes_read - before, total), total)

        src.read(Decoder(sink, stats), stats)
        if tell is not None:
            tell(READ, min(stats.bytes_read - before, total), total, last=True)
        self.last_error = src.last_error
        files = {}
        for f, st in src._states.items():
            try:
                ino = f.stat().st_ino
            except OSError:
                continue
            files[str(f)] = (
                ino,
                st.offset,
                st.pending,
                st.size,
                st.mtime_ns,
                st.whole,
                st.lines_ok,
            )
        self._state.files = files
        return new

    def _build(self) -> bool:
        """A cold build on every core when it pays (see `index_build`); on any failure
        the index is emptied again and the sequential read does it all."""
        from tracedpush.analysis import index_build

        files = FileSource(*self.paths).files()
        parallel = parallel_pays(files) if self.parallel is None else self.parallel
        if not parallel or not index_build.usable(files):
            return False
        for db in self._span_dbs.values():  # the workers write these
            db.close()
        self._span_dbs = {}
        try:
            return index_build.build(self, files, SHARDS)
        except Exception as exc:  # the sequential path reads it all instead
            self._reset()
            assert self._state is not None
            self._state.stats.note(f"parallel index build failed, read sequentially: {exc}")
            return False

    # ------------------------------------------------------------------ update
    def update(self, reanalyse_at_most: int | None = None) -> RunAnalysis:
        """Read what is new, re-analyse what it changed, return the whole run.

        `reanalyse_at_most`: when the clock offsets moved, analyse again at most that
        many of the earlier requests they moved (newest first; the new spans' requests
        always), leaving the rest to later updates (`behind`), so that a Live refresh
        never costs a minute. None: all of them (`analyze()`'s results at once)."""
        self._budget = reanalyse_at_most
        self._lease.hold()  # (touched at most once a minute)
        with paused_gc():
            return self._update()

    @property
    def behind(self) -> int:
        """Requests whose kept result was made with older clock offsets than the run's
        (an update with `reanalyse_at_most` left them; the next updates catch up)."""
        return 0 if self._state is None else self._state.behind

    def _update(self) -> RunAnalysis:
        self._open()
        building = self.needs_build()
        built = building and self._build()
        state = self._state  # a build that failed started the index again (`_reset`)
        assert state is not None
        # a build in this process tells its progress too (the parallel one: `index_build`)
        progress = self.progress if building and not built else None
        tell = Throttled(progress) if progress is not None else None
        new = [] if built else self._read(tell)  # a build read it all: this is one refresh
        self.last_new = 0
        by_trace: dict[str, list[Span]] = {}
        for s in new:
            lst = by_trace.get(s.trace_id)
            if lst is None:
                by_trace[s.trace_id] = [s]
            else:
                lst.append(s)
        grow = {t for t, news in by_trace.items() if self._grows(t, news)}
        old = self._load_spans([t for t in by_trace if t in self._kept and t not in grow])
        changed: dict[str, list[Span]] = {}
        db = self._connect()
        fresh = not state.segments and _journal(db, "DELETE")  # see `_journal`
        db.execute("BEGIN")
        rows: dict[int, list[tuple[str, bytes]]] = {}
        more: dict[int, list[tuple[str, bytes]]] = {}
        for tid in grow:  # only its new spans are stored, parsed, counted
            added = self._grow(tid, by_trace.pop(tid))
            if added:
                changed[tid] = added
                more.setdefault(shard_of(tid), []).append((tid, pack(added, self._res_ix)))
        traces = len(by_trace)
        if tell is not None:
            tell(STORE, 0, traces, last=True)
        for done, (tid, news) in enumerate(by_trace.items(), 1):
            if tell is not None and done % _TELL_EVERY == 0:
                tell(STORE, done, traces)
            spans = {s.span_id: s for s in old.get(tid, ())}
            added = 0
            for s in news:
                if s.span_id in spans:
                    state.stats.duplicates += 1
                    continue
                # one Resource object per key, as within one store: offsets go by id
                s.resource = state.resources[self._resource(s.resource)]
                spans[s.span_id] = s
                added += 1
            state.stats.spans += added
            self.last_new += added
            if not added:
                continue
            merged = list(spans.values())
            changed[tid] = merged
            k = self._kept.get(tid)
            if k is not None and k.facts.process:  # its old steps would have to go
                self._delta.spoil()
            else:
                self._delta.add(s for s in merged if s.name in PROCESS_SPANS)
            rows.setdefault(shard_of(tid), []).append((tid, pack(merged, self._res_ix)))
            self._step_cache.drop(tid)
            self._ids.pop(tid, None)
        for shard in rows.keys() | more.keys():  # committed before the state counting them
            with self.span_db(shard) as sdb:
                some = rows.get(shard, [])
                sdb.executemany("INSERT OR REPLACE INTO spans (tid, v) VALUES (?, ?)", some)
                sdb.executemany("DELETE FROM more WHERE tid = ?", [(t,) for t, _v in some])
                sdb.executemany("INSERT INTO more (tid, v) VALUES (?, ?)", more.get(shard, []))
        if tell is not None:  # stored
            tell(STORE, traces, traces, last=True)
        for tid, spans in changed.items():
            if tid in grow:
                continue
            k = self._kept.get(tid)
            seq = k.facts.seq if k is not None else state.next_seq
            if k is None:
                state.next_seq += 1
            self._kept[tid] = Kept(self._facts(tid, spans, seq))
        if any(self._kept[t].facts.process for t in changed):
            state.process_version += 1
        run = self._analyse(changed, tell)
        if changed:
            state.facts_version += 1
        self._save(changed)
        db.execute("COMMIT")
        if fresh:
            _journal(db, "WAL")
        # a Live index is seldom closed: it writes its steps and skew evidence when
        # traffic pauses, and at least every STEPS_WRITE_S
        now = time.monotonic()
        if self._steps_unsaved and (not changed or now - self._steps_written > STEPS_WRITE_S):
            self._write_steps()
        if not changed or self._skew_written is None or now - self._skew_written[1] > STEPS_WRITE_S:
            self._write_skew()
        self.run = run
        return run

    def _grows(self, tid: str, news: list[Span]) -> bool:
        """A kept trace of per-process spans only, getting more of them: it keeps its
        stored spans and gets the new ones beside them (`_grow`)."""
        k = self._kept.get(tid)
        return (
            k is not None
            and k.facts.process
            and not k.facts.res
            and all(s.name in PROCESS_SPANS for s in news)
        )

    def _grow(self, tid: str, news: list[Span]) -> list[Span]:
        """The spans of `news` the trace does not have yet (counted, facts updated)."""
        state = self._state
        assert state is not None
        ids = self._ids.get(tid)
        if ids is None:  # once per trace and index object: its ids, from its spans
            ids = self._ids[tid] = {s.span_id for s in self._load_spans([tid]).get(tid, ())}
        added = []
        for s in news:
            if s.span_id in ids:
                state.stats.duplicates += 1
                continue
            ids.add(s.span_id)
            s.resource = state.resources[self._resource(s.resource)]
            added.append(s)
        state.stats.spans += len(added)
        self.last_new += len(added)
        self._kept[tid].facts.spans += len(added)
        self._step_cache.add(tid, added)
        self._delta.add(added)
        return added

    def _facts(self, tid: str, spans: list[Span], seq: int) -> TraceFacts:
        req = [s for s in spans if s.name not in PROCESS_SPANS]
        facts = TraceFacts(seq, process=len(req) != len(spans), spans=len(spans))
        if not req:
            return facts
        ix = TraceIndex(tid, req)
        counts: dict[int, int] = {}
        for s in req:
            r = self._resource(s.resource)
            counts[r] = counts.get(r, 0) + 1
        facts.res = tuple(counts)
        facts.durations = marshal.dumps(
            tuple(
                (s.name, (s.end_ns - s.start_ns) / 1e6)
                for s in sorted(req, key=lambda s: s.start_ns)
            )
        )
        facts.res_counts = tuple(counts.values())
        root = ix.root
        if root is not None:
            facts.root_res = self._resource(root.resource)
            facts.root_iv = (root.start_ns, root.end_ns)
            facts.engine = tpot.decode_engine(ix)
        facts.pairs = tuple(
            (self._resource(a.resource), self._resource(b.resource), tb - ta)
            for a, ta, b, tb in skew.causal_pairs(ix)
        )
        return facts

    def _offsets(self, order: list[tuple[str, Kept]]) -> tuple[dict[str, ClockOffset], dict]:
        """The run's clock offsets from the kept pairs of `order` (every trace), for
        `index_build`, which asks before the results exist: the slots are kept, and it
        puts the results in them when they come (`_built`)."""
        state = self._state
        assert state is not None
        slots = self._slots = TraceSlots(self.buckets, self.load_buckets)
        slots.put_facts(order)
        state.offsets = (self.skew_policy, *slots.offsets(state.resources, self.skew_policy))
        return state.offsets[1], state.offsets[2]

    def _applied(
        self, offsets: dict[str, ClockOffset], label: dict[int, str]
    ) -> tuple[dict[str, float], list[int]]:
        """The offsets as applied: ms per clock domain (0 where skew is not corrected),
        and ns per resource (`label`: each resource's domain)."""
        assert self._state is not None
        applied = {x: (o.offset_ms if self.correct_skew else 0.0) for x, o in offsets.items()}
        off = [0] * len(self._state.resources)
        for i, lab in label.items():
            off[i] = round(applied.get(lab, 0.0) * 1e6)
        return applied, off

    def _built(self, off: list[int]) -> None:
        """`index_build` has every result's row and TPOT breakdown (made with the offsets
        `_offsets` gave, `off` ns per resource): the slots get them, as `_trace_slots`
        would make them, and `_analyse` finds nothing stale."""
        state = self._state
        assert state is not None and self._slots is not None
        self._slots.put_rows(list(self._kept.items()))
        self._slots.put_tpot([k for _t, k in self._slots.requests()])
        state.off = off

    def _trace_slots(self, changed: dict[str, list[Span]]) -> TraceSlots:
        """The kept traces by slot with the changed ones written: made from every kept
        trace when the index was just opened or built, else updated."""
        slots = self._slots
        if slots is None:
            slots = self._slots = TraceSlots(self.buckets, self.load_buckets)
            everything = list(self._kept.items())
            slots.put_facts(everything)
            slots.put_rows(everything)
            slots.put_tpot([k for _t, k in slots.requests()])
            version = self._state.facts_version  # type: ignore[union-attr]
            slots.kept_evidence(lambda: self._stored_value("skew", version))
        # just made: written again, so that the kept evidence (of the facts before this
        # update) gets the changed traces' when it is used
        slots.put_facts([(t, self._kept[t]) for t in changed])
        return slots

    def _analyse(
        self, changed: dict[str, list[Span]], tell: Throttled | None = None
    ) -> RunAnalysis:
        state = self._state
        assert state is not None
        if tell is not None:
            tell(OFFSETS, 0, 0, last=True)
        slots = self._trace_slots(changed)
        if changed or state.offsets is None or state.offsets[0] != self.skew_policy:
            state.offsets = (self.skew_policy, *slots.offsets(state.resources, self.skew_policy))
        offsets, label = state.offsets[1], state.offsets[2]
        applied, off = self._applied(offsets, label)
        self._off_ns = off
        # every kept result has these offsets (resources new since the last update are
        # only in traces that changed): only new spans count
        held = state.off is not None and off[: len(state.off)] == state.off
        if held and (not state.behind or self._left):
            stale = [tid for tid in changed if self._kept[tid].facts.res]
            stale.sort(key=lambda t: self._kept[t].facts.seq)
            if state.behind:  # the offsets held since the update that left these behind:
                # they alone are stale, no scan of every trace (0.4 s at 200,000 requests,
                # every refresh until they are caught up)
                stale += [t for t in self._left if t not in changed]
                stale = self._within_budget(stale, changed)
            else:
                self._left = set()
        else:
            stale = [
                tid
                for tid, k in slots.traces()
                if k.facts.res
                and (tid in changed or k.offsets != tuple(off[r] for r in k.facts.res))
            ]
            stale = self._within_budget(stale, changed)
        state.off = off
        need = [t for t in stale if t not in changed]
        spans_of = {**self._load_spans(need), **changed} if need else changed
        if tell is not None:
            tell(ANALYSE, 0, len(stale), last=True)
        for done, tid in enumerate(stale, 1):
            k = self._kept[tid]
            k.result = self._analysed(tid, spans_of[tid], off, self._res_ix)
            k.row = row_of(k.result)
            k.offsets = tuple(off[r] for r in k.facts.res)
            if tell is not None and (done % _TELL_EVERY == 0 or done == len(stale)):
                tell(ANALYSE, done, len(stale), last=done == len(stale))
        self.last_reanalysed = len(stale)
        self._stale_saved = stale
        slots.put_rows([(t, self._kept[t]) for t in stale])
        # TPOT breakdowns hold while the engine steps and offsets do: new results need
        # one, and those whose decode window meets steps that changed (`index_steps`)
        steps_key = self._steps_key(applied)
        before = self._tpot_before(steps_key)
        engine_steps = self._engine_steps(label, applied)
        redo_all = False
        todo = [(t, self._kept[t]) for t in stale]
        if state.tpot_key != steps_key:
            now = self._tpot_steps(steps_key, engine_steps)
            where = None if before is None else changed_windows(before, now)
            # the requests left behind on older offsets keep theirs until their turn
            left = self._left
            redo_all = where is None and not left
            if where is None:
                todo = [(t, k) for t, k in slots.requests() if t not in left]
            elif where:
                skip = left.union(stale)
                meet = slots.meeting(where, off, now.arrays.keys())
                again = [(t, k) for t, k in slots.at(meet) if t not in skip]
                if not left and len(again) * 2 > len(self._kept):  # most earlier ones (a run
                    # of one solo epoch): all, saved in place of every earlier breakdown
                    todo, redo_all = list(slots.requests()), True
                else:
                    todo += again
        self.last_tpot_redone = len(todo)
        self._tpot_saved = [t for t, _k in todo]
        # what TPOT breakdowns need of the steps is kept beside them
        got = split_tpot(
            ((t, k.row, k.facts) for t, k in todo),  # type: ignore[arg-type]
            off,
            lambda: self._tpot_steps(steps_key, engine_steps),
        )
        for tid, k in todo:
            k.tpot = got[tid]
        slots.put_tpot([k for _t, k in todo])
        self._save_all = redo_all
        state.tpot_key = steps_key
        self.last_rows_written = len(slots.touched)
        slots.touched.clear()
        # the requests in `analyze`'s order, each's `Kept` and TPOT breakdown as of now
        order, cols = slots.run_columns()
        kept, tpots = slots.kept[order], slots.tpot[order]
        resources = state.resources

        def results(positions: list[int], keep: bool = True) -> list[RequestAnalysis]:
            """The requests at `positions`, with this update's run-wide fields; each made
            is kept (`Kept.result`) unless not to `keep` (`LazyRequests.stream`)."""
            ids = cols.trace_id
            got = self._load_results(
                {ids[i]: kept[i] for i in positions if kept[i].result is None}, resources
            )
            out = []
            for i in positions:
                k = kept[i]
                r = k.result
                if r is None:
                    r = got[ids[i]]
                    if keep:
                        k.result = r
                r.load, r.load_bucket, r.bucket = cols.load[i], cols.load_bucket[i], cols.bucket[i]
                r.tpot_breakdown_ms = tpots[i]
                out.append(r)
            return out

        def spanned(positions: list[int]) -> list[RequestAnalysis]:
            """The requests at `positions` with their span views, run-wide fields as in
            `results` (made from their spans, never first without them)."""
            c = cols
            got = [
                (c.trace_id[i], c.load[i], c.load_bucket[i], c.bucket[i], tpots[i])
                for i in positions
            ]
            return self._spanned(got)

        lazy = LazyRequests(len(order), results, functools.partial(results, keep=False))
        self._spanned_of = (lazy, spanned)
        return RunAnalysis(
            requests=lazy,  # type: ignore[arg-type]
            clock_offsets=offsets,
            clock_windows=state.offsets[3],
            stats=state.stats,
            skew_corrected=self.correct_skew,
            skew_policy=self.skew_policy,
            buckets=self.buckets,
            load_buckets=self.load_buckets,
            source=", ".join(str(p) for p in self.paths),
            engine_steps=engine_steps,
            _columns=cols,
        )

    def _within_budget(self, stale: list[str], changed: dict[str, list[Span]]) -> list[str]:
        """`stale` cut to `update`'s budget: every changed trace, and at most the budget
        of the others, newest first; `state.behind` counts the ones left (`_left`)."""
        state = self._state
        assert state is not None
        state.behind = 0
        self._left = set()
        budget = self._budget
        if budget is None:
            return stale
        moved = [t for t in stale if t not in changed]
        if len(moved) <= budget:
            return stale
        moved.sort(key=lambda t: self._kept[t].facts.seq, reverse=True)
        state.behind = len(moved) - budget
        self._left = set(moved[budget:])
        return [t for t in stale if t in changed] + moved[:budget]

    def _engine_steps(
        self, label: dict[int, str], applied: dict[str, float]
    ) -> steps_mod.EngineSteps | LazySteps:
        """The run's engine steps on the proxy clock, kept until per-process spans arrive
        or the offsets move (parsing every step again cost more than a warm report);
        then the new spans are joined into them (`EngineSteps.extended`), or, where that
        is not exact, every kept process span is. Kept ones are read when used: their
        summary and contention are kept beside them (reading them back cost a report on
        200,000 requests 7 s of CPU and 2.7 GB)."""
        state = self._state
        assert state is not None
        key = self._steps_key(applied)
        delta, self._delta = self._delta, StepDelta(state.process_version)
        self.last_steps = "kept"
        if self._steps is not None and self._steps[0] == key and self._derived is not None:
            placed, (_key, truthy, summary) = self._steps[1], self._derived
            return LazySteps(lambda: placed, truthy, summary)
        derived = self._stored("steps_derived", key)
        if derived is not None:
            self._derived = derived
            return LazySteps(lambda: self._kept_steps(key, label, applied), derived[1], derived[2])
        was = None if delta.spans is None else self._steps_at(delta.base)
        got = None if was is None else was.extended(delta.parts(), self._used(label), applied)
        if got is None:
            got = self._joined(label, applied)
            self.last_steps = "joined"
        else:  # every trace's parsed parts (600 MB at 200,000 requests) are not needed
            self._step_cache = StepCache()
            self.last_steps = "extended"
        return self._keep_steps(got, key)

    def _steps_key(self, applied: dict[str, float]) -> tuple[int, list[tuple[str, float]]]:
        """What the run's steps, as placed, are made of: the process spans so far (their
        version) and the offsets applied."""
        assert self._state is not None
        return (self._state.process_version, sorted(applied.items()))

    def _used(self, label: dict[int, str]) -> list[Resource]:
        """The resources the offsets were estimated over (their clock domains)."""
        assert self._state is not None
        return [self._state.resources[i] for i in label]

    def _joined(self, label: dict[int, str], applied: dict[str, float]) -> steps_mod.EngineSteps:
        """Every process span's steps joined and placed (`StepCache`: each trace parsed once)."""
        return self._parts().placed(self._used(label), applied)

    def _steps_at(self, version: int) -> steps_mod.EngineSteps | None:
        """The steps made at this process version, with whatever offsets (to extend)."""
        if self._steps is not None and self._steps[0][0] == version:
            return self._steps[1]
        key = self._stored_key("steps")
        kept = None if key is None or key[0] != version else self._stored("steps", key)
        return None if kept is None else kept[1]

    def _stored_key(self, name: str) -> Any:
        """The key the value kept under `name` was made for (without reading it: the
        steps are 600 MB at 200,000 requests)."""
        row = self._connect().execute("SELECT v FROM meta WHERE k = ?", (f"{name}.key",))
        got = row.fetchone()
        return None if got is None else pickle.loads(got[0])

    def _stored(self, name: str, key: Any) -> Any:
        """The value kept under `name` beside the key it was made for, if that is `key`."""
        if self._stored_key(name) != key:
            return None
        if name in _FILES:
            try:
                with (self.dir / _FILES[name]).open("rb") as fh:
                    kept = pickle.load(fh)
            except Exception:  # gone or torn: made again (as an unreadable index is)
                kept = None
        else:
            row = self._connect().execute("SELECT v FROM meta WHERE k = ?", (name,)).fetchone()
            kept = pickle.loads(row[0]) if row is not None else None
        return kept if kept is not None and kept[0] == key else None

    def _stored_value(self, name: str, key: Any) -> Any:
        """What `_stored` keeps beside `key`, without it; None if not kept for `key`."""
        kept = self._stored(name, key)
        return None if kept is None else kept[1]

    def _parts(self) -> steps_mod.StepParts:
        """Every process trace's parsed steps, in first-seen order (parsed once each)."""
        assert self._slots is not None

        def load(tid: str) -> Iterator[Span]:
            return (s for s in self._load_spans([tid]).get(tid, ()) if s.name in PROCESS_SPANS)

        return self._step_cache.merged(self._slots.process_traces(), load)

    def _keep_steps(
        self, placed: steps_mod.EngineSteps, key: Any, *, write: bool = False
    ) -> LazySteps:
        """The run's steps (`key`'s), kept with their summary, contention and TPOT arrays
        (the cold build calls this with `write`: it has the time while its workers
        analyse)."""
        self._steps = (key, placed)
        # made from the last ones where `placed` extends their steps (`TpotSteps`)
        self._tpot = (key, TpotSteps(placed, None if self._tpot is None else self._tpot[1]))
        from tracedpush.analysis.contention import contention

        derived: dict[str, Any] = {}
        self._derived = (key, bool(placed), derived)
        # A Live refresh keeps them in memory: they are written when traffic pauses, at
        # least every STEPS_WRITE_S and on `close`. Their summary and contention are made
        # when a page or report asks (at 200,000 requests: 0.4 s of numpy and 2 s of
        # Python; the console's Live page reads neither), or when they are written.
        self._steps_unsaved = True
        if write:
            derived["summary"] = placed.summary()
            derived["contention"] = contention(placed)
            derived["exports"] = placed.export_health()
            self._write_steps()
        return LazySteps(lambda: placed, bool(placed), derived)  # summarised once

    def _write_steps(self) -> None:
        """The steps, their summary and contention and their TPOT arrays, as kept."""
        from tracedpush.analysis.contention import contention

        if self._steps is None or self._derived is None or self._derived[0] != self._steps[0]:
            return
        key, truthy, derived = self._derived
        if "summary" not in derived:
            derived["summary"] = self._steps[1].summary()
        if "contention" not in derived:
            derived["contention"] = contention(self._steps[1])
        if "exports" not in derived:
            derived["exports"] = self._steps[1].export_health()
        kept = [("steps", self._steps), ("steps_derived", (key, truthy, derived))]
        if self._tpot is not None and self._tpot[0] == key:
            kept.append(("steps_tpot", self._tpot))
        for name, value in kept:
            self._store(name, value)
        self._steps_unsaved = False
        self._steps_written = time.monotonic()

    def _write_skew(self) -> None:
        """The skew evidence, for the facts as saved (their version), if made and not
        written yet: an index opened again takes it (`TraceSlots.kept_evidence`)."""
        state, slots = self._state, self._slots
        got = None if slots is None else slots.made_evidence
        if state is None or got is None:
            return
        if self._skew_written is None or self._skew_written[0] != state.facts_version:
            self._store("skew", (state.facts_version, got))
        self._skew_written = (state.facts_version, time.monotonic())

    def _store(self, name: str, value: tuple[Any, Any]) -> None:
        """Store `value` (its key, what was made for it) under `name`, as `_stored` reads
        it: the value, then its key (a torn write leaves a key that differs); in a file of
        its own for the big ones (`_FILES`)."""
        db = self._connect()
        if name in _FILES:
            tmp = self.dir / f"{_FILES[name]}.tmp"
            with tmp.open("wb") as fh:
                pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.dir / _FILES[name])
        else:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (name, blob))
        key = pickle.dumps(value[0])
        db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (f"{name}.key", key))

    def _tpot_before(self, key: Any) -> TpotSteps | None:
        """The steps the kept TPOT breakdowns were made with, if not `key`'s: what
        `changed_windows` compares the new steps with. Also when the offsets moved: a
        request whose own offsets hold (others are analysed again, or left behind) has
        the same decode window, so only the steps that moved can change its breakdown."""
        state = self._state
        assert state is not None
        was = state.tpot_key
        if was is None or was == key:
            return None
        if self._tpot is not None and self._tpot[0] == was:
            return self._tpot[1]
        kept = self._stored("steps_tpot", was)
        if kept is None:
            return None
        if self._tpot is None:  # just opened: steps extended from these make theirs from
            self._tpot = kept  # them (`TpotSteps`), not from every step (0.6 s at 200,000)
        return kept[1]

    def _tpot_steps(self, key: Any, steps: LazySteps) -> TpotSteps:
        if self._tpot is None or self._tpot[0] != key:
            kept = self._stored("steps_tpot", key)
            if kept is None:  # pragma: no cover - written with the steps
                kept = (key, TpotSteps(steps.get()))
            self._tpot = kept
        return self._tpot[1]

    def _kept_steps(
        self, key: Any, label: dict[int, str], applied: dict[str, float]
    ) -> steps_mod.EngineSteps:
        """The steps made for `key`, from memory or the index; not kept there (no pause,
        no `close` since) or older: parsed."""
        if self._steps is None or self._steps[0] != key:
            kept = self._stored("steps", key)
            if kept is None:
                kept = (key, self._joined(label, applied))
                self._steps_unsaved = True
            self._steps = kept
        return self._steps[1]

    def _save(self, changed: dict[str, list[Span]]) -> None:
        """One segment of what changed (facts, result rows; or only the TPOT breakdown,
        as when an engine's solo cost moved: 4 numbers a trace, not its whole row), and
        the re-analysed results in their span databases; segments are merged when there
        are many."""
        state = self._state
        assert state is not None
        db = self._connect()
        fresh = [(t, self._kept[t].result) for t in self._stale_saved]
        for some, sdb in self._shard_dbs([t for t, r in fresh if r is not None]):
            with sdb:
                sdb.executemany(
                    "INSERT OR REPLACE INTO results (tid, v) VALUES (?, ?)",
                    ((t, dump_result(self._kept[t].result)) for t in some),  # type: ignore[arg-type]
                )
        whole = set(changed) | set(self._stale_saved)  # kept rows that changed
        tpots = [t for t in self._tpot_saved if t not in whole]  # only their breakdown
        if whole or tpots or not state.segments:
            again = self._rewritten(db, whole, tpots)
            part: Collection[str]
            if again is None:  # a segment after the others
                part, seg = whole, state.segments
                if self._save_all:
                    db.execute("DELETE FROM tpots")
            else:  # the segments from `seg` on, written again as one
                part, tpots, seg = again
            if self._save_all:  # every breakdown redone: these replace all before
                inside = part if isinstance(part, set | dict) else set(part)
                tpots = [t for t in self._kept if t not in inside]
            # the durations first: kept only in the rows about to go, after a warm open
            durations = {t: self._durations_packed(t) for t in part}
            if again is not None:
                for table in ("kept", "durations", "tpots"):
                    db.execute(f"DELETE FROM {table} WHERE seg >= ?", (seg,))
            if part:  # one blob at a time (124 + 54 MB at 200,000 requests)
                q = "INSERT INTO durations (seg, v) VALUES (?, ?)"
                db.execute(q, (seg, marshal.dumps(durations)))
                del durations
                kept = marshal.dumps({t: self._kept[t].dump() for t in part})
                db.execute("INSERT INTO kept (seg, v) VALUES (?, ?)", (seg, kept))
                del kept
            if tpots:  # breakdowns redone alone (a solo cost moved): 4 numbers a trace
                blob = marshal.dumps({t: self._kept[t].tpot for t in tpots})
                db.execute("INSERT INTO tpots (seg, v) VALUES (?, ?)", (seg, blob))
            state.segments = seg + 1
        db.execute(
            "INSERT OR REPLACE INTO meta (k, v) VALUES ('state', ?)",
            (pickle.dumps((format_key(), state), protocol=pickle.HIGHEST_PROTOCOL),),
        )

    def _rewritten(
        self, db: sqlite3.Connection, whole: set[str], tpots: list[str]
    ) -> tuple[Collection[str], list[str], int] | None:
        """What this save writes again as one segment (the traces whose rows it writes,
        those whose TPOT breakdown alone) and from which segment on; None when it appends
        one. Every trace's row from segment 0: the first save, or more than half the
        traces' rows changed. At `_COMPACT_AFTER` segments, the rows of the segments
        after the first and this save's, the breakdowns of theirs (as they are now), from
        segment 1: a Live refresh that merges them does work in proportion to what
        changed since segment 0 was written, not to the run, until half the rows have
        (then every row: each whole rewrite follows at least half as many changed rows;
        an update whose clock offsets moved redoes every breakdown, 4 numbers a trace)."""
        state = self._state
        assert state is not None
        n = len(self._kept)
        if not state.segments or len(whole) * 2 > n:
            return self._kept, [], 0
        if state.segments < _COMPACT_AFTER:
            return None
        rows, alone = set(whole), set(tpots)
        for table, into in (("kept", rows), ("tpots", alone)):
            for (blob,) in db.execute(f"SELECT v FROM {table} WHERE seg > 0"):
                into.update(marshal.loads(blob))
        if len(rows) * 2 > n:
            return self._kept, [], 0
        # in the kept order, as a whole write
        alone = {t for t in alone if t not in rows and t in self._kept}
        return [t for t in self._kept if t in rows], [t for t in self._kept if t in alone], 1

    # ------------------------------------------------------------------ access
    @property
    def stats(self) -> LoadStats:
        self._open()
        assert self._state is not None
        return self._state.stats

    def describe(self) -> str:
        return ", ".join(str(p) for p in self.paths)

    def spans(self, trace_id: str) -> list[Span]:
        """Every kept span of one trace (request and per-process), in arrival order."""
        self._open()
        return self._load_spans([trace_id]).get(trace_id, [])

    def request(self, key: str) -> RequestAnalysis | None:
        """One request with its span views (``analyze(spans=True)``'s), by trace or
        request id, from the last `update`."""
        if self.run is None:
            self.update()
        assert self.run is not None
        found = self.run.get(key)
        if found is None:
            return None
        return self.with_spans([found])[0]

    def with_spans(self, requests: Sequence[RequestAnalysis]) -> Sequence[RequestAnalysis]:
        """Copies of `requests` (from the last `update`) with span views and lanes. The
        last update's requests as a whole (`report --spans`, Perfetto) stay lazy: each is
        made with its spans when read, once, and not first without them. Some of them
        read lazily (`RunAnalysis.subset`: a time window) stay lazy too, made a batch at
        a time (`made_with`)."""
        if self._spanned_of is not None and requests is self._spanned_of[0]:
            return LazyRequests(len(requests), self._spanned_of[1])
        if isinstance(requests, LazyRequests):
            return made_with(requests, self.with_spans)
        return self._spanned(
            [(r.trace_id, r.load, r.load_bucket, r.bucket, r.tpot_breakdown_ms) for r in requests]
        )

    def _spanned(
        self, requests: list[tuple[str, int, str, str, dict[str, float] | None]]
    ) -> list[RequestAnalysis]:
        """(trace id, load, load bucket, bucket, TPOT breakdown) -> the request analysed
        with its spans (the current offsets) and those run-wide fields."""
        loaded = self._load_spans([tid for tid, *_ in requests])
        out = []
        for tid, load, load_bucket, bucket, breakdown in requests:
            full = self._analysed(tid, loaded.get(tid, ()), self._off_ns, self._res_ix, True)
            full.load, full.load_bucket, full.bucket = load, load_bucket, bucket
            full.tpot_breakdown_ms = breakdown
            out.append(full)
        return out

    def span_durations(
        self, requests: Iterable[RequestAnalysis]
    ) -> list[tuple[str, str, str, str, float]]:
        """(trace id, request id, mode, span name, ms) of every span of `requests`, from
        the kept facts: what ``r.spans`` would give, without reading a span."""
        out = []
        for r in requests:
            if r.trace_id in self._kept:
                tid = r.trace_id
                out += [(tid, r.request_id, r.mode, n, ms) for n, ms in self._durations(tid)]
        return out

    def skew_edges(self) -> skew.Edges:
        """The clock-skew evidence between clock domains the last update estimated the
        offsets from: `skew.collect` of every kept trace, kept between updates."""
        assert self._state is not None and self._state.offsets is not None
        slots = self._slots if self._slots is not None else self._trace_slots({})
        return slots.evidence().edges(self._state.offsets[2])

    def _durations(self, tid: str) -> tuple[tuple[str, float], ...]:
        """(name, ms) of a trace's request spans: made with its facts, else kept."""
        got = self._durations_packed(tid)
        return marshal.loads(got) if got else ()

    def _durations_packed(self, tid: str) -> bytes:
        got = self._kept[tid].facts.durations
        if got:
            return got
        if self._kept_durations is None:
            self._kept_durations = {}
            q = "SELECT v FROM durations ORDER BY seg"
            for (blob,) in self._connect().execute(q):
                self._kept_durations.update(marshal.loads(blob))
        return self._kept_durations.get(tid, b"")

    def __iter__(self) -> Iterator[str]:
        return iter(self._kept)

    def __len__(self) -> int:
        return len(self._kept)


def parallel_pays(files: Sequence[Path]) -> bool:
    """Whether a cold build of `files` pays for a worker per core (`index_build`). Its
    workers are forked: where nothing forks (Windows), a build is sequential, slower
    than reading without an index, so it never pays there."""
    big = sum(f.stat().st_size for f in files) >= PARALLEL_BYTES
    return big and (os.cpu_count() or 1) >= SHARDS and can_fork()


def _journal(db: sqlite3.Connection, mode: str) -> bool:
    """Put the index database in this journal mode; False where it cannot (another
    connection has it open). A new index's first save (every trace's kept rows: 180 MB
    at 200,000 requests) goes through a rollback journal, not the WAL: in WAL mode every
    page is written twice (to the WAL, then into the database when the WAL is
    checkpointed, at the latest on `close`), and in a new database a rollback journal
    holds next to nothing. It returns to WAL (readers beside a writer) after."""
    try:
        got = db.execute(f"PRAGMA journal_mode={mode}").fetchone()
    except sqlite3.OperationalError:
        return False
    return bool(got) and str(got[0]).upper() == mode


def index_run(
    paths: Iterable[str | os.PathLike[str]],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> RunAnalysis:
    """`analyze(TraceStore.from_paths(paths), spans=False)` through the index."""
    idx = AnalysisIndex(paths, index_dir=index_dir, **kwargs)
    try:
        return idx.update()
    finally:
        idx.close()


def _select(
    db: sqlite3.Connection, table: str, tids: Sequence[str], order: str = ""
) -> Iterator[tuple[str, bytes]]:
    """(tid, blob) rows of `table` for `tids` (in batches: SQLite's variable limit)."""
    by = f" ORDER BY {order}" if order else ""
    for i in range(0, len(tids), 500):
        part = tids[i : i + 500]
        marks = ",".join("?" * len(part))
        yield from db.execute(f"SELECT tid, v FROM {table} WHERE tid IN ({marks}){by}", part)


def _by_shard(tids: Iterable[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for tid in tids:
        out.setdefault(shard_of(tid), []).append(tid)
    return out
