"""Feeding and reading `tracedpush collect` in tests: real SDK exporters, real scrapes."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tracedpush.testing.synthetic import DECODE_INSTANCE, PREFILL_INSTANCE, PROXY_INSTANCE

ONE_HOST = {PROXY_INSTANCE: "box", PREFILL_INSTANCE: "box", DECODE_INSTANCE: "box"}
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def http_exporter(base_url: str, *, gzip: bool = True, timeout: float = 5) -> HttpExporter:
    return HttpExporter(
        endpoint=f"{base_url}/v1/traces",
        compression=Compression.Gzip if gzip else Compression.NoCompression,
        timeout=timeout,
    )


def grpc_exporter(port: int, *, timeout: float = 5) -> GrpcExporter:
    return GrpcExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=timeout)


def export_all(
    exporters: Sequence[SpanExporter], spans_by_process: Iterable[list[ReadableSpan]], batch: int
) -> int:
    """Each process's spans, in batches, through the exporters in turn; returns the spans
    sent. Fails loudly on an export the receiver refused."""
    sent = 0
    i = 0
    for spans in spans_by_process:
        for j in range(0, len(spans), batch):
            chunk = spans[j : j + batch]
            result = exporters[i % len(exporters)].export(chunk)
            assert result == SpanExportResult.SUCCESS, result
            sent += len(chunk)
            i += 1
    return sent


@dataclass
class Scrape:
    """One OpenMetrics scrape: samples by (name, labels) and their exemplars."""

    content_type: str
    text: str
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = field(default_factory=dict)
    exemplars: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float:
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {ls: v for (n, ls), v in self.values.items() if n == name}


def scrape(metrics_url: str, accept: str = OPENMETRICS) -> Scrape:
    req = urllib.request.Request(metrics_url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
        ctype = resp.headers.get("Content-Type", "")
    out = Scrape(ctype, text)
    if not ctype.startswith("application/openmetrics-text"):
        return out
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.values[(s.name, frozenset(s.labels.items()))] = s.value
            if s.exemplar is not None:
                out.exemplars.append((s.name, dict(s.labels), dict(s.exemplar.labels)))
    return out
