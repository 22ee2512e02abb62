"""The index's cold build on every core: one process per span shard (trace id).

Decoding spans and walking critical paths are pure Python, so one process uses one
core. Here each worker (forked, so it starts with the index's settings) scans every
line of every file, but cheaply: msgspec reads a line's structure and leaves each span
as raw bytes (``msgspec.Raw``), whose trace id is read off its first key. A worker
decodes only the spans of its shard's traces, writes them to its own span database,
and sends the parent its traces' facts (first-seen position, causal pairs, ...). The
parent estimates the clock offsets from all facts, as `AnalysisIndex` does; then each
worker analyses its requests with them and sends back the results.

Everything counted per line (lines, documents, malformed lines) is counted by worker 0;
spans by the worker of their shard. Lines that are not plain OTLP JSON (another shape, a
bad line) go through `otlp.Decoder` in every worker, each keeping its own shard. Files
that do not start with a whole OTLP line (one pretty-printed document, a torn first
line) leave the build to the sequential path, which knows those cases.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import pickle
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tracedpush.analysis.analyze import PROCESS_SPANS, request_analysis
from tracedpush.analysis.columns import row_of
from tracedpush.analysis.index_store import (
    SHARDS,
    Kept,
    TraceFacts,
    dump_result,
    open_span_db,
    pack,
    shard_of,
)
from tracedpush.analysis.model import LoadStats, Resource, Span
from tracedpush.analysis.otlp import Decoder, Malformed, attributes, norm_id
from tracedpush.analysis.timeline import LoadCounter, TraceIndex

# `idx` below is an `index.AnalysisIndex` (not imported: index imports this module)
AnalysisIndex = Any
try:
    import msgspec
except ImportError:  # pragma: no cover - the sequential build needs no msgspec
    msgspec = None  # type: ignore[assignment]

_CHUNK = 8 << 20
WORKER_PEAK_KB: list[int] = []  # the last build's workers' peak RSS (benchmarks read it)
_SPAN_ERRORS = (Malformed, AttributeError, KeyError, TypeError, ValueError)
_TID_PREFIX = b'{"traceId":"'

if msgspec is not None:
    _NULL = msgspec.Raw(b"null")  # Raw cannot be in a union: an absent field reads as null

    class _Scope(msgspec.Struct, forbid_unknown_fields=True):
        scope: msgspec.Raw = _NULL
        spans: list[msgspec.Raw] = []  # noqa: RUF012  (msgspec copies defaults)
        schemaUrl: msgspec.Raw = _NULL

    class _ResourceSpans(msgspec.Struct, forbid_unknown_fields=True):
        resource: msgspec.Raw = _NULL
        scopeSpans: list[_Scope] = []  # noqa: RUF012
        schemaUrl: msgspec.Raw = _NULL

    class _TracesData(msgspec.Struct, forbid_unknown_fields=True):
        resourceSpans: list[_ResourceSpans]

    _LINE = msgspec.json.Decoder(_TracesData)


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


class _Worker:
    """One shard's share of the build (runs in a forked process)."""

    def __init__(self, idx: AnalysisIndex, shard: int, n: int) -> None:
        self.idx, self.shard, self.n = idx, shard, n
        self.mine: Callable[[str], bool] = lambda tid: shard_of(tid) % n == shard
        self.stats = LoadStats()
        self.spans: dict[str, dict[str, Span]] = {}
        self.first: dict[str, tuple[int, int, int]] = {}  # trace -> (file, line, span)
        self.decoder = Decoder(self._add, self.stats)
        # worker 0 counts per-line things; the others decode fallback lines silently
        self.quiet = Decoder(self._add, LoadStats()) if shard else self.decoder
        self.quiet._resources = self.decoder._resources  # one interning, in every worker
        self._res_raw: dict[bytes, Resource] = {}
        self._pos = (0, 0, 0)
        self.lines_ok: list[int] = []

    def _add(self, span: Span) -> None:
        tid = span.trace_id
        if not self.mine(tid):
            return
        spans = self.spans.get(tid)
        if spans is None:
            spans = self.spans[tid] = {}
            self.first[tid] = self._pos
        elif span.span_id in spans:
            self.stats.duplicates += 1
            return
        spans[span.span_id] = span
        self.stats.spans += 1

    def read(self, files: Sequence[tuple[Path, int]]) -> None:
        for fi, (f, end) in enumerate(files):
            ok = 0
            with f.open("rb") as fh:
                left, line_no, pending = end, 0, b""
                while left > 0:
                    chunk = fh.read(min(_CHUNK, left))
                    if not chunk:
                        break
                    left -= len(chunk)
                    data = pending + chunk if pending else chunk
                    cut = data.rfind(b"\n") if left > 0 else len(data)
                    if cut < 0:
                        pending = data
                        continue
                    pending = data[cut + 1 :]
                    for line in data[:cut].split(b"\n"):
                        if not line.strip():
                            continue
                        line_no += 1
                        ok += self._line(f, fi, line_no, line)
            self.lines_ok.append(ok)

    def _line(self, f: Path, fi: int, line_no: int, line: bytes) -> int:
        lead = self.shard == 0
        if lead:
            self.stats.lines_read += 1
        try:
            doc = _LINE.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return self._fallback(f, fi, line_no, line)
        if lead:
            self.stats.documents += 1
        decode = self.decoder.span
        for rs in doc.resourceSpans:
            try:
                res = self._resource(rs.resource)
            except (AttributeError, KeyError, TypeError, ValueError):
                if lead:
                    self.stats.malformed += 1
                continue
            for si, ss in enumerate(rs.scopeSpans):
                for ri, one in enumerate(ss.spans):
                    raw = bytes(one)
                    tid = _trace_id(raw)
                    if not self.mine(tid):
                        continue
                    self._pos = (fi, line_no, si * 100_000 + ri)
                    try:
                        span = decode(json.loads(raw), res)
                    except _SPAN_ERRORS as exc:
                        self.stats.malformed += 1
                        self.stats.note(f"span skipped: {exc}")
                        continue
                    self._add(span)
        return 1

    def _resource(self, raw: msgspec.Raw) -> Resource:
        key = bytes(raw)
        res = self._res_raw.get(key)
        if res is None:
            doc = json.loads(key)
            res = self.decoder.resource(attributes((doc or {}).get("attributes")))
            self._res_raw[key] = res
        return res

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
    idx: AnalysisIndex, shard: int, n: int, files: list[tuple[Path, int]], conn: Connection
) -> None:
    """Phase 1: read, store spans, send facts; phase 2: analyse with the offsets sent."""
    gc.disable()
    try:
        w = _Worker(idx, shard, n)
        w.read(files)
        resources = list(w.decoder._resources.values())
        res_ix = {id(r): i for i, r in enumerate(resources)}
        # facts need the kept resources' positions: this worker's are every worker's
        idx._state.resources = resources  # type: ignore[union-attr]
        idx._index_resources()
        db = open_span_db(idx.dir, shard)
        facts = {}
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO spans (tid, v) VALUES (?, ?)",
                ((tid, pack(spans.values(), res_ix)) for tid, spans in w.spans.items()),
            )
        db.close()
        for tid, spans in w.spans.items():
            facts[tid] = idx._facts(tid, list(spans.values()), 0)
        conn.send_bytes(
            pickle.dumps(
                (resources if shard == 0 else None, [tuple(_key(r) for r in resources)],
                 facts, w.first, w.stats, w.lines_ok),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        )  # fmt: skip
        off = pickle.loads(conn.recv_bytes())
        rows = {}  # the parent gets each result's row; the results go to the span database
        no_load = LoadCounter(())

        def results() -> Iterator[tuple[str, bytes]]:
            for tid, spans in w.spans.items():
                if not facts[tid].res:
                    continue
                req = [s for s in spans.values() if s.name not in PROCESS_SPANS]
                ix = TraceIndex(tid, req)
                off_ns = {id(s.resource): off[res_ix[id(s.resource)]] for s in req}
                r = request_analysis(ix, off_ns, no_load, idx.buckets, idx.load_buckets, False)
                rows[tid] = row_of(r)
                yield tid, dump_result(r)

        db = open_span_db(idx.dir, shard)
        with db:
            db.executemany("INSERT OR REPLACE INTO results (tid, v) VALUES (?, ?)", results())
        db.close()
        conn.send_bytes(pickle.dumps((rows, _peak_kb()), protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        raise
    finally:
        conn.close()


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
    pipes, procs = [], []
    for shard in range(workers):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_run_worker, args=(idx, shard, workers, ends, child), daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    try:
        phase1 = [_recv(c) for c in pipes]
        keys = {tuple(k[1][0]) for k in phase1}
        if len(keys) != 1:
            raise RuntimeError("workers interned resources differently")
        resources = phase1[0][0]
        state.resources = resources
        idx._index_resources()
        firsts: list[tuple[tuple[int, int, int], str, TraceFacts]] = []
        stats = state.stats
        for _res, _keys, facts, first, st, _ok in phase1:
            firsts += [(first[tid], tid, f) for tid, f in facts.items()]
            _merge(stats, st)
        firsts.sort(key=lambda x: x[0])
        kept: dict[str, Kept] = {}
        for seq, (_pos, tid, f) in enumerate(firsts):
            f.seq = seq
            kept[tid] = Kept(f)
        state.next_seq = len(firsts)
        idx._kept = kept
        order = list(kept.items())
        offsets, label = idx._offsets(order)
        applied = {x: (o.offset_ms if idx.correct_skew else 0.0) for x, o in offsets.items()}
        off = [0] * len(resources)
        for i, lab in label.items():
            off[i] = round(applied.get(lab, 0.0) * 1e6)
        blob = pickle.dumps(off)
        for c in pipes:
            c.send_bytes(blob)
        WORKER_PEAK_KB.clear()
        for c in pipes:
            rows, peak = _recv(c)
            WORKER_PEAK_KB.append(peak)
            for tid, row in rows.items():
                k = kept[tid]
                k.row = row
                k.offsets = tuple(off[i] for i in k.facts.res)
    finally:
        for p in procs:
            p.join(timeout=60)
    lines_ok = [sum(x) for x in zip(*(p1[5] for p1 in phase1), strict=True)]
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
    state.process_version += 1
    return True


def _recv(conn: Connection) -> Any:
    out = pickle.loads(conn.recv_bytes())
    if isinstance(out, tuple) and len(out) == 2 and out[0] == "error":
        raise RuntimeError(f"index build worker failed:\n{out[1]}")
    return out


def _merge(into: LoadStats, st: LoadStats) -> None:
    for name in ("lines_read", "documents", "spans", "duplicates", "malformed"):
        setattr(into, name, getattr(into, name) + getattr(st, name))
    for msg in st.errors:
        into.note(msg)
