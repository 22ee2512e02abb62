"""Heterogeneous TP, push mode, on vLLM's real classes: spans from P TP 2 -> D TP 1 and
P TP 1 -> D TP 2.

Each engine is our connector on vLLM's scheduler plus one real `NixlPushConnectorWorker`
per TP rank, built by vLLM's own `__init__` and `register_kv_caches`, running its own
push-writer threads and its own handshakes over ZMQ; only the NIXL agent is faked
(tests/unit/vllm_workers.py). Tracing is on as in an engine: every rank's connector
records events through the hooks and the tap, its own builder thread turns them into
spans and writes them as OTLP JSON lines, and the analysis reads those files. `make
test` runs this file against vLLM 0.32 and `make test-vllm033` against 0.33.

A real P at TP 2 ran by hand on this machine too (its figures and how it first failed:
docs/connector.md, "Heterogeneous TP"); these tests keep it checked in every run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_workers import (
    D_RID,
    TRACEPARENT,
    Deployment,
    Engine,
    decode,
    deployment,
    first_token,
    prefill,
    report,
    steps_until_received,
    until,
)

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, phases
from tracedpush.analysis.model import STATUS_ERROR, Span

TRACE_ID = TRACEPARENT.split("-")[1]


def spans_in(traces: Path) -> list[Span]:
    """Every request span the engines' builders wrote, read back by the analysis' loader."""
    store = TraceStore.from_path(traces)
    return [s for s in store.all_spans() if s.trace_id == TRACE_ID]


def named(spans: list[Span], name: str, service: str) -> list[Span]:
    return sorted(
        (s for s in spans if s.name == name and s.service == service),
        key=lambda s: s.attributes[sc.TP_RANK],
    )


def d_received(d: Engine, n: int) -> bool:
    """D's rank 0 counted `n` WRITE notifications (vLLM's own counter)."""
    counts = d.workers[0].connector_worker.consumer_notification_counts_by_req
    return counts.get(D_RID, 0) >= n


@pytest.fixture
def dep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with deployment(monkeypatch, tmp_path) as d:
        yield d


def test_tp2_to_tp1_d_counts_a_notification_from_each_prefill_rank(dep: Deployment) -> None:
    """P's ranks finish out of order: rank 1's WRITE lands first, rank 0's last."""
    p = dep.engine("prefill", "p1", tp=2)
    d = dep.engine("decode", "d1", tp=1)
    rank0, rank1 = p.agents()
    dep.fabric.held.add(rank0)
    prefill(p)
    req = decode(d, p)

    def rank1_heard() -> bool:
        report(p, p.idle_step())
        d.idle_step()
        return d_received(d, 1)

    until(rank1_heard, "rank 1's notification")
    dep.fabric.held.discard(rank0)
    steps_until_received(p, d)
    first_token(d, req)
    assert sorted(w[0] for w in dep.fabric.writes) == sorted([rank0, rank1])  # a WRITE each
    dep.shutdown()

    spans = spans_in(dep.traces_dir)
    (notify,) = named(spans, sc.SPAN_KV_NOTIFY, sc.SERVICE_DECODE)
    assert notify.attributes[sc.NOTIFY_EXPECTED] == 2
    assert notify.attributes[sc.NOTIFY_RECEIVED] == 2
    assert notify.attributes[sc.NOTIFY_RANKS] == [1, 0]  # in arrival order
    assert notify.status_code != STATUS_ERROR
    assert [e.name for e in notify.events] == [sc.EVENT_NOTIFICATION] * 2
    writes = named(spans, sc.SPAN_KV_WRITE, sc.SERVICE_PREFILL)
    assert [w.attributes[sc.TP_RANK] for w in writes] == [0, 1]  # one kv.write per P rank
    assert all(w.status_code != STATUS_ERROR and w.attributes[sc.KV_BYTES] > 0 for w in writes)
    for name in (sc.SPAN_KV_RENDEZVOUS, sc.SPAN_KV_DESC_PREP, sc.SPAN_KV_HANDSHAKE):
        assert [s.attributes[sc.TP_RANK] for s in named(spans, name, sc.SERVICE_PREFILL)] == [0, 1]
    (prefill_span,) = [s for s in spans if s.name == sc.SPAN_PREFILL]
    assert {w.parent_id for w in writes} == {prefill_span.span_id}

    # The analysis: the path's WRITE is rank 0's (it landed last), each rank has a lane.
    (r,) = analyze(spans).requests
    assert r.mode == "push"
    (on_path,) = [s for s in r.spans if s.name == sc.SPAN_KV_WRITE and s.on_critical_path]
    assert on_path.attributes[sc.TP_RANK] == 0
    (write_seg,) = [s for s in r.critical_path if s.phase == phases.WRITE]
    assert write_seg.start_ms == pytest.approx(on_path.start_ms)
    lanes = {s.lane for s in r.spans if s.name == sc.SPAN_KV_WRITE}
    assert lanes == {f"{sc.SERVICE_PREFILL}/p1/push_writer/tp{rank}" for rank in (0, 1)}


def test_tp1_to_tp2_each_decode_rank_counts_the_write_into_it(dep: Deployment) -> None:
    p = dep.engine("prefill", "p1", tp=1)
    d = dep.engine("decode", "d1", tp=2)
    prefill(p)
    req = decode(d, p)
    steps_until_received(p, d)
    first_token(d, req)
    (p_agent,) = p.agents()
    # P's one rank WRITEs into each D rank, naming its own TP (1) in the notification
    assert sorted((w[0], w[1]) for w in dep.fabric.writes) == sorted(
        (p_agent, agent) for agent in d.agents()
    )
    assert {w[2] for w in dep.fabric.writes} == {f"{D_RID}:1".encode()}
    dep.shutdown()

    spans = spans_in(dep.traces_dir)
    (write,) = named(spans, sc.SPAN_KV_WRITE, sc.SERVICE_PREFILL)
    assert write.attributes[sc.TP_RANK] == 0 and write.status_code != STATUS_ERROR
    notifies = named(spans, sc.SPAN_KV_NOTIFY, sc.SERVICE_DECODE)
    assert [n.attributes[sc.TP_RANK] for n in notifies] == [0, 1]  # one per D rank
    for n in notifies:
        assert n.attributes[sc.NOTIFY_EXPECTED] == 1
        assert n.attributes[sc.NOTIFY_RECEIVED] == 1
        assert n.attributes[sc.NOTIFY_RANKS] == [0]
        assert n.status_code != STATUS_ERROR
    registers = named(spans, sc.SPAN_KV_REGISTER, sc.SERVICE_DECODE)
    assert [s.attributes[sc.TP_RANK] for s in registers] == [0, 1]
    (r,) = analyze(spans).requests
    lanes = {s.lane for s in r.spans if s.name == sc.SPAN_KV_NOTIFY}
    assert lanes == {f"{sc.SERVICE_DECODE}/d1/model_runner/tp{rank}" for rank in (0, 1)}


def test_a_prefill_rank_whose_notification_never_comes_is_named(dep: Deployment) -> None:
    p = dep.engine("prefill", "p1", tp=2)
    d = dep.engine("decode", "d1", tp=1)
    _, rank1 = p.agents()
    dep.fabric.held.add(rank1)  # rank 1's WRITE never completes, so never notifies
    prefill(p)
    decode(d, p)

    def rank0_heard() -> bool:
        report(p, p.idle_step())
        d.idle_step()
        return d_received(d, 1)

    until(rank0_heard, "rank 0's notification")
    dep.shutdown()  # the builders close what is still open, as at an engine's exit

    spans = spans_in(dep.traces_dir)
    (notify,) = named(spans, sc.SPAN_KV_NOTIFY, sc.SERVICE_DECODE)
    assert notify.status_code == STATUS_ERROR
    assert notify.attributes[sc.ERROR_TYPE] == sc.ERR_NOTIFY_TIMEOUT
    assert notify.attributes[sc.NOTIFY_EXPECTED] == 2
    assert notify.attributes[sc.NOTIFY_RECEIVED] == 1
    assert notify.attributes[sc.NOTIFY_RANKS] == [0]
    assert notify.status_message == (
        "1 of 2 completion notifications arrived; none from rank 1 of p1"
    )
    w0, w1 = named(spans, sc.SPAN_KV_WRITE, sc.SERVICE_PREFILL)
    assert w0.status_code != STATUS_ERROR
    assert w1.status_code == STATUS_ERROR and w1.attributes[sc.ERROR_TYPE] == sc.ERR_TRANSFER
    (r,) = analyze(spans).requests
    assert r.error is not None and r.error.startswith(sc.SPAN_KV_WRITE)
