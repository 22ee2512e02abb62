"""OTLP JSON lines file exporter: one `TracesData` object per line, line-atomic.

Each process writes its own file (`<service>-<host>-<pid>.jsonl`), so lines from
different processes never interleave. Every line goes out in a single `write(2)` on an
`O_APPEND` descriptor: a process killed at any moment leaves whole lines only (a
signal cannot split a write to a regular file). Large batches are split so no line
exceeds `max_line_bytes`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracedpush.telemetry.otlp_json import encode_traces_data

_SAFE = "".join(c if c.isalnum() else "-" for c in socket.gethostname())


class JsonLinesSpanExporter(SpanExporter):
    """Append spans as OTLP JSON lines to `<directory>/<stem>.jsonl`, rotating by size."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        stem: str,
        *,
        max_file_bytes: int = 256 << 20,
        max_line_bytes: int = 4 << 20,
    ) -> None:
        self.directory = Path(directory)
        self.stem = f"{stem}-{_SAFE}-{os.getpid()}"
        self.max_file_bytes = max_file_bytes
        self.max_line_bytes = max_line_bytes
        self._fd: int | None = None
        self._written = 0
        self._part = 0
        self._lock = threading.Lock()  # export() may be called by force_flush from any thread

    @property
    def path(self) -> Path:
        suffix = f".{self._part}" if self._part else ""
        return self.directory / f"{self.stem}{suffix}.jsonl"

    def _open(self) -> int:
        if self._fd is None or self._written >= self.max_file_bytes:
            if self._fd is not None:
                os.close(self._fd)
                self._part += 1
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._written = os.fstat(self._fd).st_size
        return self._fd

    def _lines(self, spans: Sequence[ReadableSpan]) -> list[bytes]:
        line = (json.dumps(encode_traces_data(spans), separators=(",", ":")) + "\n").encode()
        if len(line) <= self.max_line_bytes or len(spans) == 1:
            return [line]
        mid = len(spans) // 2
        return self._lines(spans[:mid]) + self._lines(spans[mid:])

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            with self._lock:
                for line in self._lines(list(spans)):
                    fd = self._open()
                    n = os.write(fd, line)
                    if n != len(line):  # disk full: never leave a torn line behind
                        os.ftruncate(fd, self._written)
                        return SpanExportResult.FAILURE
                    self._written += n
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
