"""One OTLP JSON span decoded by msgspec into typed structs, for the index's cold build.

Why: `otlp.Decoder.span` needs the span as dicts (``json.loads``) and converts every
attribute value in Python; a big run's bytes are mostly engine-step spans of long int
arrays, so that was most of a build worker's time. Here msgspec builds the containers
and the arrays in C, and the scalars go through the same Python expressions as
`Decoder.span` (every scalar field is typed ``Any``, so it arrives as ``json.loads``
would give it). Wherever the two could differ (an `AnyValue` with several fields or a
kvlist/bytes one, a container of an unexpected type, an end time of 0, anything that
raises), `fields` answers None and the caller uses `Decoder.span` itself: the answer is
always exactly `Decoder.span`'s (tests/unit/test_index_build_fast.py).
"""

from __future__ import annotations

import json
import marshal
from typing import Any

import msgspec
from msgspec import UNSET, Raw, Struct

from tracedpush.analysis.index_store import spans_of
from tracedpush.analysis.model import STATUS_UNSET, Resource, Span
from tracedpush.analysis.otlp import _KINDS, _STATUS, Decoder, norm_id

_ABSENT = Raw(b"")  # a Raw field cannot be optional: an absent `arrayValue` reads as this


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


def span(raw: bytes, res: Resource) -> Span:
    """`Decoder.span(json.loads(raw), res)`, by `fields` when it can."""
    got = fields(raw, 0)
    if got is None:
        return Decoder.span(json.loads(raw), res)
    tid, rec = got
    return spans_of(tid, [marshal.dumps(rec)], [res])[0]


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
