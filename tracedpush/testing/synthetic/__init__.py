"""Realistic synthetic push/pull traces in the exact file format the exporters write.

Tests and benchmarks need many requests with known answers and no vLLM. `generate()`
simulates a 1P1D behind the proxy (a FIFO prefill engine, decode steps, per-step
polling, first-contact handshakes, NIXL transfer times from KV bytes) and emits the span
tree of docs/spans.md as OTLP JSON lines, one `TracesData` per line, batched per process
like OpenTelemetry's file exporter. Each request comes with its ground truth (TTFT,
which rendezvous input came first, the phases expected on the critical path), and
clocks can be skewed per instance to test the correction.

    run = generate(200, seed=1, clock_offsets_ms={"decode-0": 50})
    run.write("/tmp/traces")          # push/*.jsonl, pull/*.jsonl

Modules, in dependency order: `deployment` (names and sizes), `encode` (processes,
spans, OTLP JSON through `tracedpush.telemetry.otlp_json`), `timeline` (simulation
state, arrival, prefill leg, finish), `push` and `pull` (each mode's handoff), `spans`
(a request's span tree), `expected` (ground truth), `steps` (per-process engine.steps
and engine.threads traces), `run` (`generate`), `shift` (clock skew injection).
"""

from __future__ import annotations

from tracedpush.testing.synthetic.deployment import (
    BLOCK_TOKENS,
    DECODE_INSTANCE,
    DEFAULT_HOSTS,
    KV_BYTES_PER_TOKEN,
    PREFILL_CHUNK_TOKENS,
    PREFILL_INSTANCE,
    PROXY_BUILD_MS,
    PROXY_INSTANCE,
)
from tracedpush.testing.synthetic.expected import SyntheticRequest
from tracedpush.testing.synthetic.run import SyntheticRun, generate
from tracedpush.testing.synthetic.shift import shift_directory, shift_documents

__all__ = [
    "BLOCK_TOKENS",
    "DECODE_INSTANCE",
    "DEFAULT_HOSTS",
    "KV_BYTES_PER_TOKEN",
    "PREFILL_CHUNK_TOKENS",
    "PREFILL_INSTANCE",
    "PROXY_BUILD_MS",
    "PROXY_INSTANCE",
    "SyntheticRequest",
    "SyntheticRun",
    "generate",
    "shift_directory",
    "shift_documents",
]
