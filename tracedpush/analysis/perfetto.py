"""Chrome trace-event JSON for ui.perfetto.dev (or chrome://tracing).

One process track (pid) per instance, one thread track (tid) per lane, and extra tids
when spans on a lane overlap without nesting (Perfetto requires slices on one tid to
nest). Times are the skew-corrected ones, in microseconds since the Unix epoch, so
requests line up. Flow arrows follow the handoff: proxy -> P, P -> D (kv.write ->
kv.notify, kv.register -> kv.rendezvous, prefill -> kv.relay -> decode, kv.read ->
kv.notify). A "critical path" process draws each request's phases on its own track.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis

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


def to_perfetto(run: RunAnalysis, trace_ids: Iterable[str] | None = None) -> dict[str, Any]:
    """Trace-event JSON (``{"traceEvents": [...]}``) for the chosen requests (all if None)."""
    wanted = None if trace_ids is None else set(trace_ids)
    reqs = [
        r for r in run.requests if wanted is None or r.trace_id in wanted or r.request_id in wanted
    ]
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[int, str], list[tuple[int, float]]] = {}  # (pid, lane) -> [(tid, busy until)]
    tid_names: dict[tuple[int, int], str] = {}
    next_tid = [1]
    flow_id = 0

    def pid_for(service: str, instance: str) -> int:
        key = f"{service} {instance}"
        pid = pids.get(key)
        if pid is None:
            pid = pids[key] = len(pids) + 2  # 1 is the critical-path process
        return pid

    def tid_for(pid: int, lane: str, start: float, end: float, nest_in: float | None) -> int:
        tracks = tids.setdefault((pid, lane), [])
        for i, (tid, busy) in enumerate(tracks):
            if busy <= start or (nest_in is not None and end <= nest_in):
                tracks[i] = (tid, max(busy, end))
                return tid
        tid = next_tid[0]
        next_tid[0] += 1
        tracks.append((tid, end))
        suffix = f" #{len(tracks)}" if len(tracks) > 1 else ""
        tid_names[(pid, tid)] = lane.split("/", 2)[-1] + suffix
        return tid

    path_tid = 0
    for r in sorted(reqs, key=lambda r: r.start_unix_ms):
        base_us = r.start_unix_ms * 1000.0
        placed: dict[str, tuple[int, int, float, float]] = {}  # span name -> pid, tid, ts, end
        for v in sorted(r.spans, key=lambda v: (v.start_ms, -v.duration_ms)):
            pid = pid_for(v.service, v.instance)
            ts = base_us + v.start_ms * 1000.0
            dur = max(v.duration_ms * 1000.0, 0.001)
            tid = tid_for(pid, v.lane, ts, ts + dur, None)
            args = {
                "trace_id": r.trace_id,
                "request_id": r.request_id,
                "mode": r.mode,
                "on_critical_path": v.on_critical_path,
                "status": v.status,
                **({"error": v.error} if v.error else {}),
                **{k: v.attributes[k] for k in v.attributes if not k.startswith("http.")},
            }
            events.append(
                {
                    "ph": "X",
                    "name": v.name,
                    "cat": r.mode,
                    "ts": ts,
                    "dur": dur,
                    "pid": pid,
                    "tid": tid,
                    "args": args,
                }
            )
            prev = placed.get(v.name)
            if prev is None or ts + dur > prev[3]:
                placed[v.name] = (pid, tid, ts, ts + dur)
        for src, dst, modes in FLOWS:
            if r.mode not in modes or src not in placed or dst not in placed:
                continue
            spid, stid, sts, send = placed[src]
            dpid, dtid, dts, _ = placed[dst]
            flow_id += 1
            at = sts if src in _FROM_START else max(send - 0.001, sts)
            events.append(
                {
                    "ph": "s",
                    "id": flow_id,
                    "name": f"{src}->{dst}",
                    "cat": "handoff",
                    "ts": at,
                    "pid": spid,
                    "tid": stid,
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": flow_id,
                    "name": f"{src}->{dst}",
                    "cat": "handoff",
                    "ts": dts,
                    "pid": dpid,
                    "tid": dtid,
                }
            )
        path_tid = _critical_track(events, r, base_us, path_tid)
    meta: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": _PATH_PID,
            "tid": 0,
            "args": {"name": "critical path"},
        },
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": _PATH_PID,
            "tid": 0,
            "args": {"sort_index": 0},
        },
    ]
    for key, pid in pids.items():
        meta.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": key}}
        )
        meta.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": pid},
            }
        )
    for (pid, tid), name in tid_names.items():
        meta.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        )
    offsets = {k: v.to_json() for k, v in run.clock_offsets.items()}
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "tracedpush report",
            "clock_offsets_ms": offsets,
            "skew_corrected": run.skew_corrected,
        },
    }


def _critical_track(
    events: list[dict[str, Any]], r: RequestAnalysis, base_us: float, tid: int
) -> int:
    if not r.critical_path:
        return tid
    tid += 1
    events.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": _PATH_PID,
            "tid": tid,
            "args": {"name": f"{r.mode} {r.request_id}"},
        }
    )
    for seg in r.critical_path:
        events.append(
            {
                "ph": "X",
                "name": seg.phase,
                "cat": "critical",
                "pid": _PATH_PID,
                "tid": tid,
                "ts": base_us + seg.start_ms * 1000.0,
                "dur": max(seg.duration_ms * 1000.0, 0.001),
                "args": {"service": seg.service, "span": seg.span, "trace_id": r.trace_id},
            }
        )
    return tid
