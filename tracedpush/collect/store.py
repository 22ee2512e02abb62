"""The collector's file in the trace store: the connectors' line-atomic JSONL writer.

One file per collector process (`tracedpush-collect-<host>-<pid>.jsonl` in the traces
directory, rotated by size), written by `telemetry.jsonl.JsonLinesSpanExporter`, so a
line is all or nothing even when the disk fills up, and `tracedpush report DIR` /
`tracedpush console DIR` read it beside (or instead of) the engines' own files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tracedpush import semconv
from tracedpush.collect.decode import span_count
from tracedpush.telemetry.jsonl import JsonLinesSpanExporter, WriteResult

STEM = "tracedpush-collect"
MAX_LINE_BYTES = 4 << 20  # as the connectors' exporter: a bigger request is split


def _encode(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def _subset(doc: dict[str, Any], keep: list[tuple[int, int, int]]) -> dict[str, Any]:
    """The document with only the spans at (resource, scope, span) positions `keep`."""
    out: list[dict[str, Any]] = []
    rs_list = doc.get("resourceSpans") or []
    by_rs: dict[int, dict[int, list[Any]]] = {}
    for r, s, i in keep:
        by_rs.setdefault(r, {}).setdefault(s, []).append(rs_list[r]["scopeSpans"][s]["spans"][i])
    for r, scopes in by_rs.items():
        rs = rs_list[r]
        out.append(
            {
                "resource": rs.get("resource") or {},
                "scopeSpans": [
                    {**{k: v for k, v in rs["scopeSpans"][s].items() if k != "spans"}, "spans": sp}
                    for s, sp in scopes.items()
                ],
            }
        )
    return {"resourceSpans": out}


def lines(doc: dict[str, Any], max_bytes: int = MAX_LINE_BYTES) -> list[tuple[bytes, int]]:
    """`(line, spans in it)`: the document as one line, or split by spans (halving) so
    no line exceeds `max_bytes` unless one span alone does."""
    line = _encode(doc)
    n = span_count(doc)
    if len(line) <= max_bytes or n <= 1:
        return [(line, n)]
    where = [
        (r, s, i)
        for r, rs in enumerate(doc.get("resourceSpans") or ())
        for s, ss in enumerate(rs.get("scopeSpans") or ())
        for i in range(len(ss.get("spans") or ()))
    ]
    mid = len(where) // 2
    return lines(_subset(doc, where[:mid]), max_bytes) + lines(_subset(doc, where[mid:]), max_bytes)


class TraceFile:
    """Appends received documents to this process's JSONL file; counts what it lost."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.exporter = JsonLinesSpanExporter(Path(directory), STEM, max_line_bytes=MAX_LINE_BYTES)
        self.written = 0
        self.dropped: dict[str, int] = {semconv.DROP_STORE_FULL: 0, semconv.DROP_EXPORT_FAILED: 0}
        self.last_error = ""

    @property
    def path(self) -> Path:
        return self.exporter.path

    def write(self, doc: dict[str, Any]) -> WriteResult:
        """Append `doc` (never raises OSError: a full disk is counted, not fatal)."""
        result = self.exporter.write_lines(lines(doc))
        self.written += result.written
        if result.dropped:
            reason = semconv.DROP_STORE_FULL if result.store_full else semconv.DROP_EXPORT_FAILED
            self.dropped[reason] += result.dropped
            self.last_error = f"cannot write {result.path} ({result.describe_error()})"
        return result

    def close(self) -> None:
        self.exporter.shutdown()
