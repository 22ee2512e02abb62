"""Reading a vLLM server's Prometheus ``/metrics``: the evidence that KV crossed the connector.

D's ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` counts prompt
tokens whose KV arrived from P instead of being computed locally. It grows by a request's
prompt length when the handoff worked, and stays put when D recomputed the prompt.
Stats reach the API server a little after the request finishes, so callers wait for it.
"""

from __future__ import annotations

import re
import time
import urllib.request

EXTERNAL_KV_COUNTER = "vllm:prompt_tokens_by_source_total"
EXTERNAL_KV_SOURCE = "external_kv_transfer"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            samples.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return samples


def scrape(base_url: str, timeout: float = 20.0) -> str:
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def metric_sum(base_url: str, name: str, **labels: str) -> float:
    """Sum of ``name`` over every label set that matches ``labels`` (0 if absent)."""
    return sum(
        value
        for n, ls, value in parse(scrape(base_url))
        if n == name and all(ls.get(k) == v for k, v in labels.items())
    )


def external_kv_prompt_tokens(base_url: str) -> int:
    """Prompt tokens this engine received over the KV connector, so far."""
    return int(metric_sum(base_url, EXTERNAL_KV_COUNTER, source=EXTERNAL_KV_SOURCE))


def wait_external_kv_tokens(base_url: str, at_least: int, timeout: float = 15.0) -> int:
    """Poll the counter until it reaches ``at_least`` or ``timeout`` passes; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = external_kv_prompt_tokens(base_url)
        if value >= at_least or time.monotonic() >= deadline:
            return value
        time.sleep(0.25)
