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
import marshal
import operator
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracedpush import semconv as sc
from tracedpush.analysis import export_health
from tracedpush.analysis import steps_columns as cols
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

    Parallel tuples, one element per thread; ``cpu_ms`` and ``cpu_wait_ms`` are cumulative
    since each thread started, so CPU (or the wait for one) over a window is the
    difference between two samples of one tid.
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
    # cumulative ms runnable without a CPU (schedstat run delay), -1 where unknown; None
    # when the sample has none (traces from before it, or a kernel without schedstats)
    cpu_wait_ms: tuple[float, ...] | None = None

    def __len__(self) -> int:
        return len(self.tids)


_SAMPLE_FIELDS = operator.attrgetter(*ThreadSample.__slots__)


def _pack_samples(samples: list[ThreadSample]) -> bytes:
    """Thread samples in `marshal`, one tuple each: pickling the objects took 2.6 s for
    the 105,000 of a 200,000-request run (an index writes its steps on every pause of a
    Live run), this 0.5 s. Every field is a plain int, float, str or tuple of them
    (`sample_from_span` converts each), which `marshal` keeps exactly."""
    return marshal.dumps(list(map(_SAMPLE_FIELDS, samples)))


def _unpack_samples(blob: bytes) -> list[ThreadSample]:
    return [ThreadSample(*t) for t in marshal.loads(blob)]


def _by_time(sample: ThreadSample) -> int:
    return sample.time_ns


# EngineSteps' samples as held (`EngineSteps.samples`); pickled packed, as "samples"
_SAMPLES_STATE = frozenset({"_samples", "_packed", "_packed_n", "_more"})


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
    wait = _floats(a, sc.THREAD_CPU_WAIT_MS, n) if sc.THREAD_CPU_WAIT_MS in a else None
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
        cpu_wait_ms=None if wait is None else tuple(-1.0 if w is None else w for w in wait),
    )


def _merge(sched: EngineStep, work: EngineStep) -> EngineStep:
    work.scheduled_ns = sched.scheduled_ns
    work.prefill_tokens = sched.prefill_tokens
    work.decode_reqs = sched.decode_reqs
    work.num_reqs = sched.num_reqs
    return work


_JOIN_SLACK_NS = 10 * 10**9  # a step is bound this soon after it was scheduled, at most
_RANK_SLACK_NS = cols.RANK_SLACK_NS  # other TP ranks bind the same step within this


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


class _StepLists(Mapping[str, list[EngineStep]]):
    """`EngineSteps.steps`: engine id -> its steps as objects, made on first read."""

    def __init__(self, store: EngineSteps) -> None:
        self._store = store

    def __getitem__(self, engine_id: str) -> list[EngineStep]:
        return self._store._objects(engine_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._store.columns)

    def __len__(self) -> int:
        return len(self._store.columns)

    def __contains__(self, engine_id: object) -> bool:
        return engine_id in self._store.columns


class StepParts:
    """Process spans parsed but not joined: per engine and side, column blocks in span
    order; thread samples; engines as first seen. The analysis index's build workers
    each parse their traces' and the parent merges them in the traces' order, which
    makes what one reader of every span makes."""

    def __init__(self, numbered_as: StepParts | None = None) -> None:
        """`numbered_as`: share its origin numbers (merging then copies no block)."""
        # (clock owner, role) of a block's steps
        self.origins: list[tuple[Resource, str]] = []
        self._origin_of: dict[tuple[int, str], int] = {}
        if numbered_as is not None:
            self.origins, self._origin_of = numbered_as.origins, numbered_as._origin_of
        self.sched: dict[str, list[cols.Columns]] = {}
        self.work: dict[str, list[cols.Columns]] = {}
        self.samples: list[ThreadSample] = []
        self.engines: dict[str, EngineInfo] = {}
        self.spans = 0
        self.resources: dict[int, Resource] = {}  # every process span's, as first seen
        # each engine process's latest engine.export record (`export_health`)
        self.exports: dict[export_health.Key, export_health.ExportAccount] = {}

    def __getstate__(self) -> dict[str, Any]:
        # ids mean nothing in another process
        resources = list(self.resources.values())
        return {**self.__dict__, "_origin_of": {}, "resources": resources,
                "samples": _pack_samples(self.samples)}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.resources = {id(r): r for r in state["resources"]}
        self.samples = _unpack_samples(state["samples"])

    def _origin(self, res: Resource, role: str) -> int:
        key = (id(res), role)
        origin = self._origin_of.get(key)
        if origin is None:
            origin = self._origin_of[key] = len(self.origins)
            self.origins.append((res, role))
        return origin

    def add(self, s: Span) -> None:
        if s.name == sc.SPAN_ENGINE_STEPS:
            side, block = _span_columns(s, self._origin(s.resource, _role(s)))
            (self.work if side == "worker" else self.sched).setdefault(_engine(s), []).append(block)
        elif s.name == sc.SPAN_ENGINE_THREADS:
            self.samples.append(sample_from_span(s))
        elif s.name == sc.SPAN_ENGINE_EXPORT:
            export_health.fold(self.exports, (export_health.account_from_span(s),))
            return
        else:
            return
        self.resources.setdefault(id(s.resource), s.resource)
        self.spans += 1
        eid = _engine(s)
        if eid not in self.engines:
            self.engines[eid] = EngineInfo(eid, _role(s), s.resource.host)

    def extend(self, spans: Iterable[Span]) -> StepParts:
        """`add` each of `spans` (one at a time: a big run's need not be in memory)."""
        for s in spans:
            self.add(s)
        return self

    def merge(
        self, other: StepParts, resource: Callable[[Resource], Resource], *, own: bool = False
    ) -> None:
        """Append `other`'s parts; `resource` maps its resources onto this reader's.
        Blocks are shared, not copied, when both number origins alike, or renumbered in
        place when `own` (`other` is used up: a build worker's, unpickled)."""
        same = other.origins is self.origins
        if not same:
            remap = np.array([self._origin(resource(r), role) for r, role in other.origins] or [0])
        for mine, theirs in ((self.sched, other.sched), (self.work, other.work)):
            for eid, blocks in theirs.items():
                out = mine.setdefault(eid, [])
                if same:
                    out += blocks
                    continue
                for b in blocks:
                    b = b if own else b.copy()
                    b[cols.ORIGIN] = remap[b[cols.ORIGIN]]
                    out.append(b)
        self.samples += other.samples
        for r in other.resources.values():
            mine = resource(r)
            self.resources.setdefault(id(mine), mine)
        for eid, info in other.engines.items():
            self.engines.setdefault(eid, info)
        self.spans += other.spans
        export_health.fold(self.exports, other.exports.values())

    def store(self) -> EngineSteps:
        """The joined steps (raw clocks; see `EngineSteps.place`). Uses the parts up:
        each engine's blocks are let go once joined (at 200,000 requests they, their
        concatenation and the join's output are 600 MB each)."""
        store = EngineSteps()
        store.origins = self.origins
        store.samples = sorted(self.samples, key=_by_time)
        store.engines = dict(self.engines)
        store.exports = dict(self.exports)
        store.spans = self.spans
        store.resources = list(self.resources.values())
        store.offsets = np.zeros(len(self.origins) or 1, np.int64)
        domains = _domains(self.origins)
        for eid in sorted(set(self.sched) | set(self.work)):
            work = self.work.pop(eid, [])
            n_work = sum(b.shape[1] for b in work)
            table = cols.stacked(work, self.sched.pop(eid, []))
            store.columns[eid] = cols.join_table(table, n_work, _JOIN_SLACK_NS, domains)
            store.recent[eid] = cols.recent(table, _JOIN_SLACK_NS)
        return store

    def placed(self, resources: Iterable[Resource], applied_ms: dict[str, float]) -> EngineSteps:
        """The joined steps moved onto the reference clock. `resources`: the request
        spans' (their clock domains carry the offsets); `applied_ms`: domain label ->
        offset applied (ms), as `analyze` computed them."""
        resources = list(resources)
        store = self.store()  # uses the parts up
        store.serving = export_health.accountable(resources)
        if store.columns and applied_ms:
            offsets = _offsets(store.origins, [*resources, *store.resources], applied_ms)
            store.place(offsets, own=True)
        return store


def _offsets(
    origins: Sequence[tuple[Resource, str]],
    resources: Sequence[Resource],
    applied_ms: dict[str, float],
) -> np.ndarray:
    """ns offset per origin: its clock domain's among `resources` (request and process
    spans': a domain label depends on which instances share a host). By equality: a
    kept store's resources are copies of the run's."""
    from tracedpush.analysis import skew

    dom = skew.domains(resources)
    ms = [applied_ms.get(dom.get(r, ""), 0.0) for r, _role in origins]
    return np.array([round(x * 1e6) for x in ms] or [0], np.int64)


class EngineSteps:
    """Every engine's steps (joined, time-ordered) and every thread sample of a run.

    The steps are kept as columns (`steps_columns`); ``steps`` makes an engine's
    `EngineStep` objects when it is read, `overlapping` only those of the window."""

    def __init__(self) -> None:
        # engine id -> its steps as columns, sorted by (start, seq)
        self.columns: dict[str, cols.Columns] = {}
        self.origins: list[tuple[Resource, str]] = []  # a step's (clock owner, role)
        self.samples: list[ThreadSample] = []
        # `contention`'s fold of the samples (a `contention.UsageFold`), and the samples
        # that came after it: contention at a Live pause folds only those
        self.usage: Any = None
        self.usage_after: list[ThreadSample] = []
        self.engines: dict[str, EngineInfo] = {}
        self.exports: dict[export_health.Key, export_health.ExportAccount] = {}
        self.spans = 0  # process spans read
        self.resources: list[Resource] = []  # every process span's, as first seen
        # the processes of the request spans that must have an export account (engine
        # processes, and any whose resource says it writes records: `export_health`)
        self.serving: list[Resource] = []
        self.offsets = np.zeros(1, np.int64)  # ns per origin, as placed
        # per engine, its latest records as read (raw clocks, every one from a time on:
        # `steps_columns.recent`), for `extended`
        self.recent: dict[str, tuple[cols.Columns, int]] = {}
        self._lists: dict[str, list[EngineStep]] = {}
        # per engine, the latest end among steps[0..i] (nondecreasing: bisectable)
        self._max_end: dict[str, np.ndarray] = {}
        self._solo: dict[str, float | None] = {}  # per engine (its summary's)
        self._solo_steps: dict[str, np.ndarray] = {}  # per engine, per step (TPOT's)
        # these columns, by identity (`TpotSteps` made of them knows it), and, when
        # `extended` made them, the token of the steps it extended and, per engine, how
        # many of its first steps are theirs, unchanged
        self.token = secrets.randbits(63)
        self.grown_from: tuple[int, dict[str, int]] | None = None

    @property
    def samples(self) -> list[ThreadSample]:
        """The thread samples, by time (ties: as read). Steps read back from an index
        keep theirs packed until asked, and so do their extensions (the new ones kept
        beside): a Live refresh that extends kept steps never asks, and unpacking the
        105,000 of a 200,000-request run was 0.9 s of its first refresh. Pickling
        packs them (`_pack`: the new ones in a chunk of their own), and they stay
        packed: the index's write of the steps at a pause does not ask either, as their
        contention folds only the samples since the last (`contention.usage_fold`)."""
        if self._packed is not None:
            got = [smp for chunk in self._packed for smp in _unpack_samples(chunk)]
            # stable: as if each extension had sorted (each chunk is sorted)
            if self._more or len(self._packed) > 1:
                got = sorted(got + self._more, key=_by_time)
            self._samples, self._packed, self._packed_n, self._more = got, None, 0, []
        return self._samples

    @samples.setter
    def samples(self, samples: list[ThreadSample]) -> None:
        self._samples, self._packed, self._packed_n, self._more = samples, None, 0, []
        self.usage, self.usage_after = None, []

    def _samples_from(self, steps: EngineSteps, new: list[ThreadSample]) -> None:
        """`steps`' samples and `new`, by time; left packed if `steps`' are. Their
        contention's fold goes on from `steps`' (`contention.usage_fold`)."""
        if steps._packed is None:
            self.samples = sorted(steps._samples + new, key=_by_time)
        else:
            self._samples, self._packed = [], steps._packed
            self._packed_n, self._more = steps._packed_n, steps._more + new
        if steps.usage is not None:  # else none (a new store's, or the setter's)
            self.usage, self.usage_after = steps.usage, steps.usage_after + new

    def _pack(self) -> None:
        """The samples packed, the new ones in a chunk of their own (not unpacked: as
        read), and kept so: an index writes its steps at every pause of a Live run, and
        only contention made again from every sample unpacks them."""
        if self._packed is None:
            self._packed, self._packed_n = [_pack_samples(self._samples)], len(self._samples)
            self._samples = []
        if self._more:  # a new list: extensions share the one they were made with
            self._packed = [*self._packed, _pack_samples(sorted(self._more, key=_by_time))]
            self._packed_n, self._more = self._packed_n + len(self._more), []

    def __getstate__(self) -> dict[str, Any]:
        self._pack()
        state = {k: v for k, v in self.__dict__.items() if k not in _SAMPLES_STATE}
        return {**state, "_lists": {}, "_max_end": {}, "_solo": {}, "_solo_steps": {},
                "samples": self._packed, "samples_n": self._packed_n}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        # older code's: no `recent`, no contention fold, the samples in one chunk, no exports
        state = {"recent": {}, "_solo_steps": {}, "usage": None, "usage_after": [], "exports": {},
                 "serving": [], **state}  # fmt: skip
        packed, n = state.pop("samples"), state.pop("samples_n", None)
        usage = state.pop("usage"), state.pop("usage_after")
        self.__dict__.update(state)
        self.samples = []
        if n is None:  # older code's: how many is not known without them
            self.samples = _unpack_samples(packed)
        elif n:
            self._packed = [packed] if isinstance(packed, bytes) else packed
            self._packed_n = n
        self.usage, self.usage_after = usage

    def __bool__(self) -> bool:
        return bool(self.columns or self._samples or self._packed_n or self._more)

    @property
    def steps(self) -> Mapping[str, list[EngineStep]]:
        return _StepLists(self)

    def export_health(self) -> export_health.ExportHealth:
        """What the processes' own export records say (`export_health`)."""
        return export_health.ExportHealth.of(self.exports, [*self.resources, *self.serving])

    @classmethod
    def from_spans(cls, spans: Iterable[Span]) -> EngineSteps:
        """From process spans, one at a time (a big run's need not be in memory at once)."""
        return StepParts().extend(spans).store()

    def place(self, offsets: np.ndarray | Callable[[Resource], int], *, own: bool = False) -> None:
        """Move every step onto the reference (proxy) clock: t - offset of its instance
        (ns per origin, or per resource). Call once; thread samples keep their raw times
        (only deltas are used). `own`: the columns are this object's alone, so they are
        moved where they are (one engine's copy at a time, not every engine's)."""
        if not isinstance(offsets, np.ndarray):
            offsets = cols.origin_offsets(self.origins, offsets)
        columns, self.columns = self.columns, {}
        for eid in list(columns):
            self.columns[eid] = cols.place(columns.pop(eid), offsets, own=own)
        self.offsets = offsets
        self._lists = {}
        self._max_end = {}
        self._solo = {}
        self._solo_steps = {}
        self.token, self.grown_from = secrets.randbits(63), None

    def extended(
        self, parts: StepParts, resources: Sequence[Resource], applied_ms: dict[str, float]
    ) -> EngineSteps | None:
        """What `StepParts.placed` makes of every process span, from these steps (placed
        with `applied_ms`) and `parts` (the process spans that arrived since), joining
        again only the new records' seqs near them (`steps_columns.extend`); the steps of
        an engine whose offsets moved are placed again first (`steps_columns.moved`),
        not joined again, and only they count as changed (`grown_from`). None where
        that would not be exact: new records that reach back past an engine's `recent`
        ones (older than 80 s before its latest), or steps kept by older code without
        them. Uses `parts` up; these steps are not changed."""
        out = EngineSteps()
        out.origins = list(self.origins)
        number = {o: i for i, o in enumerate(out.origins)}  # by equality: see `_offsets`
        for o in parts.origins:
            if o not in number:
                number[o] = len(out.origins)
                out.origins.append(o)
        remap = np.array([number[o] for o in parts.origins] or [0], np.int64)
        domain: dict[Resource, int] = {}  # by equality too: a kept one is a copy
        domains = np.array([domain.setdefault(r, len(domain)) for r, _ in out.origins] or [0])
        out.resources = list(
            {**dict.fromkeys(self.resources), **dict.fromkeys(parts.resources.values())}
        )
        out.serving = export_health.accountable(resources)
        off = np.zeros(len(out.origins) or 1, np.int64)
        if applied_ms:
            off = _offsets(out.origins, [*resources, *out.resources], applied_ms)
        was = np.zeros_like(off)  # the offsets these steps were placed with
        was[: len(self.offsets)] = self.offsets
        shift = was - off  # the engines whose steps moved are placed again
        moved = {e for e, c in self.columns.items() if shift[c[cols.ORIGIN]].any()}
        old = {e: cols.moved(c, was, off) if e in moved else c for e, c in self.columns.items()}
        same: dict[str, int] = {}
        for eid in sorted(old.keys() | parts.sched.keys() | parts.work.keys()):
            new = [cols.concat(side.pop(eid, ())) for side in (parts.sched, parts.work)]
            for c in new:
                c[cols.ORIGIN] = remap[c[cols.ORIGIN]]
            kept = self.recent.get(eid) if eid in old else (cols.empty(), cols.NONE)
            got = cols.extend(old.get(eid, cols.empty()), kept, *new, off, _JOIN_SLACK_NS, domains)
            if got is None:
                return None
            out.columns[eid], same[eid] = got[0], 0 if eid in moved else got[1]
            out.recent[eid] = got[2]
        out.grown_from = (self.token, same)
        out.offsets = off
        out._samples_from(self, parts.samples)
        out.engines = {**self.engines}
        for eid, info in parts.engines.items():
            out.engines.setdefault(eid, info)
        out.exports = dict(self.exports)
        export_health.fold(out.exports, parts.exports.values())
        out.spans = self.spans + parts.spans
        return out

    def _make(self, engine_id: str, c: cols.Columns, at: Any = slice(None)) -> list[EngineStep]:
        out = []
        for r in cols.rows(c, at):
            res, role = self.origins[r[cols.ORIGIN]]
            out.append(EngineStep(engine_id, role, res.host, *r[: cols.ORIGIN], domain=res))
        return out

    def _objects(self, engine_id: str) -> list[EngineStep]:
        got = self._lists.get(engine_id)
        if got is None:
            got = self._lists[engine_id] = self._make(engine_id, self.columns[engine_id])
        return got

    def has_worker_steps(self, engine_id: str) -> bool:
        c = self.columns.get(engine_id)
        return c is not None and bool(cols.has_worker(c).any())

    def worker_steps(self, engine_id: str) -> list[EngineStep]:
        return [s for s in self.steps.get(engine_id, ()) if s.has_worker]

    def overlapping(self, engine_id: str, t0_ns: int, t1_ns: int) -> list[EngineStep]:
        """Worker-recorded steps of one engine that overlap [t0, t1] (time order)."""
        return self._steps_at(engine_id, self._overlapping_at(engine_id, t0_ns, t1_ns))

    def overlapping_solo(
        self, engine_id: str, t0_ns: int, t1_ns: int
    ) -> tuple[list[EngineStep], list[float]]:
        """`overlapping`, and the solo forward cost of each of those steps (µs, NaN: none;
        `step_solo_us`)."""
        at = self._overlapping_at(engine_id, t0_ns, t1_ns)
        if not len(at):
            return [], []
        return self._steps_at(engine_id, at), self.step_solo_us(engine_id)[at].tolist()

    def _overlapping_at(self, engine_id: str, t0_ns: int, t1_ns: int) -> np.ndarray:
        """The positions of `overlapping`'s steps in the engine's columns."""
        c = self.columns.get(engine_id)
        if c is None or not c.shape[1]:
            return np.zeros(0, np.int64)
        ends = self._max_end.get(engine_id)
        if ends is None:
            ends = self._max_end[engine_id] = np.maximum.accumulate(np.maximum(c[cols.END], 0))
        # the first step that ends after t0: every step before it ends by t0. (Starting
        # from t0 minus the longest step scanned most of a long run for every request.)
        i = int(np.searchsorted(ends, t0_ns, side="right"))
        j = int(np.searchsorted(c[cols.START], t1_ns, side="right"))
        if j <= i:
            return np.zeros(0, np.int64)
        seg = c[:, i:j]
        return np.nonzero(cols.has_worker(seg) & (seg[cols.END] > t0_ns))[0] + i

    def _steps_at(self, engine_id: str, at: np.ndarray) -> list[EngineStep]:
        if not len(at):
            return []
        made = self._lists.get(engine_id)
        if made is not None:
            return [made[k] for k in at.tolist()]
        return self._make(engine_id, self.columns[engine_id], at)

    def step_solo_us(self, engine_id: str) -> np.ndarray:
        """Per step of one engine (`columns` order), the solo forward cost TPOT caps its
        forward at: its epoch's (`steps_columns.step_solo_us`)."""
        got = self._solo_steps.get(engine_id)
        if got is None:
            c = self.columns.get(engine_id)
            got = np.full(0, np.nan) if c is None else cols.step_solo_us(c)
            self._solo_steps[engine_id] = got
        return got

    def solo_forward_us(self, engine_id: str) -> float | None:
        """The forward cost of a step with one decode request and nothing else: the median
        forward of such steps, else the smallest forward of steps that computed anything
        (scheduler record: at least one request; no scheduler record: forward > 0). Over
        the whole run, for the summary; TPOT takes each epoch's (`step_solo_us`)."""
        if engine_id not in self._solo:
            c = self.columns.get(engine_id)
            self._solo[engine_id] = None if c is None else cols.solo_forward_us(c)
        return self._solo[engine_id]

    def know_solo(self, engine_id: str, us: float | None) -> None:
        """Take `solo_forward_us` of one engine as computed elsewhere (`index_steps`
        keeps it up to date from the last steps' without a pass over every step), so
        the summary does not compute it again."""
        self._solo[engine_id] = us

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per engine: steps, median step ms, forward, connector share, loads."""
        out: dict[str, dict[str, Any]] = {}
        for eid in sorted(self.columns):
            info = self.engines.get(eid)
            role, host = (info.role, info.host) if info else ("", "")
            solo = self.solo_forward_us(eid)
            out[eid] = cols.summary(self.columns[eid], role, host, solo)
        return out


def _span_columns(span: Span, origin: int) -> tuple[str, cols.Columns]:
    """(side, the steps of one ``engine.steps`` span as columns): `steps_from_span`'s."""
    a = span.attributes

    def column(key: str, n: int) -> np.ndarray:
        return cols.int_column(array(a.get(key)), n, lambda: _ints(a, key, n))

    n = len(array(a.get(sc.STEP_SEQ)))
    side = _side(span)
    return side, cols.block(side, column, n, column(sc.STEP_SEQ, n), origin)


def _domains(origins: Sequence[tuple[Resource, str]]) -> np.ndarray:
    """Each origin's clock domain as a number: the emitting process (its resource, by
    identity, as `join` compares them), whatever the role."""
    number: dict[int, int] = {}
    return np.array([number.setdefault(id(r), len(number)) for r, _ in origins] or [0], np.int64)


def placed(
    spans: Iterable[Span], resources: Iterable[Resource], applied_ms: dict[str, float]
) -> EngineSteps:
    """An `EngineSteps` from process spans, moved onto the reference clock
    (`StepParts.placed`)."""
    return StepParts().extend(spans).placed(resources, applied_ms)
