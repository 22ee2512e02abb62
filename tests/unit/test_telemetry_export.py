"""Export: OTLP JSON lines files, real OTLP receivers (gRPC and HTTP), and drop policy,
including the faults of issue 11: a trace store that fills up (a real 1 MiB tmpfs) and
an OTLP endpoint that accepts connections and never answers."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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

from tracedpush import semconv
from tracedpush.analysis import TraceStore, analyze
from tracedpush.telemetry import export
from tracedpush.telemetry.builder import BuilderConfig
from tracedpush.telemetry.export import (
    ExportWorker,
    SpanSink,
    build_exporters,
    build_tracer_provider,
)
from tracedpush.telemetry.jsonl import JsonLinesSpanExporter
from tracedpush.telemetry.pipeline import Pipeline
from tracedpush.testing.net import free_port
from tracedpush.testing.otlp import HangingEndpoint, OtlpHttpReceiver

RESOURCE = Resource.create({"service.name": "vllm-decode", "host.name": "h1"})


@pytest.fixture(autouse=True)
def _export_threads_end_with_their_test() -> Iterator[None]:
    """Each test's export threads end before the next test starts. A shutdown may return
    while an attempt is still running (by design: an engine must not wait out a dead
    endpoint at exit); that attempt's outage warning, logged later, would land in the
    next test's caplog (seen: the unreachable-endpoint test's in the hanging one's)."""
    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith("tracedpush-export-"):
            thread.join(timeout=15)
            assert not thread.is_alive(), f"{thread.name} still running 15 s after its test"


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
    """A process SIGKILLed while exporting in a loop leaves whole lines, but for the
    one it was writing: Linux ends a write early when a fatal signal arrives (seen here
    on an 80 kB line). The loader keeps that one as `partial`, parses every whole line
    (nothing malformed), and an exporter on the same file name (a reused pid) cuts it
    before appending."""
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
    (path,) = tmp_path.glob("*.jsonl")
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    whole, torn = lines[:-1], lines[-1]  # torn: b"" when the kill fell between writes
    assert len(whole) > 5
    spans = 0
    for line in whole:
        doc = json.loads(line)
        spans += sum(len(s["spans"]) for r in doc["resourceSpans"] for s in r["scopeSpans"])
    if torn:
        with pytest.raises(json.JSONDecodeError):
            json.loads(torn)
    store = TraceStore.from_paths([tmp_path])
    assert store.stats.malformed == 0 and store.stats.partial == (1 if torn else 0)
    assert store.stats.spans + store.stats.duplicates == spans  # it re-exports one batch
    # the next process with that pid (the same name) appends after the whole lines only
    again = JsonLinesSpanExporter(tmp_path, "x")
    again.stem = path.name.removesuffix(".jsonl")
    assert not again.write([span(1)]).dropped
    after = path.read_bytes()
    assert after.startswith(b"\n".join(whole) + b"\n") and after.endswith(b"\n")
    assert after.count(b"\n") == len(whole) + 1
    json.loads(after.split(b"\n")[-2])
    assert again.torn_lines_cut == (1 if torn else 0)


def test_jsonl_cuts_a_torn_line_left_in_its_file(tmp_path):
    """A file that ends in part of a line (a killed writer whose pid this process
    reuses): the first append cuts it and writes after the last whole line."""
    exporter = JsonLinesSpanExporter(tmp_path, "x")
    exporter.write([span(1)])
    whole = exporter.path.read_bytes()
    exporter.shutdown()
    exporter.path.write_bytes(whole + b'{"resourceSpans":[{"resou')
    again = JsonLinesSpanExporter(tmp_path, "x")
    assert not again.write([span(2)]).dropped
    lines = again.path.read_bytes().split(b"\n")
    assert lines[0] + b"\n" == whole and lines[-1] == b"" and len(lines) == 3
    assert json.loads(lines[1])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"]
    assert again.torn_lines_cut == 1
    only_torn = JsonLinesSpanExporter(tmp_path, "y")
    only_torn.path.parent.mkdir(exist_ok=True)
    only_torn.path.write_bytes(b'{"resourceSp')  # no newline at all: cut to empty
    assert not only_torn.write([span(3)]).dropped
    assert only_torn.path.read_bytes().count(b"\n") == 1
    json.loads(only_torn.path.read_bytes())


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


@pytest.mark.serial  # a latency bound
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


@pytest.mark.serial  # a latency bound
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


# ------------------------------------------------------------------ faults (issue 11)
def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def export_log(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tracedpush.export" and text in r.getMessage()
    ]


def spans_in(path) -> list[dict]:
    """Every span of a JSON lines file; fails if any line is not whole JSON."""
    raw = path.read_bytes()
    assert not raw or raw.endswith(b"\n"), "torn last line"
    out = []
    for line in raw.split(b"\n")[:-1]:
        doc = json.loads(line)
        out += [s for r in doc["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]]
    return out


@pytest.fixture
def tiny_store(tmp_path):
    """A real 1 MiB tmpfs: a traces directory that fills up."""
    mnt = tmp_path / "store"
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no mount command: cannot make a 1 MiB tmpfs to fill")
    if r.returncode != 0:
        pytest.skip(f"mounting a 1 MiB tmpfs is not permitted here (root needed): {r.stderr}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_trace_store_drops_counts_logs_once_never_tears_and_resumes(tiny_store, caplog):
    caplog.set_level(logging.WARNING, logger="tracedpush.export")
    filler = tiny_store / "filler"
    filler.write_bytes(b"\0" * 700_000)
    exporter = JsonLinesSpanExporter(tiny_store / "traces", "vllm-decode-worker0")
    worker = ExportWorker("jsonl", exporter)
    sink = SpanSink([worker])
    batch = [span(i) for i in range(50)]
    emitted = 0
    try:
        while worker.drops[semconv.DROP_STORE_FULL] == 0:
            assert emitted < 400 * len(batch), "the 1 MiB store never filled"
            sink.emit(batch)  # never raises, even as the disk fills
            emitted += len(batch)
            assert sink.flush(5)
        for _ in range(10):  # more batches while full: each tried, counted, not logged again
            sink.emit(batch)
            emitted += len(batch)
            assert sink.flush(5)
        assert worker.failing
        assert worker.drops[semconv.DROP_STORE_FULL] >= 11 * len(batch)
        # a short write happened on the full disk and was cut back: no torn line
        assert exporter.torn_lines_cut >= 1
        assert len(spans_in(exporter.path)) == worker.exported
        (failing,) = export_log(caplog, "dropping spans")
        assert str(exporter.path) in failing and "ENOSPC" in failing
        assert semconv.DROP_STORE_FULL in failing
        assert not export_log(caplog, "resumed")

        filler.unlink()  # space returns: the next batch lands, no restart
        sink.emit([span(900, name="after.space.returned")])
        emitted += 1
        assert sink.flush(5)
        assert not worker.failing
        (resumed,) = export_log(caplog, "export resumed")
        assert str(exporter.path) in resumed
        assert f"{worker.dropped} spans lost meanwhile (store_full {worker.dropped})" in resumed
        assert len(export_log(caplog, "dropping spans")) == 1
        written = spans_in(exporter.path)
        assert written[-1]["name"] == "after.space.returned"
        assert len(written) == worker.exported
        assert worker.exported + worker.dropped == emitted
        stats = sink.stats()["jsonl"]
        assert stats["dropped_by_reason"] == {
            semconv.DROP_QUEUE_FULL: 0,
            semconv.DROP_EXPORT_FAILED: 0,
            semconv.DROP_STORE_FULL: worker.dropped,
        }
        assert stats["exported"] == worker.exported and stats["failing"] is False
    finally:
        sink.shutdown()


class Switch(SpanExporter):
    """An exporter that fails or succeeds as told (the worker's outage bookkeeping alone;
    the real full store is the tmpfs test above)."""

    def __init__(self) -> None:
        self.ok = True

    def export(self, spans) -> SpanExportResult:
        return SpanExportResult.SUCCESS if self.ok else SpanExportResult.FAILURE


def test_an_endpoint_that_flaps_is_one_outage_in_the_log(caplog, monkeypatch):
    """A store on the edge of full takes a small batch now and then (seen on a real
    tmpfs under engine load): failures within FLAP_S of one getting through continue
    the outage, counted but not logged again."""
    caplog.set_level(logging.WARNING, logger="tracedpush.export")
    switch = Switch()
    worker = ExportWorker("otlp", switch, target="http://collector:4318")
    sink = SpanSink([worker])
    try:
        for ok in (False, False, True, False, True, False, False, True):
            switch.ok = ok
            sink.emit([span(1)])
            assert sink.flush(5)
        assert worker.drops[semconv.DROP_EXPORT_FAILED] == 5 and worker.exported == 3
        assert len(export_log(caplog, "dropping spans")) == 1
        resumed = export_log(caplog, "export resumed")
        assert len(resumed) == 3
        assert "after failing again 2 time(s) once batches got through" in resumed[-1]
        assert "5 spans lost meanwhile (export_failed 5)" in resumed[-1]

        monkeypatch.setattr(export, "FLAP_S", 0.0)  # long after: a new outage, logged
        switch.ok = False
        sink.emit([span(1)])
        assert sink.flush(5)
        assert len(export_log(caplog, "dropping spans")) == 2
    finally:
        sink.shutdown(timeout_s=1)


def test_a_file_size_limit_moves_on_to_a_new_part(tmp_path):
    """EFBIG (RLIMIT_FSIZE) drops the batch once, then writing goes on in a new file."""
    code = (
        "import json, resource, sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from test_telemetry_export import span\n"
        "from tracedpush.telemetry.jsonl import JsonLinesSpanExporter\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))\n"
        "e = JsonLinesSpanExporter(sys.argv[1], 'x')\n"
        "batch = [span(i) for i in range(20)]\n"
        "results = [e.write(batch) for _ in range(12)]\n"
        "print(json.dumps([(r.written, r.dropped, r.error and r.error.errno) for r in results]))\n"
    )
    here = os.path.dirname(__file__)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), here],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    results = [tuple(r) for r in json.loads(out)]
    failed = [i for i, r in enumerate(results) if r[1]]
    assert failed and all(results[i] == (0, 20, errno.EFBIG) for i in failed)
    # the batch after a failure lands, in the next part
    assert all(results[i + 1] == (20, 0, None) for i in failed if i + 1 < len(results))
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) >= 2
    assert sum(len(spans_in(f)) for f in files) == sum(r[0] for r in results)


@pytest.mark.serial  # a latency bound
def test_a_hanging_otlp_endpoint_never_blocks_emit_times_out_and_recovers(otel_env, caplog):
    caplog.set_level(logging.WARNING, logger="tracedpush.export")
    hang = HangingEndpoint()
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{hang.port}")
    otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")  # seconds, as the SDK reads it
    (worker,) = workers = build_exporters(None, "x")
    sink = SpanSink(workers)
    receiver: OtlpHttpReceiver | None = None
    batch = [span(i) for i in range(100)]
    emitted, durations = 0, []
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:  # the caller keeps emitting while it hangs
            start = time.perf_counter()
            sink.emit(batch)
            durations.append(time.perf_counter() - start)
            emitted += len(batch)
            time.sleep(0.002)
        # every attempt ends at the 1 s timeout: two failed batches in well under the
        # SDK's 10 s default (let alone 6 retries of it)
        wait_for(lambda: worker.failed_batches >= 2, 3.0, "two timed-out batches")
        assert time.monotonic() - t0 < 6.0
        worst = max(durations)
        print(f"\nemit() during the hang: {len(durations)} calls, max {worst * 1e3:.2f} ms")
        assert worst < 0.02, f"emit() took {worst * 1e3:.1f} ms during the hang"
        assert worker.failing
        assert worker.drops[semconv.DROP_QUEUE_FULL] > 0
        assert worker.drops[semconv.DROP_EXPORT_FAILED] >= 2 * len(batch)  # 2+ batches
        assert worker.drops[semconv.DROP_STORE_FULL] == 0
        (failing,) = export_log(caplog, "dropping spans")
        assert f"127.0.0.1:{hang.port}" in failing and "export_failed" in failing

        hang.close()  # the collector comes back, on the same port
        receiver = OtlpHttpReceiver(hang.port)
        got = receiver.names
        # no restart: the next batch gets through, then the backlog drains
        wait_for(lambda: not worker.failing, 10, "export to resume")
        wait_for(lambda: sink.stats()["otlp"]["queued"] == 0, 30, "the backlog to drain")
        sink.emit([span(999, name="after.recovery")])
        emitted += 1
        wait_for(lambda: "after.recovery" in got, 10, "a span emitted after recovery")
        assert sink.flush(5)
        assert not worker.failing
        (resumed,) = export_log(caplog, "export resumed")
        assert f"{worker.dropped} spans lost meanwhile" in resumed
        assert len(export_log(caplog, "dropping spans")) == 1
        assert len(got) == worker.exported  # every span counted exported really arrived
        assert worker.exported + worker.dropped == emitted
    finally:
        sink.shutdown(timeout_s=1)
        hang.close()
        if receiver is not None:
            receiver.close()


def test_a_hanging_grpc_endpoint_times_out_and_recovers(otel_env, caplog):
    caplog.set_level(logging.WARNING, logger="tracedpush.export")
    hang = HangingEndpoint()
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{hang.port}")
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    (worker,) = workers = build_exporters(None, "x")
    sink = SpanSink(workers)
    server = None
    try:
        t0 = time.monotonic()
        for _ in range(3):
            sink.emit([span(i) for i in range(600)])
        wait_for(lambda: worker.failed_batches >= 2, 5.0, "two timed-out batches")
        assert time.monotonic() - t0 < 6.0
        assert worker.drops[semconv.DROP_EXPORT_FAILED] >= 2 * 512
        hang.close()
        receiver = GrpcReceiver()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
        server.add_insecure_port(f"127.0.0.1:{hang.port}")
        server.start()
        sink.emit([span(999, name="after.recovery")])

        def arrived() -> bool:
            names = [
                s.name
                for req in receiver.requests
                for r in req.resource_spans
                for sc in r.scope_spans
                for s in sc.spans
            ]
            return "after.recovery" in names

        wait_for(arrived, 30, "a span emitted after recovery")
        assert sink.flush(5) and not worker.failing
        assert len(export_log(caplog, "dropping spans")) == 1
        assert len(export_log(caplog, "export resumed")) == 1
    finally:
        sink.shutdown(timeout_s=1)
        hang.close()
        if server is not None:
            server.stop(0)


class AlwaysFailing(SpanExporter):
    def export(self, spans):
        return SpanExportResult.FAILURE

    def shutdown(self):
        pass


def _attrs(span_json: dict) -> dict:
    def value(v: dict):
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", [])]
        (kind, x), *_ = v.items()
        return int(x) if kind == "intValue" else x

    return {a["key"]: value(a["value"]) for a in span_json["attributes"]}


def test_export_and_drop_counters_land_in_the_trace_store(tmp_path):
    """`engine.export`: per exporter and reason, cumulative, in the process's own trace."""
    jsonl = ExportWorker("jsonl", JsonLinesSpanExporter(tmp_path, "vllm-decode-worker0"))
    down = ExportWorker("otlp", AlwaysFailing(), max_queue=2)
    sink = SpanSink([jsonl, down])
    pipeline = Pipeline(
        BuilderConfig("push", "decode", "worker", "decode-engine-001"),
        RESOURCE,
        sink,
        export_stats_every_s=3600,
    )
    sink.emit([span(i) for i in range(5)])  # otlp: 3 queue full, then 2 export failed
    assert sink.flush(5)
    pipeline.emit_export_stats()
    assert sink.flush(5)
    stats = sink.stats()
    assert stats["otlp"]["dropped_by_reason"] == {
        semconv.DROP_QUEUE_FULL: 3,
        semconv.DROP_EXPORT_FAILED: 3,  # the 2 spans, then the record itself
        semconv.DROP_STORE_FULL: 0,
    }
    assert stats["jsonl"]["exported"] == 6 and stats["otlp"]["failing"] is True
    pipeline.shutdown()
    records = [s for s in spans_in(jsonl.exporter.path) if s["name"] == semconv.SPAN_ENGINE_EXPORT]
    assert len(records) == 2  # the one asked for, and the last one at shutdown
    first, last = (_attrs(r) for r in records)
    assert first[semconv.EXPORT_EXPORTER] == ["jsonl", "otlp"]
    assert first[semconv.EXPORT_EXPORTED] == [5, 0]
    assert first[semconv.EXPORT_DROPPED_QUEUE_FULL] == [0, 3]
    assert first[semconv.EXPORT_DROPPED_EXPORT_FAILED] == [0, 2]
    assert first[semconv.EXPORT_DROPPED_STORE_FULL] == [0, 0]
    assert first[semconv.EXPORT_FAILING] == [False, True]
    assert first[semconv.EVENTS_DROPPED] == 0
    assert first[semconv.ENGINE_ID] == "decode-engine-001"
    assert last[semconv.EXPORT_EXPORTED] == [6, 0]  # cumulative: the first record landed
    assert last[semconv.EXPORT_DROPPED_EXPORT_FAILED] == [0, 3]
    assert records[0]["traceId"] == records[1]["traceId"]  # the process's own trace
    assert records[1]["startTimeUnixNano"] == records[0]["endTimeUnixNano"]
    assert (first[semconv.EXPORT_FINAL], last[semconv.EXPORT_FINAL]) == (False, True)

    # what `tracedpush report` makes of them: the latest record is the account
    health = analyze(TraceStore.from_path(tmp_path)).export_health()
    (acc,) = health.accounts
    assert (acc.exported, acc.lost, acc.final, acc.failing) == (6, 6, True, ("otlp",))
    assert acc.dropped == {semconv.DROP_QUEUE_FULL: 3, semconv.DROP_EXPORT_FAILED: 3}
    lines = health.lines()
    assert lines[0].startswith("- decode-engine-001 worker (pid ")
    assert "6 spans dropped (export_failed 3, queue_full 3)" in lines[0]
    assert lines[-1] == "- 1 of 1 flushed their last spans as they shut down"

    # the same process killed before its last record: it never flushed
    (path,) = [f for f in tmp_path.iterdir() if f.suffix == ".jsonl"]
    final = f'"{semconv.EXPORT_FINAL}","value":{{"boolValue":true}}'
    kept = [line for line in path.read_text().splitlines() if final not in line]
    assert len(kept) < len(path.read_text().splitlines())
    path.write_text("\n".join(kept) + "\n")
    health = analyze(TraceStore.from_path(tmp_path)).export_health()
    assert [a.final for a in health.accounts] == [False]
    assert "1 of 1 wrote no final record: still running, or killed before" in health.lines()[-1]


@pytest.mark.parametrize("ratio", [None, "0.0"])
def test_the_proxy_writes_its_own_export_records(otel_env, tmp_path, ratio):
    """The proxy's provider writes `engine.export` records of its own exporters: every
    EXPORT_RECORD_EVERY_S when spans were exported or lost since the last one (none
    while idle), and a final one at shutdown, past its sampler (a 0% sampler still keeps
    them); `tracedpush report` names the proxy."""
    if ratio is not None:
        otel_env.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
        otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
    otel_env.setattr(export, "EXPORT_RECORD_EVERY_S", 0.05)
    provider = build_tracer_provider("tracedpush-proxy", "proxy:8000", tmp_path, mode="push")
    tracer = provider.get_tracer("t")
    for _ in range(3):
        with tracer.start_as_current_span(semconv.SPAN_REQUEST):
            pass
    time.sleep(0.5)  # ten periods: one record for the spans, then none while idle
    provider.shutdown()
    spans = [
        s
        for d in read_lines(tmp_path)
        for r in d["resourceSpans"]
        for ss in r["scopeSpans"]
        for s in ss["spans"]
    ]
    records = [_attrs(s) for s in spans if s["name"] == semconv.SPAN_ENGINE_EXPORT]
    requests = [s for s in spans if s["name"] == semconv.SPAN_REQUEST]
    assert len(requests) == (3 if ratio is None else 0)
    finals = [r[semconv.EXPORT_FINAL] for r in records]
    assert finals == ([False, True] if ratio is None else [True]), finals
    assert {r[semconv.ROLE] for r in records} == {"proxy"}
    assert {r[semconv.ENGINE_ID] for r in records} == {"proxy:8000"}
    (acc,) = analyze(TraceStore.from_path(tmp_path)).export_health().accounts
    assert (acc.service, acc.final, acc.lost) == (semconv.SERVICE_PROXY, True, 0)
    assert acc.exported == len(spans) - 1  # all it wrote but the final record itself
    assert acc.name.startswith("proxy proxy:8000 (pid ")
