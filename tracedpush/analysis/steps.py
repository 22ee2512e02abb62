"""Per-process step traces: engine steps and OS thread samples (not requests).

Each engine process emits its own trace of ``engine.steps`` and ``engine.threads`` spans
(docs/spans.md) carrying parallel array attributes. This module turns them into
`EngineStep` records (the scheduler's and the model-runner's record of one step joined
on (engine id, seq)) and `ThreadSample` records (one OS sample of one process's threads),
kept in an `EngineSteps` store next to the requests, never among them.

Times stay on the raw clock of the host that emitted them; `EngineSteps.place` shifts
them onto the proxy's clock with the offsets the analysis estimated for each instance.

Array attributes arrive as lists from OTLP JSON (``arrayValue``); Jaeger's legacy API
flattens them into JSON strings (``"[1,2,3]"``), which are parsed here too.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis.model import Resource, Span

PROCESS_SPANS = frozenset(sc.PROCESS_SPANS)


def is_process_span(span: Span) -> bool:
    """True for per-process spans (engine steps, thread samples): never a request's."""
    return span.name in PROCESS_SPANS


def array(value: Any) -> list[Any]:
    """An array attribute as a list: OTLP arrays, Jaeger legacy JSON strings, scalars."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                v = json.loads(s)
            except ValueError:
                return []
            return v if isinstance(v, list) else [v]
        return [value]
    return [value]


def _numbers(attrs: dict[str, Any], key: str, n: int, convert: Callable[[Any], Any]) -> list[Any]:
    """Element i of the array attribute `key` as `convert` makes it; None where absent or bad."""
    vals = array(attrs.get(key))
    out: list[Any] = []
    for i in range(n):
        v = vals[i] if i < len(vals) else None
        try:
            out.append(None if v is None else convert(v))
        except (TypeError, ValueError):
            out.append(None)
    return out


def _ints(attrs: dict[str, Any], key: str, n: int) -> list[int | None]:
    return _numbers(attrs, key, n, int)


def _floats(attrs: dict[str, Any], key: str, n: int) -> list[float | None]:
    return _numbers(attrs, key, n, float)


def _strs(attrs: dict[str, Any], key: str, n: int) -> list[str]:
    vals = array(attrs.get(key))
    return [str(vals[i]) if i < len(vals) and vals[i] is not None else "" for i in range(n)]


def _role(span: Span) -> str:
    role = span.attributes.get(sc.ROLE)
    if role:
        return str(role)
    service = span.resource.service
    return "prefill" if "prefill" in service else "decode" if "decode" in service else ""


def _engine(span: Span) -> str:
    return str(span.attributes.get(sc.ENGINE_ID) or span.resource.instance)


def _side(span: Span) -> str:
    side = span.attributes.get(sc.SIDE) or span.resource.attributes.get(sc.SIDE)
    if side:
        return str(side)
    # without the attribute: the worker records durations, the scheduler does not
    return "worker" if sc.STEP_DURATION_US in span.attributes else "scheduler"


@dataclass(slots=True)
class EngineStep:
    """One engine step of one engine, scheduler and worker records joined.

    Times are Unix ns on the emitting host's raw clock (see `EngineSteps.place`).
    ``start_ns``/``end_ns``: the worker's connector window (bind -> clear, which holds
    the forward) when the worker recorded the step, else the scheduler's schedule time
    (a zero-length step). Fields a side did not record are None.
    """

    engine_id: str
    role: str  # "prefill" | "decode"
    host: str
    seq: int
    start_ns: int
    end_ns: int
    scheduled_ns: int | None = None  # scheduler: when the step was scheduled
    prefill_tokens: int | None = None
    decode_reqs: int | None = None
    num_reqs: int | None = None
    duration_us: int | None = None  # worker: bind -> clear (connector window + forward)
    connector_us: int | None = None  # worker: inside connector calls on the model runner
    bind_us: int | None = None
    load_us: int | None = None  # start_load_kv
    save_us: int | None = None  # wait_for_save
    results_us: int | None = None  # get_finished / transfer results / polling
    loads_started: int | None = None
    loads_finished: int | None = None
    domain: Resource | None = field(default=None, repr=False, compare=False)  # clock owner

    @property
    def has_worker(self) -> bool:
        return self.duration_us is not None

    @property
    def has_scheduler(self) -> bool:
        return self.num_reqs is not None

    @property
    def forward_us(self) -> int | None:
        """Model forward (and the rest of execute_model's window): duration - connector."""
        if self.duration_us is None:
            return None
        return max(self.duration_us - (self.connector_us or 0), 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "role": self.role,
            "host": self.host,
            "seq": self.seq,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "scheduled_ns": self.scheduled_ns,
            "prefill_tokens": self.prefill_tokens,
            "decode_reqs": self.decode_reqs,
            "num_reqs": self.num_reqs,
            "duration_us": self.duration_us,
            "connector_us": self.connector_us,
            "connector_parts_us": {
                "bind": self.bind_us,
                "start_load_kv": self.load_us,
                "wait_for_save": self.save_us,
                "results": self.results_us,
            },
            "loads_started": self.loads_started,
            "loads_finished": self.loads_finished,
        }


@dataclass(slots=True)
class ThreadSample:
    """One OS sample (from /proc) of every thread of the processes one engine process
    samples (EngineCore samples itself and its API server; each worker itself).

    Parallel tuples, one element per thread; ``cpu_ms`` is cumulative since each thread
    started, so CPU over a window is the difference between two samples of one tid.
    """

    engine_id: str
    role: str  # the engine's role: "prefill" | "decode"
    host: str
    side: str  # "scheduler" | "worker"
    sampler_pid: str  # the process that took the sample (resource process.pid)
    time_ns: int  # when it was taken (span end), raw clock of the host
    pids: tuple[int, ...]
    tids: tuple[int, ...]
    processes: tuple[str, ...]  # "api_server" | "engine_core" | "worker"
    names: tuple[str, ...]
    thread_roles: tuple[str, ...]  # semconv.THREAD_ROLES
    cpu_ms: tuple[float, ...]
    cores: tuple[int, ...]  # -1 when unknown
    affinity: tuple[str, ...]
    events_recorded: int | None = None  # cumulative hook events of the sampling process

    def __len__(self) -> int:
        return len(self.tids)


def steps_from_span(span: Span) -> tuple[str, list[EngineStep]]:
    """(side, the steps of one ``engine.steps`` span, each with one side filled)."""
    a = span.attributes
    seqs = _ints(a, sc.STEP_SEQ, len(array(a.get(sc.STEP_SEQ))))
    n = len(seqs)
    starts = _ints(a, sc.STEP_START_NS, n)
    side = _side(span)
    eid, role, host = _engine(span), _role(span), span.resource.host
    out: list[EngineStep] = []
    if side == "worker":
        dur = _ints(a, sc.STEP_DURATION_US, n)
        conn = _ints(a, sc.STEP_CONNECTOR_US, n)
        bind = _ints(a, sc.STEP_BIND_US, n)
        load = _ints(a, sc.STEP_LOAD_US, n)
        save = _ints(a, sc.STEP_SAVE_US, n)
        res = _ints(a, sc.STEP_RESULTS_US, n)
        ls = _ints(a, sc.STEP_LOADS_STARTED, n)
        lf = _ints(a, sc.STEP_LOADS_FINISHED, n)
        for i in range(n):
            seq, t0 = seqs[i], starts[i]
            if seq is None or t0 is None:
                continue
            d = dur[i] if dur[i] is not None else 0
            out.append(
                EngineStep(
                    eid,
                    role,
                    host,
                    seq,
                    t0,
                    t0 + d * 1000,
                    duration_us=d,
                    connector_us=conn[i],
                    bind_us=bind[i],
                    load_us=load[i],
                    save_us=save[i],
                    results_us=res[i],
                    loads_started=ls[i],
                    loads_finished=lf[i],
                    domain=span.resource,
                )
            )
    else:
        pt = _ints(a, sc.STEP_PREFILL_TOKENS, n)
        dr = _ints(a, sc.STEP_DECODE_REQS, n)
        nr = _ints(a, sc.STEP_NUM_REQS, n)
        for i in range(n):
            seq, t0 = seqs[i], starts[i]
            if seq is None or t0 is None:
                continue
            out.append(
                EngineStep(
                    eid,
                    role,
                    host,
                    seq,
                    t0,
                    t0,
                    scheduled_ns=t0,
                    prefill_tokens=pt[i],
                    decode_reqs=dr[i],
                    num_reqs=nr[i],
                    domain=span.resource,
                )
            )
    return side, out


def sample_from_span(span: Span) -> ThreadSample:
    a = span.attributes
    tids = _ints(a, sc.THREAD_TID, len(array(a.get(sc.THREAD_TID))))
    n = len(tids)
    cores = _ints(a, sc.THREAD_CORE, n)
    cpu = _floats(a, sc.THREAD_CPU_MS, n)
    pids = _ints(a, sc.THREAD_PID, n)
    ev = a.get(sc.EVENTS_RECORDED)
    try:
        events = None if ev is None else int(ev)
    except (TypeError, ValueError):
        events = None
    return ThreadSample(
        engine_id=_engine(span),
        role=_role(span),
        host=span.resource.host,
        side=_side(span),
        sampler_pid=span.resource.pid,
        time_ns=span.end_ns,
        pids=tuple(-1 if p is None else p for p in pids),
        tids=tuple(-1 if t is None else t for t in tids),
        processes=tuple(_strs(a, sc.THREAD_PROCESS, n)),
        names=tuple(_strs(a, sc.THREAD_NAME, n)),
        thread_roles=tuple(r or "other" for r in _strs(a, sc.THREAD_ROLE, n)),
        cpu_ms=tuple(0.0 if c is None else c for c in cpu),
        cores=tuple(-1 if c is None else c for c in cores),
        affinity=tuple(_strs(a, sc.THREAD_AFFINITY, n)),
        events_recorded=events,
    )


def _merge(sched: EngineStep, work: EngineStep) -> EngineStep:
    work.scheduled_ns = sched.scheduled_ns
    work.prefill_tokens = sched.prefill_tokens
    work.decode_reqs = sched.decode_reqs
    work.num_reqs = sched.num_reqs
    return work


_JOIN_SLACK_NS = 10 * 10**9  # a step is bound this soon after it was scheduled, at most
_RANK_SLACK_NS = 10**9  # other TP ranks bind the same step within this


def join(sched: Iterable[EngineStep], work: Iterable[EngineStep]) -> list[EngineStep]:
    """Scheduler and worker records of one engine joined on seq: each worker record takes
    the scheduler record of its seq nearest in time (a seq repeats after a restart of an
    engine with the same id). With several workers (TP), the first worker process's
    record of a step is kept and the other ranks' (same seq, other process, bound within
    a second) are dropped. Unmatched records stay, half filled. Sorted by start."""
    by_seq: dict[int, list[EngineStep]] = {}
    for s in sorted(sched, key=lambda s: s.start_ns):
        by_seq.setdefault(s.seq, []).append(s)
    out: list[EngineStep] = []
    taken: dict[int, list[EngineStep]] = {}  # seq -> worker records kept
    for w in sorted(work, key=lambda s: s.start_ns):
        kept = taken.setdefault(w.seq, [])
        if any(
            k.domain is not w.domain and abs(w.start_ns - k.start_ns) < _RANK_SLACK_NS for k in kept
        ):
            continue  # another rank's record of the same step
        kept.append(w)
        cands = by_seq.get(w.seq)
        if cands:
            best = min(range(len(cands)), key=lambda i: abs(cands[i].start_ns - w.start_ns))
            if abs(cands[best].start_ns - w.start_ns) < _JOIN_SLACK_NS:
                out.append(_merge(cands.pop(best), w))
                continue
        out.append(w)
    for rest in by_seq.values():
        out.extend(rest)
    out.sort(key=lambda s: (s.start_ns, s.seq))
    return out


@dataclass(slots=True)
class EngineInfo:
    engine_id: str
    role: str
    host: str


@dataclass
class EngineSteps:
    """Every engine's steps (joined, time-ordered) and every thread sample of a run."""

    steps: dict[str, list[EngineStep]] = field(default_factory=dict)  # engine id -> steps
    samples: list[ThreadSample] = field(default_factory=list)
    engines: dict[str, EngineInfo] = field(default_factory=dict)
    spans: int = 0  # process spans read
    _starts: dict[str, list[int]] = field(default_factory=dict, repr=False)
    # per engine, the latest end among steps[0..i] (nondecreasing: bisectable)
    _max_end: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def __bool__(self) -> bool:
        return bool(self.steps or self.samples)

    @classmethod
    def from_spans(cls, spans: Iterable[Span]) -> EngineSteps:
        sched: dict[str, list[EngineStep]] = {}
        work: dict[str, list[EngineStep]] = {}
        store = cls()
        for s in spans:
            if s.name == sc.SPAN_ENGINE_STEPS:
                side, steps = steps_from_span(s)
                (work if side == "worker" else sched).setdefault(_engine(s), []).extend(steps)
            elif s.name == sc.SPAN_ENGINE_THREADS:
                store.samples.append(sample_from_span(s))
            else:
                continue
            store.spans += 1
            eid = _engine(s)
            if eid not in store.engines:
                store.engines[eid] = EngineInfo(eid, _role(s), s.resource.host)
        for eid in sorted(set(sched) | set(work)):
            store.steps[eid] = join(sched.get(eid, ()), work.get(eid, ()))
        store.samples.sort(key=lambda x: x.time_ns)
        return store

    def place(self, offset_ns: Callable[[Resource], int]) -> None:
        """Move every step onto the reference (proxy) clock: t - offset of its instance.
        Call once; thread samples keep their raw times (only deltas are used)."""
        for steps in self.steps.values():
            for st in steps:
                off = offset_ns(st.domain) if st.domain is not None else 0
                if off:
                    st.start_ns -= off
                    st.end_ns -= off
                    if st.scheduled_ns is not None:
                        st.scheduled_ns -= off
            steps.sort(key=lambda s: (s.start_ns, s.seq))
        self._starts = {}
        self._max_end = {}

    def worker_steps(self, engine_id: str) -> list[EngineStep]:
        return [s for s in self.steps.get(engine_id, ()) if s.has_worker]

    def overlapping(self, engine_id: str, t0_ns: int, t1_ns: int) -> list[EngineStep]:
        """Worker-recorded steps of one engine that overlap [t0, t1] (time order)."""
        steps = self.steps.get(engine_id)
        if not steps:
            return []
        starts = self._starts.get(engine_id)
        if starts is None:
            starts = self._starts[engine_id] = [s.start_ns for s in steps]
            latest, ends = 0, []
            for s in steps:
                latest = max(latest, s.end_ns)
                ends.append(latest)
            self._max_end[engine_id] = ends
        # the first step that ends after t0: every step before it ends by t0. (Starting
        # from t0 minus the longest step scanned most of a long run for every request.)
        i = bisect_right(self._max_end[engine_id], t0_ns)
        out = []
        for s in steps[i:]:
            if s.start_ns > t1_ns:
                break
            if s.has_worker and s.end_ns > t0_ns:
                out.append(s)
        return out

    def solo_forward_us(self, engine_id: str) -> float | None:
        """The forward cost of a step with one decode request and nothing else: the median
        forward of such steps, else the smallest forward of steps that computed anything
        (scheduler record: at least one request; no scheduler record: forward > 0)."""
        return _solo(self.steps.get(engine_id, ()))

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per engine: steps, median step ms, forward, connector share, loads."""
        out: dict[str, dict[str, Any]] = {}
        for eid, steps in sorted(self.steps.items()):
            info = self.engines.get(eid)
            work = [s for s in steps if s.has_worker]
            durs = [s.duration_us or 0 for s in work]
            busy = [s for s in work if s.num_reqs is None or s.num_reqs > 0]
            conn = sum(s.connector_us or 0 for s in work)
            total = sum(durs)
            parts = {
                "bind": sum(s.bind_us or 0 for s in work) / 1000.0,
                "start_load_kv": sum(s.load_us or 0 for s in work) / 1000.0,
                "wait_for_save": sum(s.save_us or 0 for s in work) / 1000.0,
                "results": sum(s.results_us or 0 for s in work) / 1000.0,
            }
            solo = _solo(steps)
            out[eid] = {
                "role": info.role if info else "",
                "host": info.host if info else "",
                "steps": len(steps),
                "worker_steps": len(work),
                "scheduler_steps": sum(1 for s in steps if s.has_scheduler),
                "joined_steps": sum(1 for s in steps if s.has_scheduler and s.has_worker),
                "busy_steps": len(busy),
                "median_step_ms": _r(median(durs) / 1000.0) if durs else None,
                "median_busy_step_ms": (
                    _r(median(s.duration_us or 0 for s in busy) / 1000.0) if busy else None
                ),
                "solo_forward_ms": None if solo is None else _r(solo / 1000.0),
                "step_ms_total": _r(total / 1000.0),
                "connector_ms_total": _r(conn / 1000.0),
                "connector_share": _r(conn / total) if total else None,
                "connector_parts_ms": {k: _r(v) for k, v in parts.items()},
                "prefill_tokens": sum(s.prefill_tokens or 0 for s in steps),
                "loads_started": sum(s.loads_started or 0 for s in work),
                "loads_finished": sum(s.loads_finished or 0 for s in work),
            }
        return out


def _solo(steps: Sequence[EngineStep]) -> float | None:
    solo = [
        s.forward_us
        for s in steps
        if s.has_worker
        and s.decode_reqs == 1
        and (s.prefill_tokens or 0) == 0
        and s.num_reqs in (None, 1)
    ]
    solo_f = [float(x) for x in solo if x is not None]
    if solo_f:
        return float(median(solo_f))
    busy = [
        float(s.forward_us)
        for s in steps
        if s.forward_us is not None
        and (
            (s.num_reqs is not None and s.num_reqs > 0) or (s.num_reqs is None and s.forward_us > 0)
        )
    ]
    return min(busy) if busy else None


def _r(x: float) -> float:
    return round(x, 4)


def placed(
    spans: Iterable[Span], resources: Iterable[Resource], applied_ms: dict[str, float]
) -> EngineSteps:
    """An `EngineSteps` from process spans, moved onto the reference clock.

    `resources`: the request spans' resources (their clock domains carry the offsets);
    `applied_ms`: domain label -> offset applied (ms), as `analyze` computed them."""
    from tracedpush.analysis import skew

    spans = list(spans)
    store = EngineSteps.from_spans(spans)
    if not store.steps or not applied_ms:
        return store
    own = {id(s.resource): s.resource for s in spans}
    dom = skew.domains([*resources, *own.values()])
    by_id = {id(r): round(applied_ms.get(label, 0.0) * 1e6) for r, label in dom.items()}
    store.place(lambda r: by_id.get(id(r), 0))
    return store
