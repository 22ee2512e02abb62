"""Critical path: segments sum to TTFT, follow the causal graph, and report hidden work."""

from __future__ import annotations

from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, compare, phases, synthetic, to_perfetto
from tracedpush.analysis.model import Event, Resource, Span

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
    """A push request with registration first: P's prefill is on the path, D's
    registration is hidden behind it. TTFT = 100 ms."""
    spec: dict[str, tuple[Any, ...]] = {
        sc.SPAN_REQUEST: (
            "proxy",
            0,
            150,
            {sc.PROMPT_TOKENS: 500, sc.OUTPUT_TOKENS: 11, sc.TTFT_MS: 100.0},
            [(sc.EVENT_FIRST_TOKEN, 100)],
        ),
        sc.SPAN_PROXY_PREFILL: ("proxy", 1, 70),
        sc.SPAN_PROXY_DECODE: ("proxy", 1.5, 149, {}, [(sc.EVENT_FIRST_TOKEN, 99)]),
        sc.SPAN_PREFILL: ("prefill", 2, 60, {sc.THREAD: "scheduler"}),
        sc.SPAN_DECODE: ("decode", 2.5, 90, {sc.THREAD: "scheduler"}),
        sc.SPAN_KV_REGISTER: ("decode", 4, 5, {sc.THREAD: "push_writer"}),
        sc.SPAN_KV_RENDEZVOUS: ("prefill", 6, 61, {sc.RENDEZVOUS_FIRST: "registration"}),
        sc.SPAN_KV_DESC_PREP: ("prefill", 62, 63),
        sc.SPAN_KV_WRITE: ("prefill", 63.5, 75, {sc.NIXL_XFER_US: 4000, sc.POLL_LAG_US: 7500}),
        sc.SPAN_KV_NOTIFY: ("decode", 70, 72),
    }
    spec.update(over)
    return spec


def exact(spans: list[Span]) -> Any:
    """Hand-built traces have no skew and one request's worth of evidence: keep every
    clock at 0 (the "zero" policy) so segment times can be asserted exactly."""
    return analyze(spans, skew_policy="zero")


def path_of(spans: list[Span]) -> list[tuple[str, float, float]]:
    (r,) = exact(spans).requests
    return [(s.phase, round(s.start_ms, 6), round(s.duration_ms, 6)) for s in r.critical_path]


def test_push_registration_first_exact_segments() -> None:
    run = exact(trace("push", push_spec()))
    (r,) = run.requests
    assert [(s.phase, round(s.start_ms, 6), round(s.duration_ms, 6)) for s in r.critical_path] == [
        (phases.PROXY, 0.0, 1.0),
        (phases.NETWORK, 1.0, 1.0),
        (phases.PREFILL, 2.0, 58.0),
        (phases.RENDEZVOUS_WAIT, 60.0, 2.0),  # prefill done -> writer, rendezvous -> prep
        (phases.DESC_PREP, 62.0, 1.5),  # kv.desc_prep + posting
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
    hidden = {s.phase: s for s in r.hidden}
    # push's whole point: registration ran during prefill, off the path
    assert hidden[phases.REGISTRATION].start_ms == pytest.approx(4.0)
    assert hidden[phases.REGISTRATION].duration_ms == pytest.approx(1.0)
    # P noticing its WRITE finished (at its next step) is not on D's path either
    assert hidden[phases.POLL_LAG].duration_ms == pytest.approx(7.5)
    assert r.tpot_ms == pytest.approx(5.0)  # (150 - 100) / (11 - 1)
    on_path = {v.name for v in r.spans if v.on_critical_path}
    assert sc.SPAN_KV_REGISTER not in on_path
    assert {sc.SPAN_PREFILL, sc.SPAN_KV_WRITE, sc.SPAN_KV_NOTIFY, sc.SPAN_KV_DESC_PREP} <= on_path


def test_push_registration_second_walks_into_decode() -> None:
    spec = push_spec(
        **{
            sc.SPAN_KV_REGISTER: ("decode", 30, 65),  # D was slow to allocate
            sc.SPAN_KV_RENDEZVOUS: ("prefill", 60.5, 66, {sc.RENDEZVOUS_FIRST: "prefill"}),
            sc.SPAN_KV_DESC_PREP: ("prefill", 66.5, 67),
            sc.SPAN_KV_WRITE: ("prefill", 67.5, 75, {sc.NIXL_XFER_US: 1000}),
            sc.SPAN_KV_NOTIFY: ("decode", 70, 72),
        }
    )
    steps = path_of(trace("push", spec))
    assert steps[:6] == [
        (phases.PROXY, 0.0, 1.5),
        (phases.NETWORK, 1.5, 1.0),
        (phases.DECODE_ADMISSION, 2.5, 27.5),
        (phases.REGISTRATION, 30.0, 35.0),
        (phases.REGISTRATION_WAIT, 65.0, 1.0),
        (phases.RENDEZVOUS_WAIT, 66.0, 0.5),
    ]
    (r,) = exact(trace("push", spec)).requests
    assert phases.PREFILL in {s.phase for s in r.hidden}
    assert r.rendezvous_first == "prefill"


def test_rendezvous_order_inferred_without_attribute() -> None:
    spec = push_spec(**{sc.SPAN_KV_RENDEZVOUS: ("prefill", 6, 61)})
    (r,) = exact(trace("push", spec)).requests
    assert r.rendezvous_first == "registration"  # registration ended long before prefill
    assert phases.PREFILL in [s.phase for s in r.critical_path]
    assert any("inferred" in p for p in r.problems)


def test_pull_path_goes_through_relay_read_and_polling_lag() -> None:
    spec = {
        sc.SPAN_REQUEST: ("proxy", 0, 200, {sc.OUTPUT_TOKENS: 1}, [(sc.EVENT_FIRST_TOKEN, 120)]),
        sc.SPAN_PROXY_PREFILL: ("proxy", 1, 64),
        sc.SPAN_PREFILL: ("prefill", 2, 60),
        sc.SPAN_KV_RELAY: ("proxy", 64.5, 65),
        sc.SPAN_PROXY_DECODE: ("proxy", 65, 199, {}, [(sc.EVENT_FIRST_TOKEN, 119)]),
        sc.SPAN_DECODE: ("decode", 66, 110),
        sc.SPAN_KV_HANDSHAKE: ("decode", 68, 78),
        sc.SPAN_KV_DESC_PREP: ("decode", 80, 85),
        sc.SPAN_KV_READ: ("decode", 85.5, 100, {sc.POLL_LAG_US: 4500}),
        sc.SPAN_KV_NOTIFY: ("prefill", 97, 97),
    }
    run = exact(trace("pull", spec))
    (r,) = run.requests
    got = [(s.phase, round(s.start_ms, 6), round(s.duration_ms, 6)) for s in r.critical_path]
    assert got == [
        (phases.PROXY, 0.0, 1.0),
        (phases.NETWORK, 1.0, 1.0),
        (phases.PREFILL, 2.0, 58.0),
        (phases.NETWORK, 60.0, 4.0),
        (phases.PROXY, 64.0, 0.5),
        (phases.RELAY, 64.5, 0.5),
        (phases.NETWORK, 65.0, 1.0),
        (phases.DECODE_ADMISSION, 66.0, 2.0),
        (phases.HANDSHAKE, 68.0, 10.0),  # carved out of the admission gap
        (phases.DECODE_ADMISSION, 78.0, 2.0),
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
    assert phs[:3] == [phases.PROXY, phases.NETWORK, phases.PREFILL]


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
    assert r.critical_path[0].phase == phases.PREFILL
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


def test_push_hides_registration_pull_shows_relay(synth: tuple[Any, Any]) -> None:
    _, run = synth
    push_reg_first = [r for r in run.by_mode("push") if r.rendezvous_first == "registration"]
    assert push_reg_first
    for r in push_reg_first:
        phs = {s.phase for s in r.critical_path}
        assert {phases.RENDEZVOUS_WAIT, phases.WRITE, phases.NOTIFICATION} <= phs
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
