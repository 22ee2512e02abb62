"""Per-process step traces for synthetic runs: ``engine.steps`` and ``engine.threads``.

`add_process_traces` reads back the request spans `generate` simulated for one mode
(true clock) and derives what each engine process would have recorded:

* P (FIFO prefill): one worker step per prefill chunk of each request, inside the
  request's compute window (``compute_started`` -> prefill end); the scheduler's record
  of the same seq carries the chunk's tokens.
* D: back-to-back decode steps while any request decodes (its first token scheduled ->
  its end), the period being the mean TPOT of the requests decoding then; each step is a
  scheduling gap (10% of the period), connector calls and the forward. In pull, the
  step in which D's model runner posts a request's READ (kv.desc_prep) carries that
  descriptor prep as connector time; in push, D polls for notifications. While
  requests only wait for their KV (push), D's loop keeps stepping with empty batches.
* Export records (``engine.export``), one every `EXPORT_EVERY_MS` per process and a
  final one after the last request: the spans it exported so far, cumulative, as the
  pipeline writes them. `export_dropped` makes a process drop spans (its queue full);
  a process in `unflushed` never writes its final record (killed before it flushed).
* Thread samples, one a second per process (EngineCore + its API server, the worker),
  with cumulative CPU consistent with that work, and cores: P on core 0, D on core 1,
  each pinned. ``unpinned_decode=True`` lets D's EngineCore thread run on both cores
  (affinity "0-1"); it is then on P's core in about half of its busy samples, and in push
  mode it burns CPU while requests wait for pushed KV (the case issue 8 found by hand).

Everything is emitted as spans of separate per-process traces (never request traces),
in batches of about one second, with parallel array attributes as the producer does.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from tracedpush import semconv as sc
from tracedpush.testing.synthetic.deployment import DECODE_INSTANCE, PREFILL_INSTANCE
from tracedpush.testing.synthetic.encode import Emitter, Process

P_CORE, D_CORE = 0, 1
EXPORT_EVERY_MS = 10_000.0  # the pipeline's period between engine.export records


@dataclass(slots=True)
class _Req:
    trace_id: int
    start: float  # proxy receipt
    end: float  # last token at the proxy
    outs: int
    prompt: int = 0
    p_compute: tuple[float, float] | None = None  # compute_started -> prefill end
    p_steps: int = 1
    d_arrival: float | None = None  # D's scheduler has it
    d_first: float | None = None  # D scheduled its first token (decode end)
    d_desc_prep: tuple[float, float] | None = None  # pull: D posts the READ
    d_loaded: float | None = None  # D learned the KV arrived
    writes: list[float] = field(default_factory=list)  # push: WRITE posted on P

    @property
    def tpot(self) -> float:
        return max(self.end - 0.2 - (self.d_first or self.end), 0.0) / max(self.outs - 1, 1)


@dataclass(slots=True)
class _Step:
    start: float
    duration: float
    connector: float
    prefill_tokens: int = 0
    decode_reqs: int = 0
    num_reqs: int = 0
    load_ms: float = 0.0
    results_ms: float = 0.0
    loads_started: int = 0
    loads_finished: int = 0


def _event(em: Emitter, proc: Process, span: ReadableSpan, name: str) -> float | None:
    for ev in span.events:
        if ev.name == name:
            return em.true_ms(ev.timestamp, proc)
    return None


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def _requests(em: Emitter, procs: Mapping[str, Process]) -> list[_Req]:
    reqs: dict[int, _Req] = {}
    proxy = procs["proxy"]
    for s in proxy.spans:
        if s.name != sc.SPAN_REQUEST:
            continue
        ft = _event(em, proxy, s, sc.EVENT_FIRST_TOKEN)
        if ft is None:
            continue
        trace_id = s.context.trace_id if s.context else 0
        reqs[trace_id] = _Req(
            trace_id,
            em.true_ms(s.start_time or 0, proxy),
            em.true_ms(s.end_time or 0, proxy),
            int(_attr(s, sc.OUTPUT_TOKENS) or 1),
        )
    for key in ("p_sched", "p_work", "d_sched", "d_work"):
        proc = procs[key]
        for s in proc.spans:
            r = reqs.get(s.context.trace_id if s.context else 0)
            if r is None:
                continue
            start = em.true_ms(s.start_time or 0, proc)
            end = em.true_ms(s.end_time or 0, proc)
            name = s.name
            if name == sc.SPAN_PREFILL:
                cs = _event(em, proc, s, sc.EVENT_COMPUTE_STARTED)
                r.p_compute = (cs if cs is not None else start, end - 0.2)
                r.p_steps = int(_attr(s, sc.PREFILL_STEPS) or 1)
                r.prompt = int(_attr(s, sc.PROMPT_TOKENS) or 0)
            elif name == sc.SPAN_DECODE:
                r.d_arrival = _event(em, proc, s, sc.EVENT_BLOCKS_ALLOCATED) or start
                r.d_first = end
            elif name == sc.SPAN_KV_DESC_PREP and key == "d_work":
                r.d_desc_prep = (start, end)
            elif name in (sc.SPAN_KV_READ, sc.SPAN_KV_NOTIFY) and key == "d_work":
                r.d_loaded = end
            elif name == sc.SPAN_KV_WRITE:
                r.writes.append(start)
    return [r for r in reqs.values() if r.d_first is not None]


def _prefill_steps(reqs: Sequence[_Req]) -> list[_Step]:
    steps = []
    for r in sorted(reqs, key=lambda r: r.p_compute[0] if r.p_compute else 0.0):
        if r.p_compute is None:
            continue
        t0, t1 = r.p_compute
        n = max(r.p_steps, 1)
        each = max(t1 - t0, 0.01) / n
        tokens = [r.prompt // n + (i < r.prompt % n) for i in range(n)]
        for i in range(n):
            steps.append(
                _Step(
                    t0 + i * each,
                    each * 0.98,
                    min(0.05 + 0.01 * i, each * 0.5),
                    prefill_tokens=tokens[i],
                    num_reqs=1,
                    results_ms=0.02,
                )
            )
    return steps


def _decode_steps(reqs: Sequence[_Req], mode: str) -> list[_Step]:
    """D's steps: decode batches while any request decodes; empty steps while requests
    only wait for their KV (push)."""
    if not reqs:
        return []
    steps: list[_Step] = []
    t = min(r.d_arrival or r.d_first or r.start for r in reqs)
    t_end = max(r.end for r in reqs)
    prep = sorted((r.d_desc_prep for r in reqs if r.d_desc_prep), key=lambda x: x[0])
    loaded = sorted(r.d_loaded for r in reqs if r.d_loaded is not None)
    pi = li = 0
    # t only grows: a request joins `active` (in d_first order) once, and leaves for good
    by_first = sorted(reqs, key=lambda r: r.d_first or 0.0)
    by_arrival = sorted(reqs, key=lambda r: r.d_arrival or 0.0)
    # where D's idle loop may wake next: every request's arrival and first decode
    wakes = sorted(x for r in reqs for x in (r.d_arrival or 0.0, (r.d_first or 0.0) - 1.0))
    active: list[_Req] = []
    on_d: list[_Req] = []  # arrived on D, first token not yet (push: waiting for KV)
    fi = ai = 0
    while t < t_end:
        while fi < len(by_first) and (by_first[fi].d_first or 0.0) - 1.0 <= t:
            active.append(by_first[fi])
            fi += 1
        active = [r for r in active if t < r.end - 0.2]
        while ai < len(by_arrival) and (by_arrival[ai].d_arrival or 0.0) <= t:
            on_d.append(by_arrival[ai])
            ai += 1
        on_d = [r for r in on_d if t < (r.d_first or 0.0)]
        waiting = mode == "push" and bool(on_d)
        starts = 0
        load_ms = 0.0
        while pi < len(prep) and prep[pi][0] <= t:
            load_ms += prep[pi][1] - prep[pi][0] + 0.05
            starts += 1
            pi += 1
        finished = 0
        while li < len(loaded) and loaded[li] <= t:
            finished += 1
            li += 1
        if not active:
            if waiting or load_ms:
                dur = 0.1 + load_ms
                steps.append(
                    _Step(
                        t,
                        dur,
                        0.09 + load_ms,
                        load_ms=load_ms,
                        results_ms=0.08,
                        loads_started=starts,
                        loads_finished=finished,
                    )
                )
                t += 5.0 if not load_ms else dur + 0.05
                continue
            # the earliest wake, load start or load end after t (the latter two lists
            # hold only what is after t: the loops above took the rest)
            wi = bisect_right(wakes, t)
            nxt = wakes[wi : wi + 1] + [p[0] for p in prep[pi : pi + 1]] + loaded[li : li + 1]
            if not nxt:
                break
            t = min(nxt) + 1e-3
            continue
        period = sum(r.tpot for r in active) / len(active)
        results = 0.05 + 0.01 * len(active) + (0.1 if mode == "push" else 0.0)
        connector = 0.02 + results + load_ms
        gap = 0.1 * period
        forward = max(period - gap - connector, 0.3)
        steps.append(
            _Step(
                t,
                forward + connector,
                connector,
                decode_reqs=len(active),
                num_reqs=len(active),
                load_ms=load_ms,
                results_ms=results,
                loads_started=starts,
                loads_finished=finished,
            )
        )
        t += max(period, forward + connector + 0.05)
    return steps


def _emit_steps(
    em: Emitter,
    rng: random.Random,
    sched: Process,
    work: Process,
    steps: Sequence[_Step],
    base: Mapping[str, Any],
) -> tuple[int, int]:
    sched_tid, work_tid = rng.getrandbits(128), rng.getrandbits(128)
    groups: dict[int, list[tuple[int, _Step]]] = {}
    for seq, st in enumerate(steps, start=1):
        groups.setdefault(int(st.start // 1000.0), []).append((seq, st))
    for _, batch in sorted(groups.items()):
        seqs = [q for q, _ in batch]
        # scheduler: scheduled just before the worker binds the step's metadata
        s_starts = [em.ns(st.start - 0.05, sched) for _, st in batch]
        _span(
            rng,
            sched,
            sched_tid,
            sc.SPAN_ENGINE_STEPS,
            s_starts[0],
            s_starts[-1],
            {
                **base,
                sc.SIDE: "scheduler",
                sc.STEP_SEQ: seqs,
                sc.STEP_START_NS: s_starts,
                sc.STEP_PREFILL_TOKENS: [st.prefill_tokens for _, st in batch],
                sc.STEP_DECODE_REQS: [st.decode_reqs for _, st in batch],
                sc.STEP_NUM_REQS: [st.num_reqs for _, st in batch],
            },
        )
        w_starts = [em.ns(st.start, work) for _, st in batch]
        durs = [max(round(st.duration * 1000), 1) for _, st in batch]
        conn = [min(round(st.connector * 1000), d) for (_, st), d in zip(batch, durs, strict=True)]
        load = [round(st.load_ms * 1000) for _, st in batch]
        res = [round(st.results_ms * 1000) for _, st in batch]
        bind = [max(c - lo - r - 1, 0) for c, lo, r in zip(conn, load, res, strict=True)]
        _span(
            rng,
            work,
            work_tid,
            sc.SPAN_ENGINE_STEPS,
            w_starts[0],
            w_starts[-1] + durs[-1] * 1000,
            {
                **base,
                sc.SIDE: "worker",
                sc.STEP_SEQ: seqs,
                sc.STEP_START_NS: w_starts,
                sc.STEP_DURATION_US: durs,
                sc.STEP_CONNECTOR_US: conn,
                sc.STEP_BIND_US: bind,
                sc.STEP_LOAD_US: load,
                sc.STEP_SAVE_US: [1 if c > 0 else 0 for c in conn],
                sc.STEP_RESULTS_US: res,
                sc.STEP_LOADS_STARTED: [st.loads_started for _, st in batch],
                sc.STEP_LOADS_FINISHED: [st.loads_finished for _, st in batch],
            },
        )
    return sched_tid, work_tid


def _span(
    rng: random.Random,
    proc: Process,
    trace_id: int,
    name: str,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, Any],
) -> None:
    """A root span of a per-process trace (span ids from the steps' own generator)."""
    proc.add(trace_id, rng.getrandbits(64), 0, name, start_ns, end_ns, attrs)


def _busy(intervals: Iterable[tuple[float, float]], t0: float, t1: float) -> float:
    return sum(max(min(b, t1) - max(a, t0), 0.0) for a, b in intervals)


class _Intervals:
    """Fixed intervals, and those of them that may meet a window [t0, t1): the others
    end by t0 or start at t1 or later, so they add exactly 0.0 to a busy sum and cover
    nothing of a union. Asking only those spares a pass over every step or request for
    every thread sample (which made `generate` quadratic), with the same result to the
    last bit."""

    def __init__(self, intervals: Sequence[tuple[float, float]]) -> None:
        self.intervals = list(intervals)
        self.starts = [a for a, _ in self.intervals]
        self.ordered = all(x <= y for x, y in zip(self.starts, self.starts[1:], strict=False))
        self.max_end = list(accumulate((b for _, b in self.intervals), max))

    def meeting(self, t0: float, t1: float) -> list[tuple[float, float]]:
        """The intervals that may meet [t0, t1), in their order (all when unordered)."""
        if not self.ordered:
            return self.intervals
        lo = bisect_right(self.max_end, t0)  # before lo every interval ends by t0
        hi = bisect_left(self.starts, t1)  # from hi every interval starts at t1 or later
        return self.intervals[lo:hi]

    def busy(self, t0: float, t1: float) -> float:
        """`_busy` of all the intervals."""
        return float(_busy(self.meeting(t0, t1), t0, t1))


@dataclass(slots=True)
class _Thread:
    pid: int
    tid: int
    process: str
    name: str
    role: str
    cpu: float  # cumulative ms
    core: int
    affinity: str
    wait: float = 0.0  # cumulative ms runnable without a CPU
    wait_per_cpu: float = 0.02  # a rule: a pinned thread barely waits for its core


def _threads(
    engine: str, mode: str, sched_pid: int, work_pid: int, api_pid: int
) -> tuple[list[_Thread], list[_Thread]]:
    """The threads an engine's scheduler side (EngineCore and its API server) and worker
    report, with their starting CPU, pinned to the engine's core."""
    core = P_CORE if engine == "prefill" else D_CORE

    def th(pid: int, tid: int, process: str, name: str, role: str, cpu: float) -> _Thread:
        return _Thread(pid, tid, process, name, role, cpu, core, str(core))

    sched = [
        th(sched_pid, sched_pid, "engine_core", "MainThread", "engine_core", 9000.0),
        th(sched_pid, sched_pid + 11, "engine_core", "ZMQbg/IO/0", "other", 5.0),
        th(
            sched_pid,
            sched_pid + 12,
            "engine_core",
            "tracedpush-builder-scheduler",
            "tracedpush",
            0.0,
        ),
        th(sched_pid, sched_pid + 13, "engine_core", "tracedpush-export-jsonl", "tracedpush", 0.0),
        th(api_pid, api_pid, "api_server", "python", "api_server", 4000.0),
    ]
    writer = [th(work_pid, work_pid + 25, "worker", "nixl-push-writer", "push_writer", 0.0)]
    work = [
        th(work_pid, work_pid, "worker", "MainThread", "model_runner", 15000.0),
        th(work_pid, work_pid + 21, "worker", "VLLM::Worker", "compute", 20000.0),
        *(writer if mode == "push" else []),
        th(work_pid, work_pid + 22, "worker", "ucx-progress", "other", 0.0),
        th(work_pid, work_pid + 23, "worker", "tracedpush-builder-worker", "tracedpush", 0.0),
        th(work_pid, work_pid + 24, "worker", "tracedpush-export-jsonl", "tracedpush", 0.0),
    ]
    return sched, work


def _emit_threads(
    em: Emitter,
    rng: random.Random,
    proc: Process,
    trace_id: int,
    threads: Sequence[_Thread],
    t0: float,
    t1: float,
    usage: Any,  # (thread, window start, window end) -> (cpu ms, core)
    events: Any,  # (window end) -> cumulative events
    base: Mapping[str, Any],
    side: str,
) -> None:
    prev = None
    t = t0
    while True:
        if prev is not None:
            for th in threads:
                ms, core = usage(th, prev, t)
                th.cpu += ms
                th.wait += ms * th.wait_per_cpu
                th.core = core
        _span(
            rng,
            proc,
            trace_id,
            sc.SPAN_ENGINE_THREADS,
            em.ns(prev if prev is not None else t, proc),
            em.ns(t, proc),
            {
                **base,
                sc.SIDE: side,
                sc.THREAD_PID: [th.pid for th in threads],
                sc.THREAD_TID: [th.tid for th in threads],
                sc.THREAD_PROCESS: [th.process for th in threads],
                sc.THREAD_NAME: [th.name for th in threads],
                sc.THREAD_ROLE: [th.role for th in threads],
                sc.THREAD_CPU_MS: [round(th.cpu, 1) for th in threads],
                sc.THREAD_CPU_WAIT_MS: [round(th.wait, 1) for th in threads],
                sc.THREAD_CORE: [th.core for th in threads],
                sc.THREAD_AFFINITY: [th.affinity for th in threads],
                sc.EVENTS_RECORDED: events(t),
            },
        )
        if t >= t1:
            break
        prev, t = t, min(t + 1000.0, t1)


def _emit_exports(
    em: Emitter,
    rng: random.Random,
    proc: Process,
    trace_id: int,
    t0: float,
    t1: float,
    base: Mapping[str, Any],
    side: str,
    dropped: int,
    final: bool,
) -> None:
    """Cumulative export records of `proc` every `EXPORT_EVERY_MS` from `t0`, the last at
    `t1` (final unless `final` is False): the spans it ended by then, `dropped` of them
    lost as the run goes (queue full) and the rest exported."""
    ends = sorted(s.end_time or 0 for s in proc.spans)
    prev, t = t0, min(t0 + EXPORT_EVERY_MS, t1)
    while True:
        lost = round(dropped * (t - t0) / max(t1 - t0, 1e-9))
        ended = bisect_right(ends, em.ns(t, proc))
        _span(
            rng,
            proc,
            trace_id,
            sc.SPAN_ENGINE_EXPORT,
            em.ns(prev, proc),
            em.ns(t, proc),
            {
                **base,
                sc.SIDE: side,
                sc.EXPORT_EXPORTER: ["jsonl"],
                sc.EXPORT_EXPORTED: [max(ended - lost, 0)],
                sc.EXPORT_QUEUED: [0],
                sc.EXPORT_FAILING: [False],
                sc.EXPORT_DROPPED_QUEUE_FULL: [lost],
                sc.EXPORT_DROPPED_EXPORT_FAILED: [0],
                sc.EXPORT_DROPPED_STORE_FULL: [0],
                sc.EVENTS_DROPPED: 0,
                sc.EXPORT_FINAL: final and t >= t1,
            },
        )
        if t >= t1:
            break
        prev, t = t, min(t + EXPORT_EVERY_MS, t1)


def add_process_traces(
    em: Emitter,
    procs: Mapping[str, Process],
    mode: str,
    *,
    seed: int = 0,
    unpinned_decode: bool = False,
    export_dropped: Mapping[str, int] | None = None,
    unflushed: Collection[str] = (),
) -> None:
    """Append engine.steps, engine.threads and engine.export spans to P's and D's
    processes. `export_dropped`: process key ("p_sched", "p_work", "d_sched", "d_work")
    -> spans it dropped; `unflushed`: keys of processes that write no final record."""
    rng = random.Random(seed)
    reqs = _requests(em, procs)
    if not reqs:
        return
    p_steps = _prefill_steps(reqs)
    d_steps = _decode_steps(reqs, mode)
    p_base = {sc.MODE: mode, sc.ROLE: "prefill", sc.ENGINE_ID: PREFILL_INSTANCE}
    d_base = {sc.MODE: mode, sc.ROLE: "decode", sc.ENGINE_ID: DECODE_INSTANCE}
    trace_ids = {
        "prefill": _emit_steps(em, rng, procs["p_sched"], procs["p_work"], p_steps, p_base),
        "decode": _emit_steps(em, rng, procs["d_sched"], procs["d_work"], d_steps, d_base),
    }

    t0 = min(r.start for r in reqs) - 500.0
    t1 = max(r.end for r in reqs) + 500.0
    p_busy = _Intervals([(s.start, s.start + s.duration) for s in p_steps])
    d_busy = _Intervals([(s.start, s.start + s.duration) for s in d_steps])
    waiting = _Intervals(sorted((r.d_arrival or r.d_first or 0.0, r.d_first or 0.0) for r in reqs))
    arrivals = sorted(r.start for r in reqs)
    writes = sorted(w for r in reqs for w in r.writes)

    def count(ts: Sequence[float], a: float, b: float) -> int:
        return bisect_left(ts, b) - bisect_left(ts, a)  # ts sorted

    def union_waiting(a: float, b: float) -> float:
        # share of [a, b) during which at least one request waits for its KV on D
        covered, cur = 0.0, a
        for s, e in waiting.meeting(a, b):
            s, e = max(s, cur), min(e, b)
            if e > s:
                covered += e - s
                cur = e
        return covered

    def usage_for(engine: str) -> Any:
        busy = p_busy if engine == "prefill" else d_busy
        n_steps = sorted(s.start for s in (p_steps if engine == "prefill" else d_steps))

        def usage(th: _Thread, a: float, b: float) -> tuple[float, int]:
            core = th.core
            if th.role == "model_runner":
                return 5.0 + 0.3 * busy.busy(a, b), core
            if th.role == "compute":
                return 0.7 * busy.busy(a, b), core
            if th.role == "api_server":
                return 8.0 + 1.5 * count(arrivals, a, b), core
            if th.role == "push_writer":
                return 1.0 + 0.4 * count(writes, a, b), core
            if th.role == "tracedpush":  # about 0.5% of the engine's CPU
                per = 0.08 if "builder" in th.name else 0.03
                return 0.1 + per * (count(arrivals, a, b) * 4 + count(n_steps, a, b) * 0.1), core
            if th.role == "engine_core":
                cpu = 15.0 + 0.02 * count(n_steps, a, b)
                if engine == "decode" and mode == "push":
                    # D's busy loop while requests wait for pushed KV
                    cpu += 0.6 * union_waiting(a, b)
                if engine == "decode" and unpinned_decode and cpu > 0:
                    core = P_CORE if rng.random() < 0.5 else D_CORE
                return cpu, core
            if th.name.startswith("ucx"):
                return 0.3, core
            return 0.1, core

        return usage

    pids = {"prefill": ("p_sched", "p_work"), "decode": ("d_sched", "d_work")}
    for engine, (ks, kw) in pids.items():
        sp, wp = procs[ks], procs[kw]
        base = p_base if engine == "prefill" else d_base
        sched, work = _threads(engine, mode, sp.pid, wp.pid, sp.pid + 50)
        if engine == "decode" and unpinned_decode:
            sched[0].affinity = f"{P_CORE}-{D_CORE}"
            sched[0].wait_per_cpu = 0.6  # half its time on P's busy core: it waits there
        usage = usage_for(engine)
        steps = p_steps if engine == "prefill" else d_steps
        starts = sorted(s.start for s in steps)

        def events(t: float, starts: Sequence[float] = starts) -> int:
            return 6 * count(arrivals, t0, t) + 2 * bisect_left(starts, t)

        s_tid, w_tid = trace_ids[engine]
        _emit_threads(em, rng, sp, s_tid, sched, t0, t1, usage, events, base, "scheduler")
        _emit_threads(em, rng, wp, w_tid, work, t0, t1, usage, events, base, "worker")
    drops = export_dropped or {}
    for engine, keys in pids.items():
        base = p_base if engine == "prefill" else d_base
        for key, side, tid in zip(keys, ("scheduler", "worker"), trace_ids[engine], strict=True):
            final = key not in unflushed
            _emit_exports(em, rng, procs[key], tid, t0, t1, base, side, drops.get(key, 0), final)
