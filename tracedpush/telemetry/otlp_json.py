"""Encode SDK spans as OTLP JSON (`TracesData`), the format of OpenTelemetry's file exporter.

Ids are lowercase hex, 64-bit integers and nanosecond timestamps are strings, enums
are integers: exactly what the Collector's file exporter writes and Jaeger's v3 API
returns, so any OTLP-JSON reader can consume our files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": value.hex()}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in (attrs or {}).items()]


def encode_span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.context
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}",
        "spanId": f"{ctx.span_id:016x}",
        "parentSpanId": f"{span.parent.span_id:016x}" if span.parent else "",
        "name": span.name,
        "kind": span.kind.value + 1,  # SDK INTERNAL=0 .. ; OTLP SPAN_KIND_INTERNAL=1
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": attributes(span.attributes),
        "status": {"code": _STATUS[span.status.status_code]},
    }
    if span.status.description:
        out["status"]["message"] = span.status.description
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(e.timestamp),
                "name": e.name,
                "attributes": attributes(e.attributes),
            }
            for e in span.events
        ]
    if span.links:
        out["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                "attributes": attributes(link.attributes),
            }
            for link in span.links
        ]
    return out


def encode_traces_data(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Group spans by resource and scope into one `TracesData` object."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for span in spans:
        res_key = id(span.resource)
        entry = by_resource.setdefault(res_key, (span.resource, {}))
        scope = span.instrumentation_scope
        scope_key = (scope.name, scope.version or "") if scope else ("", "")
        entry[1].setdefault(scope_key, []).append(encode_span(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        resource_spans.append(
            {
                "resource": {"attributes": attributes(resource.attributes if resource else {})},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": encoded}
                    for (name, version), encoded in scopes.items()
                ],
            }
        )
    return {"resourceSpans": resource_spans}
