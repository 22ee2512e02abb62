"""Critical path: segments sum to TTFT, follow the causal graph, and report hidden work."""

from __future__ import annotations

from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, compare, phases, to_perfetto
from tracedpush.analysis.model import Event, Resource, Span
from tracedpush.analysis.results import RequestAnalysis
from tracedpush.testing import synthetic

BASE = 1_700_000_000_000_000_000
RES = {
    "proxy": Resource(sc.SERVICE_PROXY, "proxy:8000", "h0", "1"),
    "prefill": Resource(sc.SERVICE_PREFILL, "prefill-0", "h1", "2"),
    "decode": Resource(sc.SERVICE_DECODE, "decode-0", "h2", "3"),
}


def ns(ms: float) -> int:
    return BASE + round(ms * 1e6)


def trace(mode: str, spec: dict[str, tuple[Any, ...]], trace_id: str = "ab" * 16) -> list[Span]:
    """Spans from {name: (side, start_ms, end_ms, attrs?, events?)}; names may carry a
    "#k" suffix to repeat a span."""
    out = []
    for i, (key, (side, start, end, *rest)) in enumerate(spec.items()):
        attrs = {sc.MODE: mode, sc.ROLE: side, sc.REQUEST_ID: "req-1", **(rest[0] if rest else {})}
        events = [Event(n, ns(t), {}) for n, t in (rest[1] if len(rest) > 1 else [])]
        out.append(
            Span(
                trace_id,
                f"{i + 1:016x}",
                "",
                key.split("#")[0],
                1,
                ns(start),
                ns(end),
                RES[side],
                attrs,
                events,
            )
        )
    return out


def push_spec(**over: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    """A push request with registration first: P's leg is on the path, D's registration
    is hidden behind it. TTFT = 100 ms."""
    spec: dict[str, tuple[Any, ...]] = {
        sc.SPAN_REQUEST: (
            "proxy",
            0,
            150,
            {sc.PROMPT_TOKENS: 500, sc.OUTPUT_TOKENS: 11, sc.TTFT_MS: 100.0},
            [(sc.EVENT_FIRST_TOKEN, 100)],
        ),
        sc.SPAN_PROXY_PREFILL: ("proxy", 1, 70, {}, [(sc.EVENT_REQUEST_SENT, 1)]),
        sc.SPAN_PROXY_DECODE: (
            "proxy",
            1.5,
            149,
            {},
            [(sc.EVENT_REQUEST_SENT, 1.5), (sc.EVENT_FIRST_TOKEN, 99)],
        ),
        sc.SPAN_PREFILL: (
            "prefill",
            2,
            60,
            {sc.THREAD: "scheduler", sc.PREFILL_STEPS: 3},
            [
                (sc.EVENT_HTTP_RECEIVED, 2),
                (sc.EVENT_SCHEDULER_RECEIVED, 3),
                (sc.EVENT_COMPUTE_STARTED, 10),
            ],
        ),
        sc.SPAN_DECODE: (
            "decode",
            2.5,
            90,
            {sc.THREAD: "scheduler"},
            [
                (sc.EVENT_HTTP_RECEIVED, 2.5),
                (sc.EVENT_SCHEDULER_RECEIVED, 3.25),
                (sc.EVENT_BLOCKS_ALLOCATED, 4),
            ],
        ),
        sc.SPAN_KV_REGISTER: ("decode", 4, 5, {sc.THREAD: "push_writer"}),
        sc.SPAN_KV_RENDEZVOUS: (
            "prefill",
            6,
            61.5,
            {sc.RENDEZVOUS_FIRST: "registration"},
            [
                (sc.EVENT_REGISTRATION_ARRIVED, 6),
                (sc.EVENT_PREFILL_FINISHED, 60),
                (sc.EVENT_HANDED_TO_WRITER, 61),
            ],
        ),
        sc.SPAN_KV_DESC_PREP: ("prefill", 62, 63),
        sc.SPAN_KV_WRITE: ("prefill", 63.5, 75, {sc.NIXL_XFER_US: 4000, sc.POLL_LAG_US: 7500}),
        sc.SPAN_KV_NOTIFY: ("decode", 70, 72),
    }
    spec.update(over)
    return spec


def pull_spec(**over: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    """A pull request with a first-contact handshake on D. TTFT = 120 ms."""
    spec: dict[str, tuple[Any, ...]] = {
        sc.SPAN_REQUEST: ("proxy", 0, 200, {sc.OUTPUT_TOKENS: 1}, [(sc.EVENT_FIRST_TOKEN, 120)]),
        sc.SPAN_PROXY_PREFILL: ("proxy", 1, 64, {}, [(sc.EVENT_REQUEST_SENT, 1)]),
        sc.SPAN_PREFILL: (
            "prefill",
            2,
            60,
            {},
            [
                (sc.EVENT_HTTP_RECEIVED, 2),
                (sc.EVENT_SCHEDULER_RECEIVED, 3),
                (sc.EVENT_COMPUTE_STARTED, 5),
            ],
        ),
        sc.SPAN_KV_RELAY: ("proxy", 64.5, 65),
        sc.SPAN_PROXY_DECODE: (
            "proxy",
            65,
            199,
            {},
            [(sc.EVENT_REQUEST_SENT, 65), (sc.EVENT_FIRST_TOKEN, 119)],
        ),
        sc.SPAN_DECODE: (
            "decode",
            66,
            110,
            {},
            [
                (sc.EVENT_HTTP_RECEIVED, 66),
                (sc.EVENT_SCHEDULER_RECEIVED, 66.5),
                (sc.EVENT_BLOCKS_ALLOCATED, 67),
            ],
        ),
        sc.SPAN_KV_HANDSHAKE: ("decode", 68, 78),
        sc.SPAN_KV_DESC_PREP: ("decode", 80, 85),
        sc.SPAN_KV_READ: ("decode", 85.5, 100, {sc.NIXL_XFER_US: 10000, sc.POLL_LAG_US: 4500}),
        sc.SPAN_KV_NOTIFY: ("prefill", 97, 97.25),
    }
    spec.update(over)
    return spec


def exact(spans: list[Span]) -> Any:
    """Hand-built traces have no skew and one request's worth of evidence: keep every
    clock at 0 (the "zero" policy) so segment times can be asserted exactly."""
    return analyze(spans, skew_policy="zero")


def path_of(spans: list[Span]) -> list[tuple[str, float, float]]:
    (r,) = exact(spans).requests
    return segments(r)


def segments(r: RequestAnalysis) -> list[tuple[str, float, float]]:
    """A request's critical path as (phase, start, duration), rounded to the ns."""
    return [(s.phase, round(s.start_ms, 6), round(s.duration_ms, 6)) for s in r.critical_path]


def test_push_registration_first_exact_segments() -> None:
    run = exact(trace("push", push_spec()))
    (r,) = run.requests
    assert segments(r) == [
        (phases.PROXY, 0.0, 1.0),
        (phases.NETWORK, 1.0, 1.0),  # proxy.prefill sent -> http_received
        (phases.API_SERVER, 2.0, 1.0),  # -> scheduler_received
        (phases.QUEUE_WAIT, 3.0, 7.0),  # -> compute_started
        (phases.PREFILL_COMPUTE, 10.0, 50.0),  # -> prefill_finished
        (phases.STEP_HANDOFF, 60.0, 1.0),  # -> handed_to_writer (P's next step)
        (phases.WRITER_QUEUE, 61.0, 0.5),  # -> the writer starts it (kv.rendezvous end)
        (phases.DESC_PREP, 61.5, 2.0),  # -> kv.desc_prep -> posting
        (phases.WRITE, 63.5, 4.0),  # NIXL xferDuration: lands at 67.5
        (phases.NOTIFICATION, 67.5, 2.5),  # D sees the first notification at 70
        (phases.NOTIFY_COUNTING, 70.0, 2.0),
        (phases.DECODE_SCHEDULING, 72.0, 18.0),
        (phases.FIRST_DECODE_STEP, 90.0, 9.0),
        (phases.PROXY, 99.0, 1.0),
    ]
    assert r.ttft_ms == pytest.approx(100.0)
    assert r.complete and r.problems == []
    assert r.rendezvous_first == "registration"
    assert r.prefill_steps == 3
    hidden = {s.phase: s for s in r.hidden}
    # push's whole point: registration ran during prefill, off the path
    assert hidden[phases.REGISTRATION].start_ms == pytest.approx(4.0)
    assert hidden[phases.REGISTRATION].duration_ms == pytest.approx(1.0)
    assert phases.REGISTRATION_WAIT not in hidden  # the registration came first
    # P noticing its WRITE finished (at its next step) is not on D's path either
    assert hidden[phases.POLL_LAG].duration_ms == pytest.approx(7.5)
    assert r.tpot_ms == pytest.approx(5.0)  # (150 - 100) / (11 - 1)
    on_path = {v.name for v in r.spans if v.on_critical_path}
    assert sc.SPAN_KV_REGISTER not in on_path
    assert {sc.SPAN_PREFILL, sc.SPAN_KV_WRITE, sc.SPAN_KV_NOTIFY, sc.SPAN_KV_DESC_PREP} <= on_path
    # every phase each engine measured, on its own clock
    assert r.engine_phases_ms == {
        "prefill": pytest.approx(
            {
                phases.API_SERVER: 1.0,
                phases.QUEUE_WAIT: 7.0,
                phases.PREFILL_COMPUTE: 50.0,
                phases.REGISTRATION_WAIT: 0.0,
                phases.STEP_HANDOFF: 1.0,
                phases.WRITER_QUEUE: 0.5,
                phases.DESC_PREP: 2.0,
                phases.WRITE: 4.0,  # xfer_duration_us / 1000 exactly
                phases.POLL_LAG: 7.5,
            }
        ),
        "decode": pytest.approx(
            {
                phases.API_SERVER: 0.75,
                phases.QUEUE_WAIT: 0.75,
                phases.REGISTRATION: 1.0,
                phases.NOTIFY_COUNTING: 2.0,
                phases.DECODE_SCHEDULING: 18.0,
            }
        ),
    }


def registration_second_spec() -> dict[str, tuple[Any, ...]]:
    """`push_spec` with D's registration second: D's leg is on the path."""
    return push_spec(
        **{
            sc.SPAN_KV_REGISTER: ("decode", 30, 65),  # D was slow to allocate
            sc.SPAN_DECODE: (
                "decode",
                2.5,
                90,
                {},
                [
                    (sc.EVENT_HTTP_RECEIVED, 2.5),
                    (sc.EVENT_SCHEDULER_RECEIVED, 4),
                    (sc.EVENT_BLOCKS_ALLOCATED, 29),
                ],
            ),
            sc.SPAN_KV_RENDEZVOUS: (
                "prefill",
                60,
                66,
                {sc.RENDEZVOUS_FIRST: "prefill"},
                [
                    (sc.EVENT_PREFILL_FINISHED, 60),
                    (sc.EVENT_HANDED_TO_WRITER, 62),  # before the registration: no handoff
                    (sc.EVENT_REGISTRATION_ARRIVED, 65.5),
                ],
            ),
            sc.SPAN_KV_DESC_PREP: ("prefill", 66.5, 67),
            sc.SPAN_KV_WRITE: ("prefill", 67.5, 75, {sc.NIXL_XFER_US: 1000}),
            sc.SPAN_KV_NOTIFY: ("decode", 70, 72),
        }
    )


def test_push_registration_second_walks_into_decode() -> None:
    spec = registration_second_spec()
    steps = path_of(trace("push", spec))
    assert steps[:9] == [
        (phases.PROXY, 0.0, 1.5),
        (phases.NETWORK, 1.5, 1.0),
        (phases.API_SERVER, 2.5, 1.5),
        (phases.QUEUE_WAIT, 4.0, 25.0),  # D's waiting queue, up to blocks_allocated
        (phases.REGISTRATION, 29.0, 36.0),  # blocks allocated -> registration sent
        (phases.REGISTRATION_DELIVERY, 65.0, 0.5),  # -> P's writer drained it
        (phases.WRITER_QUEUE, 65.5, 0.5),  # handed_to_writer came before: no step handoff
        (phases.DESC_PREP, 66.0, 1.5),
        (phases.WRITE, 67.5, 1.0),
    ]
    assert sum(d for _, _, d in steps) == pytest.approx(100.0, abs=1e-9)
    (r,) = exact(trace("push", spec)).requests
    hidden = {s.phase: s for s in r.hidden}
    # P's whole leg ran behind D's, and P waited 5.5 ms for the registration (hidden)
    assert {phases.API_SERVER, phases.QUEUE_WAIT, phases.PREFILL_COMPUTE} <= set(hidden)
    assert hidden[phases.REGISTRATION_WAIT].start_ms == pytest.approx(60.0)
    assert hidden[phases.REGISTRATION_WAIT].duration_ms == pytest.approx(5.5)
    assert r.engine_phases_ms["prefill"][phases.REGISTRATION_WAIT] == pytest.approx(5.5)
    assert r.engine_phases_ms["prefill"][phases.STEP_HANDOFF] == 0.0
    assert r.engine_phases_ms["prefill"][phases.WRITER_QUEUE] == pytest.approx(0.5)
    assert r.rendezvous_first == "prefill"
    assert r.complete and r.problems == []


def test_a_registration_that_came_after_p_gave_up_puts_ds_chain_on_the_path() -> None:
    """Seen on real engines (D's API server starved on P's busy core): D's API server
    held the request 30 s, P's lease on the blocks expired waiting for the registration,
    and D then registered and waited for a WRITE that never came. P's writer never had
    the request: the path is D's chain, not 30 s of P's "writer queue"."""
    spec = push_spec(
        **{
            sc.SPAN_REQUEST: ("proxy", 0, 60_010, {sc.ERROR_TYPE: sc.ERR_CLIENT_DISCONNECT}),
            sc.SPAN_PROXY_DECODE: ("proxy", 1.5, 60_005, {}, [(sc.EVENT_REQUEST_SENT, 1.5)]),
            sc.SPAN_DECODE: (
                "decode",
                2.5,
                60_000,
                {},
                [
                    (sc.EVENT_HTTP_RECEIVED, 2.5),
                    (sc.EVENT_SCHEDULER_RECEIVED, 30_990),
                    (sc.EVENT_BLOCKS_ALLOCATED, 30_995),
                ],
            ),
            sc.SPAN_KV_REGISTER: ("decode", 30_995, 31_020),
            sc.SPAN_KV_RENDEZVOUS: (
                "prefill",
                60,
                30_060,
                {sc.RENDEZVOUS_FIRST: "prefill", sc.ERROR_TYPE: sc.ERR_LEASE_EXPIRED},
                [(sc.EVENT_PREFILL_FINISHED, 60), (sc.EVENT_HANDED_TO_WRITER, 61)],
            ),
            sc.SPAN_KV_NOTIFY: ("decode", 31_020, 59_990),
        }
    )
    del spec[sc.SPAN_KV_DESC_PREP], spec[sc.SPAN_KV_WRITE]
    (r,) = exact(trace("push", spec)).requests
    assert r.ttft_ms is None
    assert segments(r) == [
        (phases.PROXY, 0.0, 1.5),
        (phases.NETWORK, 1.5, 1.0),
        (phases.API_SERVER, 2.5, 30_987.5),  # where the time went
        (phases.QUEUE_WAIT, 30_990.0, 5.0),
        (phases.REGISTRATION, 30_995.0, 25.0),
        (phases.NOTIFY_COUNTING, 31_020.0, 28_970.0),  # a WRITE that never came
        (phases.DECODE_SCHEDULING, 59_990.0, 10.0),
    ]
    assert any("ended without D's registration" in p for p in r.problems)
    # on P's own clock it waited for the registration, not in its writer's queue
    p_phases = r.engine_phases_ms["prefill"]
    assert p_phases[phases.REGISTRATION_WAIT] == pytest.approx(30_000.0)
    assert phases.WRITER_QUEUE not in p_phases and phases.STEP_HANDOFF not in p_phases
    # the same spans without P's failure (a trace that only lost its WRITE): usual rules
    spec[sc.SPAN_KV_RENDEZVOUS] = (
        *spec[sc.SPAN_KV_RENDEZVOUS][:3],
        {},
        spec[sc.SPAN_KV_RENDEZVOUS][4],
    )
    (r,) = exact(trace("push", spec)).requests
    assert not any("ended without D's registration" in p for p in r.problems)
    assert phases.WRITER_QUEUE in r.engine_phases_ms["prefill"]


def test_rendezvous_order_inferred_without_attribute() -> None:
    spans = trace("push", push_spec())
    rdv = next(s for s in spans if s.name == sc.SPAN_KV_RENDEZVOUS)
    del rdv.attributes[sc.RENDEZVOUS_FIRST]
    (r,) = exact(spans).requests
    assert r.rendezvous_first == "registration"  # registration ended long before prefill
    assert phases.PREFILL_COMPUTE in [s.phase for s in r.critical_path]
    assert any("inferred" in p for p in r.problems)


def test_pull_path_goes_through_response_relay_read_and_polling_lag() -> None:
    run = exact(trace("pull", pull_spec()))
    (r,) = run.requests
    got = segments(r)
    assert got == [
        (phases.PROXY, 0.0, 1.0),
        (phases.NETWORK, 1.0, 1.0),
        (phases.API_SERVER, 2.0, 1.0),
        (phases.QUEUE_WAIT, 3.0, 2.0),
        (phases.PREFILL_COMPUTE, 5.0, 55.0),
        (phases.RESPONSE, 60.0, 4.0),  # P finished -> the proxy has its answer
        (phases.PROXY, 64.0, 0.5),
        (phases.RELAY, 64.5, 0.5),
        (phases.NETWORK, 65.0, 1.0),  # relay end -> D's http_received
        (phases.API_SERVER, 66.0, 0.5),
        (phases.QUEUE_WAIT, 66.5, 0.5),  # -> blocks_allocated
        (phases.STEP_HANDOFF, 67.0, 1.0),  # -> D's worker takes it at its next step
        (phases.HANDSHAKE, 68.0, 10.0),  # carved out of the step handoff
        (phases.STEP_HANDOFF, 78.0, 2.0),
        (phases.DESC_PREP, 80.0, 5.5),
        (phases.READ, 85.5, 10.0),
        (phases.POLL_LAG, 95.5, 4.5),
        (phases.DECODE_SCHEDULING, 100.0, 10.0),
        (phases.FIRST_DECODE_STEP, 110.0, 9.0),
        (phases.PROXY, 119.0, 1.0),
    ]
    # P counting READ notifications does not delay D's first token
    assert [s.span for s in r.hidden] == [sc.SPAN_KV_NOTIFY]
    assert r.tpot_ms is None  # one output token
    assert r.engine_phases_ms == {
        "prefill": pytest.approx(
            {
                phases.API_SERVER: 1.0,
                phases.QUEUE_WAIT: 2.0,
                phases.PREFILL_COMPUTE: 55.0,
                phases.NOTIFY_COUNTING: 0.25,
            }
        ),
        "decode": pytest.approx(
            {
                phases.API_SERVER: 0.5,
                phases.QUEUE_WAIT: 0.5,
                phases.HANDSHAKE: 10.0,
                phases.STEP_HANDOFF: 3.0,  # 13 ms from blocks_allocated, minus the handshake
                phases.DESC_PREP: 5.5,
                phases.READ: 10.0,
                phases.POLL_LAG: 4.5,
                phases.DECODE_SCHEDULING: 10.0,
            }
        ),
    }


def _without_event(spans: list[Span], span: str, event: str) -> list[Span]:
    for s in spans:
        if s.name == span:
            s.events = [e for e in s.events if e.name != event]
    return spans


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_without_http_received_network_falls_back_to_the_span_start(mode: str) -> None:
    spec = push_spec() if mode == "push" else pull_spec()
    spec[sc.SPAN_PREFILL] = (
        "prefill",
        2.5,  # vLLM's arrival time: after the HTTP server had it
        60,
        {},
        [(sc.EVENT_SCHEDULER_RECEIVED, 3), (sc.EVENT_COMPUTE_STARTED, 10)],
    )
    (r,) = exact(trace(mode, spec)).requests
    segs = r.critical_path
    assert (segs[1].phase, segs[1].start_ms, segs[1].duration_ms) == (
        phases.NETWORK,
        1.0,
        pytest.approx(1.5),  # includes the API server's work before arrival_time
    )
    assert (segs[2].phase, segs[2].start_ms) == (phases.API_SERVER, 2.5)
    assert any(f"no {sc.EVENT_HTTP_RECEIVED} event on {sc.SPAN_PREFILL}" in p for p in r.problems)
    assert r.complete  # the middleware is optional
    assert sum(s.duration_ms for s in segs) == pytest.approx(r.ttft_ms, abs=1e-9)
    assert phases.API_SERVER not in r.engine_phases_ms["prefill"]  # not measured


def _with_arrival(spans: list[Span], span: str, at_ms: float) -> list[Span]:
    """Give ``span`` a vllm_arrival event at ``at_ms``."""
    return _with_event(spans, span, sc.EVENT_VLLM_ARRIVAL, at_ms)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_vllms_arrival_splits_the_api_server_from_engine_input(mode: str) -> None:
    """vllm_arrival between http_received and scheduler_received: `api server` until it
    (HTTP, validation), `engine input` after it (tokenization, IPC, the EngineCore taking
    it between steps), on the path and in the engine's own phases. Outside that window
    (another clock's value, a bad event) it is ignored: the whole is `api server`."""
    spec = push_spec() if mode == "push" else pull_spec()
    (r,) = exact(_with_arrival(trace(mode, spec), sc.SPAN_PREFILL, 2.25)).requests
    segs = segments(r)
    assert segs[1:4] == [
        (phases.NETWORK, 1.0, 1.0),
        (phases.API_SERVER, 2.0, 0.25),  # http_received -> vllm_arrival
        (phases.ENGINE_INPUT, 2.25, 0.75),  # -> scheduler_received at 3
    ]
    assert segs[4][:2] == (phases.QUEUE_WAIT, 3.0)
    pre = r.engine_phases_ms["prefill"]
    assert (pre[phases.API_SERVER], pre[phases.ENGINE_INPUT]) == pytest.approx((0.25, 0.75))
    assert phases.ENGINE_INPUT not in r.engine_phases_ms["decode"]
    for at in (1.5, 3.5):
        (r,) = exact(_with_arrival(trace(mode, spec), sc.SPAN_PREFILL, at)).requests
        assert (phases.API_SERVER, 2.0, 1.0) in segments(r), at
        assert phases.ENGINE_INPUT not in r.engine_phases_ms["prefill"], at


def _with_event(spans: list[Span], span: str, event: str, at_ms: float) -> list[Span]:
    for s in spans:
        if s.name == span:
            s.events.append(Event(event, ns(at_ms), {}))
    return spans


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_core_received_splits_engine_input_from_engine_busy(mode: str) -> None:
    """core_received (the EngineCore's input thread had the request) between vllm_arrival
    and scheduler_received: `engine input` until it (tokenizing, the message to the
    EngineCore), `engine busy` after it (the busy loop finishing its step), on the path
    and in the engine's own phases, on each engine. Without vllm_arrival it ends `api
    server`; outside the window it is ignored."""
    spec = push_spec() if mode == "push" else pull_spec()
    spans = _with_arrival(trace(mode, spec), sc.SPAN_PREFILL, 2.25)
    (r,) = exact(_with_event(spans, sc.SPAN_PREFILL, sc.EVENT_CORE_RECEIVED, 2.5)).requests
    segs = segments(r)
    assert segs[2:5] == [
        (phases.API_SERVER, 2.0, 0.25),
        (phases.ENGINE_INPUT, 2.25, 0.25),  # vllm_arrival -> core_received
        (phases.ENGINE_BUSY, 2.5, 0.5),  # -> scheduler_received at 3
    ]
    assert segs[5][:2] == (phases.QUEUE_WAIT, 3.0)
    assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(r.ttft_ms, abs=1e-9)
    pre = r.engine_phases_ms["prefill"]
    assert (pre[phases.ENGINE_INPUT], pre[phases.ENGINE_BUSY]) == pytest.approx((0.25, 0.5))
    assert phases.ENGINE_BUSY not in r.engine_phases_ms["decode"]
    # no vllm_arrival: api server runs to core_received
    spans = _with_event(trace(mode, spec), sc.SPAN_PREFILL, sc.EVENT_CORE_RECEIVED, 2.5)
    (r,) = exact(spans).requests
    segs = segments(r)
    assert segs[2:4] == [(phases.API_SERVER, 2.0, 0.5), (phases.ENGINE_BUSY, 2.5, 0.5)]
    assert r.engine_phases_ms["prefill"][phases.API_SERVER] == pytest.approx(0.5)
    for at in (2.0, 3.5):  # before vllm_arrival, after scheduler_received
        spans = _with_arrival(trace(mode, spec), sc.SPAN_PREFILL, 2.25)
        (r,) = exact(_with_event(spans, sc.SPAN_PREFILL, sc.EVENT_CORE_RECEIVED, at)).requests
        assert (phases.ENGINE_INPUT, 2.25, 0.75) in segments(r), at
        assert phases.ENGINE_BUSY not in r.engine_phases_ms["prefill"], at


def test_network_starts_when_the_bytes_left_the_proxy() -> None:
    """Building a leg is the proxy's work; `network` starts at request_sent. In pull, the
    wait between the relay span's end and D's bytes leaving belongs to the relay."""
    spec = push_spec()
    spec[sc.SPAN_PROXY_PREFILL] = ("proxy", 1, 70, {}, [(sc.EVENT_REQUEST_SENT, 1.75)])
    segs = path_of(trace("push", spec))
    assert segs[:3] == [
        (phases.PROXY, 0.0, 1.75),  # receipt -> P's bytes out (leg built at 1 -> 1.75)
        (phases.NETWORK, 1.75, 0.25),  # -> http_received at 2
        (phases.API_SERVER, 2.0, 1.0),
    ]
    spec = pull_spec()
    spec[sc.SPAN_PROXY_DECODE] = ("proxy", 65, 199, {}, [(sc.EVENT_REQUEST_SENT, 65.75)])
    segs = path_of(trace("pull", spec))
    relay = next(i for i, s in enumerate(segs) if s[0] == phases.RELAY)
    assert segs[relay : relay + 2] == [
        (phases.RELAY, 64.5, 1.25),  # kv.relay start -> D's bytes out
        (phases.NETWORK, 65.75, 0.25),  # -> D's http_received at 66
    ]


def test_a_leg_sent_again_puts_the_wait_on_the_engines_api_server() -> None:
    """The engine closed the kept-alive connection unanswered (its API server, starved,
    had not read the request) and the proxy sent it again on a new one: the time from
    the first send to the second is that engine's api server, not network."""
    spec = push_spec()
    spec[sc.SPAN_PROXY_PREFILL] = (
        "proxy", 0.5, 70, {}, [(sc.EVENT_REQUEST_SENT, 0.75), (sc.EVENT_REQUEST_RESENT, 1.5)]
    )  # fmt: skip
    (r,) = exact(trace("push", spec)).requests
    segs = [(s.phase, s.service, round(s.start_ms, 6), round(s.duration_ms, 6))
            for s in r.critical_path[:4]]  # fmt: skip
    assert segs == [
        (phases.PROXY, sc.SERVICE_PROXY, 0.0, 0.75),
        (phases.API_SERVER, sc.SERVICE_PREFILL, 0.75, 0.75),  # sent -> sent again
        (phases.NETWORK, sc.SERVICE_PREFILL, 1.5, 0.5),  # sent again -> http_received at 2
        (phases.API_SERVER, sc.SERVICE_PREFILL, 2.0, 1.0),
    ]
    assert r.complete and sum(s.duration_ms for s in r.critical_path) == pytest.approx(100.0)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_a_wait_for_the_model_catalog_is_model_lookup_not_proxy(mode: str) -> None:
    """``proxy.models`` (the request waited for the engines' /v1/models) between receipt
    and the first leg is its own phase; the proxy's own time is what is left around it."""
    spec = push_spec() if mode == "push" else pull_spec()
    spec[sc.SPAN_PROXY_MODELS] = ("proxy", 0.1, 0.6)
    segs = path_of(trace(mode, spec))
    assert segs[:4] == [
        (phases.PROXY, 0.0, 0.1),
        (phases.MODEL_LOOKUP, 0.1, 0.5),
        (phases.PROXY, 0.6, 0.4),  # -> P's bytes out at 1
        (phases.NETWORK, 1.0, 1.0),
    ]
    without = path_of(trace(mode, {k: v for k, v in spec.items() if k != sc.SPAN_PROXY_MODELS}))
    assert without[0] == (phases.PROXY, 0.0, 1.0)


def _loop_said(spans: list[Span], leg: str, waited: Any) -> list[Span]:
    """Give ``leg``'s request_sent the proxy loop's CPU figures since receipt."""
    for s in spans:
        for e in s.events if s.name == leg else ():
            if e.name == sc.EVENT_REQUEST_SENT:
                e.attributes = {sc.LOOP_ON_CPU_MS: 0.2, sc.LOOP_CPU_WAIT_MS: waited}
    return spans


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_the_proxys_wait_for_a_cpu_is_cut_out_of_its_own_time(mode: str) -> None:
    """The first leg's request_sent says the proxy's event loop waited 0.75 ms for a CPU
    since receipt: `proxy CPU wait`, drawn just before the send; `proxy` is the rest. It
    never reaches into a wait for the model catalog, and without the figure (a proxy on
    macOS, or from before it) nothing is cut."""
    spec = push_spec() if mode == "push" else pull_spec()
    segs = path_of(_loop_said(trace(mode, spec), sc.SPAN_PROXY_PREFILL, 0.75))
    assert segs[:3] == [
        (phases.PROXY, 0.0, 0.25),
        (phases.PROXY_CPU_WAIT, 0.25, 0.75),  # -> P's bytes out at 1
        (phases.NETWORK, 1.0, 1.0),
    ]
    ttft = 100.0 if mode == "push" else 120.0
    assert (segs[-1][0], segs[-1][1] + segs[-1][2]) == (phases.PROXY, ttft)  # TTFT whole
    # a catalog wait until 0.6: the CPU wait is drawn after it, and no longer than what is left
    spec[sc.SPAN_PROXY_MODELS] = ("proxy", 0.1, 0.6)
    segs = path_of(_loop_said(trace(mode, spec), sc.SPAN_PROXY_PREFILL, 0.75))
    assert segs[:4] == [
        (phases.PROXY, 0.0, 0.1),
        (phases.MODEL_LOOKUP, 0.1, 0.5),
        (phases.PROXY_CPU_WAIT, 0.6, 0.4),
        (phases.NETWORK, 1.0, 1.0),
    ]
    for waited in (None, 0.0, "0.5", float("nan"), True):
        segs = path_of(_loop_said(trace(mode, push_spec() if mode == "push" else pull_spec()),
                                  sc.SPAN_PROXY_PREFILL, waited))  # fmt: skip
        assert segs[0] == (phases.PROXY, 0.0, 1.0), waited


def test_the_cpu_wait_is_read_from_the_leg_on_the_path() -> None:
    """Push with D's registration second: D's leg is on the path, so D's request_sent
    gives the wait (P's, on a leg off the path, is not used)."""
    spans = _loop_said(trace("push", registration_second_spec()), sc.SPAN_PROXY_PREFILL, 0.9)
    assert phases.PROXY_CPU_WAIT not in [s[0] for s in path_of(spans)]
    (r,) = exact(_loop_said(spans, sc.SPAN_PROXY_DECODE, 0.5)).requests
    assert r.rendezvous_first == "prefill"
    segs = segments(r)
    d_sent = next(e.time_ns for s in spans if s.name == sc.SPAN_PROXY_DECODE for e in s.events)
    sent_ms = round((d_sent - BASE) / 1e6, 6)
    assert segs[:2] == [
        (phases.PROXY, 0.0, round(sent_ms - 0.5, 6)),
        (phases.PROXY_CPU_WAIT, round(sent_ms - 0.5, 6), 0.5),
    ]


def _token_said(mode: str, d_in: Any, out: Any) -> list[Span]:
    """A trace whose first_token events say the loop had waited ``d_in`` ms for a CPU by D's
    token coming in (proxy.decode's) and ``out`` ms by its going out (the root's)."""
    spans = trace(mode, push_spec() if mode == "push" else pull_spec())
    for s in spans:
        waited = {sc.SPAN_PROXY_DECODE: d_in, sc.SPAN_REQUEST: out}.get(s.name)
        for e in s.events if waited is not None else ():
            if e.name == sc.EVENT_FIRST_TOKEN:
                e.attributes = {sc.LOOP_ON_CPU_MS: 0.1, sc.LOOP_CPU_WAIT_MS: waited}
    return spans


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_the_first_tokens_way_out_names_the_loops_wait_for_a_cpu(mode: str) -> None:
    """Both first_token events carry the loop's figures since receipt: the root's less
    proxy.decode's is the wait between D's token coming in and going out to the client,
    drawn last (just before the token left), `proxy` the rest; never before D's token
    came in; nothing without both figures, or when the wait did not grow."""
    end = 100.0 if mode == "push" else 120.0
    segs = path_of(_token_said(mode, 0.3, 0.8))
    assert segs[-2:] == [(phases.PROXY, end - 1, 0.5), (phases.PROXY_CPU_WAIT, end - 0.5, 0.5)]
    assert sum(s[2] for s in segs) == pytest.approx(end)  # TTFT whole
    segs = path_of(_token_said(mode, 0.0, 5.0))  # longer than the 1 ms: from D's token on
    assert segs[-1] == (phases.PROXY_CPU_WAIT, end - 1, 1.0)
    assert segs[-2][0] == phases.FIRST_DECODE_STEP
    for d_in, out in ((None, 0.8), (0.3, None), (0.8, 0.8), (0.8, 0.3), (0.3, float("nan"))):
        segs = path_of(_token_said(mode, d_in, out))
        assert segs[-1] == (phases.PROXY, end - 1, 1.0), (d_in, out)


def _relay_said(waited: Any) -> list[Span]:
    """A pull trace whose kv.relay says the loop had waited ``waited`` ms by P's answer,
    and whose D leg says 0.55 ms by D's bytes out (both since receipt)."""
    spec = pull_spec()
    if waited is not None:
        spec[sc.SPAN_KV_RELAY] = ("proxy", 64.5, 65, {sc.LOOP_CPU_WAIT_MS: waited})
    return _loop_said(trace("pull", spec), sc.SPAN_PROXY_DECODE, 0.55)


def test_pulls_relay_names_the_loops_wait_for_a_cpu_since_ps_answer() -> None:
    """kv.relay carries the loop's figures at P's answer; D's request_sent, since receipt,
    less them is the relay's own wait: `proxy CPU wait` just before D's bytes out, `relay`
    the rest. The first leg's figures (none here) are not the relay's."""
    segs = path_of(_relay_said(0.25))
    i = segs.index((phases.RELAY, 64.5, 0.2))
    assert segs[i + 1 : i + 3] == [
        (phases.PROXY_CPU_WAIT, 64.7, 0.3),  # 0.55 - 0.25 -> D's bytes out at 65
        (phases.NETWORK, 65.0, 1.0),
    ]
    assert sum(s[2] for s in segs) == pytest.approx(120.0)  # TTFT whole
    # a wait longer than the relay stops at its start (P's answer); none without kv.relay's
    # figure (a proxy from before it, or without schedstat), or when nothing was added
    segs = path_of(_relay_said(0.0))
    assert (phases.PROXY_CPU_WAIT, 64.5, 0.5) in segs and phases.RELAY not in [s[0] for s in segs]
    for waited in (None, 0.55, 0.9, "0.2", float("inf")):
        segs = path_of(_relay_said(waited))
        assert (phases.RELAY, 64.5, 0.5) in segs, waited
        assert phases.PROXY_CPU_WAIT not in [s[0] for s in segs], waited


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_without_request_sent_network_starts_at_the_leg_start(mode: str) -> None:
    spec = push_spec() if mode == "push" else pull_spec()
    spec[sc.SPAN_PROXY_PREFILL] = ("proxy", 1, 64)  # a proxy from before request_sent
    (r,) = exact(trace(mode, spec)).requests
    assert (r.critical_path[1].phase, r.critical_path[1].start_ms) == (phases.NETWORK, 1.0)
    assert any(
        f"no {sc.EVENT_REQUEST_SENT} event on {sc.SPAN_PROXY_PREFILL}" in p for p in r.problems
    )
    assert r.complete
    assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(r.ttft_ms, abs=1e-9)


def test_missing_events_are_unattributed_not_guessed() -> None:
    spans = _without_event(
        trace("push", push_spec()), sc.SPAN_KV_RENDEZVOUS, sc.EVENT_HANDED_TO_WRITER
    )
    spans = _without_event(spans, sc.SPAN_PREFILL, sc.EVENT_SCHEDULER_RECEIVED)
    (r,) = exact(spans).requests
    got = segments(r)
    assert got[2:6] == [
        (phases.QUEUE_WAIT, 2.0, 8.0),  # API-server time counted in queue wait
        (phases.PREFILL_COMPUTE, 10.0, 50.0),
        (phases.UNATTRIBUTED, 60.0, 1.5),  # step handoff + writer queue, not separated
        (phases.DESC_PREP, 61.5, 2.0),
    ]
    assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(100.0, abs=1e-9)
    assert any(sc.EVENT_HANDED_TO_WRITER in p for p in r.problems)
    assert any(sc.EVENT_SCHEDULER_RECEIVED in p for p in r.problems)
    assert r.complete  # a missing event is reported, the trace is still whole
    assert phases.STEP_HANDOFF not in r.engine_phases_ms["prefill"]


def test_missing_span_gives_unattributed_gap_and_incomplete() -> None:
    spec = push_spec()
    del spec[sc.SPAN_KV_NOTIFY]
    (r,) = exact(trace("push", spec)).requests
    assert not r.complete
    assert any(sc.SPAN_KV_NOTIFY in p for p in r.problems)
    phs = [s.phase for s in r.critical_path]
    assert phases.UNATTRIBUTED in phs
    assert phases.NOTIFY_COUNTING not in phs
    assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(100.0, abs=1e-9)
    # what is known is still attributed
    assert phs[:5] == [
        phases.PROXY,
        phases.NETWORK,
        phases.API_SERVER,
        phases.QUEUE_WAIT,
        phases.PREFILL_COMPUTE,
    ]


def test_first_token_falls_back_to_proxy_decode_event() -> None:
    spec = push_spec(**{sc.SPAN_REQUEST: ("proxy", 0, 150, {sc.OUTPUT_TOKENS: 11})})
    (r,) = exact(trace("push", spec)).requests
    assert r.ttft_ms == pytest.approx(99.0)
    assert r.critical_path[-1].phase == phases.FIRST_DECODE_STEP
    assert any(sc.EVENT_FIRST_TOKEN in p for p in r.problems)


def test_request_that_never_got_a_first_token_has_no_ttft() -> None:
    spec = push_spec(
        **{
            sc.SPAN_REQUEST: ("proxy", 0, 300_000, {sc.ERROR_TYPE: sc.ERR_UPSTREAM_TIMEOUT}),
            sc.SPAN_PROXY_DECODE: ("proxy", 1.5, 300_000),
        }
    )
    (r,) = exact(trace("push", spec)).requests
    assert r.ttft_ms is None and r.tpot_ms is None and not r.complete
    assert r.critical_path[-1].end_ms == pytest.approx(90.0)  # analysed up to decode's end
    assert any("no first token" in p for p in r.problems)


def test_error_span_is_reported() -> None:
    spans = trace("push", push_spec())
    notify = next(s for s in spans if s.name == sc.SPAN_KV_NOTIFY)
    notify.status_code = 2
    notify.attributes[sc.ERROR_TYPE] = sc.ERR_NOTIFY_TIMEOUT
    (r,) = exact(spans).requests
    assert r.complete  # the trace is whole; the failure is reported separately
    assert r.error == f"{sc.SPAN_KV_NOTIFY}: {sc.ERR_NOTIFY_TIMEOUT}"
    assert any(sc.ERR_NOTIFY_TIMEOUT in p for p in r.problems)
    view = next(v for v in r.spans if v.name == sc.SPAN_KV_NOTIFY)
    assert view.status == "error" and view.error == sc.ERR_NOTIFY_TIMEOUT


def test_request_without_proxy_spans_still_gets_a_path() -> None:
    spec = {k: v for k, v in push_spec().items() if v[0] != "proxy"}
    (r,) = exact(trace("push", spec)).requests
    assert r.ttft_ms is None and not r.complete
    assert r.critical_path[0].phase == phases.API_SERVER
    assert r.critical_path[-1].phase == phases.DECODE_SCHEDULING
    assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(88.0)  # 2 -> 90


def test_tp_ranks_the_last_write_to_land_is_on_the_path() -> None:
    spec = push_spec(
        **{
            f"{sc.SPAN_KV_WRITE}#1": ("prefill", 63.5, 80, {sc.TP_RANK: 1, sc.NIXL_XFER_US: 6000}),
        }
    )
    (r,) = exact(trace("push", spec)).requests
    write = next(s for s in r.critical_path if s.phase == phases.WRITE)
    assert write.duration_ms == pytest.approx(6.0)  # the later-ending rank-1 write
    lanes = {v.lane for v in r.spans if v.name == sc.SPAN_KV_WRITE}
    assert len(lanes) == 2  # rank 1 gets its own lane


def _two_ranks(landed_last: int) -> dict[str, tuple[Any, ...]]:
    """P at TP 2, each rank's phases on its own worker. Rank 1's WRITE is *observed*
    done last (P polled it at 80 ms), but which rank's data *landed* last (post +
    NIXL xferDuration) is `landed_last`: D's last notification came from that rank."""
    slow, fast = (4000, 2000) if landed_last == 0 else (2000, 6000)
    rank0, rank1 = {sc.TP_RANK: 0}, {sc.TP_RANK: 1}
    landed = sorted((63.5 + slow / 1000, 63.7 + fast / 1000))
    heard = [(sc.EVENT_NOTIFICATION, t + 0.1) for t in landed]  # one from each rank
    counts = {sc.NOTIFY_EXPECTED: 2, sc.NOTIFY_RECEIVED: 2}
    return push_spec(
        **{
            sc.SPAN_KV_DESC_PREP: ("prefill", 62, 63, rank0),
            sc.SPAN_KV_WRITE: ("prefill", 63.5, 75, {**rank0, sc.NIXL_XFER_US: slow}),
            f"{sc.SPAN_KV_DESC_PREP}#1": ("prefill", 62.2, 63.7, rank1),
            f"{sc.SPAN_KV_WRITE}#1": ("prefill", 63.7, 80, {**rank1, sc.NIXL_XFER_US: fast}),
            sc.SPAN_KV_NOTIFY: ("decode", landed[0] + 0.1, 72, counts, heard),
        }
    )


@pytest.mark.parametrize("landed_last", [0, 1])
def test_tp_ranks_out_of_order_the_write_that_landed_last_is_on_the_path(landed_last) -> None:
    (r,) = exact(trace("push", _two_ranks(landed_last))).requests
    assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(100.0)
    (write,) = [s for s in r.critical_path if s.phase == phases.WRITE]
    start, xfer = (63.5, 4.0) if landed_last == 0 else (63.7, 6.0)
    assert (write.start_ms, write.duration_ms) == (pytest.approx(start), pytest.approx(xfer))
    (notification,) = [s for s in r.critical_path if s.phase == phases.NOTIFICATION]
    assert notification.start_ms == pytest.approx(start + xfer)  # that rank's data landed
    # ...and D counted from that rank's notification, the last, to the end of kv.notify
    (counting,) = [s for s in r.critical_path if s.phase == phases.NOTIFY_COUNTING]
    assert counting.start_ms == pytest.approx(start + xfer + 0.1)
    assert counting.start_ms + counting.duration_ms == pytest.approx(72)
    assert not any("clamped" in p for p in r.problems)
    lit = {(v.name, v.attributes.get(sc.TP_RANK)) for v in r.spans if v.on_critical_path}
    assert (sc.SPAN_KV_WRITE, landed_last) in lit
    assert (sc.SPAN_KV_WRITE, 1 - landed_last) not in lit
    # the descriptor prep before it is the same rank's
    (prep,) = [s for s in r.critical_path if s.phase == phases.DESC_PREP]
    assert prep.start_ms + prep.duration_ms == pytest.approx(start)
    assert (sc.SPAN_KV_DESC_PREP, landed_last) in lit
    # engine-local WRITE is that rank's NIXL xferDuration
    assert r.engine_phases_ms["prefill"][phases.WRITE] == pytest.approx(xfer)


def test_tp_ranks_each_get_a_lane_rank_0_too() -> None:
    (r,) = exact(trace("push", _two_ranks(0))).requests
    lanes = {v.attributes[sc.TP_RANK]: v.lane for v in r.spans if v.name == sc.SPAN_KV_WRITE}
    assert lanes == {
        0: f"{sc.SERVICE_PREFILL}/prefill-0/pid 2/tp0",
        1: f"{sc.SERVICE_PREFILL}/prefill-0/pid 2/tp1",
    }
    assert lanes[0] in r.lanes and lanes[1] in r.lanes
    assert r.lanes.index(lanes[0]) < r.lanes.index(lanes[1])
    # an instance with one rank keeps its lanes unsuffixed
    assert all("/tp" not in v.lane for v in r.spans if v.service == sc.SERVICE_DECODE)


# ------------------------------------------------------------------ synthetic runs


@pytest.fixture(scope="module")
def synth() -> tuple[synthetic.SyntheticRun, Any]:
    run = synthetic.generate(400, seed=11)
    return run, analyze(TraceStore.from_documents(run.documents))


def test_every_path_sums_to_ttft_and_is_contiguous(synth: tuple[Any, Any]) -> None:
    gen, run = synth
    truth = gen.by_trace()
    assert len(run.requests) == 400
    for r in run.requests:
        t = truth[r.trace_id]
        assert r.ttft_ms == pytest.approx(t.ttft_ms, abs=1e-3)
        total = sum(s.duration_ms for s in r.critical_path)
        assert abs(total - r.ttft_ms) < 1.0
        assert abs(total - r.ttft_attr_ms) < 1.0
        assert r.critical_path[0].start_ms == 0.0
        for a, b in zip(r.critical_path, r.critical_path[1:], strict=False):
            assert b.start_ms == pytest.approx(a.end_ms, abs=1e-9)
            assert a.duration_ms > 0
        assert r.complete, r.problems


def test_paths_match_ground_truth(synth: tuple[Any, Any]) -> None:
    gen, run = synth
    truth = gen.by_trace()
    orders = set()
    for r in run.requests:
        t = truth[r.trace_id]
        assert tuple(s.phase for s in r.critical_path) == t.expected_path, r.request_id
        hidden = {s.phase if s.phase != phases.NOTIFY_COUNTING else s.span for s in r.hidden}
        assert set(t.expected_hidden) <= hidden, r.request_id
        orders.add(r.rendezvous_first)
    assert orders == {None, "registration", "prefill"}  # both push orders were exercised


def test_every_phase_of_the_vocabulary_occurs_with_its_ground_truth(synth: tuple[Any, Any]) -> None:
    gen, run = synth
    truth = gen.by_trace()
    on_path = {s.phase for r in run.requests for s in r.critical_path}
    hidden = {s.phase for r in run.requests for s in r.hidden}
    assert (
        set(phases.PHASES)
        - {phases.NOTIFY_COUNTING, phases.UNATTRIBUTED}
        - {phases.REGISTRATION_WAIT}
        <= on_path
    )  # (the generator's notifications all arrive at once)
    assert phases.REGISTRATION_WAIT in hidden and phases.REGISTRATION_WAIT not in on_path
    assert not set(phases.REMOVED) & (on_path | hidden)
    assert set(phases.DESCRIPTIONS) == set(phases.PHASES)
    # engine-local phases equal the simulated mechanism (ns rounding only)
    checked = 0
    for r in run.requests:
        t = truth[r.trace_id]
        assert r.prefill_steps == t.prefill_steps
        for role, expected in t.expected_engine_ms.items():
            for phase, ms in expected.items():
                assert r.engine_phases_ms[role][phase] == pytest.approx(ms, abs=2e-6), (
                    r.request_id,
                    role,
                    phase,
                )
                checked += 1
    assert checked > 400 * 5
    # step handoff and writer queue really vary with the simulated mechanism
    push = run.by_mode("push")
    assert max(r.engine_phases_ms["prefill"][phases.STEP_HANDOFF] for r in push) > 5.0
    assert max(r.engine_phases_ms["prefill"][phases.WRITER_QUEUE] for r in push) > 0.2


def test_engine_phase_totals_per_mode_and_role(synth: tuple[Any, Any]) -> None:
    gen, run = synth
    totals = run.engine_phase_totals()
    counts = run.engine_phase_totals(counts=True)
    assert set(totals) == {"push", "pull"}
    for mode in ("push", "pull"):
        reqs = [t for t in gen.requests if t.mode == mode]
        for role in ("prefill", "decode"):
            for phase in (phases.QUEUE_WAIT, phases.API_SERVER):
                want = sum(t.expected_engine_ms[role][phase] for t in reqs)
                assert totals[mode][role][phase] == pytest.approx(want, rel=1e-6)
                assert counts[mode][role][phase] == len(reqs)
        want = sum(t.expected_engine_ms["prefill"][phases.PREFILL_COMPUTE] for t in reqs)
        assert totals[mode]["prefill"][phases.PREFILL_COMPUTE] == pytest.approx(want, rel=1e-6)
    # WRITE / READ are NIXL's xferDuration exactly (what vLLM's nixl_xfer_time sums)
    push, pull = ([t for t in gen.requests if t.mode == m] for m in ("push", "pull"))
    write = sum(t.expected_engine_ms["prefill"][phases.WRITE] for t in push)
    read = sum(t.expected_engine_ms["decode"][phases.READ] for t in pull)
    assert totals["push"]["prefill"][phases.WRITE] == pytest.approx(write, rel=1e-9)
    assert totals["pull"]["decode"][phases.READ] == pytest.approx(read, rel=1e-9)
    assert phases.READ not in totals["push"]["decode"]
    assert phases.WRITE not in totals["pull"]["prefill"]


def test_old_traces_without_http_received_fall_back() -> None:
    gen = synthetic.generate(120, seed=3, http_received=False)
    run = analyze(TraceStore.from_documents(gen.documents))
    truth = gen.by_trace()
    for r in run.requests:
        t = truth[r.trace_id]
        assert tuple(s.phase for s in r.critical_path) == t.expected_path
        assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(r.ttft_ms, abs=1e-6)
        assert r.complete
        assert any(sc.EVENT_HTTP_RECEIVED in p for p in r.problems)
        assert phases.API_SERVER not in r.engine_phases_ms["prefill"]
        assert r.engine_phases_ms["prefill"][phases.QUEUE_WAIT] == pytest.approx(
            t.expected_engine_ms["prefill"][phases.QUEUE_WAIT], abs=2e-6
        )
    # network now holds part of the API server's work (vLLM stamps arrival after it)
    with_mw = analyze(TraceStore.from_documents(synthetic.generate(120, seed=3).documents))
    net = compare(run).overall.phases["push"][phases.NETWORK]["mean"]
    net_mw = compare(with_mw).overall.phases["push"][phases.NETWORK]["mean"]
    assert net > net_mw


def test_push_hides_registration_pull_shows_relay(synth: tuple[Any, Any]) -> None:
    _, run = synth
    push_reg_first = [r for r in run.by_mode("push") if r.rendezvous_first == "registration"]
    assert push_reg_first
    for r in push_reg_first:
        phs = {s.phase for s in r.critical_path}
        assert {phases.WRITER_QUEUE, phases.WRITE, phases.NOTIFICATION} <= phs
        assert phases.REGISTRATION not in phs
        assert phases.REGISTRATION in {s.phase for s in r.hidden}
    for r in run.by_mode("pull"):
        phs = {s.phase for s in r.critical_path}
        assert {phases.RELAY, phases.READ, phases.DESC_PREP} <= phs
        assert phases.WRITE not in phs


def test_dropped_spans_never_break_the_sum() -> None:
    drop = {name: 0.2 for name in sc.ALL_SPANS if name != sc.SPAN_REQUEST}
    gen = synthetic.generate(200, seed=5, drop_spans=drop)
    run = analyze(TraceStore.from_documents(gen.documents))
    incomplete = 0
    for r in run.requests:
        if r.ttft_ms is not None:
            assert sum(s.duration_ms for s in r.critical_path) == pytest.approx(r.ttft_ms, abs=1e-6)
            assert all(s.duration_ms > 0 for s in r.critical_path)
        incomplete += not r.complete
        t = gen.by_trace()[r.trace_id]
        if set(t.dropped) & set(sc.REQUIRED_SPANS[r.mode]):
            assert not r.complete
            assert any("missing span" in p for p in r.problems)
    assert incomplete > 50


def test_never_raises_on_scrambled_traces() -> None:
    """Random subsets of spans with jittered times, foreign spans mixed in: the analysis
    always answers, and whenever there is a TTFT the path sums to it."""
    import random

    rng = random.Random(0)
    gen = synthetic.generate(60, seed=13)
    spans = list(TraceStore.from_documents(gen.documents).all_spans())
    foreign = Resource("jaeger-all-in-one", "jaeger", "h9", "9")
    for _ in range(30):
        subset = [s for s in spans if rng.random() < 0.8]
        for s in subset:
            if rng.random() < 0.1:
                shift = rng.randint(-5_000_000, 5_000_000)
                s.start_ns += shift
                s.end_ns = max(s.end_ns + shift, s.start_ns)
        subset.append(
            Span(
                subset[0].trace_id, "f" * 16, "", "llm_request", 2, BASE, BASE + 10, foreign, {}, []
            )
        )
        run = analyze(subset)
        for r in run.requests:
            if r.ttft_ms is not None:
                total = sum(seg.duration_ms for seg in r.critical_path)
                assert total == pytest.approx(r.ttft_ms, abs=1e-6)
                assert all(seg.duration_ms > 0 for seg in r.critical_path)
        compare(run)
        to_perfetto(run)
