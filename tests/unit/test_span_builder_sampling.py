"""Unsampled requests (traceparent flags 00): no spans built or exported on the engines,
while their KV phases still reach the engine's metrics.

First on the builder alone, fed event streams shaped like a real engine's (as in
test_span_builder.py); then on vLLM's real connector classes (tests/unit/vllm_workers.py),
where the hooks, the builder threads and the exporters run as in an engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_span_builder import (
    BASE,
    D_ID,
    D_PARENT,
    MS,
    P_ID,
    P_PARENT,
    TRACE,
    FakeTelemetry,
    new_event,
    push_prefill_worker_events,
    reg_msg,
)

from tracedpush import semconv
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.builder import BuilderConfig, SpanBuilder
from tracedpush.telemetry.context import format_traceparent, sampled
from tracedpush.telemetry.observations import PHASE, Observations, SpanObserver

UNSAMPLED_TP = format_traceparent(TRACE, P_PARENT, sampled=False)


def make(mode: str, role: str, side: str) -> tuple[SpanBuilder, InMemorySpanExporter, Observations]:
    exporter = InMemorySpanExporter()
    observations = Observations()
    builder = SpanBuilder(
        BuilderConfig(mode=mode, role=role, side=side, engine_id=f"{role}-engine-001"),
        Resource.create({"service.name": f"vllm-{role}"}),
        exporter.export,
        SpanObserver(mode, role, observations),
    )
    return builder, exporter, observations


def unsampled(events: list[tuple]) -> list[tuple]:
    """The same stream with the request's traceparent flags turned to 00."""

    def flip(e):
        if isinstance(e, ev.New) and e.traceparent:
            return e._replace(traceparent=e.traceparent[:-2] + "00")
        return e

    return [
        ev.Facts(e.t, tuple(map(flip, e.facts))) if isinstance(e, ev.Facts) else e for e in events
    ]


def push_decode_events() -> list[tuple]:
    return [
        ev.Facts(
            1005 * MS,
            (
                new_event(D_ID, 1000 * MS, D_PARENT),
                ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"),
            ),
        ),
        ev.Handshake(1006 * MS, 1030 * MS, "prefill-engine-001", None),
        ev.SendNotif(1031 * MS, "agent-p", reg_msg(D_ID)),
        ev.Notifs(1320 * MS, {"agent-p": [f"{D_ID}:1".encode()]}),
        ev.Results(1330 * MS, (), (D_ID,), ()),
    ]


def pull_decode_events() -> list[tuple]:
    return [
        ev.Facts(
            1005 * MS,
            (
                new_event(D_ID, 1000 * MS, D_PARENT),
                ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"),
            ),
        ),
        ev.LoadStart(1010 * MS, D_ID, "prefill-engine-001", P_ID, 10),
        ev.Handshake(1011 * MS, 1050 * MS, "prefill-engine-001", None),
        ev.Prep(1060 * MS, 1061 * MS, "READ", f"{P_ID}:1".encode(), 5, 40),
        ev.Post(1061 * MS, 1062 * MS, 5, "PROC"),
        ev.State(1080 * MS, 5, "DONE"),
        ev.Telemetry(1080 * MS, 5, FakeTelemetry()),
    ]


def pull_prefill_events() -> list[tuple]:
    return [
        ev.Facts(1005 * MS, (new_event(P_ID, 1000 * MS, P_PARENT),)),
        ev.Notifs(1400 * MS, {"agent-d": [f"{P_ID}:1".encode()]}),
        ev.Results(1405 * MS, (P_ID,), (), ()),
    ]


WORKER_STREAMS = {
    ("push", "prefill"): lambda: push_prefill_worker_events(reg_first=False),
    ("push", "decode"): push_decode_events,
    ("pull", "decode"): pull_decode_events,
    ("pull", "prefill"): pull_prefill_events,
}


@pytest.mark.parametrize(("mode", "role"), sorted(WORKER_STREAMS))
def test_unsampled_worker_exports_nothing_and_observes_what_a_sampled_one_does(mode, role):
    """The metrics are for every request: the observations of an unsampled request are
    exactly those the same request's spans give when it is sampled."""
    events = WORKER_STREAMS[(mode, role)]()
    b_on, exp_on, obs_on = make(mode, role, "worker")
    b_on.feed(events)
    b_off, exp_off, obs_off = make(mode, role, "worker")
    b_off.feed(unsampled(events))
    assert exp_on.get_finished_spans()  # the sampled run built its spans
    assert exp_off.get_finished_spans() == ()
    assert (b_off.spans_built, b_off.unsampled, b_on.unsampled) == (0, 1, 0)
    seen_on, _ = obs_on.take()
    seen_off, _ = obs_off.take()
    assert any(item[0] == PHASE for item in seen_on)
    assert seen_off == seen_on
    b_off.sweep(now_ns=2000 * MS + int(500e9))  # lingered out, nothing emitted late
    assert exp_off.get_finished_spans() == () and b_off.open_requests == 0


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_unsampled_scheduler_request_gets_no_engine_span(role):
    req_id = P_ID if role == "prefill" else D_ID
    b, exp, obs = make("push", role, "scheduler")
    b.feed(
        [
            ev.New(1000 * MS, req_id, 1.0, 1201, UNSAMPLED_TP, 0),
            ev.Scheduled(1002 * MS, req_id),
            ev.Finished(1300 * MS, req_id, "FINISHED_LENGTH_CAPPED", 10),
        ]
    )
    b.sweep(now_ns=1300 * MS + int(200e9))  # past stale_after: would close anything open
    assert exp.get_finished_spans() == ()
    assert b.unsampled == 1 and b.orphans == 0
    assert obs.take() == ([], 0)
    assert b.tracker.reqs[BASE].done  # dropped when its context arrived, kept to absorb


def test_late_events_of_an_unsampled_request_build_nothing():
    b, exp, _ = make("pull", "prefill", "worker")
    b.feed(unsampled(pull_prefill_events()))
    b.feed([ev.Results(1500 * MS, (P_ID,), (), ())])
    b.feed([ev.Notifs(1600 * MS, {"agent-d": [f"{P_ID}:1".encode()]})])
    b.sweep(now_ns=1600 * MS + int(500e9))
    assert exp.get_finished_spans() == ()
    assert b.unsampled == 1 and b.orphans == 0 and b.open_requests == 0


def test_a_failed_unsampled_transfer_still_counts_a_failure():
    b, exp, obs = make("pull", "decode", "worker")
    events = [*pull_decode_events()[:-2], ev.State(1080 * MS, 5, "ERR")]
    b.feed(unsampled(events))
    b.sweep(now_ns=1080 * MS + int(2e9))
    assert exp.get_finished_spans() == ()
    items, _ = obs.take()
    assert (1, semconv.ERR_TRANSFER) in items  # observations.FAILURE


@pytest.mark.parametrize(
    ("traceparent", "expected"),
    [
        (format_traceparent(TRACE, P_PARENT), True),
        (format_traceparent(TRACE, P_PARENT, sampled=False), False),
        (f"00-{TRACE:032x}-{P_PARENT:016x}-02", False),  # W3C level 2: random flag only
        (f"00-{TRACE:032x}-{P_PARENT:016x}-03", True),
        (f"00-{TRACE:032X}-{P_PARENT:016X}-0A", False),
        (None, True),  # no context (bypassed the proxy): traced, as always
        ("garbage", True),
        (1234, True),
    ],
)
def test_the_flag_test_the_hook_and_builder_share(traceparent, expected):
    assert sampled(traceparent) is expected


# ------------------------------------------------------------ vLLM's real classes
@pytest.fixture
def dep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from vllm_workers import deployment

    with deployment(monkeypatch, tmp_path) as d:
        yield d


def test_real_connectors_build_no_span_for_an_unsampled_request_but_observe_it(dep) -> None:
    """Our connector on vLLM's scheduler and real push workers (only NIXL faked): a
    request with flags 00 moves its KV as usual; the scheduler does not watch for its
    first schedule, no process writes a span for it, and P's WRITE and D's notification
    counting still reach `get_kv_connector_stats` (the engine's /metrics)."""
    from test_span_builder_tp import decode, first_token, prefill, steps_until_received
    from vllm_workers import until

    from tracedpush.analysis import TraceStore
    from tracedpush.connector.metrics import PHASE_NAMES

    traceparent = "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    p = dep.engine("prefill", "p1", tp=1)
    d = dep.engine("decode", "d1", tp=1)
    phases: dict[str, list[str]] = {"prefill": [], "decode": []}
    for engine in (p, d):
        (worker,) = engine.workers
        drain = worker.get_kv_connector_stats

        def keep(drain=drain, seen=phases[engine.role]):
            stats = drain()
            if stats is not None:
                seen.extend(stats.data.get(PHASE_NAMES, ()))
            return stats

        worker.get_kv_connector_stats = keep  # what vLLM's model runner calls each step
    kinds: dict[str, list[int]] = {"prefill": [], "decode": []}
    for engine in (p, d):
        record = engine.scheduler._tp_record  # the hooks look it up at each call

        def spy(event, record=record, seen=kinds[engine.role]):
            seen.append(event[0])
            record(event)

        engine.scheduler._tp_record = spy
    prefill(p, traceparent)
    req = decode(d, p, traceparent)
    steps_until_received(p, d)
    first_token(d, req)

    def observed() -> bool:
        p.idle_step()
        d.idle_step()
        return "WRITE" in phases["prefill"] and "notification counting" in phases["decode"]

    until(observed, "P's WRITE and D's notification counting in the stats")
    dep.shutdown()  # flushes every builder and exporter
    stats = [c.tracedpush_stats for e in (p, d) for c in (e.scheduler, *e.workers)]

    for role, seen in kinds.items():  # the scheduler recorded the request, not its schedule
        assert ev.NEW in seen and ev.SCHEDULED not in seen, role
    assert all(s is not None and s["unsampled_requests"] == 1 for s in stats), stats
    spans = list(TraceStore.from_path(dep.traces_dir).all_spans())
    assert spans and {s.name for s in spans} <= set(semconv.PROCESS_SPANS)  # steps, export
    assert not any(s.attributes.get(semconv.REQUEST_ID) == "req-7" for s in spans)
