"""OTLP JSON decoded by msgspec into typed structs: a line's structure with its spans
left raw (`LINE`), for the index's cold build, and a whole line's spans for every other
read (`document_line`).

Why: `otlp.Decoder.span` needs the span as dicts (``json.loads``) and converts every
attribute value in Python; a big run's bytes are mostly engine-step spans of long int
arrays, so that was most of a build worker's time. Here msgspec builds the containers
and the arrays in C, and the scalars go through the same Python expressions as
`Decoder.span` (every scalar field is typed ``Any``, so it arrives as ``json.loads``
would give it). Wherever the two could differ (an `AnyValue` with several fields or a
kvlist/bytes one, a container of an unexpected type, an end time of 0, anything that
raises), `fields` answers None and the caller uses `Decoder.span` itself: the answer is
always exactly `Decoder.span`'s (tests/unit/test_index_build_fast.py).

`document_line` does what `Decoder.document(json.loads(line))` does with a line that
holds one ``TracesData``, with 1.8x less CPU on a Live refresh's lines (the 23,692 lines
of 2,040 new requests: 0.78-1.20 s that way, 0.45-0.56 s here). Any line it cannot
decode exactly so (another document shape, a field it does not know, bytes that are not
UTF-8) it leaves to that (tests/unit/test_index_build_fast.py).
"""

from __future__ import annotations

import codecs
import json
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET, Raw, Struct

from tracedpush.analysis.model import STATUS_UNSET, Event, Resource, Span
from tracedpush.analysis.otlp import _KINDS, _STATUS, Decoder, attributes, norm_id

_ABSENT = Raw(b"")  # a Raw field cannot be optional: an absent `arrayValue` reads as this
_NULL = Raw(b"null")  # Raw cannot be in a union: an absent field reads as null


class Scope(Struct, forbid_unknown_fields=True):
    scope: Raw = _NULL
    spans: list[Raw] = []  # msgspec copies defaults
    schemaUrl: Raw = _NULL


class ResourceSpans(Struct, forbid_unknown_fields=True):
    resource: Raw = _NULL
    scopeSpans: list[Scope] = []
    schemaUrl: Raw = _NULL


class TracesData(Struct, forbid_unknown_fields=True):
    """A line's structure, its spans raw (unknown fields: the line is not this shape)."""

    resourceSpans: list[ResourceSpans]


LINE = msgspec.json.Decoder(TracesData)
LINE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)


class _AnyValue(Struct, forbid_unknown_fields=True, gc=False):
    # kvlistValue, bytesValue or any other key is unknown: the whole span falls back
    stringValue: Any = UNSET
    intValue: Any = UNSET
    doubleValue: Any = UNSET
    boolValue: Any = UNSET
    arrayValue: Raw = _ABSENT  # decoded on its own (`_array`): most are all ints


class _KeyValue(Struct, gc=False):
    key: str
    value: _AnyValue | None = None


class _Event(Struct, gc=False):
    name: Any = ""
    timeUnixNano: Any = None
    attributes: list[_KeyValue] | None = None


class _Status(Struct, gc=False):
    code: Any = 0
    message: Any = None


class _Span(Struct, gc=False):
    traceId: Any
    spanId: Any
    name: Any
    startTimeUnixNano: Any
    parentSpanId: Any = None
    endTimeUnixNano: Any = None
    kind: Any = 0
    attributes: list[_KeyValue] | None = None
    events: list[_Event] | None = None
    status: _Status | None = None


class _IntItem(Struct, forbid_unknown_fields=True, gc=False):
    intValue: str


class _StrItem(Struct, forbid_unknown_fields=True, gc=False):
    stringValue: Any


class _Ints(Struct, gc=False):
    values: list[_IntItem] | None = None


class _Strs(Struct, gc=False):
    values: list[_StrItem] | None = None


class _Values(Struct, gc=False):
    values: list[_AnyValue] | None = None


_SPAN = msgspec.json.Decoder(_Span)
_INTS = msgspec.json.Decoder(_Ints)
_STRS = msgspec.json.Decoder(_Strs)
_VALUES = msgspec.json.Decoder(_Values)
_INT_LIST = msgspec.json.Decoder(list[int])
_INTS_HEAD = b'{"values":[{"intValue":"'
_INTS_SEP = b'"},{"intValue":"'
_INTS_TAIL = b'"}]}'
_INTS_SEP_CHARS = bytes(set(_INTS_SEP) - {ord(",")})  # deleted, a separator is a comma
_STRS_HEAD = b'{"values":[{"stringValue":'
_NOT_ONE = ValueError("not one AnyValue field")  # caught by `fields`: the span falls back


def fields(raw: bytes | Raw, res: int) -> tuple[str, tuple] | None:
    """(trace id, `index_store.record` with resource index `res`) of one raw OTLP JSON
    span, exactly as `Decoder.span` would make it; None when only `Decoder.span` can
    say (it may also raise for that span: the caller counts it as `Decoder` does)."""
    try:
        s = _SPAN.decode(raw)
        tid = s.traceId
        tid = tid.lower() if len(tid) == 32 else norm_id(tid, 16)
        sid = s.spanId
        sid = sid.lower() if len(sid) == 16 else norm_id(sid, 8)
        pid = s.parentSpanId or ""
        if pid:
            pid = pid.lower() if len(pid) == 16 else norm_id(pid, 8)
        start = int(s.startTimeUnixNano)
        end = s.endTimeUnixNano
        # ``or start`` of a number 0 and of a string "0" differ; both decode to 0 here
        end = int(end or start) if end != 0 else None
        if end is None or end < start:
            return None
        kind = s.kind
        if kind.__class__ is not int:
            kind = _KINDS.get(kind, 0) if isinstance(kind, str) else int(kind)
        status = s.status
        code, message = STATUS_UNSET, ""
        if status is not None:
            code = status.code
            if code.__class__ is not int:
                code = _STATUS.get(code, 0) if isinstance(code, str) else int(code)
            message = status.message or ""
        evs = s.events
        events = (
            [(e.name, int(e.timeUnixNano or 0), _attributes(e.attributes)) for e in evs]
            if evs
            else []
        )
        attrs = _attributes(s.attributes)
        return tid, (sid, pid, s.name, kind, start, end, res, attrs, events, code, message)
    except Exception:  # `Decoder.span` decides (and words the error, if any)
        return None


def span(raw: bytes | Raw, res: Resource) -> Span:
    """`Decoder.span(json.loads(raw), res)`, by `fields` when it can."""
    got = fields(raw, 0)
    if got is None:
        return Decoder.span(json.loads(bytes(raw)), res)
    tid, (sid, pid, name, kind, t0, t1, _res, attrs, evs, code, msg) = got
    if evs:
        evs = [Event(n, t, a) for n, t, a in evs]
    return Span(tid, sid, pid, name, kind, t0, t1, res, attrs, evs, code, msg)


class Utf8Lines:
    """Whether lines of one buffer are UTF-8, which `json.loads` requires of a whole
    line and msgspec does not check in the parts it leaves raw (another shard's spans,
    a scope): a line of other bytes is one `json.loads` rejects, so the caller leaves
    it to that. The buffer is scanned for bytes that are not ASCII a block at a time,
    ahead of the lines asked about (0.16 s of CPU for 3.4 GB), and only a line that
    meets such a block is decoded."""

    BLOCK = 1 << 20

    def __init__(self, buf: Any, end: int) -> None:
        self._bytes = np.frombuffer(buf, np.uint8, count=end)  # holds `buf` open: `close`
        self._clean = 0  # every byte before it is ASCII, or in a line decoded already

    def utf8(self, start: int, stop: int) -> bool:
        """Whether bytes [start, stop) (one line, after every earlier one) are UTF-8."""
        b, clean = self._bytes, self._clean
        while clean < stop:
            top = min(clean + self.BLOCK, len(b))
            if b[clean:top].max() >= 0x80:
                break
            clean = top
        self._clean = max(clean, stop)
        if clean >= stop:
            return True
        try:
            codecs.utf_8_decode(b[start:stop], "strict", True)
        except UnicodeDecodeError:
            return False
        return True

    def close(self) -> None:
        del self._bytes


def document_line(line: bytes, decoder: Decoder) -> int | None:
    """`decoder.document(json.loads(line))` of one OTLP JSON line: the spans handed to
    its sink, with the same counts and notes in its stats; None, having handed nothing,
    where only that can say (the line is not a plain ``TracesData``; or not UTF-8, which
    `json.loads` rejects and msgspec skips over in a part it leaves raw)."""
    if not line.isascii():
        try:
            line.decode()
        except UnicodeDecodeError:
            return None
    try:
        doc = LINE.decode(line)
    except LINE_ERRORS:
        return None
    stats = decoder.stats
    stats.documents += 1
    n = 0
    for rs in doc.resourceSpans:
        try:
            res = resource(bytes(rs.resource), decoder)
        except (AttributeError, KeyError, TypeError, ValueError):
            stats.malformed += 1
            continue
        for ss in rs.scopeSpans:
            n += decoder.spans(ss.spans, res, span)
    return n


def resource(raw: bytes, decoder: Decoder) -> Resource:
    """The `Resource` of a ``resource`` field's raw JSON, as `Decoder.traces_data` makes
    it (and raises where it would count the resource malformed), each text decoded
    once (`Decoder.raw_resources`)."""
    got = decoder.raw_resources.get(raw)
    if got is None:
        got = decoder.resource(attributes((json.loads(raw) or {}).get("attributes")))
        decoder.raw_resources[raw] = got
    return got


def _attributes(kvs: list[_KeyValue] | None) -> dict[str, Any]:
    """`otlp.attributes`: its key order, and each value as `any_value` gives it."""
    if not kvs:
        return {}
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        if v is None:
            out[kv.key] = None
        # inline: most values are one string or one int
        elif (
            v.doubleValue is UNSET
            and v.boolValue is UNSET
            and v.arrayValue is _ABSENT
            and (v.intValue is UNSET or v.stringValue is UNSET)
        ):
            x = v.stringValue
            if x is not UNSET:
                out[kv.key] = x
            else:
                x = v.intValue
                out[kv.key] = None if x is UNSET else int(x)
        else:
            out[kv.key] = _value(v)
    return out


def _value(v: _AnyValue) -> Any:
    """`any_value` of a decoded AnyValue with at most one field (else ValueError: with
    several, `otlp` takes the first in the document, which a struct does not keep)."""
    x = v.stringValue
    if x is not UNSET:
        if (
            v.intValue is UNSET
            and v.doubleValue is UNSET
            and v.boolValue is UNSET
            and v.arrayValue is _ABSENT
        ):
            return x
        raise _NOT_ONE
    x = v.intValue
    if x is not UNSET:
        if v.doubleValue is UNSET and v.boolValue is UNSET and v.arrayValue is _ABSENT:
            return int(x)
        raise _NOT_ONE
    x = v.doubleValue
    if x is not UNSET:
        if v.boolValue is UNSET and v.arrayValue is _ABSENT:
            return float(x)
        raise _NOT_ONE
    x = v.boolValue
    if x is not UNSET:
        if v.arrayValue is _ABSENT:
            return bool(x)
        raise _NOT_ONE
    a = v.arrayValue
    return None if a is _ABSENT else _array(a)


def _array(raw: Raw) -> list[Any]:
    """`any_value` of an ``arrayValue``: ``_array((x or {}).get("values") or ())``.

    All-int and all-string arrays (one key per element, as `otlp._array`'s fast path)
    decode as such; any other array element by element (`_value`)."""
    head = bytes(memoryview(raw)[: len(_INTS_HEAD)])
    if head == _INTS_HEAD:
        ints = _plain_ints(raw)
        if ints is not None:
            return ints
        try:
            items = _INTS.decode(raw).values
        except msgspec.ValidationError:
            pass
        else:
            return [int(i.intValue) for i in items] if items else []
    elif head.startswith(_STRS_HEAD):
        try:
            items = _STRS.decode(raw).values
        except msgspec.ValidationError:
            pass
        else:
            return [i.stringValue for i in items] if items else []
    if head == b"null":
        return []
    values = _VALUES.decode(raw).values
    return [_value(i) for i in values] if values else []


def _plain_ints(raw: Raw) -> list[int] | None:
    """The ints of an array written exactly ``{"values":[{"intValue":"1"},...]}`` with
    only digits and minus signs in the values (as exporters write int64s), in C; None
    for any other text.

    Exact: between that head and tail, if every character that is not a digit or minus
    belongs to a separator ``"},{"intValue":"``, the document is that list of one-key
    objects, each value a string of digits and minus signs; those strings joined by
    commas decode as JSON ints only if each is a JSON integer, which means the same to
    `int`."""
    view = memoryview(raw)
    if view[-len(_INTS_TAIL) :] != _INTS_TAIL:
        return None
    inner = bytes(view[len(_INTS_HEAD) : -len(_INTS_TAIL)])
    seps = inner.count(_INTS_SEP)
    if len(inner.translate(None, b"0123456789-")) != seps * len(_INTS_SEP):
        return None
    try:
        out = _INT_LIST.decode(b"[" + inner.translate(None, _INTS_SEP_CHARS) + b"]")
    except msgspec.DecodeError:
        return None
    return out if len(out) == seps + 1 else None
