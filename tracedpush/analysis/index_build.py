"""The index's cold build on every core: one process per span shard (trace id).

Decoding spans and walking critical paths are pure Python, so one process uses one
core. Here each worker (forked, so it starts with the index's settings) scans every
line of every file through a memory map, but cheaply: msgspec reads a line's structure
and leaves each span as raw bytes (``msgspec.Raw``), whose shard is read off its first
key (a plain hex trace id is hashed as it stands). A worker decodes only the spans of
its shard's traces (`otlp_fast`, typed, else `otlp.Decoder`), packs each as its span
database will hold it (`index_store.pack`) and appends it to a spill file, keeping only
its place: a shard of a 200,000-request run is ~1 M spans, several GB as objects, 1.5
GB packed. Then, one trace at a time, it reads the records back, writes them to its
own span database, sends the parent each per-process trace's engine steps parsed into
columns (`steps.StepParts`) as it goes, and then its traces' facts (first-seen
position, causal pairs, ...). The parent estimates the clock offsets from all facts, as
`AnalysisIndex` does, and sends them; each worker reads its requests again and analyses
them with those offsets while the parent joins the run's engine steps from every
worker's parts (in first-seen order, as one reader would) and places them on the proxy
clock; then each worker splits its requests' TPOT over them (`index_steps.split_tpot`)
and sends back the results' rows and breakdowns (not the results: they are made again
from the stored spans when asked for, `AnalysisIndex._load_results`). Each side gives
the heap's free pages back after its big phases (`_trim`): the build's memory is what
the processes hold at once.

How far the build is goes to `AnalysisIndex.progress` when it is set (`report`'s line,
the console's page): the workers send their counts (bytes read, traces stored, traces
analysed) at most twice a second over their pipes (`_report`); the parent sums them
(`_Tally`), in its second phase through a thread that alone reads the pipes while the
parent joins the engine steps (`_Listener`).

Everything counted per line (lines, documents, malformed lines) is counted by worker 0;
spans by the worker of their shard. Lines that are not plain OTLP JSON (another shape, a
bad line) go through `otlp.Decoder` in every worker, each keeping its own shard. Files
that do not start with a whole OTLP line (one pretty-printed document, a torn first
line) leave the build to the sequential path, which knows those cases.

A build stopped (^C, an error, SIGTERM in the console's build child) terminates its
workers, which then end without a word (`_STOP_S`: one that does not is killed). A
parent killed outright (SIGKILL) leaves each worker an EOF or a broken pipe at its next
message to it, and the worker ends then (it holds no other end of the pipes).
"""

from __future__ import annotations

import ctypes
import gc
import json
import marshal
import mmap
import multiprocessing
import pickle
import queue
import re
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from tracedpush.analysis.build_progress import ANALYSE, OFFSETS, READ, STORE, Throttled
from tracedpush.analysis.columns import row_of
from tracedpush.analysis.index_steps import split_tpot
from tracedpush.analysis.index_store import (
    SHARDS,
    Kept,
    TraceFacts,
    open_span_db,
    pack_packed,
    record,
    shard_of,
    spans_of,
)
from tracedpush.analysis.model import LoadStats, Resource, Span
from tracedpush.analysis.otlp import SPAN_ERRORS, Decoder, Malformed, norm_id
from tracedpush.analysis.steps import StepParts

# `idx` below is an `index.AnalysisIndex` (not imported: index imports this module)
AnalysisIndex = Any
try:
    import msgspec

    from tracedpush.analysis import otlp_fast
except ImportError:  # pragma: no cover - the sequential build needs no msgspec
    msgspec = None  # type: ignore[assignment]
    otlp_fast = None  # type: ignore[assignment]

_CHUNK = 8 << 20
_SIZE = (1 << 32) - 1  # a spilled record's size, in its place (see `_Worker.spans`)
_DROP_EVERY = _CHUNK * 4  # bytes of spilled records read between two page drops
_STOP_S = 5.0  # a build stopped (^C, an error): how long a terminated worker may take
_PROGRESS = "progress"  # a worker's message: (_PROGRESS, stage, done, total)
_REPORT_EVERY = 256  # traces between two looks at the clock (at each: 0.1 s a worker)
WORKER_PEAK_KB: list[int] = []  # the last build's workers' peak RSS (benchmarks read it)
# and their CPU seconds: (read, store spans and facts, analyse)
WORKER_CPU: list[tuple[float, float, float]] = []
# and its timeline: Unix time at its start and as each of its stretches ended (`TIMELINE`:
# the workers read and stored; the parent estimated the offsets, alone; the parent joined
# the engine steps while the workers analysed (`workers_analysed`: when the later of the
# two was ready to split TPOT, which needs those steps; if before `steps`, it waited); every
# worker's rows were in their slots; the build's own state was kept). What follows (the
# save, the report) is the caller's.
BUILD_TIMES: dict[str, float] = {}
TIMELINE = ("start", "read_store", "offsets", "steps", "workers_analysed", "analysed", "built")
_TID_PREFIX = b'{"traceId":"'
# a span that starts with a plain lowercase hex trace id (its shard is read off it)
_PLAIN_TID = re.compile(rb'\{"traceId":"([0-9a-f]{32})"')


def usable(files: Sequence[Path]) -> bool:
    """Whether the parallel build applies: msgspec, and every file starts with a whole
    line holding an OTLP ``TracesData`` (else the sequential path's rules are needed)."""
    if msgspec is None or not files:
        return False
    for f in files:
        with f.open("rb") as fh:
            first = fh.readline()
        if not first.endswith(b"\n"):
            return False
        try:
            doc = json.loads(first)
        except ValueError:
            return False
        if not isinstance(doc, dict) or "resourceSpans" not in doc:
            return False
    return True


def _trace_id(raw: bytes) -> str:
    """The normalised trace id of a raw span ("" when it has none that decodes)."""
    if raw.startswith(_TID_PREFIX):
        end = raw.find(b'"', len(_TID_PREFIX))
        tid: Any = raw[len(_TID_PREFIX) : end].decode()
    else:
        try:
            doc = json.loads(raw)
            tid = doc.get("traceId") if isinstance(doc, dict) else None
        except ValueError:
            return ""
    if not isinstance(tid, str):
        return ""
    if len(tid) == 32:
        return tid.lower()
    try:
        return norm_id(tid, 16)
    except Malformed:
        return ""


def _report(conn: Connection | None) -> Callable[..., None]:
    """A worker's progress to the parent (`build_progress.Throttled`), nothing when the
    parent has nobody to tell."""
    if conn is None:
        return lambda *_a, **_k: None
    return Throttled(lambda *got: conn.send_bytes(pickle.dumps((_PROGRESS, *got))))


class _Tally:
    """The parent's side: each stage's counts summed over the workers, passed on."""

    def __init__(self, progress: Any, pipes: list[Connection]) -> None:
        self.progress = progress
        self.shard = {c: i for i, c in enumerate(pipes)}
        self.counts: dict[tuple[str, int], tuple[int, int]] = {}

    def stage(self, name: str) -> None:
        if self.progress is not None:
            self.progress(name, 0, 0)

    def heard(self, c: Connection, got: tuple) -> None:
        _, stage, done, total = got
        self.counts[stage, self.shard[c]] = (done, total)
        mine = [v for (st, _), v in self.counts.items() if st == stage]
        # a stage's counts once every worker has said its total (each does as it starts
        # the stage), not half of them first; reading is worker 0's alone
        if self.progress is not None and len(mine) >= (1 if stage == READ else len(self.shard)):
            self.progress(stage, sum(d for d, _ in mine), sum(t for _, t in mine))


class _Listener(threading.Thread):
    """The second phase's reader of the workers' pipes: the parent joins the engine
    steps meanwhile (10-20 s at 200,000 requests, in calls that cannot stop to read), so
    without it the workers' analysis progress came in one burst at the end. Each
    worker's reply (or the error reading it) waits in `reply`. Only this thread reads
    the pipes then; the parent only writes to them (a pipe's two directions are apart)."""

    def __init__(self, tally: _Tally, pipes: list[Connection]) -> None:
        super().__init__(name="index-build-listener", daemon=True)
        self.tally = tally
        self.pending = list(pipes)
        self.replies: dict[Connection, queue.SimpleQueue] = {c: queue.SimpleQueue() for c in pipes}

    def run(self) -> None:
        try:
            while self.pending:
                for c in wait(self.pending):
                    got = _recv(c)
                    if _is_progress(got):
                        self.tally.heard(c, got)
                    else:
                        self.pending.remove(c)
                        self.replies[c].put(got)
        except BaseException as exc:  # a worker died, or the build stopped: say so
            for c in self.pending:
                self.replies[c].put(exc)

    def reply(self, c: Connection) -> Any:
        got = self.replies[c].get()
        if isinstance(got, BaseException):
            raise got
        return got


def _is_progress(got: Any) -> bool:
    return isinstance(got, tuple) and len(got) == 4 and got[0] == _PROGRESS


class _Worker:
    """One shard's share of the build (runs in a forked process).

    Each span is packed (its `index_store.record` in `marshal`, as its span database
    keeps it) the moment it is read, and appended to a spill file: an unnamed temporary
    file beside the index, gone when the process ends however it ends. In memory stay
    only each record's place in it: a whole shard's records are ~1.5 GB at 200,000
    requests, their places ~0.1 GB, and a spilled page is the kernel's to keep or drop.
    The phases after reading read one trace's records back at a time (`traces`)."""

    def __init__(self, idx: AnalysisIndex, shard: int, n: int) -> None:
        self.idx, self.shard, self.n = idx, shard, n
        self.stats = LoadStats()
        # trace -> span id -> its record's place in the spill file (offset << 32 | size)
        self.spans: dict[str, dict[str, int]] = {}
        # open for the worker's life (`close`); unnamed, so even a kill leaves nothing
        self._spill = tempfile.TemporaryFile(dir=idx.dir, buffering=_CHUNK)  # noqa: SIM115
        self._spilled = 0  # bytes written to it
        self.first: dict[str, tuple[int, int, int]] = {}  # trace -> (file, line, span)
        self.decoder = Decoder(self._add, self.stats)
        # worker 0 counts per-line things; the others decode fallback lines silently
        self.quiet = Decoder(self._add, LoadStats()) if shard else self.decoder
        self.quiet._resources = self.decoder._resources  # one interning, in every worker
        self._res_raw: dict[bytes, tuple[Resource, int]] = {}
        self._res_ix: dict[int, int] = {}  # id(resource) -> its place in the interning
        self._pos = (0, 0, 0)
        self.lines_ok: list[int] = []
        self.report = _report(None)  # the parent's ears (`_run_worker`)
        self._read_before = 0  # bytes of the files before the one being read
        self._read_total = 0

    def close(self) -> None:
        self._spill.close()

    def mine(self, tid: str) -> bool:
        return shard_of(tid) % self.n == self.shard

    def resources(self) -> list[Resource]:
        """The interned resources in order: the records' resource indexes."""
        return list(self.decoder._resources.values())

    def _ix(self, res: Resource) -> int:
        i = self._res_ix.get(id(res))
        if i is None:  # interned since: the interning only grows, never reorders
            self._res_ix = {id(r): i for i, r in enumerate(self.resources())}
            i = self._res_ix[id(res)]
        return i

    def _keep(self, tid: str, sid: str, packed: bytes) -> None:
        spans = self.spans.get(tid)
        if spans is None:
            spans = self.spans[tid] = {}
            self.first[tid] = self._pos
        elif sid in spans:
            self.stats.duplicates += 1
            return
        self._spill.write(packed)
        spans[sid] = self._spilled << 32 | len(packed)
        self._spilled += len(packed)
        self.stats.spans += 1

    def _add(self, span: Span) -> None:
        """A span from `otlp.Decoder` (the fallback paths)."""
        if self.mine(span.trace_id):
            rec = record(span, {id(span.resource): self._ix(span.resource)})
            self._keep(span.trace_id, span.span_id, marshal.dumps(rec))

    def traces(self, tids: Iterable[str]) -> Iterator[tuple[str, list[bytes], list[Span]]]:
        """(trace id, packed records, spans) of each of `tids`, decoded one at a time.

        The spill file is mapped (a record is a slice: no system call each); the pages
        read are dropped from this process every `_DROP_EVERY` bytes, so its resident
        size does not grow to the file's."""
        resources = self.resources()
        self._spill.flush()
        if not self._spilled:  # no span kept, so no trace (and no file to map)
            return
        with mmap.mmap(self._spill.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            read = 0
            for tid in tids:
                places = self.spans[tid].values()
                packed = [mm[at >> 32 : (at >> 32) + (at & _SIZE)] for at in places]
                yield tid, packed, spans_of(tid, packed, resources)
                read += sum(map(len, packed))
                if read > _DROP_EVERY:
                    mm.madvise(mmap.MADV_DONTNEED)
                    read = 0

    def read(self, files: Sequence[tuple[Path, int]]) -> None:
        """Every whole line of `files` (each up to its end) through a read-only memory
        map: a line is a view of the page cache, not a copy in fresh heap pages (at
        200,000 requests, 400,000 fewer page faults a worker and no copy of 3.4 GB; its
        read took 18.5 s of CPU, not 21.4, side by side). A file cut shorter meanwhile
        kills the worker (the map's pages are gone): the build fails and the sequential
        read does it all."""
        self._read_total = sum(end for _f, end in files)
        self._read_before = 0
        for fi, (f, end) in enumerate(files):
            if fi:
                self._read_before += max(files[fi - 1][1], 0)
                if self.shard == 0:  # many small files: said between them too
                    self.report(READ, self._read_before, self._read_total)
            if end <= 0:  # nothing whole yet (a map cannot be empty)
                self.lines_ok.append(0)
                continue
            with f.open("rb") as fh:
                try:
                    mm = mmap.mmap(fh.fileno(), end, access=mmap.ACCESS_READ)
                except ValueError:  # "mmap length is greater than file size"
                    raise OSError(f"{f} was cut shorter while the index was built") from None
            try:
                self.lines_ok.append(self._lines(f, fi, mm, end))
            finally:
                try:
                    mm.close()
                except BufferError:  # a view outlived it (an error's traceback): GC'd
                    pass
        if self.shard == 0:
            self.report(READ, self._read_total, self._read_total, last=True)

    def _lines(self, f: Path, fi: int, mm: mmap.mmap, end: int) -> int:
        """The lines of one mapped file; the pages read are dropped from this process
        every `_DROP_EVERY` bytes (mapped pages count in its resident size)."""
        view, pos, line_no, ok, dropped, find = memoryview(mm), 0, 0, 0, 0, mm.find
        utf8 = otlp_fast.Utf8Lines(mm, end)  # a line that is not: `json.loads`'s to reject
        try:
            while pos < end:
                nl = find(b"\n", pos, end)
                if nl < 0:
                    nl = end
                line = view[pos:nl]  # msgspec reads it (and its Raw spans) uncopied
                try:
                    doc = otlp_fast.LINE.decode(line) if utf8.utf8(pos, nl) else None
                except otlp_fast.LINE_ERRORS:
                    doc = None
                pos = nl + 1
                if doc is None and not bytes(line).strip():
                    continue
                line_no += 1
                ok += self._line(f, fi, line_no, line, doc)
                if pos - dropped > _DROP_EVERY:
                    upto = pos & ~(mmap.PAGESIZE - 1)
                    mm.madvise(mmap.MADV_DONTNEED, dropped, upto - dropped)
                    dropped = upto
                    if self.shard == 0:
                        self.report(READ, self._read_before + pos, self._read_total)
        finally:
            utf8.close()
        return ok

    def _line(
        self, f: Path, fi: int, line_no: int, line: memoryview, doc: otlp_fast.TracesData | None
    ) -> int:
        lead = self.shard == 0
        if lead:
            self.stats.lines_read += 1
        if doc is None:
            return self._fallback(f, fi, line_no, bytes(line))
        if lead:
            self.stats.documents += 1
        decode = self.decoder.span
        fields = otlp_fast.fields
        n, shard, crc32, plain_tid = self.n, self.shard, zlib.crc32, _PLAIN_TID.match
        for rs in doc.resourceSpans:
            try:
                res, rix = self._resource(rs.resource)
            except (AttributeError, KeyError, TypeError, ValueError):
                if lead:
                    self.stats.malformed += 1
                continue
            for si, ss in enumerate(rs.scopeSpans):
                for ri, one in enumerate(ss.spans):
                    # `shard_of` of a plain lowercase hex id, without decoding the span
                    head = plain_tid(one)
                    if head is not None:
                        if crc32(head.group(1)) % SHARDS % n != shard:
                            continue
                    elif not self.mine(_trace_id(bytes(one))):
                        continue
                    self._pos = (fi, line_no, si * 100_000 + ri)
                    got = fields(one, rix)
                    if got is None:
                        try:
                            span = decode(json.loads(bytes(one)), res)
                        except SPAN_ERRORS as exc:
                            self.stats.malformed += 1
                            self.stats.note(f"span skipped: {exc}")
                            continue
                        self._add(span)
                        continue
                    tid, rec = got
                    if self.mine(tid):  # as `_add`: the id decoded is the one kept
                        self._keep(tid, rec[0], marshal.dumps(rec))
        return 1

    def _resource(self, raw: msgspec.Raw) -> tuple[Resource, int]:
        key = bytes(raw)
        got = self._res_raw.get(key)
        if got is None:
            res = otlp_fast.resource(key, self.decoder)
            got = self._res_raw[key] = (res, self._ix(res))
        return got

    def _fallback(self, f: Path, fi: int, line_no: int, line: bytes) -> int:
        """`FileSource._lines`'s handling of one line that is not plain OTLP JSON."""
        self._pos = (fi, line_no, 0)
        try:
            self.quiet.document(json.loads(line))
            return 1
        except (ValueError, Malformed, TypeError, AttributeError, KeyError) as exc:
            if self.shard == 0:
                self.stats.malformed += 1
                self.stats.note(f"{f.name}: line skipped: {str(exc)[:120]}")
            return 0


def _run_worker(
    idx: AnalysisIndex,
    shard: int,
    n: int,
    files: list[tuple[Path, int]],
    conn: Connection,
    inherited: list[Connection],
) -> None:
    """Phase 1: read, store spans, send facts; phase 2: analyse with the offsets sent.

    `inherited`: the parent's ends of the pipes made so far (this worker's own among
    them), copied by the fork and closed first: held here, they kept a pipe open after
    the parent died, so a worker waiting for the offsets, or sending, waited for good
    (a `report` killed mid-build left both workers behind). Now the parent's end is
    only the parent's: its death is an EOF or EPIPE here, and the worker ends quietly."""
    for c in inherited:
        c.close()
    gc.disable()
    w: _Worker | None = None
    try:
        cpu = [time.process_time()]
        w = _Worker(idx, shard, n)
        report = w.report = _report(conn if idx.progress is not None else None)
        w.read(files)
        cpu.append(time.process_time())
        resources = w.resources()
        res_ix = {id(r): i for i, r in enumerate(resources)}
        # facts need the kept resources' positions: this worker's are every worker's
        idx._state.resources = resources  # type: ignore[union-attr]
        idx._index_resources()
        facts: dict[str, TraceFacts] = {}

        def stored() -> Iterator[tuple[str, bytes]]:
            total = len(w.spans)
            report(STORE, 0, total, last=True)  # its total, at once
            for done, (tid, packed, spans) in enumerate(w.traces(list(w.spans)), 1):
                f = facts[tid] = idx._facts(tid, spans, 0)
                if f.process:  # its engine steps, parsed: the parent joins the run's
                    conn.send_bytes(pickle.dumps(("parts", tid, StepParts().extend(spans))))
                yield tid, pack_packed(packed)
                if done % _REPORT_EVERY == 0 or done == total:
                    report(STORE, done, total, last=done == total)

        db = open_span_db(idx.dir, shard, bulk=True)
        with db:
            db.executemany("INSERT OR REPLACE INTO spans (tid, v) VALUES (?, ?)", stored())
        db.close()
        cpu.append(time.process_time())
        conn.send_bytes(
            pickle.dumps(
                ("facts", resources if shard == 0 else None,
                 [tuple(_key(r) for r in resources)],
                 marshal.dumps({t: f.as_tuple() for t, f in facts.items()}),  # 5x pickle's
                 marshal.dumps(w.first), w.stats, w.lines_ok),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        )  # fmt: skip
        w.first.clear()
        # While the parent estimates the offsets: the shard made durable and put in WAL
        # mode (its first reader did it, an fsync of what the build had just written:
        # 0.2-0.4 s of the first Live refresh after a build, at 200,000 requests).
        open_span_db(idx.dir, shard).close()
        for tid, f in facts.items():  # per-process traces: no result, so no more reads
            if not f.res:
                del w.spans[tid]
        _trim()
        off = pickle.loads(conn.recv_bytes())
        cpu.append(time.process_time())
        # the parent gets each result's row; the results themselves are not written
        # (`AnalysisIndex._load_results` makes one again when it is asked for: writing
        # 200,000 took about 5 s of the build's CPU, mostly for results nobody reads)
        rows = {}
        total = len(w.spans)
        report(ANALYSE, 0, total, last=True)
        for done, (tid, _packed, spans) in enumerate(w.traces(list(w.spans)), 1):
            del w.spans[tid]
            rows[tid] = row_of(idx._analysed(tid, spans, off, res_ix))
            if done % _REPORT_EVERY == 0 or done == total:
                report(ANALYSE, done, total, last=done == total)
        # the parent joined the engine steps meanwhile (a worker that gets here first waits)
        analysed_at = time.time()
        steps = pickle.loads(conn.recv_bytes())  # always read: the parent always sends
        tpots = split_tpot(((t, row, facts[t]) for t, row in rows.items()), off, lambda: steps)
        cpu.append(time.process_time())
        times = (cpu[1] - cpu[0], cpu[2] - cpu[1], cpu[4] - cpu[3])
        # rows and breakdowns are plain tuples, dicts and numbers: `marshal`, as the facts
        reply = (marshal.dumps(rows), marshal.dumps(tpots), _peak_kb(), times, analysed_at)
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
    except (KeyboardInterrupt, SystemExit):  # stopped (^C; SIGTERM in the console's
        raise  # child): no last word, which could block on a pipe nobody reads any more
    except (EOFError, BrokenPipeError):  # the parent is gone: nobody to tell
        return
    except OSError as exc:  # the disk or the files (full, cut shorter): its message
        conn.send_bytes(pickle.dumps(("error", f"{type(exc).__name__}: {exc}")))
        raise
    except BaseException:  # anything else is a bug: its traceback
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        raise
    finally:
        if w is not None:
            w.close()
        conn.close()


def _trim() -> None:
    """Give the heap's free pages back to the system (glibc keeps them otherwise): the
    objects just let go would count in this process's resident size, and in the peak
    of the whole build's, until the process ends."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _peak_kb() -> int:
    """This process's peak resident set (VmHWM), for the benchmark's memory figure."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _key(r: Resource) -> tuple[str, str, str, str]:
    return (r.service, r.instance, r.host, r.pid)


def build(idx: AnalysisIndex, files: Sequence[Path], workers: int) -> bool:
    """Fill an empty index from `files` with `workers` processes. False (nothing done)
    when the build cannot be split; the caller then reads sequentially."""
    state = idx._state
    assert state is not None
    if workers != SHARDS:  # a worker writes one span database
        return False
    BUILD_TIMES.clear()
    BUILD_TIMES["start"] = time.time()
    ctx = multiprocessing.get_context("fork")
    ends: list[tuple[Path, int]] = []
    pending: dict[Path, bytes] = {}
    for f in files:
        size = f.stat().st_size
        with f.open("rb") as fh:
            fh.seek(max(size - _CHUNK, 0))
            tail = fh.read()
        cut = tail.rfind(b"\n")
        pend = tail[cut + 1 :] if cut >= 0 else tail
        ends.append((f, size - len(pend)))
        pending[f] = pend
    pipes, procs, stopping = [], [], False
    for shard in range(workers):
        parent, child = ctx.Pipe()
        args = (idx, shard, workers, ends, child, [*pipes, parent])
        p = ctx.Process(target=_run_worker, args=args, daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    try:
        # each worker's per-process traces' parsed engine steps as it stores them (so
        # neither side holds a shard's at once), then its facts
        mine: dict[str, StepParts] = {}
        phase1: list[Any] = [None] * workers
        # each worker's traces by first position, made as its facts arrive: the first to
        # finish storing leaves a core to its facts while the other still stores
        firsts_of: list[list[tuple[tuple[int, int, int], str, TraceFacts]]] = [[]] * workers
        tally = _Tally(idx.progress, pipes)
        waiting = {c: shard for shard, c in enumerate(pipes)}
        while waiting:
            for c in wait(list(waiting)):
                got = _recv(c)
                if got[0] == "parts":
                    mine[got[1]] = got[2]
                elif _is_progress(got):
                    tally.heard(c, got)
                else:
                    shard = waiting.pop(c)
                    res, keys_, facts, first, st, ok = got[1:]
                    phase1[shard] = (res, keys_, st, ok)
                    firsts_of[shard] = _firsts(facts, first)
                    del got, facts, first
        BUILD_TIMES["read_store"] = time.time()
        tally.stage(OFFSETS)
        keys = {tuple(k[1][0]) for k in phase1}
        if len(keys) != 1:
            raise RuntimeError("workers interned resources differently")
        resources = phase1[0][0]
        state.resources = resources
        idx._index_resources()
        stats = state.stats
        for _res, _keys, st, _ok in phase1:
            _merge(stats, st)
        # every trace in first-seen order: the workers' sorted runs merged (a sort of
        # two sorted runs is their merge)
        firsts = [x for part in firsts_of for x in part]
        del firsts_of
        firsts.sort(key=_position)
        kept: dict[str, Kept] = {}
        for seq, (_pos, tid, f) in enumerate(firsts):
            f.seq = seq
            kept[tid] = Kept(f)
        state.next_seq = len(firsts)
        idx._kept = kept
        order = list(kept.items())
        offsets, label = idx._offsets(order)
        applied, off = idx._applied(offsets, label)
        blob = pickle.dumps(off)
        for c in pipes:
            c.send_bytes(blob)
        BUILD_TIMES["offsets"] = time.time()
        # while the workers analyse: the engine steps, from every worker's parsed parts
        # in first-seen order (as the sequential path reads them), placed with the
        # offsets; then the workers split their requests' TPOT over them
        state.process_version += 1
        listener = _Listener(tally, pipes)
        listener.start()
        merged = StepParts()
        for tid in kept:
            if tid in mine:
                merged.merge(mine.pop(tid), lambda r: resources[idx._res_key[_key(r)]], own=True)
        placed = merged.placed(idx._used(label), applied)  # uses the parts up
        idx._keep_steps(placed, idx._steps_key(applied), write=True)
        idx._write_skew()  # the evidence the offsets were made from, for the next opening
        del merged
        _trim()
        tpot_key, tpot_steps = idx._tpot
        blob = pickle.dumps(tpot_steps, protocol=pickle.HIGHEST_PROTOCOL)
        for c in pipes:
            c.send_bytes(blob)
        del blob
        BUILD_TIMES["steps"] = time.time()
        WORKER_PEAK_KB.clear()
        WORKER_CPU.clear()
        offsets_of: dict[Any, tuple[int, ...]] = {}
        for c in pipes:
            rows_blob, tpots_blob, peak, times, analysed_at = listener.reply(c)
            BUILD_TIMES["workers_analysed"] = max(
                analysed_at, BUILD_TIMES.get("workers_analysed", 0.0)
            )
            rows, tpots = marshal.loads(rows_blob), marshal.loads(tpots_blob)
            del rows_blob, tpots_blob
            WORKER_PEAK_KB.append(peak)
            WORKER_CPU.append(times)
            for tid, row in rows.items():
                k = kept[tid]
                k.row = row
                res = k.facts.res  # few distinct: one tuple of offsets each
                k.offsets = offsets_of.get(res) or offsets_of.setdefault(
                    res, tuple(off[i] for i in res)
                )
                k.tpot = tpots[tid]
        BUILD_TIMES["analysed"] = time.time()
        state.tpot_key = tpot_key
        idx._built(off)
        BUILD_TIMES["built"] = time.time()
    except BaseException:  # the others would read on for nothing (and orphan a ^C)
        stopping = True
        for p in procs:
            p.terminate()
        raise
    finally:
        for c in pipes:  # a worker still waiting on the parent gets EOF
            c.close()
        for p in procs:
            p.join(timeout=_STOP_S if stopping else 60)
            if p.is_alive():  # stuck somehow (a backstop: each worker holds only its
                p.kill()  # own end of its pipe): no worker outlives the build
                p.join()
    lines_ok = phase1[0][3]  # every worker reads every line: the lead's count
    files_state = {}
    for (f, end), ok in zip(ends, lines_ok, strict=True):
        info = f.stat()
        pend = pending[f]
        files_state[str(f)] = (info.st_ino, end + len(pend), pend, info.st_size,
                               info.st_mtime_ns, False, ok)  # fmt: skip
        stats.bytes_read += end + len(pend)
    state.files = files_state
    stats.files += len(files)
    stats.partial = sum(1 for p in pending.values() if p)
    return True


def _position(x: tuple[tuple[int, int, int], str, TraceFacts]) -> tuple[int, int, int]:
    return x[0]


def _firsts(facts: bytes, first: bytes) -> list[tuple[tuple[int, int, int], str, TraceFacts]]:
    """One worker's traces as (first-seen position, trace id, facts), in that order
    (positions are unique: a span is in one trace)."""
    where = marshal.loads(first)
    out = [(where[t], t, TraceFacts(*f)) for t, f in marshal.loads(facts).items()]
    out.sort(key=_position)
    return out


def _recv(conn: Connection) -> Any:
    try:
        out = pickle.loads(conn.recv_bytes())
    except EOFError:  # it ended without a word: killed (a signal, or SIGBUS off a map)
        raise RuntimeError(
            "an index build worker died (killed, or a file it read was cut shorter)"
        ) from None
    if isinstance(out, tuple) and len(out) == 2 and out[0] == "error":
        raise RuntimeError(f"index build worker failed:\n{out[1]}")
    return out


def _merge(into: LoadStats, st: LoadStats) -> None:
    for name in ("lines_read", "documents", "spans", "duplicates", "malformed"):
        setattr(into, name, getattr(into, name) + getattr(st, name))
    for msg in st.errors:
        into.note(msg)
