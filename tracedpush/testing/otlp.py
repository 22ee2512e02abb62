"""OTLP endpoints for tests: a real OTLP/HTTP receiver, and a collector that hangs.

Both bind the same port in turn (SO_REUSEADDR), so an exporter pointed at one port sees
a healthy collector, then a hung one, then a healthy one again.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


class HangingEndpoint:
    """Accepts TCP connections and never reads or answers: a hung OTLP collector."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.sock.close()
        for conn in self.conns:
            conn.close()


class OtlpHttpReceiver:
    """A real OTLP/HTTP receiver: POST /v1/traces, protobuf, spans decoded and counted."""

    def __init__(self, port: int) -> None:
        self.names: list[str] = []
        names = self.names

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                if self.path == "/v1/traces":
                    names.extend(
                        s.name for r in req.resource_spans for sc in r.scope_spans for s in sc.spans
                    )
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", port), Handler)  # SO_REUSEADDR: same port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
