"""What the analysis index stores, shared by `index` and its parallel cold build
(`index_build`): per-trace facts, kept results, and span databases by trace id."""

from __future__ import annotations

import marshal
import sqlite3
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path

from tracedpush.analysis.failures import Failure
from tracedpush.analysis.model import Event, Resource, Segment, Span, SpanView
from tracedpush.analysis.results import RequestAnalysis

SHARDS = 2  # span databases, by trace id: the cold build writes one per process


@dataclass(slots=True)
class TraceFacts:
    """What the run-wide steps need of one trace, so they need not read its spans."""

    seq: int  # first-seen order: `analyze` lists traces in the store's insertion order
    res: tuple[int, ...] = ()  # resources of its request spans, in order of appearance
    res_counts: tuple[int, ...] = ()  # request spans per resource (same order)
    root_res: int | None = None
    root_iv: tuple[int, int] | None = None  # raw (start_ns, end_ns) of the proxy's root
    pairs: tuple[tuple[int, int, int], ...] = ()  # (resource a, resource b, slack ns)
    engine: str | None = None  # decode engine (`tpot.decode_engine`)
    process: bool = False  # holds per-process spans (engine.steps, engine.threads)
    spans: int = 0
    # ((name, ms), ...) of each request span by start, in `marshal`: the console's
    # span-duration view (as objects, 1 KB a trace, 200 MB of a 200,000-request build)
    durations: bytes = b""

    def as_tuple(self) -> tuple:
        """The fields in order, for `marshal` (``TraceFacts(*t)`` makes it again)."""
        return (self.seq, self.res, self.res_counts, self.root_res, self.root_iv, self.pairs,
                self.engine, self.process, self.spans, self.durations)  # fmt: skip


@dataclass(slots=True)
class Kept:
    facts: TraceFacts
    offsets: tuple[int, ...] | None = None  # ns offsets of `facts.res` the result used
    # the result's numbers for the run-wide statistics (`columns.Row`; None: no result)
    row: tuple | None = None
    tpot: dict[str, float] | None = None  # its TPOT breakdown (run-wide: engine steps)
    # the result itself: in memory when made or read here, else in its span database's
    # `results` table or, when the cold build made it, made again from the trace's spans
    # with `offsets` (on demand: a warm report reads only the requests it prints)
    result: RequestAnalysis | None = None

    def dump(self) -> tuple:
        """Plain tuples for `marshal` (what a segment of the `kept` table holds)."""
        f = self.facts  # not its span durations: the console reads them (`durations`)
        facts = (f.seq, f.res, f.res_counts, f.root_res, f.root_iv, f.pairs, f.engine,
                 f.process, f.spans)  # fmt: skip
        return (facts, self.offsets, self.row, self.tpot)

    @classmethod
    def load(cls, t: tuple) -> Kept:
        facts, offsets, row, tpot = t
        return cls(TraceFacts(*facts), offsets, row, tpot)


def shard_of(trace_id: str) -> int:
    return zlib.crc32(trace_id.encode()) % SHARDS


def open_span_db(
    directory: Path, shard: int, *, threads: bool = False, bulk: bool = False
) -> sqlite3.Connection:
    """One shard's span database. `bulk`: a cold build's worker filling a new file, with
    no journal and no syncs (each page is written once, not to the WAL and again to the
    database: a build's workers spent a third less system time). A build that fails or
    is killed leaves a file nothing trusts: the index has no state then, and `_reset`
    deletes the file (`index.own_files`)."""
    db = sqlite3.connect(directory / f"spans-{shard}.sqlite", check_same_thread=not threads)
    if bulk:
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
    else:
        wal(db)
        db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS spans (tid TEXT PRIMARY KEY, v BLOB)")
    db.execute("CREATE TABLE IF NOT EXISTS results (tid TEXT PRIMARY KEY, v BLOB)")
    return db


def wal(db: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """Put `db` in WAL mode, waiting up to `wait_s` for other connections. A shard a cold
    build just wrote (journal off, not WAL) is switched by the first reader, which needs
    the file to itself. Two connections switching it together each hold it shared and
    wait for the other, so SQLite fails one at once ("database is locked", its busy
    timeout unused): the two processes of a JSON export did, right after a cold build.
    The one that failed switches (or finds WAL) when it tries again."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


_DB_SUFFIXES = ("", "-wal", "-shm", "-journal")


def db_files(path: Path) -> list[Path]:
    """One SQLite database's file with its WAL, shared-memory and journal files."""
    return [path.with_name(path.name + suffix) for suffix in _DB_SUFFIXES]


def _fields(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


_RESULT = _fields(RequestAnalysis)
_SEGMENT = attrgetter(*_fields(Segment))
_SPAN_VIEW = attrgetter(*_fields(SpanView))
_FAILURE = attrgetter(*_fields(Failure))
_CP, _HIDDEN = _RESULT.index("critical_path"), _RESULT.index("hidden")
_SPANS, _FAILED = _RESULT.index("spans"), _RESULT.index("failure")


def dump_result(r: RequestAnalysis) -> bytes:
    """A result as plain lists and tuples in `marshal` (its fields in order): pickling
    the objects took three times as long (28 us a result, 15% of a build worker's
    analysis). Every field is a str, number, bool, None, or list, tuple or dict of
    them (span views' attributes are OTLP values), which `marshal` keeps exactly."""
    out = [getattr(r, name) for name in _RESULT]
    out[_CP] = list(map(_SEGMENT, r.critical_path))
    out[_HIDDEN] = list(map(_SEGMENT, r.hidden))
    out[_SPANS] = list(map(_SPAN_VIEW, r.spans))
    out[_FAILED] = None if r.failure is None else _FAILURE(r.failure)
    return marshal.dumps(out)


def load_result(blob: bytes) -> RequestAnalysis:
    got = marshal.loads(blob)
    got[_CP] = [Segment(*t) for t in got[_CP]]
    got[_HIDDEN] = [Segment(*t) for t in got[_HIDDEN]]
    got[_SPANS] = [SpanView(*t) for t in got[_SPANS]]
    if got[_FAILED] is not None:
        got[_FAILED] = Failure(*got[_FAILED])
    return RequestAnalysis(*got)


def record(s: Span, res_ix: dict[int, int]) -> tuple:
    """A span as the plain tuple a span database keeps (its trace id is the row's key;
    `otlp_fast.fields` makes the same tuple straight from JSON)."""
    return (
        s.span_id,
        s.parent_id,
        s.name,
        s.kind,
        s.start_ns,
        s.end_ns,
        res_ix[id(s.resource)],
        s.attributes,
        [(e.name, e.time_ns, e.attributes) for e in s.events],
        s.status_code,
        s.status_message,
    )


def pack(spans: Iterable[Span], res_ix: dict[int, int]) -> bytes:
    """A trace's spans, each a `record` in `marshal` (four times quicker than pickle
    here; Python-version specific, hence in `format_key`). One `marshal` per span, so
    the cold build keeps each span packed as it reads it (`pack_packed`), not decoded."""
    return marshal.dumps([marshal.dumps(record(s, res_ix)) for s in spans])


def pack_packed(spans: list[bytes]) -> bytes:
    """`pack` of spans already packed one by one (``marshal.dumps(record(...))``)."""
    return marshal.dumps(spans)


def unpack(tid: str, blob: bytes, resources: list[Resource]) -> list[Span]:
    return spans_of(tid, marshal.loads(blob), resources)


def spans_of(tid: str, packed: Iterable[bytes], resources: list[Resource]) -> list[Span]:
    """The spans of one trace from their packed records (see `pack`)."""
    out = []
    loads, add = marshal.loads, out.append
    for one in packed:
        sid, pid, name, kind, t0, t1, r, attrs, evs, code, msg = loads(one)
        if evs:
            evs = [Event(n, t, a) for n, t, a in evs]
        add(Span(tid, sid, pid, name, kind, t0, t1, resources[r], attrs, evs, code, msg))
    return out
