"""The event -> span builder, driven by event streams shaped like a real engine's.

No vLLM here: the events are what the connector hooks and the NIXL tap record (their
shapes are checked against real engines in tests/e2e/test_connector_traces.py). Spans
go to OpenTelemetry's in-memory exporter.
"""

from __future__ import annotations

import msgspec
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tracedpush import semconv
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.builder import BuilderConfig, SpanBuilder
from tracedpush.telemetry.context import format_traceparent, span_id_for, trace_id_for

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
P_PARENT = 0xB7AD6B7169203331
D_PARENT = 0xC7AD6B7169203332
P_ID = "cmpl-req-1-0-8b86e050"
D_ID = "cmpl-req-1-0-a38b6b14"
BASE = "req-1"  # the X-Request-Id behind cmpl-req-1-0-<8 hex>
MS = 1_000_000


class FakeTelemetry:
    totalBytes = 1_228_800
    descCount = 40
    postDuration = 120.0
    xferDuration = 900.0


def make(mode: str, role: str, side: str) -> tuple[SpanBuilder, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    builder = SpanBuilder(
        BuilderConfig(mode=mode, role=role, side=side, engine_id=f"{role}-engine-001"),
        Resource.create({"service.name": f"vllm-{role}"}),
        exporter.export,
    )
    return builder, exporter


def by_name(exporter: InMemorySpanExporter) -> dict:
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert len(names) == len(set(names)), f"duplicate spans: {names}"
    return {s.name: s for s in spans}


def reg_msg(d_req_id: str) -> bytes:
    return ev.PUSH_REG_PREFIX + msgspec.msgpack.encode(
        {
            "request_id": d_req_id,
            "decode_engine_id": "decode-engine-001",
            "remote_engine_id": "prefill-engine-001",
        }
    )


def new_event(req_id: str, t: int, parent: int | None) -> tuple:
    tp = format_traceparent(TRACE, parent) if parent else None
    return ev.New(t, req_id, t / 1e9, 1201, tp, 0)


def test_scheduler_prefill_span_continues_the_proxy_trace():
    b, exp = make("push", "prefill", "scheduler")
    b.feed([new_event(P_ID, 1000 * MS, P_PARENT), ev.Scheduled(1002 * MS, P_ID)])
    assert exp.get_finished_spans() == ()  # not finished yet
    b.feed([ev.Finished(1300 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 10)])
    span = by_name(exp)[semconv.SPAN_PREFILL]
    assert span.context.trace_id == TRACE
    assert span.parent.span_id == P_PARENT
    assert span.context.span_id == span_id_for(TRACE, "prefill", BASE)
    assert (span.start_time, span.end_time) == (1000 * MS, 1300 * MS)
    assert span.attributes[semconv.REQUEST_ID] == BASE
    assert span.attributes[semconv.LOCAL_REQUEST_ID] == P_ID
    assert span.attributes[semconv.PROMPT_TOKENS] == 1201
    assert [e.name for e in span.events] == ["scheduler_received", "compute_started"]
    assert span.status.status_code is StatusCode.UNSET


def test_scheduler_decode_span_ends_at_first_schedule_after_kv_arrives():
    b, exp = make("pull", "decode", "scheduler")
    b.feed(
        [
            new_event(D_ID, 1000 * MS, D_PARENT),
            ev.Alloc(1001 * MS, D_ID, 10, 1201, "prefill-engine-001"),
            ev.RecvDone(1100 * MS, (D_ID,)),
            ev.Scheduled(1105 * MS, D_ID),
        ]
    )
    span = by_name(exp)[semconv.SPAN_DECODE]
    assert span.end_time == 1105 * MS
    assert span.attributes[semconv.DECODE_END] == "first_token_scheduled"
    assert [e.name for e in span.events] == [
        "scheduler_received",
        "blocks_allocated",
        "kv_received",
    ]


def test_no_traceparent_falls_back_to_an_id_derived_from_the_base_request_id():
    b, exp = make("push", "prefill", "scheduler")
    b.feed([new_event(P_ID, 1000 * MS, None), ev.Finished(1100 * MS, P_ID, "FINISHED_STOPPED", 1)])
    span = by_name(exp)[semconv.SPAN_PREFILL]
    assert span.context.trace_id == trace_id_for(BASE)
    assert span.parent is None


def test_aborted_decode_is_an_error():
    b, exp = make("push", "decode", "scheduler")
    b.feed(
        [
            new_event(D_ID, 1000 * MS, D_PARENT),
            ev.Finished(1010 * MS, D_ID, "FINISHED_ABORTED", 0),
        ]
    )
    span = by_name(exp)[semconv.SPAN_DECODE]
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[semconv.ERROR_TYPE] == semconv.ERR_UPSTREAM


def push_prefill_worker_events(reg_first: bool) -> list[tuple]:
    facts = (new_event(P_ID, 1000 * MS, P_PARENT),)
    finished = ev.Facts(
        1250 * MS,
        (ev.Finished(1200 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 10),),
    )
    reg = ev.Notifs((1100 if reg_first else 1260) * MS, {"agent-d": [reg_msg(D_ID)]})
    start = 1265 * MS if not reg_first else 1255 * MS
    return [
        ev.Facts(1001 * MS, facts),
        *((reg, finished) if reg_first else (finished, reg)),
        ev.PushStart(start, P_ID, D_ID, "decode-engine-001", 10),
        ev.Handshake(start + 1 * MS, start + 40 * MS, "decode-engine-001", None),
        ev.PushStart(start + 41 * MS, P_ID, D_ID, "decode-engine-001", 10),
        ev.Prep(start + 41 * MS, start + 42 * MS, "WRITE", f"{D_ID}:1".encode(), 77, 40),
        ev.Post(start + 42 * MS, start + 43 * MS, 77, "PROC"),
        ev.State(start + 50 * MS, 77, "DONE"),
        ev.Telemetry(start + 50 * MS, 77, FakeTelemetry()),
    ]


@pytest.mark.parametrize("reg_first", [True, False])
def test_push_prefill_worker_spans(reg_first):
    b, exp = make("push", "prefill", "worker")
    b.feed(push_prefill_worker_events(reg_first))
    spans = by_name(exp)
    assert set(spans) == {
        semconv.SPAN_KV_RENDEZVOUS,
        semconv.SPAN_KV_HANDSHAKE,
        semconv.SPAN_KV_DESC_PREP,
        semconv.SPAN_KV_WRITE,
    }
    rdv = spans[semconv.SPAN_KV_RENDEZVOUS]
    assert rdv.attributes[semconv.RENDEZVOUS_FIRST] == ("registration" if reg_first else "prefill")
    assert rdv.start_time == (1100 if reg_first else 1200) * MS
    assert rdv.end_time <= spans[semconv.SPAN_KV_DESC_PREP].start_time
    assert spans[semconv.SPAN_KV_HANDSHAKE].end_time <= spans[semconv.SPAN_KV_DESC_PREP].start_time
    write = spans[semconv.SPAN_KV_WRITE]
    assert write.attributes[semconv.KV_BYTES] == FakeTelemetry.totalBytes
    assert write.attributes[semconv.KV_DESCRIPTORS] == FakeTelemetry.descCount
    assert write.attributes[semconv.NIXL_XFER_US] == FakeTelemetry.xferDuration
    # observed 8 ms from post to DONE, NIXL says 0.9 ms: 7.1 ms of polling lag
    assert write.attributes[semconv.POLL_LAG_US] == pytest.approx(8000 - 900)
    engine_span = span_id_for(TRACE, "prefill", BASE)
    assert all(
        s.parent.span_id == engine_span and s.context.trace_id == TRACE for s in spans.values()
    )


def test_worker_waits_for_the_scheduler_context_before_emitting():
    """The registration can reach P's worker before P's scheduler shipped the request."""
    b, exp = make("push", "prefill", "worker")
    events = push_prefill_worker_events(reg_first=True)
    facts, rest = events[0], events[1:]
    b.feed(rest)
    assert exp.get_finished_spans() == ()
    b.feed([facts])
    assert {s.context.trace_id for s in exp.get_finished_spans()} == {TRACE}
    assert len(exp.get_finished_spans()) == 4


def test_push_decode_worker_register_and_notify():
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            ev.Facts(
                1005 * MS,
                (
                    new_event(D_ID, 1000 * MS, D_PARENT),
                    ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"),
                ),
            ),
            ev.Handshake(1006 * MS, 1030 * MS, "prefill-engine-001", None),
            ev.SendNotif(1031 * MS, "agent-p", reg_msg(D_ID)),
            ev.Notifs(1320 * MS, {"agent-p": [b"HB:x", f"{D_ID}:1".encode()]}),
            ev.Results(1330 * MS, (), (D_ID,), ()),
        ]
    )
    spans = by_name(exp)
    reg = spans[semconv.SPAN_KV_REGISTER]
    assert (reg.start_time, reg.end_time) == (1003 * MS, 1031 * MS)
    assert [e.name for e in reg.events] == ["handshake"]
    notify = spans[semconv.SPAN_KV_NOTIFY]
    assert (notify.start_time, notify.end_time) == (1320 * MS, 1330 * MS)
    assert notify.attributes[semconv.NOTIFY_EXPECTED] == 1
    assert notify.attributes[semconv.NOTIFY_RECEIVED] == 1
    assert notify.parent.span_id == span_id_for(TRACE, "decode", BASE)


def test_pull_decode_worker_handshake_prep_read():
    b, exp = make("pull", "decode", "worker")
    b.feed(
        [
            ev.Facts(1005 * MS, (new_event(D_ID, 1000 * MS, D_PARENT),)),
            ev.LoadStart(1010 * MS, D_ID, "prefill-engine-001", P_ID, 10),
            ev.Handshake(1011 * MS, 1050 * MS, "prefill-engine-001", None),
            ev.Prep(1060 * MS, 1061 * MS, "READ", f"{P_ID}:1".encode(), 5, 40),
            ev.Post(1061 * MS, 1062 * MS, 5, "PROC"),
            ev.State(1080 * MS, 5, "DONE"),
            ev.Telemetry(1080 * MS, 5, FakeTelemetry()),
        ]
    )
    spans = by_name(exp)
    assert set(spans) == {
        semconv.SPAN_KV_HANDSHAKE,
        semconv.SPAN_KV_DESC_PREP,
        semconv.SPAN_KV_READ,
    }
    assert spans[semconv.SPAN_KV_HANDSHAKE].start_time == 1011 * MS
    prep = spans[semconv.SPAN_KV_DESC_PREP]
    assert (prep.start_time, prep.end_time) == (1050 * MS, 1061 * MS)
    assert spans[semconv.SPAN_KV_READ].start_time == 1061 * MS


def test_pull_prefill_worker_notify():
    b, exp = make("pull", "prefill", "worker")
    b.feed(
        [
            ev.Facts(1005 * MS, (new_event(P_ID, 1000 * MS, P_PARENT),)),
            ev.Notifs(1400 * MS, {"agent-d": [f"{P_ID}:1".encode()]}),
            ev.Results(1405 * MS, (P_ID,), (), ()),
        ]
    )
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert (notify.start_time, notify.end_time) == (1400 * MS, 1405 * MS)
    assert notify.status.status_code is StatusCode.UNSET


def test_failed_transfer_is_an_error_span():
    b, exp = make("pull", "decode", "worker")
    b.feed(
        [
            ev.Facts(1005 * MS, (new_event(D_ID, 1000 * MS, D_PARENT),)),
            ev.LoadStart(1010 * MS, D_ID, "prefill-engine-001", P_ID, 10),
            ev.Prep(1011 * MS, 1012 * MS, "READ", f"{P_ID}:1".encode(), 5, 40),
            ev.Post(1012 * MS, 1013 * MS, 5, "PROC"),
            ev.State(1020 * MS, 5, "ERR"),
            ev.Results(1021 * MS, (), (D_ID,), (D_ID,)),
        ]
    )
    read = by_name(exp)[semconv.SPAN_KV_READ]
    assert read.status.status_code is StatusCode.ERROR
    assert read.attributes[semconv.ERROR_TYPE] == semconv.ERR_TRANSFER


def test_handshake_failure_fails_the_registration():
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            ev.Facts(
                1005 * MS,
                (
                    new_event(D_ID, 1000 * MS, D_PARENT),
                    ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"),
                ),
            ),
            ev.Handshake(1006 * MS, 1030 * MS, "prefill-engine-001", "TimeoutError()"),
        ]
    )
    b.sweep(now_ns=1030 * MS + int(200e9))
    spans = by_name(exp)
    reg = spans[semconv.SPAN_KV_REGISTER]
    assert reg.status.status_code is StatusCode.ERROR
    assert reg.attributes[semconv.ERROR_TYPE] == semconv.ERR_HANDSHAKE
    notify = spans[semconv.SPAN_KV_NOTIFY]
    assert notify.attributes[semconv.ERROR_TYPE] == semconv.ERR_NOTIFY_TIMEOUT
    assert notify.attributes[semconv.NOTIFY_RECEIVED] == 0


def _decode_registered() -> list[tuple]:
    """D's worker: blocks allocated at 1.003 s, the registration sent to P at 1.031 s."""
    return [
        ev.Facts(
            1005 * MS,
            (
                new_event(D_ID, 1000 * MS, D_PARENT),
                ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"),
            ),
        ),
        ev.SendNotif(1031 * MS, "agent-p", reg_msg(D_ID)),
    ]


def test_missing_notifications_time_out_as_errors():
    b, exp = make("push", "decode", "worker")
    b.feed(_decode_registered())
    assert [s.name for s in exp.get_finished_spans()] == [semconv.SPAN_KV_REGISTER]
    b.sweep(now_ns=1031 * MS + int(60e9))  # not stale yet
    assert len(exp.get_finished_spans()) == 1
    b.sweep(now_ns=1031 * MS + int(121e9))
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert notify.status.status_code is StatusCode.ERROR
    assert "no completion notification" in notify.status.description


def test_a_decode_request_aborted_while_waiting_closes_its_notify_at_once():
    """D's scheduler ended it (the client left while D waited for P's WRITE): the worker
    learns that through the step metadata and closes kv.notify a second later, not at
    the stale limit, when a stop soon after would have lost it. A late notification
    then makes no second span."""
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            *_decode_registered(),
            ev.Facts(9000 * MS, (ev.Finished(8999 * MS, D_ID, "FINISHED_ABORTED", 10),)),
        ]
    )
    b.sweep(now_ns=9000 * MS + int(0.5e9))  # a late notification may still come
    assert [s.name for s in exp.get_finished_spans()] == [semconv.SPAN_KV_REGISTER]
    b.sweep(now_ns=9000 * MS + int(1.5e9))
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert (notify.start_time, notify.end_time) == (1031 * MS, 9000 * MS)
    assert notify.attributes[semconv.ERROR_TYPE] == semconv.ERR_NOTIFY_TIMEOUT
    assert notify.status.description == (
        "no completion notification arrived before the request ended (FINISHED_ABORTED) "
        "(none from agent agent-p)"
    )
    b.feed([ev.Notifs(9600 * MS, {"agent-p": [f"{D_ID}:1".encode()]})])
    b.sweep(now_ns=9600 * MS + int(200e9))
    assert len(exp.get_finished_spans()) == 2 and b.orphans == 0


def _new_then_finished(req_id: str, parent: int, t: int, status: str, n_blocks: int) -> tuple:
    """The step metadata of a request the scheduler saw arrive at 1 s and ended at `t`."""
    return ev.Facts(
        t, (new_event(req_id, 1000 * MS, parent), ev.Finished(t - MS, req_id, status, n_blocks))
    )


def test_a_decode_request_aborted_before_it_had_blocks_gets_no_kv_spans():
    """Aborted in D's queue: nothing was registered, so no kv.notify says a notification
    is missing (the engine's `decode` span says it was aborted)."""
    b, exp = make("push", "decode", "worker")
    b.feed([_new_then_finished(D_ID, D_PARENT, 9000 * MS, "FINISHED_ABORTED", 0)])
    b.sweep(now_ns=9000 * MS + int(2e9))
    b.flush_all()
    assert exp.get_finished_spans() == ()


def test_a_prefill_request_the_scheduler_finished_keeps_waiting_for_its_registration():
    """On P the scheduler's end is where the push starts, not where it ends."""
    b, exp = make("push", "prefill", "worker")
    b.feed([_new_then_finished(P_ID, P_PARENT, 1300 * MS, "FINISHED_LENGTH_CAPPED", 10)])
    b.sweep(now_ns=1300 * MS + int(10e9))
    assert exp.get_finished_spans() == ()


def test_registration_that_never_arrives_is_a_rendezvous_error():
    b, exp = make("push", "prefill", "worker")
    b.feed(
        [
            ev.Facts(1001 * MS, (new_event(P_ID, 1000 * MS, P_PARENT),)),
            ev.Facts(
                1250 * MS,
                (ev.Finished(1200 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 10),),
            ),
            ev.Results(9000 * MS, (P_ID,), (), ()),  # lease expired: blocks released unsent
        ]
    )
    rdv = by_name(exp)[semconv.SPAN_KV_RENDEZVOUS]
    assert rdv.status.status_code is StatusCode.ERROR
    assert rdv.attributes[semconv.ERROR_TYPE] == semconv.ERR_LEASE_EXPIRED


def test_late_events_after_completion_create_no_extra_spans():
    b, exp = make("pull", "prefill", "worker")
    b.feed(
        [
            ev.Facts(1005 * MS, (new_event(P_ID, 1000 * MS, P_PARENT),)),
            ev.Notifs(1400 * MS, {"agent-d": [f"{P_ID}:1".encode()]}),
            ev.Results(1405 * MS, (P_ID,), (), ()),
        ]
    )
    b.feed([ev.Results(1500 * MS, (P_ID,), (), ())])
    b.sweep(now_ns=1500 * MS + int(500e9))
    assert len(exp.get_finished_spans()) == 1
    assert b.open_requests == 0


@pytest.mark.parametrize(
    ("engine_id", "key"),
    [
        ("cmpl-req-1-0-8b86e050", "req-1"),
        ("chatcmpl-req-1-a38b6b14", "req-1"),
        ("cmpl-tp-ab12-0007-3-0123abcd", "tp-ab12-0007"),  # choice 3 of request tp-ab12-0007
        ("my-own-id-0123abcd", "my-own-id"),
        ("plain", "plain"),
    ],
)
def test_request_key_recovers_the_client_request_id(engine_id, key):
    from tracedpush.telemetry.context import request_key

    assert request_key(engine_id) == key


def test_stray_events_for_an_unknown_request_start_no_partial_trace():
    """A notification arriving long after its request ended must not open a new trace."""
    b, exp = make("pull", "prefill", "worker")
    b.feed([ev.Notifs(1400 * MS, {"agent-d": [f"{P_ID}:1".encode()]})])
    b.sweep(now_ns=1400 * MS + int(500e9))
    assert exp.get_finished_spans() == ()
    assert b.orphans == 1 and b.open_requests == 0


def _decode_registered_with_two_prefill_ranks() -> list[tuple]:
    """D (TP 1) handshook with P's two ranks, then registered its blocks with each. As in
    an engine, vLLM holds the agent names NIXL's add_remote_agent gave it (bytes), while
    get_new_notifs keys notifications by str."""
    return [
        ev.Facts(
            1005 * MS,
            (
                new_event(D_ID, 1000 * MS, D_PARENT),
                ev.Alloc(1003 * MS, D_ID, 10, 1201, "prefill-engine-001"),
            ),
        ),
        ev.Handshake(
            1006 * MS,
            1030 * MS,
            "prefill-engine-001",
            None,
            {(0, 0): b"agent-p0", (0, 1): b"agent-p1"},
        ),
        ev.SendNotif(1031 * MS, b"agent-p0", reg_msg(D_ID)),
        ev.SendNotif(1031 * MS, b"agent-p1", reg_msg(D_ID)),
    ]


def test_notify_lists_the_prefill_ranks_in_arrival_order():
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            *_decode_registered_with_two_prefill_ranks(),
            ev.Notifs(1300 * MS, {"agent-p1": [f"{D_ID}:2".encode()]}),
            ev.Notifs(1310 * MS, {"agent-p0": [f"{D_ID}:2".encode()], "agent-x": [b"HB:y"]}),
            ev.Results(1320 * MS, (), (D_ID,), ()),
        ]
    )
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert notify.status.status_code is StatusCode.UNSET
    assert notify.attributes[semconv.NOTIFY_EXPECTED] == 2
    assert notify.attributes[semconv.NOTIFY_RECEIVED] == 2
    assert list(notify.attributes[semconv.NOTIFY_RANKS]) == [1, 0]
    assert (notify.start_time, notify.end_time) == (1300 * MS, 1320 * MS)


def test_a_rank_that_never_notifies_is_named_in_the_error():
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            *_decode_registered_with_two_prefill_ranks(),
            ev.Notifs(1300 * MS, {"agent-p1": [f"{D_ID}:2".encode()]}),
        ]
    )
    b.sweep(now_ns=1300 * MS + int(121e9))
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert notify.status.status_code is StatusCode.ERROR
    assert notify.attributes[semconv.ERROR_TYPE] == semconv.ERR_NOTIFY_TIMEOUT
    assert notify.status.description == (
        "1 of 2 completion notifications arrived; none from rank 0 of prefill-engine-001"
    )
    assert list(notify.attributes[semconv.NOTIFY_RANKS]) == [1]


def test_no_notification_at_all_names_every_rank_waited_for():
    b, exp = make("push", "decode", "worker")
    b.feed(_decode_registered_with_two_prefill_ranks())
    b.sweep(now_ns=1031 * MS + int(121e9))
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert notify.status.description == (
        "no completion notification arrived (none from rank 0 of prefill-engine-001, "
        "rank 1 of prefill-engine-001)"
    )
    assert notify.attributes[semconv.NOTIFY_EXPECTED] == 1  # P's TP is in the notification
    assert list(notify.attributes[semconv.NOTIFY_RANKS]) == []


def test_a_sender_no_handshake_named_is_rank_minus_one():
    """A later handshake replaces an engine's agents (P restarted): the old name is
    forgotten, so its notification has rank -1."""
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            *_decode_registered_with_two_prefill_ranks(),
            ev.Handshake(1032 * MS, 1040 * MS, "prefill-engine-001", None, {(0, 0): b"agent-q0"}),
            ev.Notifs(1300 * MS, {"agent-p1": [f"{D_ID}:2".encode()]}),
            ev.Notifs(1301 * MS, {"agent-q0": [f"{D_ID}:2".encode()]}),
            ev.Results(1320 * MS, (), (D_ID,), ()),
        ]
    )
    notify = by_name(exp)[semconv.SPAN_KV_NOTIFY]
    assert list(notify.attributes[semconv.NOTIFY_RANKS]) == [-1, 0]
