"""Chrome trace-event JSON for ui.perfetto.dev (or chrome://tracing).

One process track (pid) per instance, one thread track (tid) per lane, and extra tids
when spans on a lane overlap without nesting (Perfetto requires slices on one tid to
nest). Times are the skew-corrected ones, in microseconds from the first request's
receipt (`to_perfetto`), so requests line up. Flow arrows follow the handoff: proxy ->
P, P -> D (kv.write -> kv.notify, kv.register -> kv.rendezvous, prefill -> kv.relay ->
decode, kv.read -> kv.notify). A "critical path" process draws each request's phases on
its own track.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from tracedpush import semconv as sc
from tracedpush.analysis import forked
from tracedpush.analysis.report_json import PARALLEL_STEP
from tracedpush.analysis.results import LazyRequests, RequestAnalysis, RunAnalysis

# (from span, to span, modes): an arrow from the end of one to the start of the other
FLOWS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (sc.SPAN_PROXY_PREFILL, sc.SPAN_PREFILL, ("push", "pull")),
    (sc.SPAN_PROXY_DECODE, sc.SPAN_DECODE, ("push", "pull")),
    (sc.SPAN_KV_REGISTER, sc.SPAN_KV_RENDEZVOUS, ("push",)),
    (sc.SPAN_KV_WRITE, sc.SPAN_KV_NOTIFY, ("push",)),
    (sc.SPAN_PREFILL, sc.SPAN_KV_RELAY, ("pull",)),
    (sc.SPAN_KV_RELAY, sc.SPAN_DECODE, ("pull",)),
    (sc.SPAN_KV_READ, sc.SPAN_KV_NOTIFY, ("pull",)),
)
# Which end of the source the arrow leaves from (a leg sends at its start).
_FROM_START = {sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE, sc.SPAN_KV_WRITE, sc.SPAN_KV_READ}
_PATH_PID = 1
PROGRESS_EVERY = 10_000  # requests between two `write_perfetto` progress calls
# A document past this size may not open in ui.perfetto.dev: the UI parses in the
# browser's memory (about 2 GB, Perfetto's docs, "Visualising large traces"), a trace
# takes several times its size there, and JSON traces of 900 MB were reported to crash
# it (google/perfetto#99). `report` then names Perfetto's native trace_processor.
UI_BYTES = 512 << 20


def to_perfetto(run: RunAnalysis, trace_ids: Iterable[str] | None = None) -> dict[str, Any]:
    """Trace-event JSON (``{"traceEvents": [...]}``) for the chosen requests (all if None).

    Timestamps are microseconds from the first chosen request's receipt (``otherData.
    origin_unix_us`` holds it): absolute epoch microseconds do not fit a double with
    sub-microsecond precision, and adjacent slices must share exact boundaries. The
    metadata events (process and thread names) come last: they are known only once
    every request's events are, and the format takes them anywhere. The events are
    those `write_perfetto` writes, decoded (one encoder for both)."""
    doc = _Document(run)
    events = [json.loads(e) for p in _plans(doc, run, trace_ids) for e in doc.place(p)]
    return {"traceEvents": events + doc.meta(), **doc.tail()}


def write_perfetto(
    run: RunAnalysis,
    out: TextIO,
    trace_ids: Iterable[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
) -> None:
    """``json.dumps(to_perfetto(run, trace_ids), separators=(",", ":"))``, written as each
    request's events are made: a whole big run's events are never held at once (nor,
    through the analysis index, its requests with their spans: `LazyRequests.stream`).
    `progress(looked at, total)`: after every `PROGRESS_EVERY` of the run's requests
    and the last (at 200,000 requests the export takes minutes).

    `workers` > 1: a whole run the analysis index makes is made, and its events encoded,
    a batch at a time in that many forked processes (`LazyRequests.mapped`); this one
    only gives each event its process, track and flow ids, which depend on every
    request before it (`_Document.place`). The same bytes, on every core: call it so
    only from a process without threads (the CLI's; not the console's server)."""
    doc = _Document(run)
    dumps = _DUMPS
    out.write('{"traceEvents":[')
    first = True
    for p in _plans(doc, run, trace_ids, progress, workers):
        events = doc.place(p)
        if events:
            out.write(("" if first else ",") + ",".join(events))
            first = False
    meta = doc.meta()
    out.write(("" if first else ",") + ",".join(map(dumps, meta)) + "]")
    for key, value in doc.tail().items():
        out.write(f",{dumps(key)}:{dumps(value)}")
    out.write("}")


_DUMPS = json.JSONEncoder(separators=(",", ":")).encode  # as `json.dumps` compact

# One request's events before they are placed on tracks (`plan`): its mode, its spans
# as (instance, lane, lane label, span name, ts, end, the event's JSON up to its pid,
# its args' JSON), and its critical path as (ts, end, [(segment's JSON up to its tid,
# the rest)]) or None. Made where the request is made (a forked worker's batch).
_SpanPlan = tuple[str, str, str, str, float, float, str, str]
_Plan = tuple[str, list[_SpanPlan], tuple[float, float, list[tuple[str, str]]] | None]


def _plans(
    doc: _Document,
    run: RunAnalysis,
    trace_ids: Iterable[str] | None,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
) -> Iterator[_Plan]:
    """The chosen requests' plans, in receipt order; `doc.origin_ms` is the first's
    receipt. A whole run the index makes lazily is planned `PARALLEL_STEP` requests a
    batch, on `workers` forked processes (the first request is made here too, for the
    origin every batch needs; none is kept)."""
    reqs = run.requests
    if trace_ids is not None or not isinstance(reqs, LazyRequests) or workers <= 1:
        for r in _chosen(run, trace_ids, progress):
            if doc.origin_ms is None:
                doc.origin_ms = r.start_unix_ms
            yield plan(r, doc.origin_ms)
        return
    total = len(reqs)
    if not total:
        return
    origin = doc.origin_ms = reqs.passed([0])[0].start_unix_ms
    batches = reqs.mapped(
        lambda rs: [plan(r, origin) for r in rs], workers, min(PARALLEL_STEP, PROGRESS_EVERY)
    )
    for _n, plans in forked.reported(batches, total, PROGRESS_EVERY, progress):
        yield from plans


def plan(r: RequestAnalysis, origin_ms: float) -> _Plan:
    """One request's events, encoded but for their process, track and flow ids (`_Plan`),
    with times from `origin_ms` (the first request's receipt): everything that depends
    on this request alone."""
    dumps = _DUMPS
    base_us = (r.start_unix_ms - origin_ms) * 1000.0
    spans: list[_SpanPlan] = []
    for v in sorted(r.spans, key=lambda v: (v.start_ms, -v.duration_ms)):
        ts, dur = _times(base_us, v.start_ms, v.duration_ms)
        args = {
            "trace_id": r.trace_id,
            "request_id": r.request_id,
            "mode": r.mode,
            "on_critical_path": v.on_critical_path,
            "status": v.status,
            **({"error": v.error} if v.error else {}),
            **{k: val for k, val in v.attributes.items() if not k.startswith("http.")},
        }
        head = dumps({"ph": "X", "name": v.name, "cat": r.mode, "ts": ts, "dur": dur})
        spans.append(
            (f"{v.service} {v.instance}", v.lane, v.lane.split("/", 2)[-1], v.name,
             ts, ts + dur, head[:-1], dumps(args))
        )  # fmt: skip
    path = None
    if r.critical_path:
        first, last = r.critical_path[0], r.critical_path[-1]
        span0, _ = _times(base_us, first.start_ms, 0.0)
        span1, _ = _times(base_us, last.end_ms, 0.0)
        segments = []
        for seg in r.critical_path:
            ts, dur = _times(base_us, seg.start_ms, seg.duration_ms)
            head = dumps({"ph": "X", "name": seg.phase, "cat": "critical", "pid": _PATH_PID})
            rest = dumps(
                {"ts": ts, "dur": dur,
                 "args": {"service": seg.service, "span": seg.span, "mode": r.mode,
                          "trace_id": r.trace_id, "request_id": r.request_id}}
            )  # fmt: skip
            segments.append((head[:-1], rest[1:]))
        path = (span0, span1, segments)
    return r.mode, spans, path


def _times(base_us: float, start_ms: float, dur_ms: float) -> tuple[float, float]:
    ts = round(base_us + start_ms * 1000.0, 3)
    end = round(base_us + (start_ms + dur_ms) * 1000.0, 3)
    return ts, max(end - ts, 0.001)


def _chosen(
    run: RunAnalysis,
    trace_ids: Iterable[str] | None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[RequestAnalysis]:
    """The requests `trace_ids` names (trace or request ids; all if None) by receipt. A
    run's requests are in that order already (`analyze`): those the index makes lazily
    are streamed, kept by no one, not sorted."""
    wanted = None if trace_ids is None else set(trace_ids)
    reqs = run.requests
    every: Iterable[RequestAnalysis] = (
        reqs.stream() if isinstance(reqs, LazyRequests) else sorted(reqs, key=_start)
    )
    total = len(reqs)
    for seen, r in enumerate(every, 1):
        if wanted is None or r.trace_id in wanted or r.request_id in wanted:
            yield r
        if progress is not None and (seen % PROGRESS_EVERY == 0 or seen == total):
            progress(seen, total)


def _start(r: RequestAnalysis) -> float:
    return r.start_unix_ms


class _Document:
    """What the events of one trace-event document share: a process per instance, a
    thread per lane (and per overlap), flow ids, and the origin of the timestamps (the
    first request's receipt)."""

    def __init__(self, run: RunAnalysis) -> None:
        self.run = run
        self.origin_ms: float | None = None
        self.pids: dict[str, int] = {}
        # (pid, lane) -> [[tid, busy until]]
        self.tracks: dict[tuple[int, str], list[list[float]]] = {}
        self.tid_names: dict[tuple[int, int], str] = {}
        self.next_tid = 1
        self.flow_id = 0

    def pid_for(self, key: str) -> int:
        """The process of instance `key` ("service instance")."""
        pid = self.pids.get(key)
        if pid is None:
            pid = self.pids[key] = len(self.pids) + 2  # 1 is the critical-path process
        return pid

    def tid_for(self, pid: int, lane: str, label: str, start: float, end: float) -> int:
        """First sub-track of `lane` free at `start` (overlaps get their own tid)."""
        lane_tracks = self.tracks.setdefault((pid, lane), [])
        for tr in lane_tracks:
            if tr[1] <= start:
                tr[1] = end
                return int(tr[0])
        tid = self.next_tid
        self.next_tid += 1
        lane_tracks.append([tid, end])
        suffix = f" #{len(lane_tracks)}" if len(lane_tracks) > 1 else ""
        self.tid_names[(pid, tid)] = label + suffix
        return tid

    def place(self, plan: _Plan) -> list[str]:
        """The JSON of one request's events (the requests in receipt order): each span on
        the first free track of its lane, arrows between them, its critical path."""
        mode, spans, path = plan
        dumps, tid_for = _DUMPS, self.tid_for
        events: list[str] = []
        placed: dict[str, tuple[int, int, float, float]] = {}  # span name -> pid, tid, ts, end
        for key, lane, label, name, ts, end, head, args in spans:
            pid = self.pid_for(key)
            tid = tid_for(pid, lane, label, ts, end)
            events.append(f'{head},"pid":{pid},"tid":{tid},"args":{args}}}')
            prev = placed.get(name)
            if prev is None or end > prev[3]:
                placed[name] = (pid, tid, ts, end)
        for src, dst, modes in FLOWS:
            if mode not in modes or src not in placed or dst not in placed:
                continue
            spid, stid, sts, send = placed[src]
            dpid, dtid, dts, _ = placed[dst]
            self.flow_id += 1
            flow_id = self.flow_id
            at = sts if src in _FROM_START else max(round(send - 0.001, 3), sts)
            name = f"{src}->{dst}"
            events.append(dumps(
                {"ph": "s", "id": flow_id, "name": name, "cat": "handoff", "ts": at,
                 "pid": spid, "tid": stid}
            ))  # fmt: skip
            events.append(dumps(
                {"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": "handoff",
                 "ts": dts, "pid": dpid, "tid": dtid}
            ))  # fmt: skip
        if path is not None:
            span0, span1, segments = path
            tid = tid_for(_PATH_PID, "critical path", "critical path", span0, span1)
            events += [f'{head},"tid":{tid},{rest}' for head, rest in segments]
        return events

    def meta(self) -> list[dict[str, Any]]:
        """The processes' and threads' names and order (once every request's events are
        made)."""
        meta: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": _PATH_PID, "tid": 0,
             "args": {"name": "critical path"}},
            {"ph": "M", "name": "process_sort_index", "pid": _PATH_PID, "tid": 0,
             "args": {"sort_index": 0}},
        ]  # fmt: skip
        for key, pid in self.pids.items():
            meta.append(
                {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": key}}
            )
            meta.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                 "args": {"sort_index": pid}}
            )  # fmt: skip
        for (pid, tid), name in self.tid_names.items():
            meta.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
        return meta

    def tail(self) -> dict[str, Any]:
        """The document's keys after the events."""
        run = self.run
        return {
            "displayTimeUnit": "ms",
            "otherData": {
                "generator": "tracedpush report",
                "origin_unix_us": round((self.origin_ms or 0.0) * 1000.0, 3),
                "clock_offsets_ms": {k: v.to_json() for k, v in run.clock_offsets.items()},
                "skew_corrected": run.skew_corrected,
            },
        }
