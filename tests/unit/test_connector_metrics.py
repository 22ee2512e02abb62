"""Engine /metrics through vLLM's own connector-metrics path (docs/metrics.md).

Real parts end to end, without an engine: our connector class resolved by vLLM's
KVConnectorFactory from a kv_transfer_config with kv_connector_module_path, vLLM's
KVConnectorProm building its metrics from it into prometheus_client's global registry
(as the API server's PrometheusStatLogger does), our span builder producing spans and
observations from the same event streams the connector records, and the stats payload
travelling as `to_dict()` through msgpack (the EngineCore -> API server encoding).
"""

from __future__ import annotations

import msgspec
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY, generate_latest
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorLogging,
    KVConnectorProm,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
from vllm.v1.metrics.prometheus import unregister_vllm_metrics

import tracedpush.connector as ours
from tracedpush import semconv
from tracedpush.connector import metrics as m
from tracedpush.telemetry import events as ev
from tracedpush.telemetry import observations as obs
from tracedpush.telemetry.builder import BuilderConfig, SpanBuilder
from tracedpush.telemetry.context import format_traceparent
from tracedpush.telemetry.export import ExportWorker, SpanSink
from tracedpush.telemetry.observations import Observations, SpanObserver
from tracedpush.telemetry.pipeline import Pipeline

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
PARENT = 0xB7AD6B7169203331
P_ID = "cmpl-req-1-0-8b86e050"
D_ID = "cmpl-req-1-0-a38b6b14"
MS = 1_000_000
LABELS = ["model_name", "engine"]
ENGINE = {0: ["tiny-qwen2", "0"]}


class FakeTelemetry:
    """NIXL's nixlXferTelemetry fields, as the agent tap records them."""

    totalBytes = 1_228_800
    descCount = 40
    postDuration = 120.0
    xferDuration = 900.0


def reg_msg(d_req_id: str) -> bytes:
    return ev.PUSH_REG_PREFIX + msgspec.msgpack.encode(
        {
            "request_id": d_req_id,
            "decode_engine_id": "decode-engine-001",
            "remote_engine_id": "prefill-engine-001",
        }
    )


def new_event(req_id: str, t: int) -> tuple:
    return ev.New(t, req_id, t / 1e9, 1201, format_traceparent(TRACE, PARENT), 0)


def push_prefill_events() -> list[tuple]:
    """P's worker: prefill finished (1200) before D's registration arrived (1260); blocks
    handed to the writer (1262); the writer starts (1265), handshakes with D first, then
    preps, posts and sees the WRITE done."""
    return [
        ev.Facts(1001 * MS, (new_event(P_ID, 1000 * MS),)),
        ev.Facts(1250 * MS, (ev.Finished(1200 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 10),)),
        ev.Notifs(1260 * MS, {"agent-d": [reg_msg(D_ID)]}),
        ev.Handoff(1262 * MS, (P_ID,)),
        ev.PushStart(1265 * MS, P_ID, D_ID, "decode-engine-001", 10),
        ev.Handshake(1266 * MS, 1305 * MS, "decode-engine-001", None),
        ev.PushStart(1306 * MS, P_ID, D_ID, "decode-engine-001", 10),
        ev.Prep(1306 * MS, 1307 * MS, "WRITE", f"{D_ID}:1".encode(), 77, 40),
        ev.Post(1307 * MS, 1308 * MS, 77, "PROC"),
        ev.State(1315 * MS, 77, "DONE"),
        ev.Telemetry(1315 * MS, 77, FakeTelemetry()),
    ]


def build(mode: str, role: str, events: list[tuple], sweep_ns: int = 0):
    """Spans and the observations the builder made from the same events."""
    exporter = InMemorySpanExporter()
    observations = Observations()
    builder = SpanBuilder(
        BuilderConfig(mode=mode, role=role, side="worker", engine_id=f"{role}-engine-001"),
        Resource.create({"service.name": f"vllm-{role}"}),
        exporter.export,
        SpanObserver(mode, role, observations),
    )
    builder.feed(events)
    if sweep_ns:
        builder.sweep(now_ns=sweep_ns)
    assert builder.observer_errors == 0
    return {s.name: s for s in exporter.get_finished_spans()}, observations


def seconds(span: ReadableSpan) -> float:
    return (span.end_time - span.start_time) / 1e9


def vllm_config(connector: str, kv_role: str) -> VllmConfig:
    return VllmConfig(
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path="tracedpush.connector",
            kv_role=kv_role,
            engine_id="e1",
        )
    )


@pytest.fixture
def prom():
    """vLLM's KVConnectorProm for a config, in the global registry, as the API server
    builds it (PrometheusStatLogger unregisters vLLM's metrics first, then builds it)."""

    def make(connector: str, kv_role: str) -> KVConnectorProm:
        unregister_vllm_metrics()
        return KVConnectorProm(vllm_config(connector, kv_role), LABELS, ENGINE)

    yield make
    unregister_vllm_metrics()
    m._unregister_ours()


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"model_name": "tiny-qwen2", "engine": "0", **labels})


def ship(stats) -> dict:
    """What the API server receives: the scheduler's `to_dict()`, msgpack round trip."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(stats.to_dict()))


def test_push_prefill_phases_on_vllms_prom_path_equal_the_spans(prom):
    ktc = vllm_config("NixlPushConnector", "kv_producer").kv_transfer_config
    assert KVConnectorFactory.get_connector_class(ktc) is ours.NixlPushConnector
    kv_prom = prom("NixlPushConnector", "kv_producer")
    assert isinstance(kv_prom.prom_metrics, m.TracedPromMetrics)
    assert (kv_prom.prom_metrics.mode, kv_prom.prom_metrics.role) == ("push", "prefill")

    spans, observations = build("push", "prefill", push_prefill_events())
    # worker: NIXL's own stats for the same WRITE, plus what our builder observed
    nixl = NixlKVConnectorStats()
    nixl.record_transfer(FakeTelemetry())
    worker_stats = m.collect_stats(nixl, observations)
    # scheduler side: its process dropped 3 spans (its own observations only)
    sched = Observations()
    sched.put((obs.SPANS_DROPPED, semconv.DROP_QUEUE_FULL, 3))
    sched_stats = m.collect_stats(None, sched)
    assert sched_stats is not None and not sched_stats.is_empty()
    payload = ship(worker_stats.aggregate(sched_stats))  # as Scheduler.update_from_output
    kv_prom.observe(payload, 0)

    push_p = {"mode": "push", "role": "prefill"}
    hist = semconv.METRIC_KV_PHASE
    write = spans[semconv.SPAN_KV_WRITE]
    assert value(f"{hist}_count", **push_p, phase="WRITE") == 1
    assert value(f"{hist}_sum", **push_p, phase="WRITE") == seconds(write) == 0.008
    assert value(f"{hist}_bucket", **push_p, phase="WRITE", le="0.01") == 1
    assert value(f"{hist}_bucket", **push_p, phase="WRITE", le="0.005") == 0
    for span_name in (
        semconv.SPAN_KV_RENDEZVOUS,
        semconv.SPAN_KV_HANDSHAKE,
        semconv.SPAN_KV_DESC_PREP,
    ):
        phase = semconv.KV_SPAN_PHASE[span_name]
        assert value(f"{hist}_sum", **push_p, phase=phase) == seconds(spans[span_name])
    # from kv.rendezvous's events: finished 1200, registration 1260, handed 1262, end 1265
    rdv = {e.name: e.timestamp for e in spans[semconv.SPAN_KV_RENDEZVOUS].events}
    reg_wait = (rdv[semconv.EVENT_REGISTRATION_ARRIVED] - rdv[semconv.EVENT_PREFILL_FINISHED]) / 1e9
    assert value(f"{hist}_sum", **push_p, phase="registration wait") == reg_wait == 0.06
    assert value(f"{hist}_sum", **push_p, phase="step handoff") == 0.002
    assert value(f"{hist}_sum", **push_p, phase="writer queue") == 0.003
    # phases this engine never has get no series
    assert value(f"{hist}_count", **push_p, phase="READ") is None

    for reason in semconv.KV_FAILURE_REASONS:
        assert value(f"{semconv.METRIC_KV_FAILURES}_total", **push_p, reason=reason) == 0
    assert value(f"{semconv.METRIC_KV_BYTES}_total", **push_p) == FakeTelemetry.totalBytes
    dropped = f"{semconv.METRIC_SPANS_DROPPED}_total"
    assert value(dropped, reason=semconv.DROP_QUEUE_FULL) == 3
    assert value(dropped, reason=semconv.DROP_STORE_FULL) == 0
    # NIXL's own metrics keep working on the same payload
    assert value("vllm:nixl_xfer_time_seconds_count") == 1
    assert value("vllm:nixl_xfer_time_seconds_sum") == FakeTelemetry.xferDuration / 1e6
    assert value("vllm:nixl_bytes_transferred_sum") == FakeTelemetry.totalBytes

    text = generate_latest(REGISTRY).decode()
    assert (
        'tracedpush_kv_phase_seconds_bucket{engine="0",le="0.01",mode="push",'
        'model_name="tiny-qwen2",phase="WRITE",role="prefill"} 1.0'
    ) in text
    assert (
        'tracedpush_kv_failures_total{engine="0",mode="push",model_name="tiny-qwen2",'
        'reason="lease_expired",role="prefill"} 0.0'
    ) in text

    # a second stat logger in the same process (vLLM re-creates it) does not collide
    prom("NixlPushConnector", "kv_producer")


@pytest.mark.parametrize(
    ("connector", "kv_role", "mode", "role"),
    [
        ("NixlPushConnector", "kv_consumer", "push", "decode"),
        ("NixlConnector", "kv_producer", "pull", "prefill"),
        ("NixlPullConnector", "kv_consumer", "pull", "decode"),
    ],
)
def test_mode_and_role_come_from_the_config_with_every_series_at_zero(
    prom, connector, kv_role, mode, role
):
    kv_prom = prom(connector, kv_role)
    metrics = kv_prom.prom_metrics
    assert (metrics.mode, metrics.role) == (mode, role)
    labels = {"mode": mode, "role": role}
    for phase in semconv.KV_PHASES_BY_ROLE[(mode, role)]:
        assert value(f"{semconv.METRIC_KV_PHASE}_count", **labels, phase=phase) == 0
    for reason in semconv.KV_FAILURE_REASONS:
        assert value(f"{semconv.METRIC_KV_FAILURES}_total", **labels, reason=reason) == 0
    for reason in semconv.DROP_REASONS:
        assert value(f"{semconv.METRIC_SPANS_DROPPED}_total", reason=reason) == 0


def test_the_api_servers_prometheus_stat_logger_exposes_ours_and_nixls(tmp_path, prom):
    """The whole API-server side: vLLM's PrometheusStatLogger for a real VllmConfig (the
    tiny offline model), SchedulerStats through vLLM's own msgpack codec, record()."""
    from vllm.config import ModelConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from tracedpush.model.build import ensure_model

    model = ensure_model(tmp_path / "model")
    config = vllm_config("NixlPushConnector", "kv_producer")
    config = VllmConfig(
        model_config=ModelConfig(
            model=str(model), served_model_name="tiny-qwen2", max_model_len=512
        ),
        kv_transfer_config=config.kv_transfer_config,
    )
    logger = PrometheusStatLogger(config, [0])
    assert isinstance(logger.kv_connector_prom.prom_metrics, m.TracedPromMetrics)

    spans, observations = build("push", "prefill", push_prefill_events())
    nixl = NixlKVConnectorStats()
    nixl.record_transfer(FakeTelemetry())
    stats = m.collect_stats(nixl, observations)
    wire = MsgpackEncoder().encode(SchedulerStats(kv_connector_stats=stats.to_dict()))
    received = MsgpackDecoder(SchedulerStats).decode(wire)
    logger.record(scheduler_stats=received, iteration_stats=None, engine_idx=0)

    write = seconds(spans[semconv.SPAN_KV_WRITE])
    push_p = {"mode": "push", "role": "prefill"}
    assert value(f"{semconv.METRIC_KV_PHASE}_sum", **push_p, phase="WRITE") == write
    assert value(f"{semconv.METRIC_KV_FAILURES}_total", **push_p, reason="handshake_failed") == 0
    assert value("vllm:nixl_xfer_time_seconds_count") == 1
    assert value("vllm:num_requests_running") == 0  # vLLM's own, same registry


def test_pull_decode_failed_read_counts_a_failure_not_a_duration(prom):
    kv_prom = prom("NixlPullConnector", "kv_consumer")
    facts = (new_event(D_ID, 1000 * MS), ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"))
    spans, observations = build(
        "pull",
        "decode",
        [
            ev.Facts(1005 * MS, facts),
            ev.LoadStart(1010 * MS, D_ID, "prefill-engine-001", P_ID, 10),
            ev.Prep(1011 * MS, 1012 * MS, "READ", f"{P_ID}:1".encode(), 5, 40),
            ev.Post(1012 * MS, 1013 * MS, 5, "PROC"),
            ev.State(1020 * MS, 5, "ERR"),
            ev.Results(1021 * MS, (), (D_ID,), (D_ID,)),
        ],
    )
    assert spans[semconv.SPAN_KV_READ].attributes[semconv.ERROR_TYPE] == semconv.ERR_TRANSFER
    kv_prom.observe(ship(m.collect_stats(None, observations)), 0)
    pull_d = {"mode": "pull", "role": "decode"}
    failures = f"{semconv.METRIC_KV_FAILURES}_total"
    assert value(failures, **pull_d, reason=semconv.ERR_TRANSFER) == 1
    assert value(failures, **pull_d, reason=semconv.ERR_HANDSHAKE) == 0
    hist = semconv.METRIC_KV_PHASE
    assert value(f"{hist}_count", **pull_d, phase="READ") == 0
    prep = spans[semconv.SPAN_KV_DESC_PREP]
    assert value(f"{hist}_sum", **pull_d, phase="descriptor prep") == seconds(prep)
    # D: blocks allocated (1003) -> descriptor prep starts (1010)
    assert value(f"{hist}_sum", **pull_d, phase="step handoff") == 0.007


def test_push_decode_registration_handshake_and_timeouts():
    facts = (new_event(D_ID, 1000 * MS), ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"))
    spans, observations = build(
        "push",
        "decode",
        [
            ev.Facts(1005 * MS, facts),
            ev.Handshake(1006 * MS, 1030 * MS, "prefill-engine-001", None),
            ev.SendNotif(1031 * MS, "agent-p", reg_msg(D_ID)),
        ],
        sweep_ns=1031 * MS + int(121e9),  # no notification: kv.notify times out
    )
    items, lost = observations.take()
    assert lost == 0
    assert (obs.PHASE, "registration", seconds(spans[semconv.SPAN_KV_REGISTER])) in items
    assert (obs.PHASE, "handshake", 0.024) in items  # kv.register's handshake event
    assert (obs.FAILURE, semconv.ERR_NOTIFY_TIMEOUT) in items
    assert not [i for i in items if i[0] == obs.PHASE and i[1] == "notification counting"]


def test_full_deque_drops_oldest_and_counts_them(prom):
    observations = Observations(maxlen=3)
    for i in range(5):
        observations.put((obs.BYTES, i))
    assert observations.dropped == 2
    items, lost = observations.take()
    assert items == [(obs.BYTES, 2), (obs.BYTES, 3), (obs.BYTES, 4)]  # the oldest went
    assert lost == 2
    assert observations.take() == ([], 0)  # each drop reported once
    observations.put((obs.BYTES, 10))
    observations.put((obs.BYTES, 20))
    observations.put((obs.BYTES, 30))
    observations.put((obs.BYTES, 40))
    stats = m.collect_stats(None, observations)
    assert stats.data[m.BYTES] == [20, 30, 40]
    assert stats.data[m.OBSERVATIONS_DROPPED] == [1]
    kv_prom = prom("NixlPushConnector", "kv_producer")
    kv_prom.observe(ship(stats), 0)
    assert value(f"{semconv.METRIC_OBSERVATIONS_DROPPED}_total") == 1
    assert value(f"{semconv.METRIC_KV_BYTES}_total", mode="push", role="prefill") == 90


def test_stats_payload_is_plain_and_aggregates_with_nixls():
    assert m.collect_stats(None, Observations()) is None  # nothing: vLLM sends nothing
    assert m.collect_stats(None, None) is None
    ours_only = m.collect_stats(None, _one_phase())
    assert not ours_only.is_empty()  # vLLM would discard "empty" stats
    nixl = NixlKVConnectorStats()
    nixl.record_failed_transfer()
    # a worker whose NIXL stats came alone still yields our class (vLLM asserts all
    # workers' stats share a type when it aggregates them)
    wrapped = m.collect_stats(nixl, None)
    assert type(wrapped) is m.TracedKVConnectorStats
    wrapped.aggregate(ours_only)
    wrapped.aggregate(NixlKVConnectorStats())  # empty plain stats: ignored
    payload = wrapped.to_dict()
    assert payload[m.PHASE_NAMES] == ["WRITE"] and payload[m.PHASE_SECONDS] == [0.25]
    assert payload["num_failed_transfers"] == [1]
    for key, values in payload.items():
        assert isinstance(values, list), key
        assert all(isinstance(v, str | float | int) for v in values), key
    rebuilt = ours.NixlPushConnector.build_kv_connector_stats(ship(wrapped))
    assert type(rebuilt) is m.TracedKVConnectorStats and rebuilt.to_dict() == payload
    empty = ours.NixlPullConnector.build_kv_connector_stats()
    assert empty.is_empty() and set(m.KEYS) <= set(empty.data)


def test_vllms_log_summary_includes_ours():
    logging = KVConnectorLogging(vllm_config("NixlPushConnector", "kv_producer").kv_transfer_config)
    logging.observe(ship(m.collect_stats(None, _one_phase())))
    lines: list[str] = []
    logging.log(lambda fmt, *args: lines.append(fmt % args))
    assert "Traced KV phases=1" in lines[0]


def test_the_connector_hook_drains_on_both_sides():
    """The mixin's get_kv_connector_stats on a connector as vLLM builds it per side
    (scheduler: no connector_worker; worker: NIXL's worker stats)."""
    conn = ours.NixlPushConnector.__new__(ours.NixlPushConnector)
    conn._tp_ns = [0, 0, 0, 0, 0]
    conn.connector_worker = None  # scheduler side
    conn._tp_obs = _one_phase()
    sched = conn.get_kv_connector_stats()
    assert type(sched) is m.TracedKVConnectorStats and sched.data[m.PHASE_NAMES] == ["WRITE"]
    assert conn.get_kv_connector_stats() is None  # drained

    class Worker:
        def get_kv_connector_stats(self):
            stats = NixlKVConnectorStats()
            stats.record_transfer(FakeTelemetry())
            return stats

    conn.connector_worker = Worker()
    conn._tp_obs = None  # tracing disabled: NIXL's stats still come back, as our class
    stats = conn.get_kv_connector_stats()
    assert type(stats) is m.TracedKVConnectorStats
    assert stats.data["bytes_transferred"] == [FakeTelemetry.totalBytes]


def test_pipeline_sends_span_drops_as_deltas():
    worker = ExportWorker("memory", InMemorySpanExporter(), max_queue=1)
    sink = SpanSink([worker])
    observations = Observations()
    pipeline = Pipeline(
        BuilderConfig(mode="push", role="prefill", side="worker", engine_id="e1"),
        Resource.create({}),
        sink,
        interval_s=60,
        observations=observations,
    )
    try:
        worker.submit([ReadableSpan(name=f"s{i}") for i in range(5)])  # room for 1
        pipeline.observe_drops()
        pipeline.observe_drops()  # nothing new: no observation
        worker.submit([ReadableSpan(name=f"t{i}") for i in range(3)])
        pipeline.observe_drops()
        items, _ = observations.take()
        assert items == [
            (obs.SPANS_DROPPED, semconv.DROP_QUEUE_FULL, 4),
            (obs.SPANS_DROPPED, semconv.DROP_QUEUE_FULL, items[1][2]),
        ]
        assert 2 <= items[1][2] <= 3  # the exporter may have taken one meanwhile
        assert pipeline.stats()["observations_dropped"] == 0
    finally:
        pipeline.shutdown(timeout_s=1)


def _one_phase() -> Observations:
    observations = Observations()
    observations.put((obs.PHASE, "WRITE", 0.25))
    return observations


def test_thread_cpu_and_waits_reach_vllms_prom_path_as_the_samples_say(prom):
    """Two thread samples of the builder's real /proc reader: their differences by
    (process, thread role) on the engine's /metrics, equal to the rows' own numbers; the
    request-path series exist at 0 before any sample."""
    from tracedpush.telemetry.threads import ThreadDeltas, ThreadRow

    kv_prom = prom("NixlPushConnector", "kv_consumer")
    labels = {"mode": "push", "role": "decode"}
    cpu, wait = f"{semconv.METRIC_THREAD_CPU}_total", f"{semconv.METRIC_THREAD_CPU_WAIT}_total"
    for process, thread in m.PATH_THREADS:
        assert value(cpu, **labels, process=process, thread=thread) == 0
        assert value(wait, **labels, process=process, thread=thread) == 0

    def row(tid: int, role: str, cpu_ms: float, wait_ms: float) -> ThreadRow:
        process = "worker" if role in ("model_runner", "nixl") else role
        return ThreadRow(7, tid, process, "t", role, cpu_ms, 1, "1", wait_ms)

    deltas = ThreadDeltas()
    first = [row(7, "model_runner", 100, 50), row(8, "nixl", 400, 10), row(9, "api_server", 5, 1)]
    assert deltas.update(first) == {}  # a thread's first sample: its history, not counted
    second = [row(7, "model_runner", 300, 250), row(8, "nixl", 900, -1), row(10, "nixl", 20, 20)]
    got = deltas.update(second)
    assert got == {("worker", "model_runner"): (200.0, 200.0), ("worker", "nixl"): (500.0, 0.0)}
    observations = Observations()
    SpanObserver("push", "decode", observations).on_threads(got)
    kv_prom.observe(ship(m.collect_stats(None, observations)), 0)
    assert value(cpu, **labels, process="worker", thread="model_runner") == 0.2
    assert value(wait, **labels, process="worker", thread="model_runner") == 0.2
    assert value(cpu, **labels, process="worker", thread="nixl") == 0.5
    assert value(wait, **labels, process="worker", thread="nixl") == 0  # -1: not known
    assert value(cpu, **labels, process="api_server", thread="api_server") == 0


def test_thread_observations_wait_while_nobody_drains():
    """An idle engine is not drained (vLLM collects connector stats as it steps): thread
    samples are summed in the observer beyond half the hand-off, and nothing is dropped."""
    observations = Observations(maxlen=8)
    observer = SpanObserver("pull", "prefill", observations)
    for _ in range(100):
        observer.on_threads({("worker", "model_runner"): (10.0, 5.0)})
    items, lost = observations.take()
    assert lost == 0 and len(items) == 5  # while at most half of 8 are waiting; then summed
    observer.on_threads({("worker", "model_runner"): (10.0, 5.0)})  # room again: the sum
    (last,), _ = observations.take()
    total = sum(i[3] for i in items) + last[3]
    assert last[0] == obs.THREADS and total == pytest.approx(1.01)  # 101 samples x 10 ms
