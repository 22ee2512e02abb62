"""Sampling end to end on the real 1P1D (issue 12, item 3): "With a 1% sampler, a
500-request run yields about 5 traces, and no engine spans for the rest."

The shared deployment's proxy samples everything, so each mode starts a proxy of its own
(`tracedpush proxy`, as `tracedpush up` starts it, on a free port, with its own trace
directory) with OTEL_TRACES_SAMPLER=traceidratio and OTEL_TRACES_SAMPLER_ARG=0.01, in
front of the shared engines. 500 small completions go through it, 8 at a time. Then:

* every request was answered;
* the proxy's store holds one trace per sampled request, and their number is within a
  binomial bound of 5 (0..15; P(X > 15) is about 1e-4 at n=500, p=0.01);
* the engines' trace directory got request spans for exactly those request ids (the
  sampled ones whole: every span the mode requires), none for the 495 or so others;
* the engine that moves the KV still observed every request in its phase histogram
  (`tracedpush_kv_phase_seconds`, WRITE on P in push, READ on D in pull): metrics are
  for every request, traces are sampled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze
from tracedpush.launcher import Deployment, servers
from tracedpush.launcher.metrics import metric_sum
from tracedpush.launcher.processes import ManagedProcess, stop_all, wait_healthy
from tracedpush.testing.net import free_port

MODES = [pytest.param(m, marks=pytest.mark.pd(m), id=m) for m in ("push", "pull")]
N = 500
RATIO = 0.01
CONCURRENCY = 8
PROMPT_TOKENS = 16
MAX_TRACES = 15  # binomial(500, 0.01): mean 5, sd 2.2; P(X > 15) ~ 1e-4
KV_PHASE = {"push": ("prefill", "WRITE"), "pull": ("decode", "READ")}

pytestmark = pytest.mark.timeout(600)


def start_proxy(pd: Deployment, traces: Path, log: Path) -> tuple[ManagedProcess, str]:
    """`tracedpush proxy` as the launcher starts it, with a 1% trace-id-ratio sampler."""
    port = free_port()
    argv = servers.proxy_argv(pd.mode, pd.prefills, pd.decodes, "127.0.0.1", port, traces)
    proc = ManagedProcess(
        "proxy-sampled", argv, log, ports=(port,), health_url=f"http://127.0.0.1:{port}/health"
    )
    env = servers.common_env()
    env.update({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(RATIO)})
    proc.start(env)
    wait_healthy([proc], timeout=60, interval=0.25)
    return proc, f"http://127.0.0.1:{port}"


async def drive(url: str, model: str, ids: list[str]) -> list[int]:
    """One 16-token, 2-token-answer completion per id, CONCURRENCY at a time; statuses."""
    sem = asyncio.Semaphore(CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=120)

    async def one(session: aiohttp.ClientSession, i: int, rid: str) -> int:
        prompt = [200 + (i * PROMPT_TOKENS + k) % 15000 for k in range(PROMPT_TOKENS)]
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
        async with (
            sem,
            session.post(f"{url}/v1/completions", json=body, headers={"X-Request-Id": rid}) as resp,
        ):
            await resp.read()
            return resp.status

    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(*(one(session, i, rid) for i, rid in enumerate(ids)))


def request_ids(spans, prefix: str, services: set[str]) -> set[str]:
    """Request ids of this run among the request spans of `services`."""
    out = set()
    for s in spans:
        rid = s.attributes.get(sc.REQUEST_ID)
        if s.resource.service in services and isinstance(rid, str) and rid.startswith(prefix):
            out.add(rid)
    return out


def phase_count(pd: Deployment, mode: str) -> float:
    role, phase = KV_PHASE[mode]
    url = pd.prefill_url if role == "prefill" else pd.decode_url
    return metric_sum(url, f"{sc.METRIC_KV_PHASE}_count", phase=phase)


@pytest.mark.parametrize("mode", MODES)
def test_one_percent_sampler_traces_about_5_of_500(pd, mode, tmp_path, figures):
    prefix = f"samp-{mode}-{uuid.uuid4().hex[:6]}-"
    ids = [f"{prefix}{i:03d}" for i in range(N)]
    proxy_traces = tmp_path / "proxy-traces"
    proxy_traces.mkdir()  # readable even if no request is sampled (p = 0.7%)
    proc, url = start_proxy(pd, proxy_traces, tmp_path / "proxy.log")
    try:
        ready = (tmp_path / "proxy.log").read_text()
        assert "sampler traceidratio at 1%" in ready, ready
        observed_before = phase_count(pd, mode)
        t0 = time.monotonic()
        statuses = asyncio.run(drive(url, pd.model_name, ids))
        seconds = time.monotonic() - t0
    finally:
        report = stop_all([proc])  # SIGTERM: the proxy flushes its spans before exit
    assert report.clean, report
    assert statuses.count(200) == N, sorted(set(statuses))

    proxy_store = TraceStore.from_path(proxy_traces)
    roots = [s for s in proxy_store.all_spans() if s.name == sc.SPAN_REQUEST]
    sampled = {s.attributes[sc.REQUEST_ID] for s in roots}
    assert len(roots) == len(sampled) <= MAX_TRACES
    assert sampled <= set(ids)
    assert {s.attributes[sc.SAMPLER_RATIO] for s in roots} <= {RATIO}
    assert all(s.attributes[sc.SAMPLER] == "traceidratio" for s in roots)
    assert {s.resource.service for s in proxy_store.all_spans()} <= {sc.SERVICE_PROXY}

    # The engines' spans for the sampled requests: whole traces, with the proxy's.
    engine_services = {sc.SERVICE_PREFILL, sc.SERVICE_DECODE}
    deadline = time.monotonic() + 60
    while True:
        store = TraceStore.from_paths([proxy_traces, pd.traces_dir])
        mine = [r for r in analyze(store, spans=False).requests if r.request_id in sampled]
        if len(mine) == len(sampled) and all(r.complete for r in mine):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"sampled traces not whole after 60 s: {[r.problems for r in mine]}")
        time.sleep(1.0)
    # Every request ended long ago and the builders drop an unsampled one as soon as its
    # context arrives: a few more seconds would show any span built for the others.
    time.sleep(3.0)
    engine_spans = TraceStore.from_path(pd.traces_dir).all_spans()
    assert request_ids(engine_spans, prefix, engine_services) == sampled

    # Metrics for every request: the KV phase histogram counted all of them. Our
    # observations reach /metrics as the engine steps, so a few extra requests (on the
    # shared proxy) push the last ones out.
    deadline = time.monotonic() + 60
    nudges = 0
    while (observed := phase_count(pd, mode) - observed_before) < N:
        if time.monotonic() > deadline:
            pytest.fail(f"{sc.METRIC_KV_PHASE} counted {observed:.0f} of {N} requests")
        asyncio.run(drive(pd.proxy_url, pd.model_name, [f"{prefix}nudge-{nudges}"]))
        nudges += 1
        time.sleep(0.5)

    figures.record(
        mode=mode,
        requests=N,
        ratio=RATIO,
        traces=len(sampled),
        seconds=round(seconds, 1),
        phase_observations=observed,
    )
    print(
        f"{mode}: {len(sampled)} traces of {N} requests in {seconds:.1f} s; {observed:.0f} observed"
    )
