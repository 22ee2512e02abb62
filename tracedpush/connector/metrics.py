"""tracedpush's metrics on each engine's own /metrics, through vLLM's connector mechanism.

vLLM already carries connector metrics from the engine to its API server's /metrics:
the worker's and the scheduler's `get_kv_connector_stats()` return a `KVConnectorStats`
each step, the scheduler aggregates them and ships `to_dict()` to the API server inside
`SchedulerStats`, where `KVConnectorProm` asks the connector class to
`build_prom_metrics(...)` once and then `observe(data, engine_idx)` every interval. Riding
on it means one scrape target per engine carries vLLM's metrics and ours, under vLLM's
own `model_name` / `engine` labels, with no extra port, server or process.

`TracedKVConnectorStats` extends NIXL's stats with our observations (plain parallel
lists, so they serialize and aggregate like NIXL's own); `TracedPromMetrics` registers
NIXL's `vllm:nixl_*` metrics unchanged and ours beside them. The numbers are produced
off the engine's threads by the span builder (`tracedpush.telemetry.observations`);
`collect_stats` only drains them. Importing this module needs neither NIXL nor a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import REGISTRY
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
    NixlPromMetrics,
)

from tracedpush import semconv
from tracedpush.telemetry import observations as obs
from tracedpush.telemetry.observations import Observations

# Keys of our data in the stats payload (parallel lists: element i of the two phase
# lists, or of the two drop lists, describe the same observation).
PHASE_NAMES: Final = "tracedpush_phase"  # str[]
PHASE_SECONDS: Final = "tracedpush_phase_seconds"  # float[]
FAILURES: Final = "tracedpush_failure"  # str[]: one error.type per failed KV span
BYTES: Final = "tracedpush_bytes"  # int[]: bytes moved, one per transfer span
DROP_REASONS: Final = "tracedpush_spans_dropped_reason"  # str[]
DROP_COUNTS: Final = "tracedpush_spans_dropped_count"  # int[]: spans lost, a delta
OBSERVATIONS_DROPPED: Final = "tracedpush_observations_dropped"  # int[]: deltas
# one element per thread sample's (process, thread role): CPU and wait seconds, deltas
THREAD_PROCESS: Final = "tracedpush_thread_process"  # str[]
THREAD_ROLE: Final = "tracedpush_thread_role"  # str[]
THREAD_CPU_S: Final = "tracedpush_thread_cpu_s"  # float[]
THREAD_WAIT_S: Final = "tracedpush_thread_wait_s"  # float[]
KEYS: Final = (
    PHASE_NAMES,
    PHASE_SECONDS,
    FAILURES,
    BYTES,
    DROP_REASONS,
    DROP_COUNTS,
    OBSERVATIONS_DROPPED,
    THREAD_PROCESS,
    THREAD_ROLE,
    THREAD_CPU_S,
    THREAD_WAIT_S,
)
# the threads a request waits on, by (process, thread role): their series exist at 0
PATH_THREADS: Final = (
    ("api_server", "api_server"),
    ("engine_core", "engine_core"),
    ("worker", "model_runner"),
)


@dataclass
class TracedKVConnectorStats(NixlKVConnectorStats):
    """NIXL's stats plus our observations; NIXL's keys and methods work unchanged."""

    def __post_init__(self) -> None:
        super().__post_init__()
        data = self.data
        for key in KEYS:  # a payload from NIXL alone (or an older peer) has none of ours
            data.setdefault(key, [])

    def reset(self) -> None:
        super().reset()
        for key in KEYS:
            self.data[key] = []

    def is_empty(self) -> bool:
        # vLLM drops empty stats: ours alone must still reach the API server
        data = self.data
        return super().is_empty() and not any(data.get(key) for key in KEYS)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Extend every list (NIXL's and ours); `other` may be NIXL's plain stats."""
        if not other.is_empty():
            data = self.data
            for key, values in other.data.items():
                data.setdefault(key, []).extend(values)
        return self

    def reduce(self) -> dict[str, int | float]:
        """NIXL's log summary, plus what we observed in the interval."""
        out = super().reduce()
        data = self.data
        out["Traced KV phases"] = len(data[PHASE_NAMES])
        out["Traced KV failures"] = len(data[FAILURES])
        out["Spans dropped"] = sum(data[DROP_COUNTS])
        return out

    def add(self, items: Iterable[tuple], observations_lost: int = 0) -> None:
        """Sort drained observations into the payload's lists."""
        data = self.data
        names, seconds = data[PHASE_NAMES], data[PHASE_SECONDS]
        for item in items:
            kind = item[0]
            if kind == obs.PHASE:
                names.append(item[1])
                seconds.append(item[2])
            elif kind == obs.FAILURE:
                data[FAILURES].append(item[1])
            elif kind == obs.BYTES:
                data[BYTES].append(item[1])
            elif kind == obs.SPANS_DROPPED:
                data[DROP_REASONS].append(item[1])
                data[DROP_COUNTS].append(item[2])
            elif kind == obs.THREADS:
                data[THREAD_PROCESS].append(item[1])
                data[THREAD_ROLE].append(item[2])
                data[THREAD_CPU_S].append(item[3])
                data[THREAD_WAIT_S].append(item[4])
        if observations_lost:
            data[OBSERVATIONS_DROPPED].append(observations_lost)


def collect_stats(
    stats: KVConnectorStats | None, observations: Observations | None
) -> KVConnectorStats | None:
    """`get_kv_connector_stats` on the engine's threads: NIXL's stats (or None) plus
    what the builder observed since the last call. Only pops the deque.

    Always our class when anything is returned: vLLM's worker-output aggregator asserts
    every worker's stats share a type, and NIXL's `aggregate` fails on our keys.
    """
    items: list[tuple] = []
    lost = 0
    if observations is not None:
        items, lost = observations.take()
    if stats is None and not items and not lost:
        return None
    if not isinstance(stats, TracedKVConnectorStats):
        stats = TracedKVConnectorStats(data=stats.data if stats is not None else {})
    if items or lost:
        stats.add(items, lost)
    return stats


_registered: list[Any] = []  # the metrics the last TracedPromMetrics registered


def _unregister_ours() -> None:
    """Like vLLM's `unregister_vllm_metrics` (which only knows `vllm:` names): a second
    stat logger in the process must not fail on duplicate series. Only what we
    registered is removed."""
    while _registered:
        collector = _registered.pop()
        try:
            REGISTRY.unregister(collector)
        except KeyError:  # registered elsewhere (a custom registry), or already gone
            pass


class TracedPromMetrics(NixlPromMetrics):
    """NIXL's Prometheus metrics, plus tracedpush's engine metrics (docs/metrics.md).

    `mode` and `role` are this engine's, known in the API server only from its
    kv_transfer_config (the connector class and `kv_role`). Every failure reason and
    spans-dropped reason series exists at 0 from the start, and so does every phase
    this mode and role observes, so a rate or an alert has a series before the first
    event.
    """

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        *,
        mode: str,
        role: str,
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.mode = mode
        self.role = role
        _unregister_ours()
        kv_labels = [*labelnames, semconv.LABEL_MODE, semconv.LABEL_ROLE]
        self._phase_parent = self._histogram_cls(
            name=semconv.METRIC_KV_PHASE,
            documentation="Engine-local KV transfer phases (tracedpush): the duration of "
            "each KV phase span that ended without error, or of the part of it a phase "
            "names; one observation per request and worker rank.",
            buckets=list(semconv.PHASE_BUCKETS),
            labelnames=[*kv_labels, semconv.LABEL_PHASE],
        )
        self._failure_parent = self._counter_cls(
            name=semconv.METRIC_KV_FAILURES,
            documentation="Failed KV phase spans (tracedpush), by their error.type.",
            labelnames=[*kv_labels, semconv.LABEL_REASON],
        )
        bytes_parent = self._counter_cls(
            name=semconv.METRIC_KV_BYTES,
            documentation="Bytes moved by this engine's NIXL transfers (tracedpush, NIXL "
            "totalBytes of each kv.write / kv.read).",
            labelnames=kv_labels,
        )
        self._dropped_parent = self._counter_cls(
            name=semconv.METRIC_SPANS_DROPPED,
            documentation="Spans this engine's processes could not export (tracedpush), "
            "by reason, summed over their exporters.",
            labelnames=[*labelnames, semconv.LABEL_REASON],
        )
        lost_parent = self._counter_cls(
            name=semconv.METRIC_OBSERVATIONS_DROPPED,
            documentation="tracedpush metric observations discarded before vLLM collected "
            "them (the bounded hand-off from the span builder was full).",
            labelnames=labelnames,
        )
        thread_labels = [*kv_labels, semconv.LABEL_PROCESS, semconv.LABEL_THREAD]
        self._cpu_parent = self._counter_cls(
            name=semconv.METRIC_THREAD_CPU,
            documentation="CPU time of this engine's threads (tracedpush, from /proc: "
            "utime + stime), by process and thread role.",
            labelnames=thread_labels,
        )
        self._wait_parent = self._counter_cls(
            name=semconv.METRIC_THREAD_CPU_WAIT,
            documentation="Time this engine's threads were runnable without a CPU "
            "(tracedpush, from the kernel's schedstat run delay), by process and thread role.",
            labelnames=thread_labels,
        )
        parents = (self._phase_parent, self._failure_parent, self._dropped_parent)
        _registered.extend((*parents, bytes_parent, lost_parent))
        _registered.extend((self._cpu_parent, self._wait_parent))
        phases = semconv.KV_PHASES_BY_ROLE.get((mode, role), ())
        self.phase_seconds: dict[int, dict[str, Any]] = {}
        self.failures: dict[int, dict[str, Any]] = {}
        self.kv_bytes: dict[int, Any] = {}
        self.spans_dropped: dict[int, dict[str, Any]] = {}
        self.observations_dropped: dict[int, Any] = {}
        # (process, thread role) -> (CPU child, wait child), per engine
        self.threads: dict[int, dict[tuple[str, str], tuple[Any, Any]]] = {}
        for idx, values in per_engine_labelvalues.items():
            kv_values = [*values, mode, role]
            self.phase_seconds[idx] = {p: self._phase_parent.labels(*kv_values, p) for p in phases}
            self.failures[idx] = {
                r: self._failure_parent.labels(*kv_values, r) for r in semconv.KV_FAILURE_REASONS
            }
            self.kv_bytes[idx] = bytes_parent.labels(*kv_values)
            self.spans_dropped[idx] = {
                r: self._dropped_parent.labels(*values, r) for r in semconv.DROP_REASONS
            }
            self.observations_dropped[idx] = lost_parent.labels(*values)
            self.threads[idx] = {}
            for process, thread in PATH_THREADS:
                self._thread_children(idx, kv_values, process, thread)

    def _thread_children(
        self, idx: int, kv_values: list[object], process: str, thread: str
    ) -> tuple[Any, Any]:
        pair = self.threads[idx][process, thread] = (
            self._cpu_parent.labels(*kv_values, process, thread),
            self._wait_parent.labels(*kv_values, process, thread),
        )
        return pair

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        super().observe(transfer_stats_data, engine_idx)
        data = transfer_stats_data
        self._observe_threads(data, engine_idx)
        values = self.per_engine_labelvalues[engine_idx]
        hists = self.phase_seconds[engine_idx]
        phases = zip(data.get(PHASE_NAMES, ()), data.get(PHASE_SECONDS, ()), strict=False)
        for phase, seconds in phases:
            child = hists.get(phase)
            if child is None:  # a phase this mode/role was not expected to have
                child = hists[phase] = self._phase_parent.labels(
                    *values, self.mode, self.role, phase
                )
            child.observe(seconds)
        failures = self.failures[engine_idx]
        for reason in data.get(FAILURES, ()):
            child = failures.get(reason)
            if child is None:
                child = failures[reason] = self._failure_parent.labels(
                    *values, self.mode, self.role, reason
                )
            child.inc()
        moved = sum(data.get(BYTES, ()))
        if moved:
            self.kv_bytes[engine_idx].inc(moved)
        dropped = self.spans_dropped[engine_idx]
        for reason, n in zip(data.get(DROP_REASONS, ()), data.get(DROP_COUNTS, ()), strict=False):
            child = dropped.get(reason)
            if child is None:
                child = dropped[reason] = self._dropped_parent.labels(*values, reason)
            child.inc(n)
        lost = sum(data.get(OBSERVATIONS_DROPPED, ()))
        if lost:
            self.observations_dropped[engine_idx].inc(lost)

    def _observe_threads(self, data: dict[str, Any], engine_idx: int) -> None:
        children = self.threads[engine_idx]
        values = [*self.per_engine_labelvalues[engine_idx], self.mode, self.role]
        rows = zip(
            data.get(THREAD_PROCESS, ()),
            data.get(THREAD_ROLE, ()),
            data.get(THREAD_CPU_S, ()),
            data.get(THREAD_WAIT_S, ()),
            strict=False,
        )
        for process, thread, cpu_s, wait_s in rows:
            pair = children.get((process, thread))
            if pair is None:
                pair = self._thread_children(engine_idx, values, process, thread)
            if cpu_s > 0:
                pair[0].inc(cpu_s)
            if wait_s > 0:
                pair[1].inc(wait_s)
