"""`TraceStore`: spans grouped by trace, loaded from files or a Jaeger, incrementally.

Files: one path or several merged into one store (`TraceStore.from_paths`); a directory
is searched recursively for ``*.jsonl`` and ``*.json``. Each is read as JSON lines (one
OTLP `TracesData` per line, as OpenTelemetry's file exporter and the Collector's file
exporter write) unless it is one whole JSON document (a pretty-printed export, a Jaeger
download). Re-reading reads only new bytes: every file keeps its offset, and a trailing
line without its newline is kept for the next refresh rather than counted as malformed
(the writer may be half-way through it); once the file stops growing, the
remainder is parsed or counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tracedpush.analysis._gc import paused_gc
from tracedpush.analysis.model import LoadStats, Span
from tracedpush.analysis.otlp import Decoder, Malformed

try:
    from tracedpush.analysis.otlp_fast import document_line
except ImportError:  # pragma: no cover - without msgspec every line goes through json
    document_line = None  # type: ignore[assignment]

_CHUNK = 8 << 20  # bytes read per system call on big files
_SUFFIXES = (".jsonl", ".json")


class Source(Protocol):
    """Something a store can pull new spans from."""

    def read(self, decoder: Decoder, stats: LoadStats) -> None: ...

    def describe(self) -> str: ...


@dataclass(slots=True)
class _FileState:
    offset: int = 0  # bytes consumed so far
    pending: bytes = b""  # a trailing line without its newline
    size: int = -1  # size at the previous refresh
    mtime_ns: int = 0
    whole: bool = False  # a single JSON document, re-read when it changes
    lines_ok: int = 0


class FileSource:
    """Trace files or directories of them (recursive), read as one source.

    Several paths (``report --traces A --traces B``: the engines' directory and the
    proxy's, when they were not given the same place) are merged; a file reached through
    two of them is read once.
    """

    def __init__(self, path: str | os.PathLike[str], *more: str | os.PathLike[str]) -> None:
        self.paths = [Path(p) for p in (path, *more)]
        self._states: dict[Path, _FileState] = {}
        self.last_error: str | None = None

    def describe(self) -> str:
        return ", ".join(str(p) for p in self.paths)

    def files(self) -> list[Path]:
        found: dict[Path, None] = {}
        for path in self.paths:
            if path.is_file():
                found[path.resolve()] = None
            elif path.is_dir():
                found.update(
                    (p.resolve(), None)
                    for p in path.rglob("*")
                    if p.suffix in _SUFFIXES and p.is_file()
                )
        return sorted(found)

    def read(self, decoder: Decoder, stats: LoadStats) -> None:
        missing = [p for p in self.paths if not p.exists()]
        self.last_error = None
        if missing:
            self.last_error = "; ".join(f"{p}: no such file or directory" for p in missing)
            stats.note(self.last_error)
            if len(missing) == len(self.paths):
                return
        for f in self.files():
            state = self._states.get(f)
            if state is None:
                state = self._states[f] = _FileState()
                stats.files += 1
            try:
                self._read_file(f, state, decoder, stats)
            except OSError as exc:
                stats.note(f"{f}: {exc}")
        stats.partial = sum(1 for s in self._states.values() if s.pending)

    def _read_file(self, f: Path, st: _FileState, decoder: Decoder, stats: LoadStats) -> None:
        info = f.stat()
        size, mtime = info.st_size, info.st_mtime_ns
        if size < st.offset:  # truncated or replaced: start over (duplicates are dropped)
            st.offset, st.pending, st.whole = 0, b"", False
        if st.whole:
            if size != st.size or mtime != st.mtime_ns:
                self._read_whole(f, st, decoder, stats)
            st.size, st.mtime_ns = size, mtime
            return
        grew = size > st.offset
        if grew:
            with f.open("rb") as fh:
                fh.seek(st.offset)
                while True:
                    chunk = fh.read(_CHUNK)
                    if not chunk:
                        break
                    st.offset += len(chunk)
                    stats.bytes_read += len(chunk)
                    data = st.pending + chunk if st.pending else chunk
                    cut = data.rfind(b"\n")
                    if cut < 0:
                        st.pending = data
                        continue
                    st.pending = data[cut + 1 :]
                    self._lines(f, st, data[:cut], decoder, stats)
        elif st.pending and size == st.size:
            # The file stopped growing with a line that has no newline: it is either
            # complete (some writers omit the last newline) or torn for good.
            tail, st.pending = st.pending, b""
            self._lines(f, st, tail, decoder, stats)
        st.size, st.mtime_ns = size, mtime

    def _lines(
        self, f: Path, st: _FileState, block: bytes, decoder: Decoder, stats: LoadStats
    ) -> None:
        bad: list[bytes] = []
        fast = document_line
        for line in block.split(b"\n"):
            if not line.strip():
                continue
            stats.lines_read += 1
            try:
                if fast is None or fast(line, decoder) is None:
                    decoder.document(json.loads(line))
                st.lines_ok += 1
            except (ValueError, Malformed, TypeError, AttributeError, KeyError) as exc:
                bad.append(line)
                stats.note(f"{f.name}: line skipped: {str(exc)[:120]}")
        if not bad:
            return
        if (
            st.lines_ok == 0
            and bad[0].lstrip()[:1] in (b"{", b"[")
            and self._try_whole(f, st, decoder, stats)
        ):
            stats.lines_read -= len(bad)
            return
        stats.malformed += len(bad)

    def _try_whole(self, f: Path, st: _FileState, decoder: Decoder, stats: LoadStats) -> bool:
        """A file none of whose lines parse may be one pretty-printed document."""
        try:
            doc = json.loads(f.read_bytes())
        except ValueError:
            return False
        st.whole = True
        st.pending = b""
        try:
            decoder.document(doc)
        except (Malformed, TypeError, AttributeError, KeyError, ValueError) as exc:
            stats.malformed += 1
            stats.note(f"{f.name}: {exc}")
        return True

    def _read_whole(self, f: Path, st: _FileState, decoder: Decoder, stats: LoadStats) -> None:
        data = f.read_bytes()
        stats.bytes_read += len(data)
        st.offset = len(data)
        try:
            decoder.document(json.loads(data))
        except (ValueError, Malformed, TypeError, AttributeError, KeyError) as exc:
            stats.malformed += 1
            stats.note(f"{f.name}: {exc}")


class TraceStore:
    """Spans grouped by trace id; refreshable from its source.

    ``TraceStore.from_path(dir)`` / ``TraceStore.from_jaeger(url)`` load at once;
    ``refresh()`` then reads only what is new and returns the number of new spans.
    Duplicate spans (same trace and span id) are dropped, so re-reading overlapping
    Jaeger windows or a file copied into two places is harmless.
    """

    def __init__(self, source: Source | None = None) -> None:
        self.source = source
        self.stats = LoadStats()
        self.traces: dict[str, dict[str, Span]] = {}
        self.version = 0  # bumped by every refresh that added spans
        self.changed: set[str] = set()  # trace ids that got spans in the last refresh
        self._decoder = Decoder(self._add, self.stats)
        self._new = 0

    # ------------------------------------------------------------------ builders
    @classmethod
    def from_path(cls, path: str | os.PathLike[str], *, load: bool = True) -> TraceStore:
        return cls.from_paths([path], load=load)

    @classmethod
    def from_paths(
        cls, paths: Iterable[str | os.PathLike[str]], *, load: bool = True
    ) -> TraceStore:
        """Files or directories merged into one store (a file reached twice is read once)."""
        paths = list(paths)
        if not paths:
            raise ValueError("no trace paths given")
        store = cls(FileSource(*paths))
        if load:
            store.refresh()
        return store

    @classmethod
    def from_jaeger(
        cls,
        url: str,
        *,
        service: str | None = None,
        lookback: str | float = "1h",
        trace_ids: Iterable[str] | None = None,
        timeout: float = 10.0,
        load: bool = True,
        since: float | None = None,
        until: float | None = None,
    ) -> TraceStore:
        """A live Jaeger query service (e.g. http://localhost:16686); see `jaeger`.
        `since` / `until` (unix s): search that window instead of the `lookback`."""
        from tracedpush.analysis.jaeger import JaegerSource

        store = cls(
            JaegerSource(
                url,
                service=service,
                lookback=lookback,
                trace_ids=trace_ids,
                timeout=timeout,
                since=since,
                until=until,
            )
        )
        if load:
            store.refresh()
        return store

    @classmethod
    def from_spans(cls, spans: Iterable[Span]) -> TraceStore:
        store = cls()
        store.add_spans(spans)
        return store

    @classmethod
    def from_documents(cls, docs: Iterable[Any]) -> TraceStore:
        """OTLP JSON documents already in memory (e.g. a synthetic run's `documents`)."""
        store = cls()
        store.add_documents(docs)
        return store

    # ------------------------------------------------------------------ loading
    def _add(self, span: Span) -> None:
        spans = self.traces.get(span.trace_id)
        if spans is None:
            spans = self.traces[span.trace_id] = {}
        elif span.span_id in spans:
            self.stats.duplicates += 1
            return
        spans[span.span_id] = span
        self.changed.add(span.trace_id)
        self.stats.spans += 1
        self._new += 1

    def add_spans(self, spans: Iterable[Span]) -> int:
        self._new = 0
        for s in spans:
            self._add(s)
        if self._new:
            self.version += 1
        return self._new

    def add_documents(self, docs: Iterable[Any]) -> int:
        self._new = 0
        with paused_gc():
            self._add_documents(docs)
        if self._new:
            self.version += 1
        return self._new

    def _add_documents(self, docs: Iterable[Any]) -> None:
        for doc in docs:
            try:
                self._decoder.document(doc)
            except (Malformed, TypeError, AttributeError, KeyError, ValueError) as exc:
                self.stats.malformed += 1
                self.stats.note(str(exc))

    def refresh(self) -> int:
        """Read what is new at the source; returns the number of new spans."""
        self._new = 0
        self.changed = set()
        if self.source is not None:
            with paused_gc():
                self.source.read(self._decoder, self.stats)
        if self._new:
            self.version += 1
        return self._new

    # ------------------------------------------------------------------ access
    @property
    def last_error(self) -> str | None:
        """Why the last refresh could not read its source (unreachable Jaeger, missing
        directory), or None. Skipped lines are counted in `stats`, not reported here."""
        return getattr(self.source, "last_error", None)

    def __len__(self) -> int:
        return len(self.traces)

    def __iter__(self) -> Iterator[list[Span]]:
        for spans in self.traces.values():
            yield list(spans.values())

    def spans(self, trace_id: str) -> list[Span]:
        return list(self.traces.get(trace_id, {}).values())

    def all_spans(self) -> Iterator[Span]:
        for spans in self.traces.values():
            yield from spans.values()

    def describe(self) -> str:
        return self.source.describe() if self.source is not None else "memory"
