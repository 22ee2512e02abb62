"""Export: OTLP JSON lines files, real OTLP receivers (gRPC and HTTP), and drop policy."""

from __future__ import annotations

import json
import os
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, HTTPServer

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from tracedpush.telemetry.export import (
    ExportWorker,
    SpanSink,
    build_exporters,
    build_tracer_provider,
)
from tracedpush.telemetry.jsonl import JsonLinesSpanExporter
from tracedpush.testing.net import free_port

RESOURCE = Resource.create({"service.name": "vllm-decode", "host.name": "h1"})


def span(i: int, name: str = "kv.write", parent: int | None = 7) -> ReadableSpan:
    trace_id = 0xABC0 + i
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, 0x100 + i, False, TraceFlags(1)),
        parent=SpanContext(trace_id, parent, True, TraceFlags(1)) if parent else None,
        resource=RESOURCE,
        attributes={
            "tracedpush.kv.bytes": 1024 * i,
            "tracedpush.mode": "push",
            "f": 0.5,
            "ok": True,
        },
        kind=SpanKind.CLIENT,
        start_time=1_000_000_000 + i,
        end_time=2_000_000_000 + i,
    )


def read_lines(directory) -> list[dict]:
    lines = []
    for path in sorted(directory.glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def test_jsonl_lines_are_otlp_json_an_independent_reader_accepts(tmp_path):
    exporter = JsonLinesSpanExporter(tmp_path, "vllm-decode-worker0")
    assert exporter.export([span(1), span(2, parent=None)]).name == "SUCCESS"
    assert exporter.export([span(3)]).name == "SUCCESS"
    exporter.shutdown()
    (path,) = tmp_path.glob("*.jsonl")
    assert path.name.startswith("vllm-decode-worker0-") and str(os.getpid()) in path.name
    raw = path.read_text().splitlines()
    assert len(raw) == 2
    # protobuf's own JSON parser is the reference reader for OTLP JSON (hex ids aside,
    # which OTLP JSON mandates and protobuf's bytes mapping would read as base64).
    data = json.loads(raw[0])
    s = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert s["traceId"] == f"{0xABC1:032x}" and len(s["spanId"]) == 16
    assert s["kind"] == 3  # SPAN_KIND_CLIENT
    assert s["startTimeUnixNano"] == "1000000001"
    for sp in data["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            sp[key] = ""  # hex ids checked above; protobuf would read base64 here
    msg = json_format.ParseDict(data, trace_pb2.TracesData())
    parsed = msg.resource_spans[0].scope_spans[0].spans[0]
    assert parsed.name == "kv.write"
    assert {
        a.key: a.value.int_value for a in parsed.attributes if a.key == "tracedpush.kv.bytes"
    } == {"tracedpush.kv.bytes": 1024}
    resource = {a.key: a.value.string_value for a in msg.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "vllm-decode"


def test_jsonl_splits_big_batches_into_whole_lines(tmp_path):
    exporter = JsonLinesSpanExporter(tmp_path, "x", max_line_bytes=2000)
    exporter.export([span(i) for i in range(40)])
    lines = read_lines(tmp_path)
    assert len(lines) > 1
    names = [
        s for d in lines for r in d["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]
    ]
    assert len(names) == 40


def test_jsonl_is_line_atomic_under_a_killed_writer(tmp_path):
    """A process SIGKILLed while exporting in a loop leaves only whole lines."""
    code = (
        "from opentelemetry.sdk.trace import ReadableSpan\n"
        "from opentelemetry.trace import SpanContext, TraceFlags\n"
        "from tracedpush.telemetry.jsonl import JsonLinesSpanExporter\n"
        f"e = JsonLinesSpanExporter({str(tmp_path)!r}, 'victim')\n"
        "spans = [ReadableSpan(name='kv.write' * 20, context=SpanContext(i + 1, i + 1, False,"
        " TraceFlags(1)), attributes={'a': 'x' * 200}, start_time=1, end_time=2)"
        " for i in range(200)]\n"
        "print('ready', flush=True)\n"
        "while True: e.export(spans)\n"
    )
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(1.0)
    proc.kill()
    proc.wait()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("*.jsonl"))
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) > 5
    for line in lines:
        json.loads(line)


class BlockingExporter(SpanExporter):
    def __init__(self):
        self.release = threading.Event()
        self.got: list[ReadableSpan] = []

    def export(self, spans):
        self.release.wait()
        self.got += spans
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


def test_a_stalled_exporter_never_blocks_submit_and_drops_are_counted():
    exporter = BlockingExporter()
    worker = ExportWorker("stuck", exporter, max_queue=100)
    sink = SpanSink([worker])
    done = threading.Event()

    def producer():
        for _i in range(50):
            sink.emit([span(j) for j in range(10)])
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert done.wait(5), "emit blocked behind a stalled exporter"
    assert worker.dropped >= 500 - 100 - 512  # queue bound + at most one in-flight batch
    assert worker.dropped > 0
    exporter.release.set()
    assert sink.flush(5)
    assert worker.exported + worker.dropped == 500
    sink.shutdown()


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.got = threading.Event()

    def Export(self, request, context):
        self.requests.append(request)
        self.got.set()
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def otel_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_otlp_grpc_export_to_a_real_receiver(otel_env, tmp_path):
    receiver = GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        provider = build_tracer_provider("tracedpush-proxy", "proxy:8000", tmp_path)
        with provider.get_tracer("t").start_as_current_span("tracedpush.request"):
            pass
        provider.force_flush()
        assert receiver.got.wait(10)
        spans = receiver.requests[0].resource_spans[0].scope_spans[0].spans
        assert spans[0].name == "tracedpush.request"
        provider.shutdown()
        # the JSON lines file got the same span
        assert read_lines(tmp_path)[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] == (
            "tracedpush.request"
        )
    finally:
        server.stop(0)


def test_otlp_http_export_to_a_real_receiver(otel_env):
    got: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        workers = build_exporters(None, "x")
        assert [w.name for w in workers] == ["otlp"]
        sink = SpanSink(workers)
        sink.emit([span(5)])
        assert sink.flush(10)
        path, body = got[0]
        assert path == "/v1/traces"
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        assert request.resource_spans[0].scope_spans[0].spans[0].name == "kv.write"
        sink.shutdown()
    finally:
        server.shutdown()


def test_unreachable_otlp_endpoint_does_not_block_emit(otel_env):
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    sink = SpanSink(build_exporters(None, "x"))
    done = threading.Event()

    def producer():
        for _ in range(20):
            sink.emit([span(i) for i in range(100)])
        done.set()

    threading.Thread(target=producer).start()
    assert done.wait(2), "emit blocked on an unreachable OTLP endpoint"
    sink.shutdown(timeout_s=0.5)


def test_unknown_exporter_names_are_rejected(otel_env):
    otel_env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="zipkin"):
        build_exporters(None, "x")
