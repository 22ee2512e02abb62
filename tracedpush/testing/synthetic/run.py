"""`generate`: simulate runs mode by mode and collect their files and ground truth."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from tracedpush import semconv as sc
from tracedpush.analysis._gc import paused_gc
from tracedpush.testing.synthetic.deployment import (
    DECODE_INSTANCE,
    DEFAULT_HOSTS,
    PREFILL_INSTANCE,
    PROXY_INSTANCE,
)
from tracedpush.testing.synthetic.encode import Emitter, Process
from tracedpush.testing.synthetic.expected import SyntheticRequest, engine_truth, expected_path
from tracedpush.testing.synthetic.pull import pull_leg
from tracedpush.testing.synthetic.push import PushLeg, push_leg
from tracedpush.testing.synthetic.spans import emit_request
from tracedpush.testing.synthetic.steps import add_process_traces
from tracedpush.testing.synthetic.timeline import Deployment, arrive, finish, prefill_leg


@dataclass
class SyntheticRun:
    """Generated traces: ``files`` maps a relative file name to its lines (documents)."""

    files: dict[str, list[dict[str, Any]]]
    requests: list[SyntheticRequest]
    clock_offsets_ms: dict[str, float] = field(default_factory=dict)
    # the same spans as SDK `ReadableSpan`s per file (one process each, export order),
    # for feeding real exporters (OTLP to `tracedpush collect`)
    spans: dict[str, list[ReadableSpan]] = field(default_factory=dict)

    @property
    def documents(self) -> list[dict[str, Any]]:
        return [doc for docs in self.files.values() for doc in docs]

    @paused_gc()
    def write(
        self,
        directory: str | os.PathLike[str],
        proxy_directory: str | os.PathLike[str] | None = None,
    ) -> list[Path]:
        """Write every file as JSON lines under `directory` (the proxy's under
        `proxy_directory` if given: a proxy told another place than the engines);
        returns the paths."""
        out = []
        root = Path(directory)
        proxy_root = Path(proxy_directory) if proxy_directory is not None else root
        for name, docs in self.files.items():
            path = (proxy_root if "proxy" in name else root) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as fh:
                for doc in docs:
                    fh.write(json.dumps(doc, separators=(",", ":")))
                    fh.write("\n")
            out.append(path)
        return out

    def by_trace(self) -> dict[str, SyntheticRequest]:
        return {r.trace_id: r for r in self.requests}


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
    clock_steps_ms: Mapping[str, tuple[float, float]] | None = None,
    hosts: Mapping[str, str] | None = None,
    start_unix_s: float = 1_760_000_000.0,
    batch: int = 64,
    drop_spans: Mapping[str, float] | None = None,
    registration_late: float = 0.15,
    http_received: bool = True,
    engine_steps: bool = True,
    unpinned_decode: bool = False,
    export_dropped: Mapping[str, int] | None = None,
    unflushed: Sequence[str] = (),
) -> SyntheticRun:
    """Simulate `n_requests` split evenly over `modes`, one run per mode, in sequence.

    `prompt_tokens`: None (log-uniform 64..8192), ``(lo, hi)`` or a sequence cycled.
    `qps`: arrival rates cycled in waves of 25 requests, so load varies within a run.
    `clock_offsets_ms`: instance -> how far its clock is ahead of the proxy's.
    `clock_steps_ms`: instance -> (seconds into the run, ms): its clock steps by that
    much then (a clock set mid-run), on top of its offset.
    `drop_spans`: span name -> probability that a request loses that span.
    `registration_late`: push: share of requests whose D registration arrives after P
    finished prefill (D admission delayed), so both rendezvous orders occur.
    `http_received=False`: engines without the HTTP middleware (and traces from before
    it): no ``http_received`` events, engine spans start at vLLM's arrival time.
    `engine_steps`: add the per-process step traces (``engine.steps``, ``engine.threads``;
    see `steps`). `unpinned_decode`: D's EngineCore thread may run on P's core
    (give both engines one host with `hosts` to see it as cross-engine contention).
    With engine steps come each engine process's export records (``engine.export``):
    `export_dropped` maps a process ("p_sched", "p_work", "d_sched", "d_work") to the
    spans it dropped, and a process in `unflushed` writes no final record (both per mode).
    """
    rng = random.Random(seed)
    offsets_ns = {k: round(v * 1e6) for k, v in (clock_offsets_ms or {}).items()}
    host_of = {**DEFAULT_HOSTS, **(hosts or {})}
    steps_ns = {
        k: (at_s * 1e3, round(ms * 1e6)) for k, (at_s, ms) in (clock_steps_ms or {}).items()
    }
    em = Emitter(rng, int(start_unix_s * 1e9), offsets_ns, steps_ns)
    files: dict[str, list[dict[str, Any]]] = {}
    spans: dict[str, list[ReadableSpan]] = {}
    requests: list[SyntheticRequest] = []
    per_mode = [n_requests // len(modes) + (i < n_requests % len(modes)) for i in range(len(modes))]
    t0 = 0.0
    for mi, (mode, n) in enumerate(zip(modes, per_mode, strict=True)):
        pid0 = 1000 * (mi + 1)
        p_host, d_host = host_of[PREFILL_INSTANCE], host_of[DECODE_INSTANCE]
        procs = {
            "proxy": Process(sc.SERVICE_PROXY, PROXY_INSTANCE, host_of[PROXY_INSTANCE], pid0),
            "p_sched": Process(sc.SERVICE_PREFILL, PREFILL_INSTANCE, p_host, pid0 + 1),
            "p_work": Process(sc.SERVICE_PREFILL, PREFILL_INSTANCE, p_host, pid0 + 2),
            "d_sched": Process(sc.SERVICE_DECODE, DECODE_INSTANCE, d_host, pid0 + 3),
            "d_work": Process(sc.SERVICE_DECODE, DECODE_INSTANCE, d_host, pid0 + 4),
        }
        dep = Deployment(
            rng, mode, registration_late=registration_late, http_received=http_received
        )
        prompts = _prompt_lengths(rng, n, prompt_tokens)
        t = t0
        for i in range(n):
            rate = qps[(i // 25) % len(qps)]
            t += rng.expovariate(rate) * 1000.0
            outs = rng.randint(*output_tokens)
            rid = f"{mode}-{i:05d}"
            requests.append(
                _request(dep, em, procs, drop_spans or {}, rid, t, prompts[i], outs, i == 0)
            )
        t0 = dep.last_end_ms + 1000.0
        if engine_steps:
            add_process_traces(
                em,
                procs,
                mode,
                seed=seed * 7919 + mi,
                unpinned_decode=unpinned_decode,
                export_dropped=export_dropped,
                unflushed=unflushed,
            )
        for key, proc in procs.items():
            if proc.spans:
                name = f"{mode}/{proc.service}-{key}-{proc.pid}.jsonl"
                files[name] = proc.lines(batch)
                spans[name] = sorted(proc.spans, key=lambda s: s.end_time or 0)
    return SyntheticRun(files, requests, dict(clock_offsets_ms or {}), spans)


def _request(
    dep: Deployment,
    em: Emitter,
    procs: Mapping[str, Process],
    drop_spans: Mapping[str, float],
    rid: str,
    t: float,
    prompt: int,
    outs: int,
    first: bool,
) -> SyntheticRequest:
    """Simulate one request: its timeline, its spans, and what the analysis should find."""
    a = arrive(dep, em, drop_spans, rid, t, prompt, outs, first=first)
    pre = prefill_leg(dep, a)
    leg = push_leg(dep, a, pre) if a.mode == "push" else pull_leg(dep, a, pre)
    fin = finish(dep, a, leg)
    emit_request(em, procs, a, pre, leg, fin, http_received=dep.http_received)
    lookup = a.lookup is not None and sc.SPAN_REQUEST not in a.dropped
    path, hidden = expected_path(
        leg,
        lookup=lookup,
        cpu_wait=a.loop_wait > 0,
        relay_wait=a.relay_wait > 0,
        engine_input=dep.http_received,
        token_wait=a.token_wait > 0,
    )
    return SyntheticRequest(
        trace_id=f"{a.trace_id:032x}",
        request_id=rid,
        mode=a.mode,
        prompt_tokens=prompt,
        output_tokens=outs,
        ttft_ms=fin.ft - t,
        tpot_ms=a.step,
        start_unix_ns=em.base_ns + round(t * 1e6),
        rendezvous_first=leg.rdv_first if isinstance(leg, PushLeg) else None,
        expected_path=path,
        expected_hidden=hidden,
        dropped=tuple(sorted(a.dropped)),
        expected_engine_ms=engine_truth(a, pre, leg, http_received=dep.http_received),
        prefill_steps=pre.steps,
    )
