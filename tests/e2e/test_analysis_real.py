"""The analysis on real traces from the local 1P1D, push and pull.

Requests go through the proxy; their traces are read from the deployment's traces
directory. Every request's critical path must sum to the proxy-measured TTFT (the
``tracedpush.ttft_ms`` attribute) within 1 ms, follow the mode's handoff, and survive a
simulated clock skew: every span of one engine shifted by +/-50 ms must leave every
phase attribution within 1 ms once corrected, with the estimated offset within its bound.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from e2e_support import requests_in, wait_for_traces

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, phases
from tracedpush.bench.workload import PromptMaker
from tracedpush.testing.synthetic import shift_directory

MODES = [pytest.param(m, marks=pytest.mark.pd(m), id=m) for m in ("push", "pull")]
N_REQUESTS = 6
CLIENT_TIMEOUT_S = 150.0
# Engines, startup and the engines lock can take long on a busy 2-core machine.
RECORDING_SLACK_MS = 1.0

pytestmark = pytest.mark.timeout(2400)


def _stream(base: str, model: str, prompt: str, request_id: str) -> str | None:
    """One streamed completion read to its [DONE]; returns None or why it failed."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(
        f"{base}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "X-Request-Id": request_id},
    )
    tokens = 0
    try:
        with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    break
                if line.startswith("data:") and json.loads(line[5:]).get("choices"):
                    tokens += 1
    except (OSError, ValueError) as exc:  # HTTP errors, timeouts, resets
        return f"{type(exc).__name__}: {exc}"
    return None if tokens else "no token streamed"


@pytest.fixture(scope="module")
def sent() -> dict[str, Any]:
    return {}


@pytest.mark.parametrize("mode", MODES)
def test_real_critical_path_sums_to_proxy_ttft(pd: Any, mode: str, sent: dict[str, Any]) -> None:
    if not pd.config.trace:
        pytest.skip("the traced connectors are not loaded (TRACEDPUSH_E2E_TRACE=0)")
    prefix = f"analysis-{mode}-{uuid.uuid4().hex[:6]}"
    prompts = PromptMaker(pd.model, seed=7).mix([120, 400, 900], N_REQUESTS)
    ids = [f"{prefix}-{i:02d}" for i in range(N_REQUESTS)]
    with ThreadPoolExecutor(2) as pool:  # two in flight: some overlap, some queueing
        errors = list(
            pool.map(
                lambda a: _stream(pd.proxy_url, pd.model_name, *a),
                zip([p.text for p in prompts], ids, strict=True),
            )
        )
    ok = {i for i, e in zip(ids, errors, strict=True) if e is None}
    failed = {i: e for i, e in zip(ids, errors, strict=True) if e is not None}
    if failed:  # the deployment's problem, not the analysis': reported, not asserted here
        warnings.warn(f"{mode}: {len(failed)} request(s) failed: {failed}", stacklevel=1)
    assert len(ok) >= N_REQUESTS // 2, f"too few requests succeeded to analyse: {failed}"
    store = wait_for_traces(pd.traces_dir, ok)
    run = analyze(store)
    mine = requests_in(run, ok)
    for r in mine:
        assert r.mode == mode
        assert r.complete, r.problems
        assert r.ttft_attr_ms is not None, "the proxy did not record tracedpush.ttft_ms"
        total = sum(s.duration_ms for s in r.critical_path)
        assert abs(total - r.ttft_attr_ms) < 1.0, (r.request_id, total, r.ttft_attr_ms)
        assert abs(r.ttft_ms - r.ttft_attr_ms) < 1.0
        assert all(s.duration_ms > 0 for s in r.critical_path)
        phs = {s.phase for s in r.critical_path}
        # the proxy learnt the model catalog as it started (its /health waits for it)
        assert phases.MODEL_LOOKUP not in phs
        assert sc.SPAN_PROXY_MODELS not in {s.name for s in r.spans}
        _proxy_cpu_wait_is_named(r, store)
        if mode == "push":
            assert phases.WRITE in phs or phases.NOTIFICATION in phs, r.critical_path
            assert phases.READ not in phs and phases.RELAY not in phs
            on_path = phases.REGISTRATION in phs
            hidden = phases.REGISTRATION in {s.phase for s in r.hidden}
            assert on_path or hidden, "kv.register neither on the path nor hidden"
        else:
            assert {phases.RELAY, phases.READ} & phs, r.critical_path
            assert phases.WRITE not in phs
    # requests that failed are analysed too, and say so
    for r in requests_in(run, set(failed)):
        assert r.error is not None or not r.complete
    # one host, one clock: every instance is tied to the proxy's, the pairs agreeing
    for name, o in run.clock_offsets.items():
        assert o.host_clock and o.offset_ms == 0.0, (name, o)
    print(f"\n{mode}: {len(ok)} ok, {len(failed)} failed; clock offsets:")
    for name, o in run.clock_offsets.items():
        print(
            f"  {name}: {o.offset_ms:+.3f} +/- {o.bound_ms:.3f} ms [{o.lo_ms:.3f}, {o.hi_ms:.3f}]"
        )
    sent[mode] = (ok, {r.trace_id: r.phase_ms() for r in mine})


def _proxy_cpu_wait_is_named(r: Any, store: TraceStore) -> None:
    """`proxy CPU wait` is what the proxy measured (its loop's wait since receipt, on the
    events and kv.relay): the first leg's on the path (P's, or D's when the registration
    came second in push), in pull the relay's (D's less kv.relay's), and the first
    token's way out (the root's first_token less proxy.decode's)."""
    if not os.path.exists("/proc/thread-self/schedstat"):
        return  # no figures to name it by
    spans = {s.name: s for s in store.spans(r.trace_id)}

    def said(name: str, event: str) -> float:
        got = spans[name].event(event)
        assert got is not None, (name, event)
        return got.attributes[sc.LOOP_CPU_WAIT_MS]

    legs = (sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE)
    p_leg, d_leg = (said(n, sc.EVENT_REQUEST_SENT) for n in legs)
    first, relay = p_leg, 0.0
    if r.mode == "pull":
        at_answer = spans[sc.SPAN_KV_RELAY].attributes[sc.LOOP_CPU_WAIT_MS]
        assert p_leg <= at_answer <= d_leg, (p_leg, at_answer, d_leg)
        relay = d_leg - at_answer
    elif r.rendezvous_first == "prefill":  # D's leg was on the path
        first = d_leg
    d_in, out = (said(n, sc.EVENT_FIRST_TOKEN) for n in (sc.SPAN_PROXY_DECODE, sc.SPAN_REQUEST))
    assert d_leg <= d_in <= out, (d_leg, d_in, out)
    waited = sum(s.duration_ms for s in r.critical_path if s.phase == phases.PROXY_CPU_WAIT)
    assert waited == pytest.approx(first + relay + out - d_in, abs=0.05), r.critical_path
    print(f"  {r.request_id}: proxy CPU wait {first:.2f} ms to the first send, {relay:.2f} "
          f"ms in the relay, {out - d_in:.2f} ms on the first token's way out")  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("delta_ms", [50.0, -50.0])
def test_real_traces_survive_a_shifted_engine_clock(
    pd: Any, mode: str, delta_ms: float, sent: dict[str, Any], tmp_path: Path
) -> None:
    if mode not in sent:
        pytest.skip("needs test_real_critical_path_sums_to_proxy_ttft's requests")
    ok, _ = sent[mode]
    # a frozen copy, so spans still arriving cannot change the evidence between runs; each
    # instance on a host of its own, as if P and D ran on two machines (on one host their
    # clocks are tied, and a shifted engine would contradict the tie)
    snapshot = tmp_path / "snapshot"
    shift_directory(pd.traces_dir, snapshot, "", 0.0, own_hosts=True)
    run0 = analyze(TraceStore.from_path(snapshot))
    base = {r.trace_id: r.phase_ms() for r in requests_in(run0, ok)}
    engines = {
        v.instance
        for r in requests_in(run0, ok)
        for v in r.spans
        if v.service != sc.SERVICE_PROXY and v.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE)
    }
    assert len(engines) == 2
    worst_overall = 0.0
    for instance in sorted(engines):
        out = tmp_path / instance
        shift_directory(snapshot, out, instance, delta_ms)
        run = analyze(TraceStore.from_path(out))
        o = run.clock_offsets[instance]
        # The estimator moves by exactly the shift it is shown ...
        o0 = run0.clock_offsets[instance]
        assert abs(o.offset_ms - (o0.offset_ms + delta_ms)) <= 1e-3, (instance, o0, o)
        # ... and lands within its bound of the truth, up to how late our hooks observe an
        # event (engine threads timestamp when vLLM calls them: a causal pair on one host
        # was once seen 0.28 ms "violated" on this loaded 2-core machine). RECORDING_SLACK_MS
        # is that observation error, stated rather than hidden.
        assert abs(o.offset_ms - delta_ms) <= o.bound_ms + RECORDING_SLACK_MS, (instance, o)
        worst = 0.0
        for r in requests_in(run, ok):
            before = base[r.trace_id]
            after = r.phase_ms()
            for phase in set(before) | set(after):
                worst = max(worst, abs(before.get(phase, 0.0) - after.get(phase, 0.0)))
            assert abs(sum(s.duration_ms for s in r.critical_path) - r.ttft_attr_ms) < 1.0
        print(
            f"\n{mode} {instance} shifted {delta_ms:+.0f} ms: estimated {o.offset_ms:+.3f} "
            f"+/- {o.bound_ms:.3f} ms; worst phase change {worst:.3f} ms"
        )
        worst_overall = max(worst_overall, worst)
    assert worst_overall <= 1.0
