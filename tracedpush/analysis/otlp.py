"""Decode OTLP JSON (and Jaeger's legacy JSON) into `Span` objects.

One decoder for every source: the OpenTelemetry file exporter's lines, a Collector's
file exporter, Jaeger's v3 API (`{"result": TracesData}`) and Jaeger's internal
`/api/traces` shape (`{"data": [...]}`). Anything that does not decode is counted, never
raised: a half-written span must not cost the user the rest of the file.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import Any

from tracedpush import semconv
from tracedpush.analysis.model import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_INTERNAL,
    KIND_PRODUCER,
    KIND_SERVER,
    KIND_UNSPECIFIED,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_UNSET,
    Event,
    LoadStats,
    Resource,
    Span,
)

SpanSink = Callable[[Span], None]

_KINDS = {
    "SPAN_KIND_UNSPECIFIED": KIND_UNSPECIFIED,
    "SPAN_KIND_INTERNAL": KIND_INTERNAL,
    "SPAN_KIND_SERVER": KIND_SERVER,
    "SPAN_KIND_CLIENT": KIND_CLIENT,
    "SPAN_KIND_PRODUCER": KIND_PRODUCER,
    "SPAN_KIND_CONSUMER": KIND_CONSUMER,
    # Jaeger legacy "span.kind" tag values
    "internal": KIND_INTERNAL,
    "server": KIND_SERVER,
    "client": KIND_CLIENT,
    "producer": KIND_PRODUCER,
    "consumer": KIND_CONSUMER,
}
_STATUS = {
    "STATUS_CODE_UNSET": STATUS_UNSET,
    "STATUS_CODE_OK": STATUS_OK,
    "STATUS_CODE_ERROR": STATUS_ERROR,
    "UNSET": STATUS_UNSET,
    "OK": STATUS_OK,
    "ERROR": STATUS_ERROR,
}
_HEX = frozenset("0123456789abcdefABCDEF")


class Malformed(ValueError):
    """A document or span that cannot be decoded."""


def norm_id(value: Any, nbytes: int) -> str:
    """A trace/span id as lowercase hex; accepts hex or base64 (protobuf JSON)."""
    if not value:
        return ""
    if not isinstance(value, str):
        raise Malformed(f"id {value!r} is not a string")
    if len(value) == 2 * nbytes and _HEX.issuperset(value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Malformed(f"id {value!r} is neither hex nor base64") from exc
    if len(raw) != nbytes:
        raise Malformed(f"id {value!r} has {len(raw)} bytes, expected {nbytes}")
    return raw.hex()


def any_value(v: Any) -> Any:
    """Decode an OTLP `AnyValue` (`{"stringValue": ...}` etc.)."""
    if not isinstance(v, dict):
        return v
    for key, x in v.items():
        if key == "stringValue":
            return x
        if key == "intValue":
            return int(x)
        if key == "doubleValue":
            return float(x)
        if key == "boolValue":
            return bool(x)
        if key == "arrayValue":
            return _array((x or {}).get("values") or ())
        if key == "kvlistValue":
            return attributes((x or {}).get("values"))
        if key == "bytesValue":
            return x
    return None


def _array(values: Any) -> list[Any]:
    """`any_value` of each element; one-key int and string values (engine.steps'
    arrays: most of a big run's attribute values) without the call."""
    out = []
    for i in values:
        if i.__class__ is dict and len(i) == 1:
            if "intValue" in i:
                out.append(int(i["intValue"]))
                continue
            if "stringValue" in i:
                out.append(i["stringValue"])
                continue
        out.append(any_value(i))
    return out


def attributes(items: Any) -> dict[str, Any]:
    """OTLP `[{"key": k, "value": AnyValue}]` -> dict."""
    if not items:
        return {}
    out: dict[str, Any] = {}
    for kv in items:
        v = kv.get("value")
        # fast path: almost every value is a stringValue or an intValue
        if v is None:
            out[kv["key"]] = None
        elif "stringValue" in v:
            out[kv["key"]] = v["stringValue"]
        elif "intValue" in v:
            out[kv["key"]] = int(v["intValue"])
        else:
            out[kv["key"]] = any_value(v)
    return out


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _camelize(obj: Any) -> Any:
    """snake_case keys (protobuf JSON with original names) -> the camelCase OTLP uses."""
    if isinstance(obj, dict):
        return {_camel(k) if "_" in k and k != "key" else k: _camelize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_camelize(v) for v in obj]
    return obj


# what decoding one span may raise: the span is counted malformed and skipped
SPAN_ERRORS = (Malformed, AttributeError, KeyError, TypeError, ValueError)


class Decoder:
    """Turns documents into spans; interns resources so spans share them."""

    def __init__(self, sink: SpanSink, stats: LoadStats) -> None:
        self.sink = sink
        self.stats = stats
        self._resources: dict[tuple[str, str, str, str], Resource] = {}
        # a resource's raw JSON -> what `resource` made of it (`otlp_fast.document_line`)
        self.raw_resources: dict[bytes, Resource] = {}

    # ------------------------------------------------------------------ resources
    def resource(self, attrs: dict[str, Any]) -> Resource:
        service = str(attrs.get(semconv.RES_SERVICE_NAME) or "unknown_service")
        host = str(attrs.get(semconv.RES_HOST_NAME) or "")
        instance = str(attrs.get(semconv.RES_SERVICE_INSTANCE_ID) or host or service)
        pid = attrs.get(semconv.RES_PROCESS_PID)
        key = (service, instance, host, "" if pid is None else str(pid))
        res = self._resources.get(key)
        if res is None:
            res = Resource(service, instance, host, key[3], attrs)
            self._resources[key] = res
        return res

    # ------------------------------------------------------------------ documents
    def document(self, doc: Any) -> int:
        """Decode any supported document; returns the number of spans handed to the sink."""
        if isinstance(doc, list):
            return sum(self.document(d) for d in doc)
        if not isinstance(doc, dict):
            raise Malformed("document is not a JSON object")
        if "resourceSpans" in doc:
            self.stats.documents += 1
            return self.traces_data(doc["resourceSpans"])
        if "result" in doc:  # Jaeger v3: {"result": TracesData}
            return self.document(doc["result"])
        if "data" in doc and isinstance(doc["data"], list):  # Jaeger legacy
            self.stats.documents += 1
            return self.jaeger_legacy(doc["data"])
        if "resource_spans" in doc:
            return self.document(_camelize(doc))
        if "error" in doc:
            raise Malformed(f"error document: {str(doc['error'])[:200]}")
        if "traceID" in doc and "spans" in doc:  # one legacy trace
            self.stats.documents += 1
            return self.jaeger_legacy([doc])
        if not doc:
            return 0
        raise Malformed(f"unknown document with keys {sorted(doc)[:5]}")

    def traces_data(self, resource_spans: Any) -> int:
        n = 0
        stats = self.stats
        for rs in resource_spans or ():
            try:
                res = self.resource(attributes((rs.get("resource") or {}).get("attributes")))
                scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ()
            except (AttributeError, KeyError, TypeError, ValueError):
                stats.malformed += 1
                continue
            for ss in scopes:
                n += self.spans(ss.get("spans") or (), res, self.span)
        return n

    def spans(
        self, raw: Iterable[Any], res: Resource, decode: Callable[[Any, Resource], Span]
    ) -> int:
        """Each span of one scope, by `decode`, to the sink; one that does not decode is
        counted and skipped. How many went to the sink."""
        n = 0
        stats, sink = self.stats, self.sink
        for s in raw:
            try:
                span = decode(s, res)
            except SPAN_ERRORS as exc:
                stats.malformed += 1
                stats.note(f"span skipped: {exc}")
                continue
            sink(span)
            n += 1
        return n

    @staticmethod
    def span(s: dict[str, Any], res: Resource) -> Span:
        # Hex ids have 32/16 characters; base64 ones (protobuf JSON) 24/12.
        tid = s["traceId"]
        tid = tid.lower() if len(tid) == 32 else norm_id(tid, 16)
        sid = s["spanId"]
        sid = sid.lower() if len(sid) == 16 else norm_id(sid, 8)
        pid = s.get("parentSpanId") or ""
        if pid:
            pid = pid.lower() if len(pid) == 16 else norm_id(pid, 8)
        start = int(s["startTimeUnixNano"])
        end = int(s.get("endTimeUnixNano") or start)
        if end < start:
            raise Malformed(f"span {sid} ends before it starts")
        kind = s.get("kind", 0)
        if kind.__class__ is not int:
            kind = _KINDS.get(kind, 0) if isinstance(kind, str) else int(kind)
        status = s.get("status")
        code, message = STATUS_UNSET, ""
        if status:
            code = status.get("code", 0)
            if code.__class__ is not int:
                code = _STATUS.get(code, 0) if isinstance(code, str) else int(code)
            message = status.get("message") or ""
        evs = s.get("events")
        events = (
            [
                Event(
                    e.get("name", ""),
                    int(e.get("timeUnixNano") or 0),
                    attributes(e.get("attributes")),
                )
                for e in evs
            ]
            if evs
            else []
        )
        return Span(
            tid,
            sid,
            pid,
            s["name"],
            kind,
            start,
            end,
            res,
            attributes(s.get("attributes")),
            events,
            code,
            message,
        )

    # ------------------------------------------------------------ Jaeger legacy
    def jaeger_legacy(self, traces: list[Any]) -> int:
        """Jaeger's internal `/api/traces` shape: microseconds, references, processes."""
        n = 0
        for tr in traces:
            if not isinstance(tr, dict):
                self.stats.malformed += 1
                continue
            procs: dict[str, Resource] = {}
            for pid_key, proc in (tr.get("processes") or {}).items():
                attrs = _jaeger_tags(proc.get("tags"))
                attrs.setdefault(semconv.RES_SERVICE_NAME, proc.get("serviceName") or "")
                procs[pid_key] = self.resource(attrs)
            for s in tr.get("spans") or ():
                try:
                    span = self._jaeger_span(s, procs)
                except (Malformed, AttributeError, KeyError, TypeError, ValueError) as exc:
                    self.stats.malformed += 1
                    self.stats.note(f"legacy span skipped: {exc}")
                    continue
                self.sink(span)
                n += 1
        return n

    def _jaeger_span(self, s: dict[str, Any], procs: dict[str, Resource]) -> Span:
        res = procs.get(s.get("processID", ""))
        if res is None:
            res = self.resource(dict((s.get("process") and _jaeger_process(s["process"])) or {}))
        tags = _jaeger_tags(s.get("tags"))
        parent = ""
        for ref in s.get("references") or ():
            if ref.get("refType", "CHILD_OF") in ("CHILD_OF", "FOLLOWS_FROM") and ref.get(
                "traceID"
            ) == s.get("traceID"):
                parent = ref.get("spanID", "")
                break
        kind = _KINDS.get(str(tags.pop("span.kind", "")), KIND_INTERNAL)
        code = _STATUS.get(str(tags.pop("otel.status_code", "")).upper(), STATUS_UNSET)
        if code == STATUS_UNSET and tags.get("error") is True:
            code = STATUS_ERROR
        message = str(tags.pop("otel.status_description", "") or "")
        for k in ("otel.scope.name", "otel.scope.version", "internal.span.format"):
            tags.pop(k, None)
        start = int(s["startTime"]) * 1000
        end = start + int(s.get("duration") or 0) * 1000
        events = []
        for log in s.get("logs") or ():
            fields = _jaeger_tags(log.get("fields"))
            name = str(fields.pop("event", "") or fields.pop("message", "") or "log")
            events.append(Event(name, int(log.get("timestamp") or 0) * 1000, fields))
        tid = norm_id(s["traceID"].rjust(32, "0"), 16)
        sid = norm_id(s["spanID"].rjust(16, "0"), 8)
        return Span(
            tid,
            sid,
            norm_id(parent.rjust(16, "0"), 8) if parent else "",
            s["operationName"],
            kind,
            start,
            end,
            res,
            tags,
            events,
            code,
            message,
        )


def _jaeger_process(proc: dict[str, Any]) -> dict[str, Any]:
    attrs = _jaeger_tags(proc.get("tags"))
    attrs.setdefault(semconv.RES_SERVICE_NAME, proc.get("serviceName") or "")
    return attrs


def _jaeger_tags(tags: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in tags or ():
        v = t.get("value")
        typ = t.get("type", "string")
        if typ == "int64" and v is not None:
            v = int(v)
        elif typ == "float64" and v is not None:
            v = float(v)
        elif typ == "bool" and isinstance(v, str):
            v = v.lower() == "true"
        out[t["key"]] = v
    return out
