"""Under load (8 in flight), in both modes: our per-engine phases agree with vLLM's own
counters on the same run, and the push-pull TTFT difference is fully named.

vLLM measures some of what we measure, from its own timestamps: P's
`vllm:request_queue_time_seconds` (QUEUED -> SCHEDULED), `vllm:request_prefill_time_seconds`
(SCHEDULED -> first token) and the NIXL transfer time `vllm:nixl_xfer_time_seconds`
(NIXL's xferDuration; on P in push mode, on D in pull mode). The growth of those sums
over our workload must match the totals of our `engine_phases_ms` within 5%, with equal
request counts. P's `vllm:time_to_first_token_seconds` runs from vLLM's arrival_time (our
`vllm_arrival`) to P's one token back in its API server: our engine input + engine busy +
queue wait + prefill compute must be at most that, and within 5% of it (engine busy is
the rest of the old engine input, after the EngineCore's own receipt). On D, vLLM's
queue time (QUEUED -> first SCHEDULED, after the KV arrived) must equal our
`scheduler_received` -> `decode` end within 5%, and D's engine input + engine busy + that
queue time + vLLM's prefill time on D must be at most D's TTFT, within 5% or 10 ms a
request (the token's way back), and D's TTFT at most D's arrival -> the token at the
proxy. Each engine main thread's sampled wait for a CPU agrees with the kernel's
counter, read while the engines run. Engine busy is
checked against each engine's own step records: every request is taken at the first
step boundary after `core_received`. Then the account of where the TTFT difference
between the modes goes must leave less than 1% of it unattributed.
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_right
from pathlib import Path
from typing import Any

import pytest
from e2e_support import requests_in, wait_for_traces

from tracedpush import semconv as sc
from tracedpush.analysis import RunAnalysis, TraceStore, analyze, phases, request_json
from tracedpush.analysis.steps import EngineSteps
from tracedpush.bench.workload import PromptMaker, run_workload
from tracedpush.launcher.metrics import metric_sum
from tracedpush.testing.kernel import thread_wait_ms

MODES = [pytest.param(m, marks=pytest.mark.pd(m), id=m) for m in ("push", "pull")]
CONCURRENCY = 8
N_REQUESTS = 24
LENGTHS = [256, 512, 1024]
TOLERANCE = 0.05
WAY_BACK_MS = 10.0  # a token's way from the EngineCore to its API server, at most (mean)

QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
XFER = "vllm:nixl_xfer_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"  # each engine: its arrival_time -> first token out
MAIN_ROLES = ("api_server", "engine_core", "model_runner")  # each engine's main threads
STRETCH_MS = 100.0  # a wait the kernel adds only as it ends (a scheduler period or so)
ROUNDED_MS = 0.05  # a span's cpu_wait_ms is rounded to 0.1 ms

pytestmark = pytest.mark.timeout(2400)


def _counters(pd: Any, mode: str) -> dict[str, float]:
    """vLLM's sums and counts: P's queue, prefill and TTFT, the transfer on the engine
    that runs it, and D's own queue, prefill and TTFT (prefixed ``d_``)."""
    xfer_url = pd.prefill_url if mode == "push" else pd.decode_url
    out = {"xfer_sum": metric_sum(xfer_url, XFER + "_sum"),
           "xfer_count": metric_sum(xfer_url, XFER + "_count")}  # fmt: skip
    for prefix, url in (("", pd.prefill_url), ("d_", pd.decode_url)):
        for key, name in (("queue", QUEUE), ("prefill", PREFILL), ("ttft", TTFT)):
            for part in ("sum", "count"):
                out[f"{prefix}{key}_{part}"] = metric_sum(url, f"{name}_{part}")
    return out


def _grown(pd: Any, mode: str, before: dict[str, float], n: int) -> dict[str, float]:
    """vLLM's stats reach /metrics a little after a request ends: wait for all n."""
    deadline = time.monotonic() + 30.0
    counts = ("queue_count", "prefill_count", "xfer_count", "d_queue_count", "d_ttft_count")
    while True:
        now = _counters(pd, mode)
        delta = {k: now[k] - before[k] for k in now}
        if all(delta[k] >= n for k in counts) or time.monotonic() > deadline:
            return delta
        time.sleep(0.5)


def _analysed(traces_dir: Path, ids: set[str]) -> tuple[TraceStore, RunAnalysis]:
    store = wait_for_traces(traces_dir, ids, ready=lambda r: r.complete and r.engine_phases_ms)
    run = analyze(store, spans=False)
    run.requests = requests_in(run, ids)
    return store, run


def _busy_in_steps(
    store: TraceStore, run: RunAnalysis
) -> dict[str, tuple[float, float, list[int]]]:
    """Per engine, its `engine busy` (core_received -> scheduler_received, from the engine
    spans) against that engine's own step records (the model runner's bind -> clear
    window, stamped by another thread): the busy time summed over the run's requests
    (ms), the part of it before the first step end after core_received (ms), and for
    each request how many step ends lie between its two events."""
    steps = EngineSteps.from_spans(store.all_spans())
    out = {}
    for role, name in (("prefill", sc.SPAN_PREFILL), ("decode", sc.SPAN_DECODE)):
        ends = sorted(
            s.end_ns
            for per_engine in steps.steps.values()
            for s in per_engine
            if s.role == role and s.has_worker
        )
        busy = before = 0
        crossed = []
        for r in run.requests:
            for span in store.spans(r.trace_id):
                at = {e.name: e.time_ns for e in span.events}
                core, sched = at.get(sc.EVENT_CORE_RECEIVED), at.get(sc.EVENT_SCHEDULER_RECEIVED)
                if span.name != name or core is None or sched is None:
                    continue
                i = bisect_right(ends, core)
                busy += sched - core
                before += min(ends[i] if i < len(ends) else sched, sched) - core
                crossed.append(bisect_right(ends, sched) - i)
        out[role] = (busy / 1e6, before / 1e6, sorted(crossed))
    return out


def _d_queued(store: TraceStore, run: RunAnalysis) -> tuple[float, int]:
    """D's `scheduler_received` -> `decode` span end, summed over the run's requests (ms),
    and how many had both: vLLM's QUEUED -> first SCHEDULED on D, which for a request
    whose KV comes from P is after the KV arrived (our `queue wait` on D ends earlier,
    when D allocates the blocks; the handoff's phases follow it)."""
    total, n = 0, 0
    for r in run.requests:
        for span in store.spans(r.trace_id):
            sched = span.event_ns(sc.EVENT_SCHEDULER_RECEIVED)
            if span.name == sc.SPAN_DECODE and sched is not None:
                total += span.end_ns - sched
                n += 1
    return total / 1e6, n


def _d_to_proxy_token(store: TraceStore, run: RunAnalysis) -> float:
    """D's `vllm_arrival` -> the first token reaching the proxy (`proxy.decode`'s
    `first_token`), summed over the run's requests (ms): one host, one clock. vLLM's TTFT
    on D ends before that, as D's API server has the token and before it sends it."""
    total = 0
    for r in run.requests:
        spans = {s.name: s for s in store.spans(r.trace_id)}
        arrival = spans[sc.SPAN_DECODE].event_ns(sc.EVENT_VLLM_ARRIVAL)
        token = spans[sc.SPAN_PROXY_DECODE].event_ns(sc.EVENT_FIRST_TOKEN)
        assert arrival is not None and token is not None, r.trace_id
        total += token - arrival
    return total / 1e6


def _waits_agree_with_the_kernel(run: RunAnalysis) -> None:
    """Each engine main thread's last sampled wait for a CPU (`cpu_wait_ms`, cumulative)
    against the kernel's own counter read now, the engines still up: at least that, and
    grown since by no more than the time since (a wait cannot outrun the clock)."""
    last: dict[tuple[int, int], tuple[int, float, str]] = {}
    for smp in run.engine_steps.samples:
        if smp.cpu_wait_ms is None:
            continue
        for i, tid in enumerate(smp.tids):
            key = (smp.pids[i], tid)
            if smp.thread_roles[i] in MAIN_ROLES and smp.time_ns > last.get(key, (0,))[0]:
                last[key] = (smp.time_ns, smp.cpu_wait_ms[i], smp.thread_roles[i])
    assert {role for _t, _w, role in last.values()} == set(MAIN_ROLES), last
    for (pid, tid), (at_ns, ours_ms, role) in last.items():
        kernel_ms = thread_wait_ms(pid, tid)
        now_ns = time.time_ns()  # after the read: the wait grew by at most the time since
        grown_ms = kernel_ms - ours_ms  # (the sample's time was taken after its read)...
        # ...and a wait in progress at the sample, which the kernel adds as it ends
        assert -ROUNDED_MS <= grown_ms <= (now_ns - at_ns) / 1e6 + STRETCH_MS, (role, pid, grown_ms)
    print("\nwaits for a CPU (ms, cumulative at the last sample): " + ", ".join(
        f"{role} {w:.0f}" for _t, w, role in sorted(last.values(), key=lambda v: v[2])
    ))  # fmt: skip


def _total(run: RunAnalysis, engine: str, phase: str) -> tuple[float, int]:
    values = [r.engine_phases_ms.get(engine, {}).get(phase) for r in run.requests]
    measured = [v for v in values if v is not None]
    return sum(measured), len(measured)


def _agree(ours_ms: float, vllm_s: float, what: str) -> None:
    theirs = vllm_s * 1000.0
    assert theirs > 0, f"vLLM's {what} did not grow"
    assert abs(ours_ms - theirs) <= TOLERANCE * theirs, (
        f"{what}: ours {ours_ms:.1f} ms, vLLM {theirs:.1f} ms"
    )


@pytest.fixture(scope="session")
def loaded() -> dict[str, RunAnalysis]:
    """Each mode's run, for the comparison. Session-scoped: the suite runs every push test
    before every pull test (tests/conftest.py), so this module's push and pull runs are
    apart, and a module-scoped dict was made anew between them (CI skipped the comparison)."""
    return {}


@pytest.mark.parametrize("mode", MODES)
def test_engine_phases_agree_with_vllm_under_load(
    pd: Any, mode: str, loaded: dict[str, RunAnalysis]
) -> None:
    if not pd.config.trace:
        pytest.skip("the traced connectors are not loaded (TRACEDPUSH_E2E_TRACE=0)")
    prefix = f"load-{mode}-{uuid.uuid4().hex[:6]}"
    prompts = PromptMaker(pd.model, seed=11).mix(LENGTHS, N_REQUESTS)
    before = _counters(pd, mode)
    results = run_workload(
        pd.proxy_url, prompts, CONCURRENCY, 8, model=pd.model_name, request_id_prefix=prefix
    )
    failed = [r for r in results if not r.ok]
    assert not failed, f"requests failed under load: {[r.to_dict() for r in failed][:3]}"
    ids = {f"{prefix}-{i:04d}" for i in range(N_REQUESTS)}
    delta = _grown(pd, mode, before, N_REQUESTS)
    store, run = _analysed(pd.traces_dir, ids)
    loaded[mode] = run

    queue_ms, n_queue = _total(run, "prefill", phases.QUEUE_WAIT)
    compute_ms, n_compute = _total(run, "prefill", phases.PREFILL_COMPUTE)
    assert n_queue == int(delta["queue_count"]) == N_REQUESTS
    assert n_compute == int(delta["prefill_count"]) == N_REQUESTS
    _agree(queue_ms, delta["queue_sum"], "P's queue wait vs request_queue_time_seconds_sum")
    _agree(compute_ms, delta["prefill_sum"], "P's prefill compute vs request_prefill_time_sum")

    engine, phase = ("prefill", phases.WRITE) if mode == "push" else ("decode", phases.READ)
    xfer_ms, n_xfer = _total(run, engine, phase)
    assert n_xfer == int(delta["xfer_count"]) == N_REQUESTS
    _agree(xfer_ms, delta["xfer_sum"], f"{phase} vs nixl_xfer_time_seconds_sum")
    # the judged shape of the JSON: every request's path sums to its TTFT, and each has
    # engine_phases_ms and a tpot_breakdown_ms that sums to its TPOT within 1%
    for r in run.requests:
        payload = request_json(r)
        assert abs(sum(s.duration_ms for s in r.critical_path) - r.ttft_ms) < 1e-6 * r.ttft_ms
        assert payload["engine_phases_ms"]["prefill"] and payload["engine_phases_ms"]["decode"]
        tb = payload["tpot_breakdown_ms"]
        assert tb and abs(sum(tb.values()) - r.tpot_ms) <= 0.01 * r.tpot_ms, (tb, r.tpot_ms)
    # the engines' middleware stamped every request, so API-server work is its own phase,
    # and vLLM's arrival_time splits it from engine input (tokenization, IPC, the
    # EngineCore taking it between steps)
    for r in run.requests:
        on_path = {seg.phase for seg in r.critical_path}
        assert {phases.API_SERVER, phases.ENGINE_INPUT} <= on_path, r.critical_path
        assert not any("http_received" in p for p in r.problems), r.problems
        for engine in ("prefill", "decode"):
            assert phases.ENGINE_INPUT in r.engine_phases_ms[engine], r.engine_phases_ms
            # the EngineCore's input thread stamped it: engine busy follows engine input
            assert phases.ENGINE_BUSY in r.engine_phases_ms[engine], r.engine_phases_ms
    api_ms = {e: _total(run, e, phases.API_SERVER)[0] for e in ("prefill", "decode")}
    input_ms = {e: _total(run, e, phases.ENGINE_INPUT)[0] for e in ("prefill", "decode")}
    busy_ms = {e: _total(run, e, phases.ENGINE_BUSY)[0] for e in ("prefill", "decode")}
    # vLLM's TTFT on P runs from the same arrival_time to its one token reaching P's API
    # server: engine input + engine busy + queue wait + prefill compute, and the output's
    # way back
    ours = input_ms["prefill"] + busy_ms["prefill"] + queue_ms + compute_ms
    theirs = delta["ttft_sum"] * 1e3
    assert int(delta["ttft_count"]) == N_REQUESTS
    print(
        f"\n{mode}: api server / engine input / engine busy, P {api_ms['prefill']:.0f} / "
        f"{input_ms['prefill']:.0f} / {busy_ms['prefill']:.0f} ms, D {api_ms['decode']:.0f} / "
        f"{input_ms['decode']:.0f} / {busy_ms['decode']:.0f} ms; "
        f"P's arrival -> prefill end {ours:.0f} ms, vLLM's TTFT on P {theirs:.0f} ms "
        f"({ours / theirs:.3f})"
    )
    # (here 0.98 in both modes: the way back is about 4 ms a request)
    assert (1 - TOLERANCE) * theirs <= ours <= theirs, (ours, theirs)
    # D: vLLM's queue time there is QUEUED -> first SCHEDULED, the KV's arrival included
    d_queue_ms, n_d = _d_queued(store, run)
    assert n_d == int(delta["d_queue_count"]) == N_REQUESTS
    _agree(d_queue_ms, delta["d_queue_sum"], "D's scheduler_received -> decode end")
    # vLLM's TTFT on D runs from D's arrival_time: engine input + engine busy on D (to
    # QUEUED), that queue time, D's prefill time (SCHEDULED -> its first token: D's first
    # forward, which no span of ours covers: vLLM's figure here) and the token's way back
    # to D's API server (an IPC hop and output processing: 3.5-5 ms a request here, on
    # both engines), so it lies between that sum and the token reaching the proxy. The
    # way back is allowed 5% of it, or WAY_BACK_MS a request: in pull D's TTFT is about
    # 80 ms a request here, and 5% of it is less than the hop.
    assert int(delta["d_ttft_count"]) == int(delta["d_prefill_count"]) == N_REQUESTS
    ours_d = input_ms["decode"] + busy_ms["decode"] + d_queue_ms + delta["d_prefill_sum"] * 1e3
    theirs_d = delta["d_ttft_sum"] * 1e3
    at_proxy = _d_to_proxy_token(store, run)
    print(
        f"\n{mode}: D's scheduler_received -> decode end {d_queue_ms:.0f} ms (vLLM's queue "
        f"time on D {delta['d_queue_sum'] * 1e3:.0f}; our queue wait on D "
        f"{_total(run, 'decode', phases.QUEUE_WAIT)[0]:.0f}); D's arrival -> first token "
        f"{ours_d:.0f} ms, vLLM's TTFT on D {theirs_d:.0f} ms ({ours_d / theirs_d:.3f}), "
        f"D's arrival -> the token at the proxy {at_proxy:.0f} ms"
    )
    assert ours_d <= theirs_d <= at_proxy, (ours_d, theirs_d, at_proxy)
    assert theirs_d - ours_d <= max(TOLERANCE * theirs_d, WAY_BACK_MS * N_REQUESTS)
    # engine busy is the EngineCore's loop finishing the step it was in: the scheduler
    # takes the request at the first step boundary after the input thread had it. Checked
    # against each engine's own step records (another thread's stamps): a request whose
    # core_received came a step too early (or on the wrong thread) would cross two or
    # more step ends. (Here: every request crosses at most one; on P 0.85-0.89 of the busy
    # time is before that step's end, the rest the loop's work after the forward.)
    in_steps = _busy_in_steps(store, run)
    for engine, (busy, before, crossed) in in_steps.items():
        print(
            f"\n{mode}: {engine} engine busy {busy:.0f} ms, {before:.0f} ms of it before the "
            f"first step end after core_received; step ends crossed {crossed}"
        )
        assert busy == pytest.approx(busy_ms[engine], rel=1e-6)
        assert len(crossed) == N_REQUESTS
        # at most one request in ten crosses a second step end (its input thread starved)
        assert sum(1 for n in crossed if n > 1) <= N_REQUESTS // 10, crossed
    busy, before, _ = in_steps["prefill"]
    assert before >= 0.5 * busy, in_steps
    network = sorted(
        seg.duration_ms for r in run.requests for seg in r.critical_path if seg.phase == "network"
    )
    # pinned engines do not share cores: no cross-engine contention is reported
    found = run.contention()
    assert found, "no engine.threads samples"
    assert not [f.text for f in found.findings if f.kind == "cross_engine"]
    _waits_agree_with_the_kernel(run)
    # `network` runs from the proxy's bytes leaving (request_sent) to their arrival in the
    # engine's socket (the kernel's receive stamp), on one clock (one host): transport
    # only. Issue 8's target on loopback is a p50 of at most 2 ms. Without the kernel stamp
    # (the loop's read clock) it was 2.1-3.5 ms here under the full suite: the API
    # server's thread waiting for its core, which is `api server` time
    p50 = network[len(network) // 2]
    print(f"\n{mode}: network p50 {p50:.2f} ms, p90 {network[len(network) * 9 // 10]:.2f} ms")
    assert p50 <= 2.0, network
    for r in run.requests:
        assert not any("request_sent" in p for p in r.problems), r.problems
    print(
        f"\n{mode}: queue {queue_ms:.0f} ms (vLLM {delta['queue_sum'] * 1e3:.0f}), "
        f"prefill {compute_ms:.0f} ms (vLLM {delta['prefill_sum'] * 1e3:.0f}), "
        f"{phase} {xfer_ms:.1f} ms (vLLM {delta['xfer_sum'] * 1e3:.1f})"
    )


@pytest.mark.pd("pull")
def test_push_pull_ttft_difference_is_named_at_the_highest_load(
    loaded: dict[str, RunAnalysis],
) -> None:
    """Every millisecond of the mean TTFT difference at 8 in flight has a mechanism."""
    if set(loaded) != {"push", "pull"}:
        pytest.skip("needs both runs of test_engine_phases_agree_with_vllm_under_load")
    means: dict[str, dict[str, float]] = {}
    ttft: dict[str, float] = {}
    for mode, run in loaded.items():
        reqs = [r for r in run.requests if r.ttft_ms is not None]
        ttft[mode] = sum(r.ttft_ms for r in reqs) / len(reqs)
        acc: dict[str, float] = {}
        for r in reqs:
            for ph, ms in r.phase_ms().items():
                acc[ph] = acc.get(ph, 0.0) + ms / len(reqs)
        means[mode] = acc
    delta = ttft["push"] - ttft["pull"]
    by_phase = {
        ph: means["push"].get(ph, 0.0) - means["pull"].get(ph, 0.0)
        for ph in set(means["push"]) | set(means["pull"])
    }
    assert abs(sum(by_phase.values()) - delta) < 1e-6 * max(1.0, abs(delta))
    unattributed = abs(by_phase.get(phases.UNATTRIBUTED, 0.0))
    assert unattributed < 0.01 * abs(delta), (delta, by_phase)
    top = sorted(by_phase.items(), key=lambda kv: -abs(kv[1]))[:5]
    print(f"\npush - pull mean TTFT at {CONCURRENCY} in flight: {delta:+.1f} ms")
    for ph, ms in top:
        print(f"  {ph:24s} {ms:+9.1f} ms")
