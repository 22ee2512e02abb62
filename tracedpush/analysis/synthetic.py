"""Realistic synthetic push/pull traces in the exact file format the exporters write.

Tests, benchmarks and the console need many requests with known answers and no vLLM.
`generate()` simulates a 1P1D behind the proxy (a FIFO prefill engine, decode steps,
per-step polling, first-contact handshakes, NIXL transfer times from KV bytes) and
emits the span tree of docs/spans.md as OTLP JSON lines, one `TracesData` per line,
batched per process like OpenTelemetry's file exporter. Each request comes with its
ground truth (TTFT, which rendezvous input came first, the phases expected on the
critical path), and clocks can be skewed per instance to test the correction.

    run = generate(200, seed=1, clock_offsets_ms={"decode-0": 50})
    run.write("/tmp/traces")          # push/*.jsonl, pull/*.jsonl
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis import phases as ph
from tracedpush.analysis._gc import paused_gc

PROXY_INSTANCE = "proxy-host:8000"
PREFILL_INSTANCE = "prefill-0"
DECODE_INSTANCE = "decode-0"
DEFAULT_HOSTS = {
    PROXY_INSTANCE: "proxy-host",
    PREFILL_INSTANCE: "p-host",
    DECODE_INSTANCE: "d-host",
}
BLOCK_TOKENS = 16
KV_BYTES_PER_TOKEN = 4096
PREFILL_CHUNK_TOKENS = 512  # tokens per prefill engine step (tracedpush.prefill.steps)
PROXY_BUILD_MS = 0.1  # a proxy leg: span start -> its bytes written (request_sent)


@dataclass(slots=True)
class SyntheticRequest:
    """Ground truth for one generated request (true clock, ms from the proxy's receipt)."""

    trace_id: str
    request_id: str
    mode: str
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float
    tpot_ms: float
    start_unix_ns: int
    rendezvous_first: str | None  # push: "registration" or "prefill"
    expected_path: tuple[str, ...]  # phases expected on the critical path, in order
    expected_hidden: tuple[str, ...]  # phases expected to be hidden
    dropped: tuple[str, ...] = ()  # span names removed to simulate loss
    # engine-local phases the simulation knows exactly: {"prefill"|"decode": {phase: ms}}
    expected_engine_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    prefill_steps: int = 0


@dataclass
class SyntheticRun:
    """Generated traces: ``files`` maps a relative file name to its lines (documents)."""

    files: dict[str, list[dict[str, Any]]]
    requests: list[SyntheticRequest]
    clock_offsets_ms: dict[str, float] = field(default_factory=dict)

    @property
    def documents(self) -> list[dict[str, Any]]:
        return [doc for docs in self.files.values() for doc in docs]

    @paused_gc()
    def write(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write every file as JSON lines under `directory`; returns the paths."""
        out = []
        root = Path(directory)
        for name, docs in self.files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as fh:
                for doc in docs:
                    fh.write(json.dumps(doc, separators=(",", ":")))
                    fh.write("\n")
            out.append(path)
        return out

    def by_trace(self) -> dict[str, SyntheticRequest]:
        return {r.trace_id: r for r in self.requests}


# ------------------------------------------------------------------ OTLP encoding


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attrs(d: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in d.items() if v is not None]


@dataclass(slots=True)
class _Proc:
    service: str
    instance: str
    host: str
    pid: int
    spans: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (end_ns, span)

    def resource(self) -> dict[str, Any]:
        return {
            "attributes": _attrs(
                {
                    sc.RES_SERVICE_NAME: self.service,
                    sc.RES_SERVICE_INSTANCE_ID: self.instance,
                    sc.RES_HOST_NAME: self.host,
                    sc.RES_PROCESS_PID: self.pid,
                    sc.RES_TRACEDPUSH_VERSION: "0.1.0",
                }
            )
        }


class _Emitter:
    """Builds span dicts on the true clock and writes them with per-instance skew."""

    def __init__(self, rng: random.Random, base_ns: int, offsets_ns: Mapping[str, int]) -> None:
        self.rng = rng
        self.base_ns = base_ns
        self.offsets_ns = offsets_ns

    def new_id(self, nbytes: int) -> str:
        return f"{self.rng.getrandbits(nbytes * 8):0{nbytes * 2}x}"

    def ns(self, ms: float, proc: _Proc) -> int:
        return self.base_ns + round(ms * 1e6) + self.offsets_ns.get(proc.instance, 0)

    def span(
        self,
        proc: _Proc,
        trace_id: str,
        parent: str,
        name: str,
        start_ms: float,
        end_ms: float,
        attrs: Mapping[str, Any],
        *,
        kind: int = 1,
        events: Sequence[tuple[str, float]] = (),
        error: str | None = None,
    ) -> str:
        span_id = self.new_id(8)
        end_ns = self.ns(max(end_ms, start_ms), proc)
        d: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": span_id,
            "parentSpanId": parent,
            "name": name,
            "kind": kind,
            "startTimeUnixNano": str(self.ns(start_ms, proc)),
            "endTimeUnixNano": str(end_ns),
            "attributes": _attrs(attrs),
            "events": [
                {"timeUnixNano": str(self.ns(t, proc)), "name": n, "attributes": []}
                for n, t in events
            ],
            "links": [],
            "status": {"code": 2, "message": error} if error else {"code": 0},
        }
        proc.spans.append((end_ns, d))
        return span_id


def _lines(proc: _Proc, batch: int) -> list[dict[str, Any]]:
    """Spans in export order (by end time), `batch` per TracesData line."""
    spans = [d for _, d in sorted(proc.spans, key=lambda t: t[0])]
    resource = proc.resource()
    return [
        {
            "resourceSpans": [
                {
                    "resource": resource,
                    "scopeSpans": [
                        {
                            "scope": {"name": sc.INSTRUMENTATION_SCOPE, "version": "0.1.0"},
                            "spans": spans[i : i + batch],
                        }
                    ],
                }
            ]
        }
        for i in range(0, len(spans), batch)
    ]


# ------------------------------------------------------------------ simulation


def _prompt_lengths(rng: random.Random, n: int, spec: Any) -> list[int]:
    if spec is None:  # log-uniform 64..8192: every default bucket gets requests
        return [int(math.exp(rng.uniform(math.log(64), math.log(8192)))) for _ in range(n)]
    if isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = spec
        return [rng.randint(lo, hi) for _ in range(n)]
    seq = list(spec)
    return [seq[i % len(seq)] for i in range(n)]


@paused_gc()
def generate(
    n_requests: int = 100,
    *,
    modes: Sequence[str] = ("push", "pull"),
    seed: int = 0,
    prompt_tokens: Any = None,
    output_tokens: tuple[int, int] = (16, 64),
    qps: Sequence[float] = (2.0, 6.0, 12.0),
    clock_offsets_ms: Mapping[str, float] | None = None,
    hosts: Mapping[str, str] | None = None,
    start_unix_s: float = 1_760_000_000.0,
    batch: int = 64,
    drop_spans: Mapping[str, float] | None = None,
    registration_late: float = 0.15,
    http_received: bool = True,
    engine_steps: bool = True,
    unpinned_decode: bool = False,
) -> SyntheticRun:
    """Simulate `n_requests` split evenly over `modes`, one run per mode, in sequence.

    `prompt_tokens`: None (log-uniform 64..8192), ``(lo, hi)`` or a sequence cycled.
    `qps`: arrival rates cycled in waves of 25 requests, so load varies within a run.
    `clock_offsets_ms`: instance -> how far its clock is ahead of the proxy's.
    `drop_spans`: span name -> probability that a request loses that span.
    `registration_late`: push: share of requests whose D registration arrives after P
    finished prefill (D admission delayed), so both rendezvous orders occur.
    `http_received=False`: engines without the HTTP middleware (and traces from before
    it): no ``http_received`` events, engine spans start at vLLM's arrival time.
    `engine_steps`: add the per-process step traces (``engine.steps``, ``engine.threads``;
    see `synthetic_steps`). `unpinned_decode`: D's EngineCore thread may run on P's core
    (give both engines one host with `hosts` to see it as cross-engine contention).
    """
    rng = random.Random(seed)
    offsets_ns = {k: round(v * 1e6) for k, v in (clock_offsets_ms or {}).items()}
    host_of = {**DEFAULT_HOSTS, **(hosts or {})}
    base_ns = int(start_unix_s * 1e9)
    em = _Emitter(rng, base_ns, offsets_ns)
    files: dict[str, list[dict[str, Any]]] = {}
    requests: list[SyntheticRequest] = []
    per_mode = [n_requests // len(modes) + (i < n_requests % len(modes)) for i in range(len(modes))]
    t0 = 0.0
    for mi, (mode, n) in enumerate(zip(modes, per_mode, strict=True)):
        pid0 = 1000 * (mi + 1)
        procs = {
            "proxy": _Proc(sc.SERVICE_PROXY, PROXY_INSTANCE, host_of[PROXY_INSTANCE], pid0),
            "p_sched": _Proc(
                sc.SERVICE_PREFILL, PREFILL_INSTANCE, host_of[PREFILL_INSTANCE], pid0 + 1
            ),
            "p_work": _Proc(
                sc.SERVICE_PREFILL, PREFILL_INSTANCE, host_of[PREFILL_INSTANCE], pid0 + 2
            ),
            "d_sched": _Proc(
                sc.SERVICE_DECODE, DECODE_INSTANCE, host_of[DECODE_INSTANCE], pid0 + 3
            ),
            "d_work": _Proc(sc.SERVICE_DECODE, DECODE_INSTANCE, host_of[DECODE_INSTANCE], pid0 + 4),
        }
        sim = _Sim(em, rng, mode, procs, drop_spans or {}, registration_late)
        sim.http_received = http_received
        prompts = _prompt_lengths(rng, n, prompt_tokens)
        t = t0
        for i in range(n):
            rate = qps[(i // 25) % len(qps)]
            t += rng.expovariate(rate) * 1000.0
            outs = rng.randint(*output_tokens)
            requests.append(sim.request(f"{mode}-{i:05d}", t, prompts[i], outs, first=i == 0))
        t0 = sim.last_end_ms + 1000.0
        if engine_steps:
            from tracedpush.analysis.synthetic_steps import add_process_traces

            add_process_traces(
                em, procs, mode, seed=seed * 7919 + mi, unpinned_decode=unpinned_decode
            )
        for key, proc in procs.items():
            if proc.spans:
                files[f"{mode}/{proc.service}-{key}-{proc.pid}.jsonl"] = _lines(proc, batch)
    return SyntheticRun(files, requests, dict(clock_offsets_ms or {}))


class _Sim:
    """One mode's deployment: a FIFO prefill engine and a stepping decode engine."""

    def __init__(
        self,
        em: _Emitter,
        rng: random.Random,
        mode: str,
        procs: dict[str, _Proc],
        drop: Mapping[str, float],
        registration_late: float,
    ) -> None:
        self.em, self.rng, self.mode, self.p, self.drop = em, rng, mode, procs, drop
        self.registration_late = registration_late
        self.p_free = 0.0  # prefill engine busy until
        self.w_free = 0.0  # push writer thread busy until
        self.http_received = True  # emit http_received (the API-server middleware is on)
        self.inflight: list[float] = []  # end times of requests in flight at the proxy
        self.last_end_ms = 0.0

    def net(self) -> float:
        return 0.25 + self.rng.expovariate(10.0)  # one way, ~0.35 ms mean, symmetric

    def request(
        self, rid: str, t: float, prompt: int, outs: int, *, first: bool
    ) -> SyntheticRequest:
        rng, em, p, mode = self.rng, self.em, self.p, self.mode
        self.inflight = [e for e in self.inflight if e > t]
        load = len(self.inflight) + 1
        step = 6.0 + 0.6 * load + prompt * 0.0004  # decode step period (ms)
        tpot = step
        blocks = -(-prompt // BLOCK_TOKENS)
        kv_bytes = prompt * KV_BYTES_PER_TOKEN
        xfer = 0.05 + kv_bytes / 5e6  # ms at 5 GB/s
        drop = {n for n, pr in self.drop.items() if rng.random() < pr}
        trace_id = em.new_id(16)
        local = f"{rid}-{em.new_id(4)}"

        # ---- proxy and prefill (both modes)
        # Every engine leg: network (proxy -> HTTP server), api server (HTTP, tokenization,
        # IPC; vLLM's arrival_time is stamped after tokenization), queue wait (FIFO).
        pp_start = t + 0.2 + rng.random() * 0.1
        p_sent = pp_start + PROXY_BUILD_MS  # the leg's bytes leave the proxy
        p_http = p_sent + self.net()
        p_api = 0.4 + prompt * 0.0002 + rng.uniform(0.0, 0.3) * load
        p_arrival = p_http + 0.6 * p_api
        p_sched = p_http + p_api
        compute_start = max(p_sched + rng.uniform(0.05, 0.3), self.p_free)  # FIFO queue
        compute = 4.0 + prompt * 0.03
        p_steps = -(-prompt // PREFILL_CHUNK_TOKENS)
        self.p_free = compute_start + compute
        pre_end = self.p_free + 0.2
        pp_end = pre_end + 0.8 + self.net()
        pre_start = p_http if self.http_received else p_arrival
        p_step = 4.0 + 1.5 * load  # P's engine step (another request's chunk) under load

        rdv_first: str | None = None
        handoff = writer_q = reg_wait = 0.0
        if mode == "push":
            pd_start = t + 0.25 + rng.random() * 0.1
            d_sent = pd_start + PROXY_BUILD_MS
            d_http = d_sent + self.net()
            d_api = 0.3 + prompt * 0.0001 + rng.uniform(0.0, 0.2)
            d_sched = d_http + d_api
            alloc = d_sched + rng.uniform(0.2, step)
            if rng.random() < self.registration_late:
                alloc = max(alloc, pre_end + rng.uniform(1.0, 10.0))
            reg_start = alloc
            reg_end = reg_start + 0.3 + (10.0 if first else 0.0) + blocks * 0.001
            reg_arrival = reg_end + 0.2 + rng.uniform(0.0, 0.3)
            fin = pre_end  # P's scheduler finished it (prefill_finished)
            # P's worker takes the finished blocks up at its next step, after its forward
            handed = fin + rng.uniform(0.05, p_step)
            ready = max(fin, reg_arrival)
            handoff = max(handed - ready, 0.0)
            # the writer starts it once it has both, after the requests queued before it
            w_ready = max(handed, ready)
            rdv_end = max(w_ready, self.w_free) + rng.uniform(0.05, 0.3)
            writer_q = rdv_end - w_ready
            reg_wait = max(reg_arrival - fin, 0.0)
            rdv_first = "registration" if reg_arrival <= fin else "prefill"
            rdv_start = min(reg_arrival, fin)
            hs = (rdv_end + 0.05, rdv_end + 12.0) if first else None
            dp_start = (hs[1] if hs else rdv_end) + 0.05 + rng.uniform(0.0, 0.1)
            dp_end = dp_start + 0.15 + blocks * 0.002
            w_start = dp_end + 0.05
            poll_lag = rng.uniform(0.0, step)
            w_end = w_start + xfer + poll_lag
            self.w_free = w_start  # the writer posts and moves on
            landed = w_start + xfer
            nt_start = landed + 0.1 + rng.uniform(0.0, step)
            nt_end = nt_start
            kv_done = nt_end
        else:  # pull
            relay_start = pp_end + 0.05
            relay_end = relay_start + 0.1 + rng.uniform(0.0, 0.1)
            pd_start = relay_end
            d_sent = pd_start + PROXY_BUILD_MS
            d_http = d_sent + self.net()
            d_api = 0.3 + prompt * 0.0001 + rng.uniform(0.0, 0.2)
            d_sched = d_http + d_api
            alloc = d_sched + rng.uniform(0.1, 1.0)
            load_start = alloc + rng.uniform(0.2, step)  # D's worker, at its next step
            hs = (load_start + 0.05, load_start + 15.0) if first else None
            dp_start = (hs[1] if hs else load_start) + 0.05
            handoff = dp_start - alloc - (hs[1] - hs[0] if hs else 0.0)
            dp_end = dp_start + 0.3 + blocks * 0.02 * (1 + 0.2 * load)
            r_start = dp_end + 0.05
            poll_lag = rng.uniform(0.0, step)
            r_end = r_start + xfer + poll_lag
            nt_start = r_start + xfer + 0.1 + rng.uniform(0.0, 5.0)
            nt_end = nt_start
            kv_done = r_end
        dec_start = d_http if self.http_received else d_http + 0.6 * d_api

        dec_end = kv_done + rng.uniform(0.1, step)
        pd_ft = dec_end + step + 0.3 + self.net()
        ft = pd_ft + 0.1
        end = ft + (outs - 1) * tpot + 0.2
        pd_end = end - 0.1
        self.inflight.append(end)
        self.last_end_ms = max(self.last_end_ms, end)

        # ---- emit
        common = {sc.MODE: mode, sc.REQUEST_ID: rid}
        eng_p = {
            **common,
            sc.ROLE: "prefill",
            sc.ENGINE_ID: PREFILL_INSTANCE,
            sc.LOCAL_REQUEST_ID: local,
        }
        eng_d = {
            **common,
            sc.ROLE: "decode",
            sc.ENGINE_ID: DECODE_INSTANCE,
            sc.LOCAL_REQUEST_ID: local,
        }
        remote_d = {
            sc.REMOTE_ENGINE_ID: DECODE_INSTANCE,
            sc.REMOTE_HOST: "d-host",
            sc.REMOTE_PORT: 5600,
        }
        remote_p = {
            sc.REMOTE_ENGINE_ID: PREFILL_INSTANCE,
            sc.REMOTE_HOST: "p-host",
            sc.REMOTE_PORT: 5500,
        }
        kv = {sc.KV_BLOCKS: blocks, sc.KV_DESCRIPTORS: blocks}
        xfer_attrs = {
            **kv,
            sc.KV_BYTES: kv_bytes,
            sc.NIXL_POST_US: 40,
            sc.NIXL_XFER_US: round(xfer * 1000),
            sc.POLL_LAG_US: round(poll_lag * 1000),
        }

        def emit(
            proc: str, parent: str, name: str, s: float, e: float, attrs: dict, **kw: Any
        ) -> str:
            if name in drop:
                return parent
            return em.span(p[proc], trace_id, parent, name, s, e, attrs, **kw)

        root = emit(
            "proxy",
            "",
            sc.SPAN_REQUEST,
            t,
            end,
            {
                **common,
                sc.ROLE: "proxy",
                sc.PROMPT_TOKENS: prompt,
                sc.OUTPUT_TOKENS: outs,
                sc.STREAM: True,
                sc.TTFT_MS: round(ft - t, 3),
                sc.HTTP_METHOD: "POST",
                sc.HTTP_ROUTE: "/v1/completions",
                sc.HTTP_STATUS: 200,
            },
            kind=2,
            events=[(sc.EVENT_FIRST_TOKEN, ft)],
        )
        leg = {**common, sc.ROLE: "proxy", sc.HTTP_METHOD: "POST", sc.HTTP_STATUS: 200}
        ppid = emit(
            "proxy",
            root,
            sc.SPAN_PROXY_PREFILL,
            pp_start,
            pp_end,
            {**leg, sc.ENGINE_ID: PREFILL_INSTANCE, sc.UPSTREAM_URL: "http://p-host:8100"},
            kind=3,
            events=[(sc.EVENT_REQUEST_SENT, p_sent)],
        )
        http_ev = [(sc.EVENT_HTTP_RECEIVED, p_http)] if self.http_received else []
        pre = emit(
            "p_sched",
            ppid,
            sc.SPAN_PREFILL,
            pre_start,
            pre_end,
            {
                **eng_p,
                sc.THREAD: "scheduler",
                sc.PROMPT_TOKENS: prompt,
                sc.PREFILL_STEPS: p_steps,
            },
            events=[
                *http_ev,
                (sc.EVENT_SCHEDULER_RECEIVED, p_sched),
                (sc.EVENT_COMPUTE_STARTED, compute_start),
            ],
        )
        w = {sc.TP_RANK: 0}
        if mode == "pull":
            emit(
                "proxy",
                root,
                sc.SPAN_KV_RELAY,
                relay_start,
                relay_end,
                {**common, sc.ROLE: "proxy"},
            )
        pdid = emit(
            "proxy",
            root,
            sc.SPAN_PROXY_DECODE,
            pd_start,
            pd_end,
            {**leg, sc.ENGINE_ID: DECODE_INSTANCE, sc.UPSTREAM_URL: "http://d-host:8200"},
            kind=3,
            events=[(sc.EVENT_REQUEST_SENT, d_sent), (sc.EVENT_FIRST_TOKEN, pd_ft)],
        )
        dec = emit(
            "d_sched",
            pdid,
            sc.SPAN_DECODE,
            dec_start,
            dec_end,
            {
                **eng_d,
                sc.THREAD: "scheduler",
                sc.PROMPT_TOKENS: prompt,
                sc.DECODE_END: "first_token_scheduled",
            },
            events=[
                *([(sc.EVENT_HTTP_RECEIVED, d_http)] if self.http_received else []),
                (sc.EVENT_SCHEDULER_RECEIVED, d_sched),
                (sc.EVENT_BLOCKS_ALLOCATED, alloc),
            ],
        )
        if mode == "push":
            emit(
                "d_work",
                dec,
                sc.SPAN_KV_REGISTER,
                reg_start,
                reg_end,
                {**eng_d, **w, **remote_p, sc.THREAD: "push_writer", sc.KV_BLOCKS: blocks},
            )
            emit(
                "p_work",
                pre,
                sc.SPAN_KV_RENDEZVOUS,
                rdv_start,
                rdv_end,
                {
                    **eng_p,
                    **w,
                    **remote_d,
                    sc.THREAD: "push_writer",
                    sc.RENDEZVOUS_FIRST: rdv_first,
                },
                events=sorted(
                    [
                        (sc.EVENT_REGISTRATION_ARRIVED, reg_arrival),
                        (sc.EVENT_PREFILL_FINISHED, fin),
                        (sc.EVENT_HANDED_TO_WRITER, handed),
                    ],
                    key=lambda e: e[1],
                ),
            )
            if hs:
                emit(
                    "p_work",
                    pre,
                    sc.SPAN_KV_HANDSHAKE,
                    hs[0],
                    hs[1],
                    {**eng_p, **w, **remote_d, sc.THREAD: "push_writer"},
                )
            emit(
                "p_work",
                pre,
                sc.SPAN_KV_DESC_PREP,
                dp_start,
                dp_end,
                {**eng_p, **w, **remote_d, **kv, sc.THREAD: "push_writer"},
            )
            emit(
                "p_work",
                pre,
                sc.SPAN_KV_WRITE,
                w_start,
                w_end,
                {**eng_p, **w, **remote_d, **xfer_attrs, sc.THREAD: "push_writer"},
            )
            emit(
                "d_work",
                dec,
                sc.SPAN_KV_NOTIFY,
                nt_start,
                nt_end,
                {
                    **eng_d,
                    **w,
                    **remote_p,
                    sc.THREAD: "model_runner",
                    sc.NOTIFY_EXPECTED: 1,
                    sc.NOTIFY_RECEIVED: 1,
                },
            )
            p_leg = [ph.PROXY, ph.NETWORK, ph.API_SERVER, ph.QUEUE_WAIT]
            p_parts = [ph.API_SERVER, ph.QUEUE_WAIT, ph.PREFILL_COMPUTE]
            if rdv_first == "registration":  # prefill came second: P's leg is on the path
                path = [*p_leg, ph.PREFILL_COMPUTE]
                hidden = [ph.REGISTRATION]
            else:
                path = [*p_leg, ph.REGISTRATION, ph.REGISTRATION_DELIVERY]
                hidden = [*p_parts, ph.REGISTRATION_WAIT]
            if handoff > 0:
                path.append(ph.STEP_HANDOFF)
            path += [ph.WRITER_QUEUE, ph.DESC_PREP]
            if hs:
                path += [ph.HANDSHAKE, ph.DESC_PREP]
            path += [ph.WRITE, ph.NOTIFICATION, ph.DECODE_SCHEDULING]
            hidden.append(ph.POLL_LAG)
        else:
            if hs:
                emit(
                    "d_work",
                    dec,
                    sc.SPAN_KV_HANDSHAKE,
                    hs[0],
                    hs[1],
                    {**eng_d, **w, **remote_p, sc.THREAD: "model_runner"},
                )
            emit(
                "d_work",
                dec,
                sc.SPAN_KV_DESC_PREP,
                dp_start,
                dp_end,
                {**eng_d, **w, **remote_p, **kv, sc.THREAD: "model_runner"},
            )
            emit(
                "d_work",
                dec,
                sc.SPAN_KV_READ,
                r_start,
                r_end,
                {**eng_d, **w, **remote_p, **xfer_attrs, sc.THREAD: "model_runner"},
            )
            emit(
                "p_work",
                pre,
                sc.SPAN_KV_NOTIFY,
                nt_start,
                nt_end,
                {
                    **eng_p,
                    **w,
                    **remote_d,
                    sc.THREAD: "model_runner",
                    sc.NOTIFY_EXPECTED: 1,
                    sc.NOTIFY_RECEIVED: 1,
                },
            )
            leg = [ph.NETWORK, ph.API_SERVER, ph.QUEUE_WAIT]
            path = [ph.PROXY, *leg, ph.PREFILL_COMPUTE, ph.RESPONSE, ph.PROXY, ph.RELAY]
            path += [*leg, ph.STEP_HANDOFF]
            if hs:
                path += [ph.HANDSHAKE, ph.STEP_HANDOFF]
            path += [ph.DESC_PREP, ph.READ, ph.POLL_LAG, ph.DECODE_SCHEDULING]
            hidden = [sc.SPAN_KV_NOTIFY]
        path += [ph.FIRST_DECODE_STEP, ph.PROXY]
        truth = {
            "prefill": {
                ph.QUEUE_WAIT: compute_start - p_sched,
                ph.PREFILL_COMPUTE: pre_end - compute_start,
            },
            "decode": {ph.QUEUE_WAIT: alloc - d_sched},
        }
        if self.http_received:
            truth["prefill"][ph.API_SERVER] = p_sched - p_http
            truth["decode"][ph.API_SERVER] = d_sched - d_http
        if mode == "push":
            truth["prefill"].update(
                {
                    ph.WRITE: round(xfer * 1000) / 1000,
                    ph.STEP_HANDOFF: handoff,
                    ph.WRITER_QUEUE: writer_q,
                    ph.REGISTRATION_WAIT: reg_wait,
                }
            )
        else:
            truth["decode"].update({ph.READ: round(xfer * 1000) / 1000, ph.STEP_HANDOFF: handoff})
        return SyntheticRequest(
            trace_id=trace_id,
            request_id=rid,
            mode=mode,
            prompt_tokens=prompt,
            output_tokens=outs,
            ttft_ms=ft - t,
            tpot_ms=tpot,
            start_unix_ns=em.base_ns + round(t * 1e6),
            rendezvous_first=rdv_first,
            expected_path=tuple(path),
            expected_hidden=tuple(hidden),
            dropped=tuple(sorted(drop)),
            expected_engine_ms=truth,
            prefill_steps=p_steps,
        )


# ------------------------------------------------------------------ skew injection


def shift_documents(
    docs: Iterable[dict[str, Any]], instance: str, delta_ms: float, *, own_hosts: bool = False
) -> list[dict[str, Any]]:
    """Copies of OTLP `TracesData` documents with every timestamp of one instance
    (resource ``service.instance.id``) moved by `delta_ms`: a clock `delta_ms` ahead.
    `own_hosts`: also rename every instance's ``host.name`` to its instance id, so a
    one-host run reads as one host per instance (whose clocks are not tied)."""
    delta = round(delta_ms * 1e6)
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        for rs in doc.get("resourceSpans") or ():
            res_attrs = (rs.get("resource") or {}).get("attributes") or ()
            attrs = {a["key"]: a["value"] for a in res_attrs}
            inst = attrs.get(sc.RES_SERVICE_INSTANCE_ID, {}).get("stringValue")
            if own_hosts and inst is not None:
                for a in res_attrs:
                    if a["key"] == sc.RES_HOST_NAME:
                        a["value"] = {"stringValue": inst}
            if inst != instance:
                continue
            for ss in rs.get("scopeSpans") or ():
                for s in ss.get("spans") or ():
                    for key in ("startTimeUnixNano", "endTimeUnixNano"):
                        s[key] = str(int(s[key]) + delta)
                    for ev in s.get("events") or ():
                        ev["timeUnixNano"] = str(int(ev["timeUnixNano"]) + delta)
        out.append(doc)
    return out


def shift_directory(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    instance: str,
    delta_ms: float,
    *,
    own_hosts: bool = False,
) -> int:
    """Copy a traces directory, shifting one instance's clock (and with `own_hosts`,
    giving each instance its own host; see `shift_documents`); returns lines written.
    Lines that do not parse are copied unchanged."""
    src, dst = Path(src), Path(dst)
    n = 0
    for f in sorted(src.rglob("*.json*")):
        if f.suffix not in (".json", ".jsonl") or not f.is_file():
            continue
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        with f.open() as fin, target.open("w") as fout:
            for line in fin:
                try:
                    doc = json.loads(line)
                except ValueError:
                    fout.write(line)
                    continue
                (doc,) = shift_documents([doc], instance, delta_ms, own_hosts=own_hosts)
                fout.write(json.dumps(doc, separators=(",", ":")) + "\n")
                n += 1
    return n
