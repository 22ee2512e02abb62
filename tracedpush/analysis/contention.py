"""CPU contention from the engines' OS thread samples (``engine.threads``).

Per engine process and thread: CPU time over the run (the difference of the cumulative
utime+stime between the first and the last sample of the thread), the cores it ran on
(share of samples per core, and CPU-weighted: each interval's CPU is charged to the
core the thread was on at the end of the interval), its role and affinity.

Findings, in words:

* across engines: two engines on the same ``host.name`` where a busy thread of one ran
  on the cores where the other's model runner computes ("decode engine_core (pid 123)
  ran on core 0 in 40% of its busy samples, where the prefill model runner computes; it
  used 9.0 s of CPU");
* within an engine: push writer, NIXL/UCX, tracedpush and other helper threads that used
  CPU on the model runner's core, and the engine's own EngineCore / API server on it;
* waiting for a CPU: threads on a request's way through an engine (API server,
  EngineCore, model runner, push writer) that were runnable without a CPU for a share
  of the time they wanted one ("decode api_server (pid 123) waited 4.1 s for a CPU, 31%
  of the time it was runnable"), from the kernel's run delay (``cpu_wait_ms``): where a
  thread ran says who shared a core, its wait says whom that cost;
* tracedpush's own cost: CPU of threads with role ``tracedpush`` over the engine
  processes' total CPU (plus hook time, events x per-event cost, when that cost is given).

Limits: a sample says where a thread was at the sample, not where it ran in between, so
core shares are samples, not time; with about one sample a second, a short burst on a
foreign core can be missed or over-counted. CPU time and the wait for a CPU, being
cumulative, are exact between a thread's first and last sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tracedpush.analysis.steps import EngineSteps, ThreadSample

BUSY_MIN_MS = 50.0  # a thread using less CPU than this over the run is not "busy"
COMPUTE_CORE_SHARE = 0.2  # a core carries >= this share of a model runner's CPU: its core
FOREIGN_SHARE = 0.1  # a thread with >= this share of its CPU on another engine's cores
HELPER_MIN_SHARE = 0.01  # helpers' CPU on the model runner's core worth reporting
WAIT_MIN_MS = 100.0  # a thread waiting less than this for a CPU over the run is not named
WAIT_SHARE = 0.1  # ... nor one waiting less than this share of its runnable time
# threads a request waits on as it passes through an engine, in the order it meets them
PATH_ROLES = ("api_server", "engine_core", "model_runner", "push_writer")
KINDS = ("cross_engine", "within_engine", "cpu_wait")  # findings' kinds, in the report's order
SHARERS_MAX = 2  # the busiest threads named on the core a waiting thread was on


@dataclass(slots=True)
class ThreadUsage:
    """One OS thread over the run."""

    engine_id: str
    engine_role: str  # "prefill" | "decode"
    host: str
    pid: int
    tid: int
    process: str  # "api_server" | "engine_core" | "worker"
    name: str
    role: str  # semconv.THREAD_ROLES
    cpu_ms: float = 0.0  # over the run (last - first cumulative sample)
    samples: int = 0
    busy_samples: int = 0  # samples after an interval in which it used CPU
    core_samples: dict[int, int] = field(default_factory=dict)  # core -> samples
    busy_core_samples: dict[int, int] = field(default_factory=dict)  # core -> busy samples
    cpu_by_core_ms: dict[int, float] = field(default_factory=dict)  # CPU charged per core
    affinity: str = ""
    cpu_wait_ms: float = 0.0  # runnable without a CPU over the run (schedstat run delay)
    wait_known: bool = False  # two samples of it carried the wait (else cpu_wait_ms says 0)
    _last_cpu: float | None = None
    _last_wait: float | None = None

    @property
    def label(self) -> str:
        """ "decode engine_core (pid 123)"-style name of the thread."""
        what = self.role if self.role not in ("other", "compute") else self.name or self.role
        if what == self.process or self.role in (self.process, "model_runner"):
            return f"{self.engine_role} {what}"
        return f"{self.engine_role} {self.process} {what}"

    def core_share(self) -> dict[int, float]:
        n = sum(self.core_samples.values())
        return {c: k / n for c, k in sorted(self.core_samples.items())} if n else {}

    def busy_core_share(self) -> dict[int, float]:
        n = sum(self.busy_core_samples.values())
        return {c: k / n for c, k in sorted(self.busy_core_samples.items())} if n else {}

    def wait_share(self) -> float:
        """The share of its runnable time (on a CPU or waiting for one) spent waiting."""
        total = self.cpu_ms + self.cpu_wait_ms
        return self.cpu_wait_ms / total if total > 0 else 0.0

    def cpu_share_on(self, cores: Iterable[int]) -> float:
        total = sum(self.cpu_by_core_ms.values())
        if total <= 0:
            return 0.0
        return sum(self.cpu_by_core_ms.get(c, 0.0) for c in cores) / total

    def to_json(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "engine_role": self.engine_role,
            "host": self.host,
            "pid": self.pid,
            "tid": self.tid,
            "process": self.process,
            "name": self.name,
            "role": self.role,
            "cpu_s": round(self.cpu_ms / 1000.0, 4),
            "cpu_wait_s": round(self.cpu_wait_ms / 1000.0, 4) if self.wait_known else None,
            "samples": self.samples,
            "busy_samples": self.busy_samples,
            "core_share": {str(c): round(v, 4) for c, v in self.core_share().items()},
            "busy_core_share": {str(c): round(v, 4) for c, v in self.busy_core_share().items()},
            "cpu_by_core_s": {
                str(c): round(v / 1000.0, 4) for c, v in sorted(self.cpu_by_core_ms.items())
            },
            "affinity": self.affinity,
        }


@dataclass(slots=True)
class ProcessUsage:
    engine_id: str
    engine_role: str
    host: str
    pid: int
    process: str
    cpu_ms: float
    threads: int
    tracedpush_cpu_ms: float
    events_recorded: int | None  # hook events recorded over the run (sampling process)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "engine_role": self.engine_role,
            "host": self.host,
            "pid": self.pid,
            "process": self.process,
            "cpu_s": round(self.cpu_ms / 1000.0, 4),
            "threads": self.threads,
            "tracedpush_cpu_s": round(self.tracedpush_cpu_ms / 1000.0, 4),
            "events_recorded": self.events_recorded,
        }


@dataclass(slots=True)
class Finding:
    kind: str  # KINDS
    text: str
    engine_id: str  # the engine whose model runner is contended
    host: str
    cpu_ms: float  # CPU the intruders used on the contended cores (cpu_wait: the waits)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "engine_id": self.engine_id,
            "host": self.host,
            "cpu_s": round(self.cpu_ms / 1000.0, 4),
            **self.details,
        }


@dataclass(slots=True)
class TracingCost:
    tracedpush_cpu_ms: float  # CPU of our own threads (role "tracedpush")
    engine_cpu_ms: float  # every sampled thread of the engine processes
    events: int  # hook events recorded on engine threads over the run
    event_cost_us: float | None  # per-event cost used for hook time (None: not counted)

    @property
    def hook_ms(self) -> float | None:
        return None if self.event_cost_us is None else self.events * self.event_cost_us / 1000.0

    @property
    def thread_ratio(self) -> float | None:
        return self.tracedpush_cpu_ms / self.engine_cpu_ms if self.engine_cpu_ms > 0 else None

    @property
    def ratio(self) -> float | None:
        """(our threads' CPU + hook time) / engine processes' CPU."""
        if self.engine_cpu_ms <= 0:
            return None
        return (self.tracedpush_cpu_ms + (self.hook_ms or 0.0)) / self.engine_cpu_ms

    def to_json(self) -> dict[str, Any]:
        hook = self.hook_ms
        return {
            "tracedpush_cpu_s": round(self.tracedpush_cpu_ms / 1000.0, 4),
            "engine_cpu_s": round(self.engine_cpu_ms / 1000.0, 4),
            "thread_ratio": None if self.thread_ratio is None else round(self.thread_ratio, 6),
            "events_recorded": self.events,
            "event_cost_us": self.event_cost_us,
            "hook_s": None if hook is None else round(hook / 1000.0, 4),
            "ratio": None if self.ratio is None else round(self.ratio, 6),
        }


@dataclass(slots=True)
class Contention:
    threads: list[ThreadUsage]  # busiest first
    processes: list[ProcessUsage]
    findings: list[Finding]
    cost: TracingCost
    window_s: dict[str, float]  # engine id -> seconds between its first and last sample
    samples: int

    def __bool__(self) -> bool:
        return self.samples > 0

    def to_json(self, *, min_cpu_ms: float = 1.0) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "window_s": {k: round(v, 3) for k, v in self.window_s.items()},
            "findings": [f.to_json() for f in self.findings],
            "tracedpush_cost": self.cost.to_json(),
            "processes": [p.to_json() for p in self.processes],
            "threads": [t.to_json() for t in self.threads if t.cpu_ms >= min_cpu_ms],
        }


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def _cores(cores: Iterable[int]) -> str:
    cs = sorted(cores)
    return ("core " if len(cs) == 1 else "cores ") + ", ".join(str(c) for c in cs)


ThreadKey = tuple[str, str, int, int]  # (host, engine id, pid, tid)


class UsageFold:
    """`thread_usage`, the engines' sample windows and event counts, folded sample by
    sample in time order: what `contention` reads of the samples. A Live run's samples
    keep coming; `extended` folds only the new ones into a copy, exactly, where each
    thread's new samples come after its folded ones (its CPU is a difference between
    consecutive samples), so contention at a pause costs what arrived, not a pass over
    every sample of the run (2 s at 200,000 requests)."""

    __slots__ = ("events", "last_ns", "samples", "threads", "window")

    def __init__(self) -> None:
        self.threads: dict[ThreadKey, ThreadUsage] = {}
        self.last_ns: dict[ThreadKey, int] = {}  # each thread's latest folded sample
        self.window: dict[str, list[int]] = {}  # engine id -> [first, last] sample
        # (host, engine id, sampler pid) -> [least, most] cumulative hook events
        self.events: dict[tuple[str, str, str], list[int]] = {}
        self.samples = 0

    def add(self, samples: Iterable[ThreadSample]) -> UsageFold:
        """Fold `samples` in (sorted by time here, ties kept as given)."""
        threads, last = self.threads, self.last_ns
        for smp in sorted(samples, key=lambda s: s.time_ns):
            self.samples += 1
            w = self.window.setdefault(smp.engine_id, [smp.time_ns, smp.time_ns])
            w[0], w[1] = min(w[0], smp.time_ns), max(w[1], smp.time_ns)
            if smp.events_recorded is not None:
                ev = self.events.setdefault(
                    (smp.host, smp.engine_id, smp.sampler_pid),
                    [smp.events_recorded, smp.events_recorded],
                )
                ev[0], ev[1] = min(ev[0], smp.events_recorded), max(ev[1], smp.events_recorded)
            for i in range(len(smp.tids)):
                key = (smp.host, smp.engine_id, smp.pids[i], smp.tids[i])
                last[key] = smp.time_ns
                t = threads.get(key)
                if t is None:
                    t = threads[key] = ThreadUsage(
                        smp.engine_id,
                        smp.role,
                        smp.host,
                        smp.pids[i],
                        smp.tids[i],
                        smp.processes[i],
                        smp.names[i],
                        smp.thread_roles[i],
                    )
                cpu, core = smp.cpu_ms[i], smp.cores[i]
                t.samples += 1
                t.core_samples[core] = t.core_samples.get(core, 0) + 1
                t.affinity = smp.affinity[i] or t.affinity
                t.name = smp.names[i] or t.name
                if t._last_cpu is not None:
                    d = max(cpu - t._last_cpu, 0.0)
                    t.cpu_ms += d
                    if d > 0:
                        t.busy_samples += 1
                        t.busy_core_samples[core] = t.busy_core_samples.get(core, 0) + 1
                        t.cpu_by_core_ms[core] = t.cpu_by_core_ms.get(core, 0.0) + d
                t._last_cpu = cpu
                wait = smp.cpu_wait_ms[i] if smp.cpu_wait_ms is not None else -1.0
                if wait < 0:
                    t._last_wait = None  # not known here: no difference across it
                    continue
                if t._last_wait is not None:
                    t.cpu_wait_ms += max(wait - t._last_wait, 0.0)
                    t.wait_known = True
                t._last_wait = wait
        return self

    def extended(self, samples: Sequence[ThreadSample]) -> UsageFold | None:
        """A copy with `samples` folded in, or None where that would not equal folding
        every sample again: a new sample of a thread at or before its latest folded one
        (a late file), which changes the differences its CPU is made of. Ties between
        threads are free: each thread is folded on its own, and `usage` orders by a
        whole key."""
        last = self.last_ns
        for smp in samples:
            for i in range(len(smp.tids)):
                t = last.get((smp.host, smp.engine_id, smp.pids[i], smp.tids[i]))
                if t is not None and smp.time_ns <= t:
                    return None
        out = UsageFold()
        out.threads = {k: _copied(t) for k, t in self.threads.items()}
        out.last_ns = dict(last)
        out.window = {e: list(w) for e, w in self.window.items()}
        out.events = {k: list(v) for k, v in self.events.items()}
        out.samples = self.samples
        return out.add(samples)

    def usage(self) -> list[ThreadUsage]:
        """Busiest first (host last in the key: an engine id is one host's)."""
        return sorted(
            self.threads.values(), key=lambda t: (-t.cpu_ms, t.engine_id, t.pid, t.tid, t.host)
        )


def _copied(t: ThreadUsage) -> ThreadUsage:
    return replace(
        t,
        core_samples=dict(t.core_samples),
        busy_core_samples=dict(t.busy_core_samples),
        cpu_by_core_ms=dict(t.cpu_by_core_ms),
    )


def thread_usage(samples: Iterable[ThreadSample]) -> list[ThreadUsage]:
    """Per-thread CPU over the run and where it ran, busiest first."""
    return UsageFold().add(samples).usage()


def usage_fold(store: EngineSteps) -> UsageFold:
    """The fold of a store's samples: the one it keeps, extended by the samples it got
    since (`EngineSteps.usage`, `usage_after`), else made of every sample; kept in it."""
    fold = store.usage
    if fold is not None and store.usage_after:
        fold = fold.extended(store.usage_after)
    if fold is None:
        fold = UsageFold().add(store.samples)
    store.usage, store.usage_after = fold, []
    return fold


def _compute_cores(threads: list[ThreadUsage]) -> set[int]:
    """Cores carrying >= COMPUTE_CORE_SHARE of the model runner's (else compute
    threads') CPU."""
    for roles in (("model_runner",), ("compute",)):
        by_core: dict[int, float] = {}
        for t in threads:
            if t.role in roles:
                for c, v in t.cpu_by_core_ms.items():
                    by_core[c] = by_core.get(c, 0.0) + v
        total = sum(by_core.values())
        if total > 0:
            return {c for c, v in by_core.items() if c >= 0 and v / total >= COMPUTE_CORE_SHARE}
    return set()


_HELPER_GROUPS = (
    ("push_writer", lambda t: t.role == "push_writer"),
    (
        "NIXL/UCX",
        lambda t: (
            t.role == "nixl" or any(k in t.name.lower() for k in ("ucx", "nixl", "ucp", "progress"))
        ),
    ),
    ("tracedpush", lambda t: t.role == "tracedpush"),
)


def _helper_group(t: ThreadUsage) -> str | None:
    if t.role in ("model_runner", "compute", "engine_core", "api_server"):
        return None
    for name, match in _HELPER_GROUPS:
        if match(t):
            return name
    return "other threads"


def _main_core(t: ThreadUsage) -> int | None:
    """The core a thread was on in most of its busy samples (else of all), if known."""
    share = {c: v for c, v in (t.busy_core_share() or t.core_share()).items() if c >= 0}
    return max(share, key=share.__getitem__) if share else None


def _busiest_on(core: int, host: str, threads: Sequence[ThreadUsage]) -> list[ThreadUsage]:
    """The threads of `host` whose CPU was charged most to `core` (at least
    `BUSY_MIN_MS`; at most `SHARERS_MAX`): whom a thread waiting there shared it with."""
    on = [o for o in threads if o.host == host and o.cpu_by_core_ms.get(core, 0.0) >= BUSY_MIN_MS]
    on.sort(key=lambda o: -o.cpu_by_core_ms[core])
    return on[:SHARERS_MAX]


def _waits(
    by_engine: dict[str, list[ThreadUsage]],
    role_of: dict[str, str],
    host_of: dict[str, str],
    threads: Sequence[ThreadUsage],
) -> list[Finding]:
    """Per engine, its request-path threads that waited for a CPU (`WAIT_MIN_MS` and
    `WAIT_SHARE` both), longest wait first, grouped by the core each was mostly on, with
    the busiest threads there; `cpu_ms` of the finding is the waits' sum."""
    out: list[Finding] = []
    for e, ts in sorted(by_engine.items()):
        waited = [
            t
            for t in ts
            if t.wait_known
            and t.role in PATH_ROLES
            and t.cpu_wait_ms >= WAIT_MIN_MS
            and t.wait_share() >= WAIT_SHARE
        ]
        if not waited:
            continue
        waited.sort(key=lambda t: -t.cpu_wait_ms)
        by_core: dict[int | None, list[ThreadUsage]] = {}
        for t in waited:
            by_core.setdefault(_main_core(t), []).append(t)
        busiest = {c: _busiest_on(c, host_of[e], threads) for c in by_core if c is not None}
        groups = []
        for c, members in by_core.items():
            waits = "; ".join(
                f"{t.label} (pid {t.pid}) {t.cpu_wait_ms / 1000.0:.2f} s, "
                f"{_pct(t.wait_share())} of the time it was runnable"
                for t in members
            )
            there = ", ".join(
                f"{o.label} (pid {o.pid}) {o.cpu_by_core_ms[c] / 1000.0:.1f} s"
                for o in busiest.get(c, [])
            )
            groups.append(f"on core {c} (busiest there: {there}): {waits}" if there else waits)
        total = sum(t.cpu_wait_ms for t in waited)
        out.append(
            Finding(
                "cpu_wait",
                f"{role_of[e]} engine {e}: threads on the requests' way waited for a CPU, "
                + "; ".join(groups),
                e,
                host_of[e],
                total,
                {
                    "waits": [
                        {
                            "pid": t.pid,
                            "tid": t.tid,
                            "role": t.role,
                            "process": t.process,
                            "cpu_wait_s": round(t.cpu_wait_ms / 1000.0, 4),
                            "cpu_s": round(t.cpu_ms / 1000.0, 4),
                            "wait_share": round(t.wait_share(), 4),
                            "core": c,
                        }
                        for c, members in by_core.items()
                        for t in members
                    ],
                    "busiest_on_core": {
                        str(c): [
                            {
                                "engine_id": o.engine_id,
                                "pid": o.pid,
                                "tid": o.tid,
                                "role": o.role,
                                "process": o.process,
                                "cpu_s": round(o.cpu_by_core_ms[c] / 1000.0, 4),
                            }
                            for o in on
                        ]
                        for c, on in busiest.items()
                    },
                },
            )
        )
    return out


def contention(
    store: EngineSteps | Iterable[ThreadSample], *, event_cost_us: float | None = None
) -> Contention:
    """Analyse the thread samples of a run (an `EngineSteps` store or samples)."""
    fold = usage_fold(store) if isinstance(store, EngineSteps) else UsageFold().add(store)
    threads = fold.usage()
    by_engine: dict[str, list[ThreadUsage]] = {}
    for t in threads:
        by_engine.setdefault(t.engine_id, []).append(t)
    role_of = {e: ts[0].engine_role for e, ts in by_engine.items()}
    host_of = {e: ts[0].host for e, ts in by_engine.items()}
    compute = {e: _compute_cores(ts) for e, ts in by_engine.items()}

    findings: list[Finding] = []
    # ---- across engines on one host
    for e, cores in sorted(compute.items()):
        if not cores:
            continue
        for other, ts in sorted(by_engine.items()):
            if other == e or host_of[other] != host_of[e]:
                continue
            for t in ts:
                if t.cpu_ms < BUSY_MIN_MS or not t.busy_samples:
                    continue
                share = t.cpu_share_on(cores)
                if share < FOREIGN_SHARE:
                    continue
                on = [c for c in t.busy_core_samples if c in cores]
                smp = sum(t.busy_core_samples[c] for c in on) / t.busy_samples
                on_ms = sum(t.cpu_by_core_ms.get(c, 0.0) for c in cores)
                aff = f" (allowed on {t.affinity})" if t.affinity else ""
                text = (
                    f"{t.label} (pid {t.pid}) ran on {_cores(on or cores)} in {_pct(smp)} of "
                    f"its busy samples, where the {role_of[e]} model runner computes; it used "
                    f"{t.cpu_ms / 1000.0:.1f} s of CPU, {on_ms / 1000.0:.1f} s of it there{aff}"
                )
                findings.append(
                    Finding(
                        "cross_engine",
                        text,
                        e,
                        host_of[e],
                        on_ms,
                        {
                            "intruder_engine_id": other,
                            "intruder_pid": t.pid,
                            "intruder_tid": t.tid,
                            "intruder_role": t.role,
                            "intruder_process": t.process,
                            "cores": sorted(cores),
                            "busy_sample_share": round(smp, 4),
                            "intruder_cpu_s": round(t.cpu_ms / 1000.0, 4),
                        },
                    )
                )
    # ---- within an engine: helpers and the engine's other processes on the runner's core
    for e, cores in sorted(compute.items()):
        if not cores:
            continue
        ts = by_engine[e]
        # the model runner's work: its main thread and its compute (OpenMP / torch) pool
        runner_ms = sum(t.cpu_ms for t in ts if t.role in ("model_runner", "compute"))
        groups: dict[str, float] = {}
        for t in ts:
            g = _helper_group(t)
            if g is None:
                continue
            v = sum(t.cpu_by_core_ms.get(c, 0.0) for c in cores)
            if v > 0:
                groups[g] = groups.get(g, 0.0) + v
        total = sum(groups.values())
        if total > 0 and (total >= 100.0 or (runner_ms and total / runner_ms >= HELPER_MIN_SHARE)):
            parts = ", ".join(
                f"{g} {v / 1000.0:.2f} s" for g, v in sorted(groups.items(), key=lambda kv: -kv[1])
            )
            rel = (
                f" ({_pct(total / runner_ms)} of the model runner's CPU, compute threads included)"
                if runner_ms
                else ""
            )
            findings.append(
                Finding(
                    "within_engine",
                    f"{role_of[e]} engine {e}: helper threads used {total / 1000.0:.2f} s of CPU "
                    f"on the model runner's {_cores(cores)}{rel}: {parts}",
                    e,
                    host_of[e],
                    total,
                    {"groups_s": {g: round(v / 1000.0, 4) for g, v in groups.items()}},
                )
            )
        own: dict[str, float] = {}
        for t in ts:
            if t.role in ("engine_core", "api_server") or (
                t.process in ("engine_core", "api_server") and t.role != "tracedpush"
            ):
                v = sum(t.cpu_by_core_ms.get(c, 0.0) for c in cores)
                if v > 0:
                    own[t.process] = own.get(t.process, 0.0) + v
        tot = sum(own.values())
        if tot >= 100.0 or (runner_ms and tot / runner_ms >= 0.05):
            parts = ", ".join(f"{p} {v / 1000.0:.2f} s" for p, v in sorted(own.items()))
            rel = (
                f" ({_pct(tot / runner_ms)} of the model runner's CPU, compute threads included)"
                if runner_ms
                else ""
            )
            findings.append(
                Finding(
                    "within_engine",
                    f"{role_of[e]} engine {e}: its EngineCore / API server used "
                    f"{tot / 1000.0:.2f} s of CPU on the model runner's {_cores(cores)}{rel}: "
                    f"{parts}",
                    e,
                    host_of[e],
                    tot,
                    {"processes_s": {p: round(v / 1000.0, 4) for p, v in own.items()}},
                )
            )
    findings += _waits(by_engine, role_of, host_of, threads)
    findings.sort(key=lambda f: (KINDS.index(f.kind), -f.cpu_ms))

    # ---- per process, and our own cost
    procs: dict[tuple[str, str, int], ProcessUsage] = {}
    for t in threads:
        k = (t.host, t.engine_id, t.pid)
        p = procs.get(k)
        if p is None:
            p = procs[k] = ProcessUsage(
                t.engine_id, t.engine_role, t.host, t.pid, t.process, 0.0, 0, 0.0, None
            )
        p.cpu_ms += t.cpu_ms
        p.threads += 1
        if t.role == "tracedpush":
            p.tracedpush_cpu_ms += t.cpu_ms
    events = 0
    for (host, eid, spid), (least, most) in fold.events.items():
        n = most - least
        events += n
        try:
            p = procs.get((host, eid, int(spid)))
        except ValueError:
            p = None
        if p is not None:
            p.events_recorded = n
    processes = sorted(procs.values(), key=lambda p: (p.engine_id, -p.cpu_ms))
    cost = TracingCost(
        sum(p.tracedpush_cpu_ms for p in processes),
        sum(p.cpu_ms for p in processes),
        events,
        event_cost_us,
    )
    return Contention(
        threads,
        processes,
        findings,
        cost,
        {e: (w[1] - w[0]) / 1e9 for e, w in fold.window.items()},
        fold.samples,
    )
