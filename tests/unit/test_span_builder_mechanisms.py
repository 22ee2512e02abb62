"""The events that name each mechanism: HTTP receipt, steps, writer hand-off, threads.

Events are fed as the connector hooks record them (their shapes are checked against
real engines in tests/e2e); spans go to OpenTelemetry's in-memory exporter.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_span_builder import BASE, D_ID, MS, P_ID, P_PARENT, TRACE, by_name, make, reg_msg

from tracedpush import semconv
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.context import format_traceparent


def _process_spans(exp: InMemorySpanExporter, name: str) -> list:
    return [s for s in exp.get_finished_spans() if s.name == name]


def test_prefill_span_starts_at_http_receipt_and_counts_its_steps():
    b, exp = make("push", "prefill", "scheduler")
    tp = format_traceparent(TRACE, P_PARENT)
    b.feed(
        [
            ev.New(1010 * MS, P_ID, 1005 * MS / 1e9, 1201, tp, 1000 * MS),
            ev.Scheduled(1020 * MS, P_ID),
            ev.SchedStep(1020 * MS, 1, {P_ID: 512, "other": 1}),
            ev.SchedStep(1100 * MS, 2, {P_ID: 512}),
            ev.SchedStep(1180 * MS, 3, {P_ID: 177, "other": 1}),
            ev.Finished(1250 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 10),
            ev.SchedStep(1260 * MS, 4, {"other": 1}),  # after finish: not counted
        ]
    )
    span = by_name(exp)[semconv.SPAN_PREFILL]
    assert span.start_time == 1000 * MS  # http_received, before vLLM's arrival_time
    events = {e.name: e.timestamp for e in span.events}
    assert events[semconv.EVENT_VLLM_ARRIVAL] == pytest.approx(1005 * MS, abs=1000)  # float s
    assert events == {
        semconv.EVENT_HTTP_RECEIVED: 1000 * MS,
        semconv.EVENT_VLLM_ARRIVAL: events[semconv.EVENT_VLLM_ARRIVAL],
        semconv.EVENT_SCHEDULER_RECEIVED: 1010 * MS,
        semconv.EVENT_COMPUTE_STARTED: 1020 * MS,
    }
    assert span.attributes[semconv.PREFILL_STEPS] == 3


def test_prefill_span_carries_when_the_engine_core_had_it():
    """core_received (the EngineCore's input thread, `connector/core_input.py`) is an
    event when it lies between vLLM's arrival and the scheduler's; else it is dropped."""
    tp = format_traceparent(TRACE, P_PARENT)
    for core_ns, kept in ((1007 * MS, True), (1004 * MS, False), (1012 * MS, False), (0, False)):
        b, exp = make("push", "prefill", "scheduler")
        b.feed(
            [
                ev.New(1010 * MS, P_ID, 1.005, 1201, tp, 1000 * MS, core_ns),
                ev.Scheduled(1020 * MS, P_ID),
                ev.Finished(1050 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 1),
            ]
        )
        events = {e.name: e.timestamp for e in by_name(exp)[semconv.SPAN_PREFILL].events}
        assert events.get(semconv.EVENT_CORE_RECEIVED) == (core_ns if kept else None), core_ns


def test_without_the_middleware_the_span_starts_at_arrival():
    b, exp = make("pull", "prefill", "scheduler")
    b.feed(
        [
            ev.New(1010 * MS, P_ID, 1.005, 10, None, 0),
            ev.Finished(1050 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 1),
        ]
    )
    span = by_name(exp)[semconv.SPAN_PREFILL]
    assert abs(span.start_time - 1005 * MS) < 1000  # arrival_time is a float in seconds
    names = [e.name for e in span.events]  # vLLM's arrival is the start: no event for it
    assert semconv.EVENT_HTTP_RECEIVED not in names and semconv.EVENT_VLLM_ARRIVAL not in names


def test_rendezvous_carries_the_hand_off_to_the_writer():
    b, exp = make("push", "prefill", "worker")
    new = ev.New(1000 * MS, P_ID, 1.0, 1201, format_traceparent(TRACE, P_PARENT), 0)
    b.feed(
        [
            ev.Facts(1001 * MS, (new,)),
            ev.Notifs(1100 * MS, {"agent-d": [reg_msg(D_ID)]}),  # registration first
            ev.Facts(1300 * MS, (ev.Finished(1200 * MS, P_ID, "FINISHED_LENGTH_CAPPED", 10),)),
            ev.Handoff(1290 * MS, (P_ID,)),  # after the next step's forward
            ev.PushStart(1295 * MS, P_ID, D_ID, "decode-engine-001", 10),
        ]
    )
    rdv = by_name(exp)[semconv.SPAN_KV_RENDEZVOUS]
    events = {e.name: e.timestamp for e in rdv.events}
    assert events[semconv.EVENT_HANDED_TO_WRITER] == 1290 * MS
    assert events[semconv.EVENT_PREFILL_FINISHED] == 1200 * MS
    assert (rdv.start_time, rdv.end_time) == (1100 * MS, 1295 * MS)
    assert rdv.attributes[semconv.REQUEST_ID] == BASE


def test_worker_steps_become_one_engine_steps_span_per_sweep():
    b, exp = make("push", "decode", "worker")
    b.feed(
        [
            ev.WorkerStep(1000 * MS, 1012 * MS, 7, 3000, 20_000, 1000, 50_000, 4000, 1, 0),
            ev.WorkerStep(1013 * MS, 1020 * MS, 8, 2000, 0, 1000, 9000, 1000, 0, 1),
        ]
    )
    assert _process_spans(exp, semconv.SPAN_ENGINE_STEPS) == []  # batched until the sweep
    b.sweep(now_ns=1021 * MS)
    (span,) = _process_spans(exp, semconv.SPAN_ENGINE_STEPS)
    a = span.attributes
    assert list(a[semconv.STEP_SEQ]) == [7, 8]
    assert list(a[semconv.STEP_DURATION_US]) == [12_000, 7_000]
    assert list(a[semconv.STEP_CONNECTOR_US]) == [78, 13]
    assert list(a[semconv.STEP_RESULTS_US]) == [50, 9]
    assert list(a[semconv.STEP_LOADS_STARTED]) == [1, 0]
    assert list(a[semconv.STEP_LOADS_FINISHED]) == [0, 1]
    assert a[semconv.SIDE] == "worker" and a[semconv.ENGINE_ID] == "decode-engine-001"
    assert span.parent is None  # its own per-process trace, not a request's
    assert (span.start_time, span.end_time) == (1000 * MS, 1020 * MS)


def test_scheduler_steps_record_batch_composition():
    b, exp = make("pull", "decode", "scheduler")
    b.feed(
        [
            ev.SchedStep(1000 * MS, 1, {"a": 1, "b": 1, "c": 300}),
            ev.SchedStep(1010 * MS, 2, {"a": 1}),
        ]
    )
    b.sweep(now_ns=1011 * MS)
    (span,) = _process_spans(exp, semconv.SPAN_ENGINE_STEPS)
    a = span.attributes
    assert list(a[semconv.STEP_PREFILL_TOKENS]) == [300, 0]
    assert list(a[semconv.STEP_DECODE_REQS]) == [2, 1]
    assert list(a[semconv.STEP_NUM_REQS]) == [3, 1]
    assert list(a[semconv.STEP_START_NS]) == [1000 * MS, 1010 * MS]


def test_thread_sample_reads_this_process_from_proc():
    """Real /proc of the test process: the scheduler side samples itself and its parent."""
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: stop.wait(5), name="tracedpush-test-spin")
    spinner.start()
    try:
        b, exp = make("push", "prefill", "scheduler")
        b.sample_threads()
        sum(i * i for i in range(2_000_000))  # the main thread uses CPU between samples
        b.sample_threads()
    finally:
        stop.set()
        spinner.join()
    first, second = _process_spans(exp, semconv.SPAN_ENGINE_THREADS)
    assert second.start_time == first.end_time  # consecutive sample windows
    a = first.attributes
    n = len(a[semconv.THREAD_TID])
    assert n == len(a[semconv.THREAD_CPU_MS]) == len(a[semconv.THREAD_ROLE])
    rows = list(
        zip(
            a[semconv.THREAD_PID],
            a[semconv.THREAD_TID],
            a[semconv.THREAD_PROCESS],
            a[semconv.THREAD_NAME],
            a[semconv.THREAD_ROLE],
            strict=True,
        )
    )
    me = os.getpid()
    assert (me, me, "engine_core", "MainThread", "engine_core") in rows
    assert (me, spinner.native_id, "engine_core", "tracedpush-test-spin", "tracedpush") in rows
    assert any(r[0] == os.getppid() and r[2] == "api_server" for r in rows)
    cores = set(a[semconv.THREAD_CORE])
    assert cores <= set(range(os.cpu_count() or 1))
    mine = a[semconv.THREAD_TID].index(me)
    assert a[semconv.THREAD_CPU_MS][mine] > 0  # pytest's main thread has used CPU
    if Path("/proc/self/schedstat").exists():  # each thread's wait for a CPU, as the kernel's
        waits = a[semconv.THREAD_CPU_WAIT_MS]
        assert len(waits) == n and all(w >= 0 for w in waits), waits
    assert a[semconv.THREAD_AFFINITY][mine]
    # the second sample lists only threads that used CPU since the first: not the
    # spinner, which only waited
    assert spinner.native_id not in list(second.attributes[semconv.THREAD_TID])
    assert len(second.attributes[semconv.THREAD_TID]) < n


def test_native_threads_found_at_start_keep_their_role():
    """NIXL's progress thread has no name the OS knows: the connector hands its id over."""
    from tracedpush.telemetry.threads import sample_process

    stop = threading.Event()
    other = threading.Thread(target=lambda: stop.wait(5))
    other.start()
    try:
        rows = sample_process(os.getpid(), "worker", None, {other.native_id: "nixl"})
    finally:
        stop.set()
        other.join()
    roles = {r.tid: r.role for r in rows}
    assert roles[other.native_id] == "nixl"
    assert roles[os.getpid()] == "model_runner"
