"""Tensor parallelism on the prefill side of a generated run, for one request.

`add_prefill_rank` turns one push request's P into a TP 2 engine as tracedpush's
connector would trace it: a second worker process (its own file) with rank 1's copies
of P's worker spans, and D's `kv.notify` counting one notification from each rank. The
ranks finish out of order: rank 1 posts its WRITE earlier and its data lands first, but
P's polling sees it done last, so the span that *ends* last is not the one D waited for.
Only `SyntheticRun.files` change (the OTLP JSON documents), not `spans` or the ground
truth: rank 0 still lands last, so the request's critical path is unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from tracedpush import semconv as sc
from tracedpush.testing.synthetic.run import SyntheticRun

RANK_SPANS = (sc.SPAN_KV_RENDEZVOUS, sc.SPAN_KV_HANDSHAKE, sc.SPAN_KV_DESC_PREP, sc.SPAN_KV_WRITE)


def _attr(span: dict[str, Any], key: str) -> Any:
    for a in span.get("attributes", ()):
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


def _set(span: dict[str, Any], key: str, value: dict[str, Any]) -> None:
    attrs = span.setdefault("attributes", [])
    for a in attrs:
        if a["key"] == key:
            a["value"] = value
            return
    attrs.append({"key": key, "value": value})


def _shift(span: dict[str, Any], ns: int) -> None:
    for key in ("startTimeUnixNano", "endTimeUnixNano"):
        span[key] = str(int(span[key]) + ns)
    for event in span.get("events", ()):
        event["timeUnixNano"] = str(int(event["timeUnixNano"]) + ns)


def _spans(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource, span) of every span in `docs`."""
    return [
        (rs["resource"], span)
        for doc in docs
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


def add_prefill_rank(run: SyntheticRun, trace_id: str, early_ms: float = 0.3) -> str:
    """Give request `trace_id` (push) a second P rank; returns the new file's name.

    Rank 1's worker spans are rank 0's moved `early_ms` earlier (its data lands that much
    before rank 0's), except that its `kv.write` is observed done 1 ms after rank 0's.
    D's `kv.notify` then starts at rank 1's notification and counts 2."""
    early = round(early_ms * 1e6)
    p_name = next(n for n in run.files if "vllm-prefill" in n and "_work" in n)
    copies: list[dict[str, Any]] = []
    resource: dict[str, Any] | None = None
    for res, span in _spans(run.files[p_name]):
        if span["traceId"] != trace_id or span["name"] not in RANK_SPANS:
            continue
        resource = res
        twin = copy.deepcopy(span)
        twin["spanId"] = f"{int(span['spanId'], 16) ^ 0x5A5A5A5A5A5A5A5A:016x}"
        _shift(twin, -early)
        _set(twin, sc.TP_RANK, {"intValue": "1"})
        if span["name"] == sc.SPAN_KV_WRITE:
            twin["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) + 1_000_000)
            lag = _attr(span, sc.POLL_LAG_US)
            if lag is not None:
                lag_us = float(lag) + (early + 1_000_000) / 1e3
                _set(twin, sc.POLL_LAG_US, {"doubleValue": lag_us})
        copies.append(twin)
    if resource is None:
        raise ValueError(f"no prefill worker spans for trace {trace_id}")
    res = copy.deepcopy(resource)
    for a in res["attributes"]:
        if a["key"] == sc.RES_PROCESS_PID:
            a["value"] = {"intValue": str(int(a["value"]["intValue"]) + 100)}
    scope = {"name": sc.INSTRUMENTATION_SCOPE}
    doc = {"resourceSpans": [{"resource": res, "scopeSpans": [{"scope": scope, "spans": copies}]}]}
    name = p_name.replace("_work", "_work-tp1")
    run.files[name] = [doc]

    d_name = next(n for n in run.files if "vllm-decode" in n and "_work" in n)
    for _, span in _spans(run.files[d_name]):
        if span["traceId"] == trace_id and span["name"] == sc.SPAN_KV_NOTIFY:
            last = int(span["startTimeUnixNano"])
            first = last - early
            span["startTimeUnixNano"] = str(first)
            span["events"] = [
                {"timeUnixNano": str(t), "name": sc.EVENT_NOTIFICATION} for t in (first, last)
            ]
            _set(span, sc.NOTIFY_EXPECTED, {"intValue": "2"})
            _set(span, sc.NOTIFY_RECEIVED, {"intValue": "2"})
            ranks = [{"intValue": "1"}, {"intValue": "0"}]
            _set(span, sc.NOTIFY_RANKS, {"arrayValue": {"values": ranks}})
    return name
