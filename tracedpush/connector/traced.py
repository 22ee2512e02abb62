"""The tracing layer shared by the push and pull connectors.

`TracedConnectorMixin` sits in front of vLLM's NIXL connector facade. Each hook calls
vLLM first or last exactly as before and, around it, appends one compact event to the
process's pipeline: no I/O, no locks, no span building on the engine or worker
threads. Any failure inside our own code is swallowed (and counted by the pipeline):
tracing must never take an engine down.

Scheduler side: `on_new_request`, `update_state_after_alloc`, `build_connector_meta`,
`update_connector_output`, `request_finished[_all_groups]` (public, stable hooks). The
scheduler ships the facts a worker needs (trace context, allocation and finish times)
inside the connector metadata (`meta.tracedpush_facts`).

Sampling: `on_new_request` reads the request's traceparent flags (a character test).
An unsampled request is not watched for its first schedule; its other events are still
recorded, because the engine's KV metrics count every request, but no span is built or
exported for it (`telemetry.builder`).

The scheduler side also stamps each request as the EngineCore's input thread has it
(`core_input.py`), which splits `engine input` from the wait for the busy loop.

Worker side: `bind_connector_metadata`, `start_load_kv`, `get_finished` /
`get_transfer_results` (public), the NIXL agent tap (`tap.py`), and two private seams
checked by `version.py`: `_nixl_handshake` (handshake timing) and, in push mode,
`_do_start_push_kv` (the rendezvous moment on P's writer thread).

Metrics (both sides, and the API server): `get_kv_connector_stats` adds the span
builder's observations to NIXL's stats; the class methods `build_kv_connector_stats` and
`build_prom_metrics` give vLLM's API server our stats and Prometheus metrics beside
NIXL's (`metrics.py`, docs/metrics.md).
"""

from __future__ import annotations

import logging
import socket
from time import monotonic, time_ns
from typing import Any

from tracedpush import semconv
from tracedpush.connector import core_input, version
from tracedpush.connector.config import TracedConfig
from tracedpush.connector.metrics import TracedKVConnectorStats, TracedPromMetrics, collect_stats
from tracedpush.connector.producer_renewal import PullRenewal, PushRenewal
from tracedpush.connector.tap import NixlAgentTap
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.builder import BuilderConfig
from tracedpush.telemetry.context import sampled
from tracedpush.telemetry.export import SpanSink, build_exporters, make_resource
from tracedpush.telemetry.observations import Observations
from tracedpush.telemetry.pipeline import Pipeline
from tracedpush.telemetry.threads import native_thread_ids, python_thread_ids

log = logging.getLogger("tracedpush.connector")

_KEY = semconv.KV_PARAMS_TRACE_KEY


def _role_for(kv_role: str | None) -> str:
    return "decode" if kv_role == "kv_consumer" else "prefill"


def _positive_int(value: Any) -> int:
    """A count from kv_transfer_params (pp_size), 1 if absent or not a positive int."""
    return value if type(value) is int and value > 0 else 1


def _vllm_times(request: Any, now_ns: int, mono_s: float) -> tuple[int, int]:
    """vLLM's (QUEUED, SCHEDULED) moments of `request`, on our clock (ns since the epoch),
    read in the step that first scheduled it; QUEUED 0 and SCHEDULED `now_ns` without them.

    vLLM measures request_queue_time and request_prefill_time from these events, stamped
    with `time.monotonic()`: QUEUED as `add_request` ends, SCHEDULED as the step's
    `schedule()` begins. `build_connector_meta` runs at the step's end, after the
    scheduler's work for every request in the step, so its own time would move that work
    into the queue wait. Both are converted with one offset, so their difference is
    vLLM's exactly. Without events (the engine runs with --disable-log-stats) the step's
    end is the answer.
    """
    queued, scheduled = 0, now_ns
    for event in request.events or ():
        name = event.type.name
        if name == "QUEUED":
            queued = now_ns - int((mono_s - event.timestamp) * 1e9)
        elif name == "SCHEDULED":
            scheduled = now_ns - int((mono_s - event.timestamp) * 1e9)
    return queued, scheduled


class TracedConnectorMixin:
    """Mixed in before vLLM's NixlPushConnector / NixlPullConnector."""

    _TRACEDPUSH_MODE = "pull"

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        before = native_thread_ids()
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[call-arg]
        # Native threads vLLM's worker started while building the NIXL agent (its UCX
        # progress thread): named so in `engine.threads`, since the OS calls them nothing.
        self._tp_nixl_tids = native_thread_ids() - before - python_thread_ids()
        self._tp_pipeline: Pipeline | None = None
        self._tp_record = None
        self._tp_obs: Observations | None = None  # builder -> get_kv_connector_stats
        self._tp_outbox: list[tuple] = []
        self._tp_await_sched: dict[str, Any] = {}  # request id -> vLLM's Request
        self._tp_seq = 0  # scheduler: engine steps scheduled
        # worker: the step in progress (bind -> clear), its connector time per call
        self._tp_step_t0 = 0
        self._tp_step_seq = -1
        self._tp_ns = [0, 0, 0, 0, 0]  # bind, start_load, wait_save, results, other
        self._tp_loads = [0, 0]  # started, finished
        ktc = vllm_config.kv_transfer_config
        config = self._tp_config = TracedConfig.from_extra_config(ktc.kv_connector_extra_config)
        self._tp_role = _role_for(ktc.kv_role)
        self._tp_block_size = int(getattr(vllm_config.cache_config, "block_size", 16) or 16)
        worker = getattr(self, "connector_worker", None)
        self._tp_renewal = self._tp_renewal_for(worker, config)
        if not config.enabled:
            return
        if worker is not None:  # checked before anything is wrapped
            version.check_seams(worker, version.WORKER_INSTANCE_SEAMS, type(worker).__name__)
        try:
            self._tp_start(config, ktc.engine_id, worker)
        except Exception:  # tracing off, engine unaffected
            log.exception("tracedpush: tracing disabled for this connector")
            self._tp_record = None

    # ------------------------------------------------------------------ setup
    def _tp_renewal_for(self, worker: Any, config: TracedConfig) -> Any:
        """D: serve again after a prefill restart (producer_renewal.py); not tracing."""
        if worker is None or self._tp_role != "decode" or not config.producer_renewal:
            return None
        push = self._TRACEDPUSH_MODE == "push"
        try:
            seams = version.PUSH_RENEWAL_SEAMS if push else version.PULL_RENEWAL_SEAMS
            version.check_seams(worker, seams, type(worker).__name__)
            return (PushRenewal if push else PullRenewal)(worker).install()
        except Exception:
            log.exception("tracedpush: no producer renewal; vLLM's own behaviour applies")
            return None

    def _tp_renew(self) -> None:
        """Engine thread, after start_load_kv: one truthiness test unless a peer failed."""
        renewal = self._tp_renewal
        if renewal is not None and renewal.pending:
            try:
                renewal.apply()
            except Exception:  # never take the engine down
                log.exception("tracedpush: producer renewal failed this step")

    def _tp_start(self, config: TracedConfig, engine_id: str, worker: Any) -> None:
        side = "worker" if worker is not None else "scheduler"
        rank = int(getattr(worker, "tp_rank", 0)) if worker is not None else 0
        size = int(getattr(worker, "world_size", 1)) if worker is not None else 1
        service = config.service_for(self._tp_role)
        try:
            import vllm

            vllm_version = vllm.__version__
        except Exception:  # pragma: no cover
            vllm_version = "unknown"
        resource = make_resource(
            service,
            engine_id,
            {
                semconv.RES_VLLM_VERSION: vllm_version,
                "tracedpush.side": side,
                semconv.RES_EXPORT_RECORDS: True,
            },
        )
        stem = f"{service}-{side}{rank if side == 'worker' else ''}"
        observations = Observations()
        sink = SpanSink(build_exporters(config.traces_dir, stem))
        builder_config = BuilderConfig(
            mode=self._TRACEDPUSH_MODE,
            role=self._tp_role,
            side=side,
            engine_id=engine_id,
            tp_rank=rank,
            tp_size=size,
            stale_after_s=config.stale_after_s,
        )
        self._tp_pipeline = Pipeline(
            builder_config,
            resource,
            sink,
            interval_s=config.interval_ms / 1000,
            sample_threads=config.sample_threads,
            thread_roles=dict.fromkeys(self._tp_nixl_tids if worker is not None else (), "nixl"),
            observations=observations,
        )
        self._tp_obs = observations
        record = self._tp_record = self._tp_pipeline.record
        if worker is not None:
            worker.nixl_wrapper = NixlAgentTap(worker.nixl_wrapper, record)
            self._tp_wrap_handshake(worker, record)
        else:  # when the EngineCore's input thread had each request (engine input's split)
            core_input.install()
        log.info(
            "tracedpush: tracing %s %s (%s) on %s -> %s",
            self._TRACEDPUSH_MODE,
            self._tp_role,
            side,
            socket.gethostname(),
            ", ".join(w.name for w in sink.workers) or "no exporter",
        )

    @staticmethod
    def _tp_wrap_handshake(worker: Any, record) -> None:
        original = worker._nixl_handshake

        def _nixl_handshake(host, port, remote_tp_size, expected_engine_id, *args, **kwargs):
            t0 = time_ns()
            try:
                result = original(host, port, remote_tp_size, expected_engine_id, *args, **kwargs)
            except Exception as e:
                record((ev.HANDSHAKE, t0, time_ns(), expected_engine_id, repr(e)[:300], None))
                raise
            # vLLM returns ({(pp_rank, tp_rank): agent name}, clock offset): keep its dict
            # (a reference, read on the builder thread) to tell which rank notified.
            agents = result[0] if type(result) is tuple and result else None
            record((ev.HANDSHAKE, t0, time_ns(), expected_engine_id, None, agents))
            return result

        worker._nixl_handshake = _nixl_handshake

    @property
    def tracedpush_stats(self) -> dict[str, object] | None:
        return self._tp_pipeline.stats() if self._tp_pipeline else None

    # --------------------------------------------------------- scheduler side
    def on_new_request(self, request: Any) -> None:
        record = self._tp_record
        if record is not None:
            try:
                params = request.kv_transfer_params
                ctx = params.pop(_KEY, None) if params else None
                if not isinstance(ctx, dict):
                    ctx = {}
                received = ctx.get(semconv.TRACE_RECEIVED_NS_KEY)
                traceparent = ctx.get("traceparent")
                event = (
                    ev.NEW,
                    time_ns(),
                    request.request_id,
                    request.arrival_time,
                    request.num_prompt_tokens,
                    traceparent,
                    received if isinstance(received, int) else 0,
                    core_input.received(request.request_id),
                )
                record(event)
                self._tp_outbox.append(event)
                # The first-scheduled moment only ends the engine span, which an unsampled
                # request does not get; its other events feed the KV metrics.
                if sampled(traceparent):
                    self._tp_await_sched[request.request_id] = request
            except Exception:
                pass
        elif request.kv_transfer_params:
            request.kv_transfer_params.pop(_KEY, None)
        super().on_new_request(request)  # type: ignore[misc]

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        record = self._tp_record
        if record is not None and num_external_tokens > 0:
            try:
                params = request.kv_transfer_params
                if params and params.get("do_remote_prefill"):
                    event = (
                        ev.ALLOC,
                        time_ns(),
                        request.request_id,
                        -(-num_external_tokens // self._tp_block_size),
                        num_external_tokens,
                        params.get("remote_engine_id", ""),
                        _positive_int(params.get("pp_size")),
                    )
                    record(event)
                    self._tp_outbox.append(event)
            except Exception:
                pass
        return super().update_state_after_alloc(request, blocks, num_external_tokens)  # type: ignore[misc]

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)  # type: ignore[misc]
        record = self._tp_record
        if record is not None:
            try:
                now = time_ns()
                scheduled = scheduler_output.num_scheduled_tokens
                waiting = self._tp_await_sched
                if waiting:
                    hits = [rid for rid in waiting if rid in scheduled]
                    if hits:
                        mono = monotonic()
                        for rid in hits:
                            queued, at = _vllm_times(waiting.pop(rid), now, mono)
                            record((ev.SCHEDULED, at, rid, queued))
                self._tp_seq = seq = self._tp_seq + 1
                record((ev.SCHED_STEP, now, seq, scheduled))
                meta.tracedpush_step = seq
                if self._tp_outbox:
                    meta.tracedpush_facts = tuple(self._tp_outbox)
                    self._tp_outbox = []
            except Exception:
                pass
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        record = self._tp_record
        if record is not None:
            try:
                if connector_output.finished_recving:
                    record((ev.RECV_DONE, time_ns(), tuple(connector_output.finished_recving)))
                if connector_output.finished_sending:
                    record((ev.SEND_DONE, time_ns(), tuple(connector_output.finished_sending)))
            except Exception:
                pass
        super().update_connector_output(connector_output)  # type: ignore[misc]

    def _tp_finished(self, request: Any, block_ids: Any) -> None:
        record = self._tp_record
        if record is None:
            return
        try:
            n_blocks = sum(len(group) for group in block_ids) if block_ids else 0
            event = (ev.FINISHED, time_ns(), request.request_id, request.status.name, n_blocks)
            record(event)
            self._tp_outbox.append(event)
            self._tp_await_sched.pop(request.request_id, None)
        except Exception:
            pass

    def request_finished(self, request: Any, block_ids: list[int]):
        self._tp_finished(request, (block_ids,))
        return super().request_finished(request, block_ids)  # type: ignore[misc]

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]):
        self._tp_finished(request, block_ids)
        return super().request_finished_all_groups(request, block_ids)  # type: ignore[misc]

    # ------------------------------------------------------------ worker side
    # One engine step on the model-runner thread: bind_connector_metadata ... (forward,
    # start_load_kv, wait_for_save, get_finished / get_transfer_results) ...
    # clear_connector_metadata. Each hook adds its own duration to the step's counters;
    # `clear` records the whole step as one `WorkerStep` event.
    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        t0 = time_ns()
        super().bind_connector_metadata(connector_metadata)  # type: ignore[misc]
        record = self._tp_record
        if record is not None:
            self._tp_step_t0 = t0
            self._tp_step_seq = getattr(connector_metadata, "tracedpush_step", -1)
            facts = getattr(connector_metadata, "tracedpush_facts", None)
            if facts:
                record((ev.FACTS, t0, facts))
            self._tp_ns[0] += time_ns() - t0

    def _tp_on_load(self, metadata: Any, now: int) -> None:
        """Mode-specific events when start_load_kv takes requests (see push.py, pull.py)."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._tp_record is None:
            super().start_load_kv(forward_context, **kwargs)  # type: ignore[misc]
            self._tp_renew()
            return
        t0 = time_ns()
        try:
            self._tp_on_load(self._connector_metadata, t0)  # type: ignore[attr-defined]
        except Exception:
            pass
        super().start_load_kv(forward_context, **kwargs)  # type: ignore[misc]
        self._tp_renew()
        self._tp_ns[1] += time_ns() - t0

    def wait_for_save(self) -> None:
        t0 = time_ns()
        super().wait_for_save()  # type: ignore[misc]
        self._tp_ns[2] += time_ns() - t0

    def get_kv_connector_stats(self) -> Any:
        """NIXL's stats plus the builder's metric observations (both sides: vLLM calls
        it on the model runner and on the scheduler every step). Only drains a deque."""
        t0 = time_ns()
        stats = super().get_kv_connector_stats()  # type: ignore[misc]
        try:
            stats = collect_stats(stats, self._tp_obs)
        except Exception:
            pass
        self._tp_ns[4] += time_ns() - t0
        return stats

    # ------------------------------------------------ API server: /metrics
    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> Any:
        """Rebuild the payload `get_kv_connector_stats` produced (NIXL's keys and ours)."""
        return TracedKVConnectorStats(data=data) if data is not None else TracedKVConnectorStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> Any:
        """NIXL's `vllm:nixl_*` metrics and ours (docs/metrics.md). The API server knows
        this engine's mode and role only from its config: our class and `kv_role`."""
        ktc = vllm_config.kv_transfer_config
        return TracedPromMetrics(
            vllm_config,
            metric_types,
            labelnames,
            per_engine_labelvalues,
            mode=cls._TRACEDPUSH_MODE,
            role=_role_for(ktc.kv_role if ktc is not None else None),
        )

    def clear_connector_metadata(self) -> None:
        t0 = time_ns()
        super().clear_connector_metadata()  # type: ignore[misc]
        record = self._tp_record
        if record is not None and self._tp_step_t0:
            t1 = time_ns()
            ns = self._tp_ns
            loads = self._tp_loads
            try:
                record(
                    (
                        ev.WORKER_STEP,
                        self._tp_step_t0,
                        t1,
                        self._tp_step_seq,
                        ns[0],
                        ns[1],
                        ns[2],
                        ns[3],
                        ns[4] + t1 - t0,
                        loads[0],
                        loads[1],
                    )
                )
            except Exception:
                pass
            self._tp_step_t0 = 0
            ns[0] = ns[1] = ns[2] = ns[3] = ns[4] = 0
            loads[0] = loads[1] = 0

    def _tp_results(self, t0: int, sending: Any, recving: Any, failed: Any = ()) -> None:
        record = self._tp_record
        if record is None:
            return
        if sending or recving or failed:
            try:
                record((ev.RESULTS, t0, tuple(sending), tuple(recving), tuple(failed)))
                self._tp_loads[1] += len(sending) + len(recving) + len(failed)
            except Exception:
                pass
        self._tp_ns[3] += time_ns() - t0

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        t0 = time_ns()
        sending, recving = super().get_finished(finished_req_ids)  # type: ignore[misc]
        self._tp_results(t0, sending or (), recving or ())
        return sending, recving

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        t0 = time_ns()
        results = super().get_transfer_results(finished_req_ids)  # type: ignore[misc]
        self._tp_results(
            t0, results.finished_sending, results.finished_recving, results.failed_recving
        )
        return results

    def shutdown(self) -> None:
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            if self._tp_pipeline is not None:
                self._tp_pipeline.shutdown()
