"""OTLP export requests (protobuf or JSON, gzip or not) -> OTLP JSON `TracesData` + spans.

Everything received becomes the one format the trace store holds (docs/spans.md, the
file exporter's OTLP JSON: hex ids, integer enums, 64-bit integers as strings), so
`tracedpush report` reads what `collect` wrote exactly as it reads the connectors'
files. The same document is decoded by the analysis' own `Decoder` into `Span`s for
assembly, so the collector and the report cannot disagree on what a span says.
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tracedpush.analysis.model import LoadStats, Span
from tracedpush.analysis.otlp import Decoder, Malformed

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
MAX_BODY_BYTES = 64 << 20  # after decompression: a bigger request is refused (a 400)


class BadRequest(ValueError):
    """A body that is not an OTLP trace export request: answered 400, never raised on."""


@dataclass(slots=True)
class Batch:
    """One export request, decoded: the document the store gets and its spans."""

    document: dict[str, Any]  # OTLP JSON TracesData
    spans: list[Span]  # what the analysis' decoder made of it
    rejected: int  # spans it could not decode (skipped, reported as partial success)


def decompress(body: bytes, encoding: str | None) -> bytes:
    """The body without its Content-Encoding (gzip or deflate; identity)."""
    enc = (encoding or "identity").strip().lower()
    try:
        if enc == "gzip":
            out = gzip.decompress(body)
        elif enc == "deflate":
            out = zlib.decompress(body)
        elif enc in ("identity", ""):
            out = body
        else:
            raise BadRequest(f"unsupported Content-Encoding {encoding!r} (use gzip)")
    except (OSError, EOFError, zlib.error) as exc:
        raise BadRequest(f"body is not valid {enc}: {exc}") from None
    if len(out) > MAX_BODY_BYTES:
        raise BadRequest(f"body is larger than {MAX_BODY_BYTES} bytes")
    return out


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    try:
        return ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise BadRequest(f"not an OTLP ExportTraceServiceRequest: {exc}") from None


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("OTLP JSON body must be an object with resourceSpans")
    if not doc:
        return {"resourceSpans": []}
    rs = doc.get("resourceSpans")
    if not isinstance(rs, list) or not all(isinstance(r, dict) for r in rs):
        raise BadRequest("OTLP JSON body has no resourceSpans list")
    return doc


def _any(v: AnyValue) -> dict[str, Any]:
    which = v.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": v.string_value}
    if which == "int_value":
        return {"intValue": str(v.int_value)}
    if which == "bool_value":
        return {"boolValue": v.bool_value}
    if which == "double_value":
        return {"doubleValue": v.double_value}
    if which == "array_value":
        return {"arrayValue": {"values": [_any(x) for x in v.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": _attrs(v.kvlist_value.values)}}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode()}
    return {}


def _attrs(kvs: Any) -> list[dict[str, Any]]:
    return [{"key": kv.key, "value": _any(kv.value)} for kv in kvs]


def _span(s: PbSpan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": s.trace_id.hex(),
        "spanId": s.span_id.hex(),
        "parentSpanId": s.parent_span_id.hex(),
        "name": s.name,
        "kind": int(s.kind),
        "startTimeUnixNano": str(s.start_time_unix_nano),
        "endTimeUnixNano": str(s.end_time_unix_nano),
        "attributes": _attrs(s.attributes),
        "status": {"code": int(s.status.code)},
    }
    if s.trace_state:
        out["traceState"] = s.trace_state
    if s.status.message:
        out["status"]["message"] = s.status.message
    if s.events:
        out["events"] = [
            {
                "timeUnixNano": str(e.time_unix_nano),
                "name": e.name,
                "attributes": _attrs(e.attributes),
            }
            for e in s.events
        ]
    if s.links:
        out["links"] = [
            {
                "traceId": link.trace_id.hex(),
                "spanId": link.span_id.hex(),
                "attributes": _attrs(link.attributes),
            }
            for link in s.links
        ]
    return out


def to_document(req: ExportTraceServiceRequest) -> dict[str, Any]:
    """An export request as OTLP JSON, the way `telemetry.otlp_json` writes spans."""
    resource_spans = []
    for rs in req.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            scope: dict[str, Any] = {"name": ss.scope.name, "version": ss.scope.version}
            if ss.scope.attributes:
                scope["attributes"] = _attrs(ss.scope.attributes)
            scopes.append({"scope": scope, "spans": [_span(s) for s in ss.spans]})
        resource_spans.append(
            {"resource": {"attributes": _attrs(rs.resource.attributes)}, "scopeSpans": scopes}
        )
    return {"resourceSpans": resource_spans}


def decode_document(doc: dict[str, Any]) -> Batch:
    """Spans of an OTLP JSON document, through the analysis' decoder (it skips and
    counts a span it cannot read instead of failing the whole request)."""
    spans: list[Span] = []
    stats = LoadStats()
    try:
        Decoder(spans.append, stats).document(doc)
    except (Malformed, TypeError, AttributeError, KeyError, ValueError) as exc:
        raise BadRequest(f"not an OTLP trace document: {exc}") from None
    return Batch(doc, spans, stats.malformed)


def from_http(body: bytes, content_type: str | None, encoding: str | None) -> Batch:
    """An OTLP/HTTP POST /v1/traces body (protobuf unless the type says JSON)."""
    raw = decompress(body, encoding)
    ctype = (content_type or PROTOBUF).split(";")[0].strip().lower()
    if ctype == JSON:
        return decode_document(parse_json(raw))
    if ctype in (PROTOBUF, "application/protobuf", "application/octet-stream"):
        return decode_document(to_document(parse_protobuf(raw)))
    raise BadRequest(f"unsupported Content-Type {content_type!r} ({PROTOBUF} or {JSON})")


def from_request(req: ExportTraceServiceRequest) -> Batch:
    """A gRPC TraceService/Export request."""
    return decode_document(to_document(req))


def span_count(doc: dict[str, Any]) -> int:
    return sum(
        len(ss.get("spans") or ())
        for rs in doc.get("resourceSpans") or ()
        for ss in rs.get("scopeSpans") or ()
    )
