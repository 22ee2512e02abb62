"""The simulated 1P1D deployment: names, hosts and sizes shared by traces and tests."""

from __future__ import annotations

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
# the first request of each mode waits this long for the proxy's model catalog
# (proxy.models, from 0.05 ms after receipt), as one that beats the start-up lookup does
MODEL_LOOKUP_MS = 3.0
