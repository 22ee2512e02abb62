"""The typed span decoder (`otlp_fast`) gives exactly `otlp.Decoder.span`'s spans, on
real and synthetic spans and on every odd shape it must hand back to `Decoder.span`
(the fallback), and its packed spans unpack to the same spans; a whole line read by
`otlp_fast.document_line` gives what `Decoder.document` gives, or is left to it."""

from __future__ import annotations

import base64
import faulthandler
import gzip
import json
import marshal
import mmap
import multiprocessing
import os
import sqlite3
import zlib
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tracedpush.analysis import index_build, otlp_fast
from tracedpush.analysis.index_store import (
    SHARDS,
    pack,
    pack_packed,
    record,
    shard_of,
    unpack,
)
from tracedpush.analysis.model import LoadStats, Resource, Span
from tracedpush.analysis.otlp import Decoder
from tracedpush.testing import synthetic

REAL = Path(__file__).resolve().parent.parent / "data" / "real-run.jsonl.gz"
RES = Resource("svc", "inst", "host", "1", {})
TID = "5b8efff798038103d269b633813fc60c"
SID = "eee19b7ec3c1b174"


def spans_of_docs(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                yield from ss["spans"]


def reference(raw: bytes) -> Span | type[Exception]:
    """`Decoder.span` of `raw`, or the type of what it raises."""
    try:
        return Decoder.span(json.loads(raw), RES)
    except Exception as exc:  # compared with the typed path's outcome
        return type(exc)


def typed(raw: bytes) -> Span | type[Exception]:
    try:
        return otlp_fast.span(raw, RES)
    except Exception as exc:
        return type(exc)


def check(raw: bytes, *, fast: bool | None = None) -> None:
    """The typed path equals `Decoder.span` (by repr: types, key order and NaN count);
    `fast`: whether it must (not) fall back."""
    assert repr(typed(raw)) == repr(reference(raw)), raw
    if fast is not None:
        assert (otlp_fast.fields(raw, 0) is not None) == fast, raw


def test_real_and_synthetic_spans_decode_alike() -> None:
    run = synthetic.generate(40, seed=3, batch=4)
    with gzip.open(REAL, "rt") as fh:
        real = [json.loads(line) for line in fh if line.strip()]
    n = 0
    for s in [*spans_of_docs(run.documents), *spans_of_docs(real)]:
        for raw in (json.dumps(s).encode(), json.dumps(s, separators=(",", ":")).encode()):
            check(raw, fast=True)
            n += 1
    assert n > 1000


def span(**over: Any) -> bytes:
    s: dict[str, Any] = {
        "traceId": TID,
        "spanId": SID,
        "parentSpanId": "",
        "name": "x",
        "kind": 2,
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": "2000",
        "attributes": [],
        "status": {"code": 0},
    }
    for k, v in over.items():
        if v is _DROP:
            s.pop(k, None)
        else:
            s[k] = v
    return json.dumps(s, separators=(",", ":")).encode()


_DROP = object()


def attr(value: Any) -> bytes:
    return span(attributes=[{"key": "a", "value": value}, {"key": "b", "value": {"intValue": "7"}}])


def ints(*texts: str) -> dict[str, Any]:
    return {"arrayValue": {"values": [{"intValue": t} for t in texts]}}


# (raw span, whether the typed path decodes it itself)
ODD_SPANS = [
    # ids: uppercase hex, base64 (protobuf JSON), missing parent, bad ids
    (span(traceId=TID.upper(), spanId=SID.upper(), parentSpanId=SID.upper()), True),
    (span(traceId=base64.b64encode(bytes.fromhex(TID)).decode()), True),
    (span(spanId=base64.b64encode(bytes.fromhex(SID)).decode()), True),
    (span(parentSpanId=base64.b64encode(bytes.fromhex(SID)).decode()), True),
    (span(parentSpanId=_DROP), True),
    (span(parentSpanId=None), True),
    (span(traceId="zz"), False),
    (span(traceId=5), False),
    (span(spanId=_DROP), False),
    # times: numbers, missing or null end, end 0 (a number and a string), backwards
    (span(startTimeUnixNano=1000, endTimeUnixNano=2000), True),
    (span(endTimeUnixNano=_DROP), True),
    (span(endTimeUnixNano=None), True),
    (span(endTimeUnixNano=0), False),
    (span(endTimeUnixNano="0"), False),
    (span(endTimeUnixNano="500"), False),
    (span(startTimeUnixNano="1e3"), False),
    (span(startTimeUnixNano=_DROP), False),
    # kind and status: names, numbers, odd types
    (span(kind="SPAN_KIND_CLIENT"), True),
    (span(kind="2"), True),
    (span(kind=3.0), True),
    (span(kind=None), False),
    (span(kind=_DROP), True),
    (span(status={}), True),
    (span(status=None), True),
    (span(status=_DROP), True),
    (span(status={"code": "STATUS_CODE_ERROR", "message": "boom"}), True),
    (span(status={"code": 2, "message": None}), True),
    (span(status={"code": "ERROR", "other": 1}), True),
    (span(status=[]), False),
    (span(name=_DROP), False),
    (span(name=7), True),
    (span(traceState="x", links=[], droppedAttributesCount=0, flags=1), True),
    # events
    (
        span(
            events=[
                {
                    "timeUnixNano": "1500",
                    "name": "e",
                    "attributes": [{"key": "k", "value": {"stringValue": "v"}}],
                },
                {"name": "no-time"},
                {"timeUnixNano": 1600},
                {"timeUnixNano": "0", "name": None, "attributes": None},
            ]
        ),
        True,
    ),
    (span(events=[]), True),
    (span(events=None), True),
    (span(events={}), False),
    (span(events=[{"timeUnixNano": "x"}]), False),
    # attribute values: every kind, odd types, several fields, unknown ones
    (attr({"stringValue": 'é " \\ \u2603'}), True),
    (attr({"stringValue": None}), True),
    (attr({"stringValue": 5}), True),
    (attr({"intValue": 5}), True),
    (attr({"intValue": "-5"}), True),
    (attr({"intValue": "1e3"}), False),
    (attr({"intValue": "12.0"}), False),
    (attr({"intValue": 12.0}), True),
    (attr({"intValue": " 12"}), True),
    (attr({"doubleValue": 1}), True),
    (attr({"doubleValue": 1.25}), True),
    (attr({"doubleValue": "NaN"}), True),
    (attr({"doubleValue": "1.5"}), True),
    (attr({"boolValue": True}), True),
    (attr({"boolValue": "false"}), True),
    (attr({"boolValue": 0}), True),
    (attr({}), True),
    (attr(None), True),
    (attr({"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "1"}}]}}), False),
    (attr({"bytesValue": "AAEC"}), False),
    (attr({"stringValue": "s", "intValue": "1"}), False),
    (attr({"intValue": "1", "stringValue": "s"}), False),
    (attr({"intValue": "1", "doubleValue": 2.0}), False),
    (attr({"foo": 1}), False),
    (attr("plain"), False),
    (span(attributes=[{"value": {"stringValue": "no key"}}]), False),
    (span(attributes=[{"key": "k"}]), True),
    (span(attributes=None), True),
    (span(attributes={}), False),
    # arrays: all ints (plain and not), strings, doubles, mixed, nested, empty
    (attr(ints("1", "-22", "333", "0")), True),
    (attr(ints("01", "2")), True),
    (attr(ints("+5")), True),
    (attr(ints(" 5")), True),
    (attr(ints("1e3")), False),
    (attr(ints("")), False),
    (attr(ints("1", "x")), False),
    (attr(ints("99999999999999999999999999")), True),
    (attr({"arrayValue": {"values": [{"intValue": 1}, {"intValue": "2"}]}}), True),
    (attr({"arrayValue": {"values": [{"intValue": "1", "stringValue": "s"}]}}), False),
    (attr({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "s"}]}}), True),
    (attr({"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": None}]}}), True),
    (attr({"arrayValue": {"values": [{"doubleValue": 1.5}, {"doubleValue": 2}]}}), True),
    (attr({"arrayValue": {"values": [{"boolValue": True}, {}]}}), True),
    (attr({"arrayValue": {"values": [{"arrayValue": {"values": [{"intValue": "3"}]}}]}}), True),
    (attr({"arrayValue": {"values": [5]}}), False),
    (attr({"arrayValue": {"values": []}}), True),
    (attr({"arrayValue": {"values": None}}), True),
    (attr({"arrayValue": {}}), True),
    (attr({"arrayValue": None}), True),
    (attr({"arrayValue": []}), False),
    (attr({"arrayValue": {"values": [{"intValue": "1"}], "x": 1}}), True),
]


@pytest.mark.parametrize(("raw", "fast"), ODD_SPANS)
def test_odd_spans_decode_alike(raw: bytes, fast: bool) -> None:
    check(raw, fast=fast)


# raw spans that are odd as JSON text
ODD_TEXTS = [
    b'{"traceId":"' + TID.encode() + b'","spanId":"' + SID.encode() + b'",'
    b'"name":"x","startTimeUnixNano":"1","name":"y"}',  # a repeated key: the last
    b'{"traceId":"' + TID.encode() + b'","spanId":"' + SID.encode() + b'",'
    b'"name":"x","startTimeUnixNano":"1","attributes":[{"key":"a","value":'
    b'{"stringValue":"\\ud800"}}]}',  # a lone surrogate
    b'{"traceId":"' + TID.encode() + b'","spanId":"' + SID.encode() + b'",'
    b'"name":"x","startTimeUnixNano":"1","attributes":[{"key":"a","value":'
    b'{"doubleValue":NaN}}]}',  # not JSON, but json.loads reads it
    b'{"traceId":"' + TID.encode() + b'","spanId":"' + SID.encode() + b'",'
    b'"name":"x","startTimeUnixNano":"1","attributes":[{"key":"a","value":'
    b'{"arrayValue":{"values":[{"intValue":"1"} , {"intValue":"2"}]}}}]}',  # blanks
    b"[]",
    b"null",
    b'"span"',
]


@pytest.mark.parametrize("raw", ODD_TEXTS)
def test_odd_documents_decode_alike(raw: bytes) -> None:
    check(raw)


def read_line(line: bytes, *, fast: bool) -> tuple[Any, ...]:
    """What one line hands a `Decoder`'s sink and its stats: through `document_line`
    (`fast`; None where it leaves the line to the other way) or `Decoder.document`."""
    got: list[Span] = []
    stats = LoadStats()
    decoder = Decoder(got.append, stats)
    if fast:
        n: Any = otlp_fast.document_line(line, decoder)
    else:
        try:
            n = decoder.document(json.loads(line))
        except Exception as exc:  # compared with the typed path's outcome
            n = type(exc)
    return n, repr(got), stats.to_json(), stats.errors


def check_line(line: bytes, *, fast: bool | None = None) -> None:
    """`document_line` hands the sink what `Decoder.document` does, with the same
    counts and notes, or leaves the line untouched; `fast`: whether it must not leave
    it."""
    got = read_line(line, fast=True)
    if got[0] is None:
        assert got[1:] == read_line(b"{}", fast=False)[1:], line  # nothing handed or counted
        assert fast is not True, line
    else:
        assert got == read_line(line, fast=False), line
        assert fast is not False, line


def line_of(*spans: bytes, resource: bytes = b'{"attributes":[]}', scope: bytes = b"{}") -> bytes:
    return (
        b'{"resourceSpans":[{"resource":' + resource + b',"scopeSpans":[{"scope":' + scope
        + b',"spans":[' + b",".join(spans) + b"]}]}]}"
    )  # fmt: skip


def test_real_and_synthetic_lines_read_alike() -> None:
    """Whole lines as exporters write them (several resources and spans a line)."""
    run = synthetic.generate(40, seed=3, batch=4)
    with gzip.open(REAL, "rb") as fh:
        lines = [ln for ln in fh.read().split(b"\n") if ln.strip()]
    lines += [json.dumps(d).encode() for d in run.documents]
    for line in lines:
        check_line(line, fast=True)
    assert len(lines) > 100


@pytest.mark.parametrize("raw", [raw for raw, _fast in ODD_SPANS])
def test_lines_of_odd_spans_read_alike(raw: bytes) -> None:
    """An odd span beside a plain one: the line is read span by span as `Decoder`
    reads it (one span that does not decode is counted, the other kept), whether the
    typed path decodes the odd one itself or hands it back."""
    check_line(line_of(span(), raw), fast=True)


@pytest.mark.parametrize("raw", ODD_TEXTS)
def test_lines_of_odd_texts_read_alike(raw: bytes) -> None:
    check_line(line_of(raw, span()))


res_attr = b'{"attributes":[{"key":"service.name","value":{"stringValue":"s"}}]}'


@pytest.mark.parametrize(
    ("line", "fast"),
    [
        (line_of(span(), resource=res_attr), True),
        (line_of(span(), resource=b"null"), True),
        (line_of(span(), resource=b"{}"), True),
        (line_of(span(), resource=b'{"attributes":null}'), True),
        (line_of(span(), resource=b"5"), True),  # counted malformed, as `Decoder` does
        (line_of(span(), resource=b'"r"'), True),
        (line_of(span(), resource=b"[]"), True),
        (line_of(span(), resource=b'{"attributes":{}}'), True),
        (
            line_of(
                span(), resource=b'{"attributes":[{"key":"k","value":{"stringValue":"\xff"}}]}'
            ),
            False,
        ),  # not UTF-8: `json.loads` rejects the line
        (line_of(span(), scope=b'{"name":"\xff"}'), False),
        (line_of(span(name="\u00e9")), True),  # not ASCII, but UTF-8
        (line_of(span()).replace(b'"x"', '"\u00e9"'.encode()), True),
        (line_of(span()).replace(b'"x"', b'"\xe9"'), False),
        (line_of(span(), scope=b'{"n":NaN}'), False),
        (line_of(span(), scope=b'{"n":1e400}'), True),
        (line_of(span(), scope=b'{"n":"\\ud800"}'), False),
        (line_of(), True),
        (b'{"resourceSpans":[]}', True),
        (b'{"resourceSpans":null}', False),
        (b'{"resourceSpans":{}}', False),
        (b'{"resourceSpans":[5]}', False),
        (b'{"resourceSpans":[{"scopeSpans":null}]}', False),
        (
            b'{"resourceSpans":[{"instrumentationLibrarySpans":[{"spans":[' + span() + b"]}]}]}",
            False,
        ),
        (b'{"resourceSpans":[{"scopeSpans":[{"spans":null}]}]}', False),
        (b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + span() + b']}]}],"other":1}', False),
        (
            b'{"resourceSpans":[],"resourceSpans":[{"scopeSpans":[{"spans":[' + span() + b"]}]}]}",
            True,
        ),  # a repeated key: the last, as `json.loads`
        (b'{"result":{"resourceSpans":[]}}', False),
        (b"\xef\xbb\xbf" + line_of(span()), False),  # a byte-order mark
        (b"[" + line_of(span()) + b"]", False),
        (b"{}", False),
        (b"null", False),
        (line_of(span())[:-2], False),  # torn
        (line_of(span()) + b" x", False),
        (line_of(span(), span()), True),  # a span twice: the store drops the second
    ],
)
def test_odd_lines_read_alike(line: bytes, fast: bool) -> None:
    check_line(line, fast=fast)


def test_utf8_lines_are_found_a_block_at_a_time(monkeypatch) -> None:
    """`Utf8Lines` answers as decoding each line would, with blocks smaller than lines
    and larger, a character cut by a block's edge, and bytes that are not UTF-8."""
    lines = [b"plain", "caf\u00e9 \u2603".encode(), b"bad \xff here", b"x" * 40, b"\xe2\x98", b"ok"]
    buf = b"\n".join(lines * 3)
    for block in (1, 3, 7, 64, 1 << 20):
        monkeypatch.setattr(otlp_fast.Utf8Lines, "BLOCK", block)
        scan = otlp_fast.Utf8Lines(buf, len(buf))
        pos, got = 0, []
        for line in lines * 3:
            got.append(scan.utf8(pos, pos + len(line)))
            pos += len(line) + 1
        scan.close()
        want = []
        for line in lines * 3:
            try:
                line.decode()
                want.append(True)
            except UnicodeDecodeError:
                want.append(False)
        assert got == want, block


def test_a_resource_is_decoded_once_and_shared() -> None:
    two = b'{"resourceSpans":[' + b",".join(
        [b'{"resource":' + res_attr + b',"scopeSpans":[{"spans":[' + span() + b"]}]}"] * 2
    ) + b"]}"  # fmt: skip
    got: list[Span] = []
    decoder = Decoder(got.append, LoadStats())
    assert otlp_fast.document_line(two, decoder) == 2
    assert otlp_fast.document_line(two, decoder) == 2
    assert len({id(s.resource) for s in got}) == 1 and got[0].resource.service == "s"


def test_packed_spans_unpack_to_the_same_spans() -> None:
    run = synthetic.generate(12, seed=5, batch=4)
    res = [RES, Resource("b", "b", "b", "2", {})]
    spans = [otlp_fast.span(json.dumps(s).encode(), res[i % 2])
             for i, s in enumerate(spans_of_docs(run.documents))]  # fmt: skip
    res_ix = {id(r): i for i, r in enumerate(res)}
    by_trace: dict[str, list[Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    for tid, some in by_trace.items():
        assert unpack(tid, pack(some, res_ix), res) == some
        # the cold build packs each span from its JSON as it reads it: the same records
        read = [otlp_fast.fields(json.dumps(_raw(s)).encode(), res_ix[id(s.resource)])
                for s in some]  # fmt: skip
        assert repr([rec for _tid, rec in read]) == repr([record(s, res_ix) for s in some])
        assert unpack(tid, pack_packed([marshal.dumps(r) for _t, r in read]), res) == some


def _raw(s: Span) -> dict[str, Any]:
    """An OTLP JSON span for `s` (for the packing comparison)."""

    def kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": k, "value": _any(v)} for k, v in attrs.items()]

    return {
        "traceId": s.trace_id, "spanId": s.span_id, "parentSpanId": s.parent_id,
        "name": s.name, "kind": s.kind, "startTimeUnixNano": str(s.start_ns),
        "endTimeUnixNano": str(s.end_ns), "attributes": kv(s.attributes),
        "events": [{"name": e.name, "timeUnixNano": str(e.time_ns),
                    "attributes": kv(e.attributes)} for e in s.events],
        "status": {"code": s.status_code, "message": s.status_message},
    }  # fmt: skip


def _any(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_any(x) for x in v]}}
    return {"stringValue": v}


@pytest.mark.parametrize("tid", [TID, TID.upper(), "00" * 16, "ff" * 16, "0123456789abcdef" * 2])
def test_shard_of_raw_ids(tid: str) -> None:
    """The worker's shard test on a raw lowercase id is `shard_of` of the decoded id."""
    raw = span(traceId=tid)
    plain = index_build._PLAIN_TID.match(raw)
    assert (plain is not None) == (tid == tid.lower())
    if plain is not None:
        assert zlib.crc32(plain.group(1)) % SHARDS == shard_of(tid.lower())
    assert index_build._PLAIN_TID.match(span(traceId=tid + "0")) is None  # 33 characters
    assert index_build._trace_id(raw) == tid.lower()


def test_parallel_build_with_odd_spans_equals_analyze(tmp_path: Path) -> None:
    """Spans the typed path hands back (uppercase and base64 ids, kvlist and bytes
    values), malformed spans and repeated ones: the parallel build keeps and counts what
    the sequential read does."""
    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.analysis.index import AnalysisIndex

    run = synthetic.generate(60, seed=11, batch=4)
    for i, s in enumerate(spans_of_docs(run.documents)):
        if i % 7 == 1:
            s["traceId"] = s["traceId"].upper()
        elif i % 7 == 2:
            s["spanId"] = base64.b64encode(bytes.fromhex(s["spanId"])).decode()
        elif i % 7 == 3:
            s.setdefault("attributes", []).append(
                {"key": "kv", "value": {"kvlistValue": {"values": [
                    {"key": "k", "value": {"intValue": "1"}}]}}})  # fmt: skip
        elif i % 7 == 4:
            s.setdefault("attributes", []).append({"key": "b", "value": {"bytesValue": "AA=="}})
        elif i % 7 == 5 and i % 2:
            s["traceId"] = base64.b64encode(bytes.fromhex(s["traceId"])).decode()
    docs = run.files
    first = next(iter(docs))
    one = docs[first][0]["resourceSpans"][0]["scopeSpans"][0]["spans"]
    one.append(dict(one[0]))  # a repeated span
    one.append({**one[0], "spanId": "ab" * 8, "endTimeUnixNano": "1"})  # ends too early
    one.append({**one[0], "spanId": "cd" * 8, "name": None, "kind": None})  # malformed
    d = tmp_path / "traces"
    run.write(d)
    # a line whose scope (which no worker decodes) is not UTF-8: `json.loads` rejects it
    f = sorted(d.rglob("*.jsonl"))[0]
    lines = f.read_bytes().split(b"\n")
    doc = json.loads(lines[1])
    doc["resourceSpans"][0]["scopeSpans"][0]["scope"] = {"name": "SCOPE"}
    lines[1] = json.dumps(doc).encode().replace(b"SCOPE", b"\xff")
    f.write_bytes(b"\n".join(lines))
    store = TraceStore.from_paths([d])
    want = analyze(store, spans=False)
    assert any("line skipped" in e for e in store.stats.errors)
    index_build.WORKER_PEAK_KB.clear()
    idx = AnalysisIndex([d], parallel=True)
    got = idx.update()
    idx.close()
    assert len(index_build.WORKER_PEAK_KB) == SHARDS  # built in parallel, not sequentially
    # its timeline (benchmarks/bench_report.py prints it): the parent's stretches in
    # order, the workers' analysis done after the offsets and before their rows came
    at = index_build.BUILD_TIMES
    assert sorted(at) == sorted(index_build.TIMELINE)
    mine = [at[k] for k in index_build.TIMELINE if k != "workers_analysed"]
    assert mine == sorted(mine)
    assert at["offsets"] <= at["workers_analysed"] <= at["analysed"]
    for shard in range(SHARDS):  # each worker put its shard in WAL mode (synced): no reader must
        with closing(sqlite3.connect(idx.dir / f"spans-{shard}.sqlite")) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert got.stats.spans > 0 and got.stats.duplicates > 0 and got.stats.malformed > 0
    assert [r.trace_id for r in got.requests] == [r.trace_id for r in want.requests]
    for x, y in zip(got.requests, want.requests, strict=True):
        assert x == y, x.trace_id
    mine, theirs = got.stats.to_json(), store.stats.to_json()
    del mine["errors"], theirs["errors"]
    assert mine == theirs


def test_build_dropping_spilled_pages_after_every_trace_equals_analyze(
    tmp_path: Path, monkeypatch
) -> None:
    """A build worker reads the trace files and its spilled records back through memory
    maps and drops the pages it has read (every 32 MB at scale): dropped after every
    line and every trace here, the lines and records it reads are still whole, and the
    build equals `analyze`."""
    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.analysis.index import AnalysisIndex

    monkeypatch.setattr(index_build, "_DROP_EVERY", 0)
    run = synthetic.generate(40, seed=21, batch=4)
    d = tmp_path / "traces"
    run.write(d)
    want = analyze(TraceStore.from_paths([d]), spans=False)
    index_build.WORKER_PEAK_KB.clear()
    idx = AnalysisIndex([d], parallel=True)
    got = idx.update()
    assert len(index_build.WORKER_PEAK_KB) == SHARDS  # built in parallel
    assert list(got.requests) == list(want.requests)
    assert (
        list(idx.with_spans(list(got.requests)[:5]))
        == list(analyze(TraceStore.from_paths([d]), spans=True).requests)[:5]
    )
    idx.close()


def test_results_stored_come_back_equal() -> None:
    """`dump_result` keeps every field of a result, span views (with their attributes),
    hidden segments and a failure included, and `load_result` makes the same objects."""
    import dataclasses

    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.analysis.failures import Failure
    from tracedpush.analysis.index_store import dump_result, load_result

    run = synthetic.generate(20, seed=8, batch=4)
    results = list(analyze(TraceStore.from_documents(run.documents), spans=True).requests)
    assert any(r.spans and r.hidden for r in results)
    failed = Failure("decode", "503", "engine gone", "kv.write", "vllm-decode", 12.5)
    results.append(dataclasses.replace(results[0], failure=failed, error="kv.write: 503"))
    for r in results:
        back = load_result(dump_result(r))
        assert back == r
        assert [type(x) for x in back.spans] == [type(x) for x in r.spans]
        assert type(back.failure) is type(r.failure)


@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_parallel_build_that_fails_reads_everything_sequentially(
    tmp_path: Path, monkeypatch, how: str
) -> None:
    """A worker that fails as it starts reading (an error it reports, or a death
    without a word: a kill, a SIGBUS off a file cut shorter under its memory map)
    leaves the build to the sequential read, which equals `analyze` and says why in the
    run's notes."""
    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.analysis.index import AnalysisIndex

    def broken(*_args: Any) -> None:
        if how == "dies":
            os._exit(1)
        raise OSError("no space left on device")

    monkeypatch.setattr(index_build._Worker, "read", broken)
    run = synthetic.generate(20, seed=9, batch=4)
    d = tmp_path / "traces"
    run.write(d)
    store = TraceStore.from_paths([d])
    want = analyze(store, spans=False)
    idx = AnalysisIndex([d], parallel=True)
    got = idx.update()
    idx.close()
    assert list(got.requests) == list(want.requests)
    assert not multiprocessing.active_children()  # the other worker did not read on
    why = "no space left" if how == "raises" else "worker died"
    assert any("parallel index build failed" in e and why in e for e in got.stats.errors)
    mine, theirs = got.stats.to_json(), store.stats.to_json()
    del mine["errors"], theirs["errors"]
    assert mine == theirs


@pytest.mark.parametrize("when", ["before the map", "under the map"])
def test_a_file_cut_shorter_during_the_build_is_read_as_it_is(
    tmp_path: Path, monkeypatch, when: str
) -> None:
    """A trace file cut shorter while the build workers read it. Before their memory
    maps: the map fails, and the worker says which file was cut. Under their maps: the
    first read of a page past its new end is a real SIGBUS, which kills the worker, not
    the report. Either way the build then reads sequentially the file as it is now,
    which equals `analyze` of it, and the run's notes say why. (Not a mock: the file is
    truncated on disk and the kernel refuses the map or raises the signal.)"""
    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.analysis.index import AnalysisIndex

    run = synthetic.generate(40, seed=10, batch=4)
    d = tmp_path / "traces"
    run.write(d)
    big = max(d.rglob("*.jsonl"), key=lambda f: f.stat().st_size)
    data = big.read_bytes()
    assert len(data) > 8 * mmap.PAGESIZE
    cut = data.index(b"\n", len(data) // 4) + 1  # whole lines stay
    both = multiprocessing.get_context("fork").Barrier(2)  # the two workers, in step

    def truncate(shard: int) -> None:
        both.wait(timeout=60)
        if shard == 0:
            os.truncate(big, cut)
        both.wait(timeout=60)

    if when == "before the map":
        start = index_build._run_worker

        def cut_then_start(idx: Any, shard: int, *args: Any) -> None:
            truncate(shard)
            start(idx, shard, *args)

        monkeypatch.setattr(index_build, "_run_worker", cut_then_start)
        why = f"{big} was cut shorter while the index was built"
    else:
        lines = index_build._Worker._lines

        def cut_then_read(self: Any, f: Path, fi: int, mm: mmap.mmap, end: int) -> int:
            faulthandler.disable()  # the worker's death needs no traceback in the log
            if f == big:
                truncate(self.shard)
            return lines(self, f, fi, mm, end)

        monkeypatch.setattr(index_build._Worker, "_lines", cut_then_read)
        why = "worker died"
    idx = AnalysisIndex([d], parallel=True)
    got = idx.update()
    idx.close()
    assert big.stat().st_size == cut
    store = TraceStore.from_paths([d])
    want = analyze(store, spans=False)
    assert list(got.requests) == list(want.requests)
    assert not multiprocessing.active_children()
    notes = [e for e in got.stats.errors if "parallel index build failed" in e]
    assert len(notes) == 1 and why in notes[0], got.stats.errors
    assert "Traceback" not in notes[0]  # a cut file is no bug: its message, no traceback
    mine, theirs = got.stats.to_json(), store.stats.to_json()
    del mine["errors"], theirs["errors"]
    assert mine == theirs


def test_a_stopped_build_ends_its_workers_even_mid_message(tmp_path: Path, monkeypatch) -> None:
    """A build stopped while its workers are blocked sending to it (the console's build
    child gets SIGTERM, raised as SystemExit, while it is not reading): the workers are
    terminated and end within seconds, none left behind. Before, a worker answered the
    SIGTERM with its traceback on the same pipe, whose peer end the workers themselves
    hold (inherited at fork), so it blocked for good; the build waited 60 s a worker and
    returned with them still alive. Here each worker's first per-process message is made
    64 MB (far more than a socket buffer) and the parent stops as soon as both block."""
    import signal
    import time

    from tracedpush.analysis.index import AnalysisIndex

    d = tmp_path / "traces"
    synthetic.generate(20, seed=5, batch=4).write(d)
    marks = tmp_path / "marks"
    marks.mkdir()

    class BigParts:  # in the workers: every process trace's message far over the buffer
        def extend(self, spans: Any) -> bytes:
            (marks / str(os.getpid())).touch()
            return b"x" * (64 << 20)

    def stop_when_blocked(conns: Any, timeout: Any = None) -> Any:  # in the parent
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < index_build.SHARDS:
            assert time.monotonic() < deadline, "the workers never sent"
            time.sleep(0.05)
        time.sleep(0.5)  # each is in its send now, the buffer full
        raise KeyboardInterrupt

    def as_the_child(signum: int, frame: Any) -> None:  # `index_child._die_with_parent`'s
        raise SystemExit(128 + signum)

    monkeypatch.setattr(index_build, "StepParts", BigParts)
    monkeypatch.setattr(index_build, "wait", stop_when_blocked)
    previous = signal.signal(signal.SIGTERM, as_the_child)  # the workers inherit it
    idx = AnalysisIndex([d], parallel=True)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            idx.update()
        took = time.monotonic() - started
        assert not multiprocessing.active_children()
        assert took < 30, took
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in multiprocessing.active_children():
            p.kill()
        idx.close()


def test_workers_end_when_the_build_is_killed(slow_build_traces: Path) -> None:
    """A `report` killed outright (SIGKILL: no cleanup) while its workers build: they
    end by themselves. Before, each worker held copies of the parent's pipe ends from
    the fork (its own among them), so one waiting for the offsets never saw EOF and one
    sending blocked once the buffer was full: both stayed, for good."""
    import signal

    from tracedpush.testing.processes import python_tree, wait_ended

    code = (
        "import sys; from pathlib import Path; from tracedpush.analysis.index import "
        "AnalysisIndex; AnalysisIndex([Path(sys.argv[1])], parallel=True).update()"
    )
    with python_tree(code, str(slow_build_traces), below=index_build.SHARDS) as (parent, workers):
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_ended(workers)
