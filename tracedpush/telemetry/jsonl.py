"""OTLP JSON lines file exporter: one `TracesData` object per line, line-atomic.

Each process writes its own file (`<service>-<host>-<pid>.jsonl`), so lines from
different processes never interleave. Every line goes out in a single `write(2)` on an
`O_APPEND` descriptor, so a process that dies leaves whole lines, but for the one it was
writing when killed: Linux ends a write to a regular file early, at a page, when a fatal
signal arrives (a SIGKILL tore an 80 kB line in the test). The loader keeps such a
trailing line as `partial` and never parses it, and a later process that reuses the pid
(the same file name) cuts it off before it appends. Large batches are split so no line
exceeds `max_line_bytes`.

A full or failing file system (ENOSPC, EDQUOT, EFBIG, EIO, ...) never leaves a torn
line either: each line is all or nothing. After a short write (a nearly full disk)
the rest of the line is written once more, which either completes it or returns the
real errno; then the partial line is cut back with `ftruncate` to the offset recorded
before it, and nothing is appended until that cut has succeeded. `write` reports what
was written and what was not (`WriteResult`) instead of raising, so `ExportWorker` can
count the drops and log the outage once; the next batch simply tries again.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracedpush.telemetry.otlp_json import encode_traces_data

_SAFE = "".join(c if c.isalnum() else "-" for c in socket.gethostname())

# errnos that mean "the store has no room": the file system, a quota or a size limit.
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one `write` did: every span is either in the file (`written`) or not."""

    written: int
    dropped: int = 0
    error: OSError | None = None  # why `dropped` spans were not written
    path: Path | None = None  # the file written to, or that could not be written

    @property
    def store_full(self) -> bool:
        return self.error is not None and self.error.errno in SPACE_ERRNOS

    def describe_error(self) -> str:
        """`ENOSPC: No space left on device`, for log lines."""
        e = self.error
        if e is None:
            return ""
        code = errno.errorcode.get(e.errno or 0, str(e.errno))
        return f"{code}: {e.strerror or e}"


def _after_last_newline(fd: int, size: int, chunk: int = 1 << 16) -> int:
    """The offset just after the last newline in the first `size` bytes (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


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
        self.torn_lines_cut = 0  # partial lines cut back after a short or failed write
        self._fd: int | None = None
        self._written = 0
        self._part = 0
        self._torn_at: int | None = None  # a partial line starts here: cut it before writing
        self._lock = threading.Lock()  # export() may be called by force_flush from any thread

    @property
    def path(self) -> Path:
        suffix = f".{self._part}" if self._part else ""
        return self.directory / f"{self.stem}{suffix}.jsonl"

    def _open(self) -> int:
        rotate = self._written >= self.max_file_bytes and self._torn_at is None
        if self._fd is None or rotate:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
                self._part += 1
            self.directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            self._written = os.fstat(self._fd).st_size
            if self._written:
                whole = _after_last_newline(self._fd, self._written)
                if whole < self._written:  # a killed writer's torn line: cut before appending
                    self._torn_at = whole
        return self._fd

    def _lines(self, spans: Sequence[ReadableSpan]) -> list[tuple[bytes, int]]:
        """(line, spans in it): lines of at most `max_line_bytes` (unless one span is more)."""
        line = (json.dumps(encode_traces_data(spans), separators=(",", ":")) + "\n").encode()
        if len(line) <= self.max_line_bytes or len(spans) == 1:
            return [(line, len(spans))]
        mid = len(spans) // 2
        return self._lines(spans[:mid]) + self._lines(spans[mid:])

    def _cut(self, fd: int, offset: int) -> None:
        """Remove a partial line: back to `offset`, now or (if that fails) before the next write."""
        self._torn_at = offset
        try:
            if os.fstat(fd).st_size > offset:
                os.ftruncate(fd, offset)
                self.torn_lines_cut += 1
            self._torn_at = None
        except OSError:
            pass

    def _append(self, line: bytes) -> None:
        """Append one whole line or nothing; raise the OSError that prevented it."""
        fd = self._open()
        if self._torn_at is not None:
            self._cut(fd, self._torn_at)
            if self._torn_at is not None:
                raise OSError(errno.EIO, "cannot cut back a partial line")
        offset = os.fstat(fd).st_size  # the line's start, recorded before writing
        view = memoryview(line)
        done = 0
        try:
            while done < len(line):
                n = os.write(fd, view[done:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                # A short write means the store ran out of room (or a signal): the
                # next write of the rest returns the real errno, or finishes the line.
                done += n
        except OSError as e:
            self._cut(fd, offset)
            if e.errno == errno.EFBIG and offset > 0:
                self._written = self.max_file_bytes  # a per-file limit: go on in a new part
            raise
        self._written = offset + done

    def write(self, spans: Sequence[ReadableSpan]) -> WriteResult:
        """Append `spans`; never raises OSError: failures come back in the result."""
        if not spans:
            return WriteResult(0)
        return self.write_lines(self._lines(list(spans)))

    def write_lines(self, lines: Sequence[tuple[bytes, int]]) -> WriteResult:
        """Append already encoded lines, `(line ending in a newline, spans in it)` each,
        with the same guarantees as `write`: for spans that arrive as OTLP JSON already
        (`tracedpush collect`), so they are not decoded into SDK spans just to be
        encoded again."""
        total = sum(n for _, n in lines)
        written = 0
        with self._lock:
            for line, n in lines:
                try:
                    self._append(line)
                except OSError as e:
                    return WriteResult(written, total - written, e, self.path)
                written += n
            return WriteResult(written, 0, None, self.path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.write(spans)
        except Exception:  # the SDK's contract: report, never raise
            return SpanExportResult.FAILURE
        return SpanExportResult.FAILURE if result.dropped else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
