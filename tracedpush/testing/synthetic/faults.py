"""Failure injection: turn generated requests into failed ones, in place.

`generate` simulates healthy requests; tests of the failure accounting need requests
that failed the way the proxy and the engines record it (docs/spans.md, "Failures"):
spans closed with status ERROR, a message and ``error.type``, no first token at the
proxy, and the root's HTTP status. This edits the OTLP JSON documents of a
`SyntheticRun` (before `write`), so the analysis reads failures in the real file format.

    run = generate(40, seed=3)
    fail_request(run, "push-00004", ("proxy.prefill", "upstream_error", "prefill leg: 500"))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tracedpush import semconv as sc
from tracedpush.testing.synthetic.run import SyntheticRun

STATUS_ERROR = 2  # OTLP's STATUS_CODE_ERROR
Fault = tuple[str, str, str]  # (span name, error.type, status message)


def _spans(run: SyntheticRun, trace_id: str) -> Iterator[dict[str, Any]]:
    for doc in run.documents:
        for rs in doc.get("resourceSpans") or ():
            for ss in rs.get("scopeSpans") or ():
                for span in ss.get("spans") or ():
                    if span.get("traceId") == trace_id:
                        yield span


def _set_attribute(span: dict[str, Any], key: str, value: dict[str, Any]) -> None:
    attrs = [a for a in span.get("attributes") or () if a["key"] != key]
    span["attributes"] = [*attrs, {"key": key, "value": value}]


def _drop_attribute(span: dict[str, Any], key: str) -> None:
    span["attributes"] = [a for a in span.get("attributes") or () if a["key"] != key]


def fail_request(
    run: SyntheticRun,
    request_id: str,
    *faults: Fault,
    status: int | None = 502,
    answered: bool = False,
) -> str:
    """Fail the spans named in `faults` of one generated request; returns its trace id.

    `answered=False` removes the first token the proxy saw (root and ``proxy.decode``
    events, ``tracedpush.ttft_ms``): the client got no token. `status`: the HTTP status
    the proxy answered with (the root's ``http.response.status_code``); None leaves it.
    """
    req = next(r for r in run.requests if r.request_id == request_id)
    failing = {name: (kind, message) for name, kind, message in faults}
    for span in _spans(run, req.trace_id):
        name = span["name"]
        if name in failing:
            kind, message = failing[name]
            span["status"] = {"code": STATUS_ERROR, "message": message}
            _set_attribute(span, sc.ERROR_TYPE, {"stringValue": kind})
        if name == sc.SPAN_REQUEST and status is not None:
            _set_attribute(span, sc.HTTP_STATUS, {"intValue": str(status)})
        if not answered and name in (sc.SPAN_REQUEST, sc.SPAN_PROXY_DECODE):
            events = span.get("events") or ()
            span["events"] = [e for e in events if e["name"] != sc.EVENT_FIRST_TOKEN]
            _drop_attribute(span, sc.TTFT_MS)
    return req.trace_id
