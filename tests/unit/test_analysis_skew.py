"""Clock skew: offsets estimated from causal pairs, applied before attribution."""

from __future__ import annotations

import copy

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import RunAnalysis, TraceStore, analyze
from tracedpush.testing import synthetic
from tracedpush.testing.synthetic import DECODE_INSTANCE, PREFILL_INSTANCE, PROXY_INSTANCE


@pytest.fixture(scope="module")
def gen() -> synthetic.SyntheticRun:
    return synthetic.generate(300, seed=21)


@pytest.fixture(scope="module")
def base(gen: synthetic.SyntheticRun) -> RunAnalysis:
    return analyze(TraceStore.from_documents(gen.documents))


def _attributions_close(a: RunAnalysis, b: RunAnalysis, tol_ms: float) -> float:
    """Largest difference between the two runs' per-request, per-phase critical ms and
    segment starts; asserts it is within `tol_ms`."""
    worst = 0.0
    assert len(a.requests) == len(b.requests)
    for ra in a.requests:
        rb = b.get(ra.trace_id)
        assert rb is not None
        assert rb.ttft_ms == pytest.approx(ra.ttft_ms, abs=1e-6)
        pa, pb = ra.phase_ms(), rb.phase_ms()
        for phase in set(pa) | set(pb):
            worst = max(worst, abs(pa.get(phase, 0.0) - pb.get(phase, 0.0)))
        # every phase boundary moves by less than tol (a phase of a few microseconds
        # may vanish or appear; its neighbours absorb it)
        for seg in ra.critical_path:
            near = min(abs(seg.start_ms - t.start_ms) for t in rb.critical_path)
            if seg.duration_ms > tol_ms:
                worst = max(worst, near)
    assert worst <= tol_ms
    return worst


def test_unskewed_run_offsets_stay_within_the_evidence(base: RunAnalysis) -> None:
    offs = base.clock_offsets
    assert offs[PROXY_INSTANCE].reference
    for inst in (PREFILL_INSTANCE, DECODE_INSTANCE):
        o = offs[inst]
        assert o.lo_ms <= 0.0 <= o.hi_ms  # the true offset (0) is inside the evidence
        assert abs(o.offset_ms) <= o.bound_ms  # so the estimate is within its bound of it
        assert o.lo_ms <= o.offset_ms <= o.hi_ms
        assert o.pairs > 100 and o.consistent
        assert o.bound_ms < 2.0


def test_zero_policy_keeps_consistent_clocks_uncorrected(gen: synthetic.SyntheticRun) -> None:
    run = analyze(TraceStore.from_documents(gen.documents), skew_policy="zero")
    assert run.skew_policy == "zero"
    for inst in (PREFILL_INSTANCE, DECODE_INSTANCE):
        assert run.clock_offsets[inst].offset_ms == 0.0
    shifted = analyze(
        TraceStore.from_documents(synthetic.shift_documents(gen.documents, DECODE_INSTANCE, 50)),
        skew_policy="zero",
    )
    o = shifted.clock_offsets[DECODE_INSTANCE]
    assert abs(o.offset_ms - 50) <= o.bound_ms


@pytest.mark.parametrize("delta_ms", [50.0, -50.0, 0.1, 1234.5])
def test_midpoint_is_shift_equivariant(
    gen: synthetic.SyntheticRun, base: RunAnalysis, delta_ms: float
) -> None:
    """Shifting a clock moves its estimate by exactly the shift: nothing else changes."""
    docs = synthetic.shift_documents(gen.documents, PREFILL_INSTANCE, delta_ms)
    run = analyze(TraceStore.from_documents(docs))
    for inst, o in run.clock_offsets.items():
        expect = base.clock_offsets[inst].offset_ms + (delta_ms if inst == PREFILL_INSTANCE else 0)
        assert o.offset_ms == pytest.approx(expect, abs=1e-6)
        assert o.bound_ms == pytest.approx(base.clock_offsets[inst].bound_ms, abs=1e-6)
    assert _attributions_close(base, run, 1e-5) <= 1e-5


@pytest.mark.parametrize("instance", [PREFILL_INSTANCE, DECODE_INSTANCE])
@pytest.mark.parametrize("delta_ms", [50.0, -50.0])
def test_shifting_one_instance_changes_no_attribution(
    gen: synthetic.SyntheticRun, base: RunAnalysis, instance: str, delta_ms: float
) -> None:
    shifted = analyze(
        TraceStore.from_documents(synthetic.shift_documents(gen.documents, instance, delta_ms))
    )
    o = shifted.clock_offsets[instance]
    assert abs(o.offset_ms - delta_ms) <= o.bound_ms
    assert o.lo_ms <= delta_ms <= o.hi_ms
    _attributions_close(base, shifted, 1.0)
    # and against the generator's true clock: every phase longer than 1 ms is one the
    # ground truth expects
    truth = gen.by_trace()
    for r in shifted.requests:
        long = {p for p, ms in r.phase_ms().items() if ms > 1.0}
        assert long <= set(truth[r.trace_id].expected_path)


def test_skew_on_both_engines_at_once(gen: synthetic.SyntheticRun, base: RunAnalysis) -> None:
    docs = synthetic.shift_documents(gen.documents, PREFILL_INSTANCE, 37.0)
    docs = synthetic.shift_documents(docs, DECODE_INSTANCE, -23.0)
    run = analyze(TraceStore.from_documents(docs))
    for inst, true in ((PREFILL_INSTANCE, 37.0), (DECODE_INSTANCE, -23.0)):
        o = run.clock_offsets[inst]
        assert abs(o.offset_ms - true) <= o.bound_ms
    _attributions_close(base, run, 1.0)


def test_without_correction_offsets_are_reported_not_applied(gen: synthetic.SyntheticRun) -> None:
    docs = synthetic.shift_documents(gen.documents, DECODE_INSTANCE, 50.0)
    run = analyze(TraceStore.from_documents(docs), correct_skew=False)
    assert not run.skew_corrected
    assert abs(run.clock_offsets[DECODE_INSTANCE].offset_ms - 50.0) < 1.0  # estimated...
    r = run.requests[0]
    decode = next(v for v in r.spans if v.instance == DECODE_INSTANCE)
    assert decode.start_ms > 50.0  # ...but not applied: D's spans sit 50 ms late
    # the walk notices causality violations it had to clamp
    assert any("after what follows them" in p for r in run.requests for p in r.problems)


def test_skew_generated_at_source_is_recovered() -> None:
    gen = synthetic.generate(200, seed=3, clock_offsets_ms={PREFILL_INSTANCE: 12.5})
    run = analyze(TraceStore.from_documents(gen.documents))
    o = run.clock_offsets[PREFILL_INSTANCE]
    assert abs(o.offset_ms - 12.5) <= o.bound_ms
    truth = gen.by_trace()
    for r in run.requests:
        long = {p for p, ms in r.phase_ms().items() if ms > 1.0}
        assert long <= set(truth[r.trace_id].expected_path)


def test_small_skew_inside_the_evidence(gen: synthetic.SyntheticRun) -> None:
    # 0.1 ms is below what the pairs can resolve: the bound covers the truth either way
    docs = synthetic.shift_documents(gen.documents, DECODE_INSTANCE, 0.1)
    for policy in ("midpoint", "zero"):
        run = analyze(TraceStore.from_documents(docs), skew_policy=policy)
        o = run.clock_offsets[DECODE_INSTANCE]
        assert abs(0.1 - o.offset_ms) <= o.bound_ms
        if policy == "zero":
            assert o.offset_ms == 0.0


def test_unknown_policy_is_refused(gen: synthetic.SyntheticRun) -> None:
    with pytest.raises(ValueError, match="skew policy"):
        analyze(TraceStore.from_documents(gen.documents[:2]), skew_policy="median")


def test_instance_without_causal_pairs_is_not_corrected() -> None:
    gen = synthetic.generate(20, seed=1, drop_spans={"proxy.decode": 1.0, "tracedpush.request": 0})
    run = analyze(TraceStore.from_documents(gen.documents))
    # D still has pairs with P (WRITE -> notification, registration) and with the root;
    # nothing is unbounded, so every instance has a finite bound
    for o in run.clock_offsets.values():
        assert o.bound_ms != float("inf")


def test_same_instance_id_on_two_hosts_is_two_clock_domains() -> None:
    gen = synthetic.generate(60, seed=2)
    docs = gen.documents
    # move P's worker process (not its scheduler) to another host with its own clock
    for doc in docs:
        for rs in doc["resourceSpans"]:
            attrs = rs["resource"]["attributes"]
            kv = {a["key"]: a["value"] for a in attrs}
            if kv["service.name"]["stringValue"] == "vllm-prefill" and kv["process.pid"][
                "intValue"
            ].endswith("2"):
                for a in attrs:
                    if a["key"] == "host.name":
                        a["value"] = {"stringValue": "p-worker-host"}
    run = analyze(TraceStore.from_documents(docs))
    assert f"{PREFILL_INSTANCE}@p-worker-host" in run.clock_offsets
    assert f"{PREFILL_INSTANCE}@p-host" in run.clock_offsets


ONE_HOST = {PROXY_INSTANCE: "box", PREFILL_INSTANCE: "box", DECODE_INSTANCE: "box"}


def test_instances_on_one_host_share_its_clock() -> None:
    """One host, one kernel clock: no midpoint "correction" between its processes, so
    cross-process phases (network) keep their raw, true lengths."""
    gen = synthetic.generate(120, seed=5, hosts=ONE_HOST)
    run = analyze(TraceStore.from_documents(gen.documents))
    for inst in (PROXY_INSTANCE, PREFILL_INSTANCE, DECODE_INSTANCE):
        o = run.clock_offsets[inst]
        assert o.host_clock and o.offset_ms == 0.0 and o.bound_ms == 0.0, o
    # the evidence the pairs alone give is still reported (wider than the tie)
    assert run.clock_offsets[DECODE_INSTANCE].lo_ms < 0.0 < run.clock_offsets[DECODE_INSTANCE].hi_ms


def test_a_host_name_shared_by_two_clocks_is_not_tied() -> None:
    """Two machines that both call themselves "box", one 50 ms ahead: the pairs
    contradict a shared clock, so D keeps its own estimate; P stays tied to the proxy."""
    gen = synthetic.generate(120, seed=5, hosts=ONE_HOST, clock_offsets_ms={DECODE_INSTANCE: 50})
    run = analyze(TraceStore.from_documents(gen.documents))
    o = run.clock_offsets[DECODE_INSTANCE]
    assert not o.host_clock
    assert abs(o.offset_ms - 50.0) <= o.bound_ms
    assert run.clock_offsets[PREFILL_INSTANCE].host_clock
    assert run.clock_offsets[PREFILL_INSTANCE].offset_ms == 0.0


def test_a_clock_that_jumps_elsewhere_leaves_one_host_tied() -> None:
    """P shares the proxy's host; D's clock, on its own host, jumps 30 ms halfway
    through, so D's pairs contradict each other (no single offset fits). D is reported
    inconsistent; P keeps the proxy's clock (before, any contradiction untied every
    host and P got a -0.35 ms "correction")."""
    hosts = {PROXY_INSTANCE: "box", PREFILL_INSTANCE: "box", DECODE_INSTANCE: "d-box"}
    gen = synthetic.generate(120, seed=5, hosts=hosts, clock_offsets_ms={DECODE_INSTANCE: 10})
    docs = copy.deepcopy(gen.documents)
    roots = [s["traceId"] for s in _spans(docs) if s["name"] == sc.SPAN_REQUEST]
    late = set(roots[60:])
    for rs in (rs for doc in docs for rs in doc["resourceSpans"]):
        service = next(a["value"]["stringValue"] for a in rs["resource"]["attributes"]
                       if a["key"] == sc.RES_SERVICE_NAME)  # fmt: skip
        for span in (s for ss in rs["scopeSpans"] for s in ss["spans"]):
            if service == sc.SERVICE_DECODE and span["traceId"] in late:
                for key in ("startTimeUnixNano", "endTimeUnixNano"):
                    span[key] = str(int(span[key]) + 30_000_000)
                for e in span.get("events") or ():
                    e["timeUnixNano"] = str(int(e["timeUnixNano"]) + 30_000_000)
    run = analyze(TraceStore.from_documents(docs))
    d = run.clock_offsets[DECODE_INSTANCE]
    assert not d.consistent and not d.host_clock
    p = run.clock_offsets[PREFILL_INSTANCE]
    assert p.host_clock and p.offset_ms == 0.0 and p.bound_ms == 0.0, p


def _spans(docs: list[dict]) -> list[dict]:
    return [s for doc in docs for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
            for s in ss["spans"]]  # fmt: skip
