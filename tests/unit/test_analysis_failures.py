"""Failed requests: where each failed (leg, type, message), the run's account of failed,
recovered and incomplete requests, in the JSON and text reports (issue 11, item 7)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, run_json
from tracedpush.analysis.model import Event, Resource, Span
from tracedpush.analysis.report import render
from tracedpush.cli import main as cli_main
from tracedpush.testing import synthetic
from tracedpush.testing.synthetic.faults import fail_request

BASE = 1_700_000_000_000_000_000
RES = {
    "proxy": Resource(sc.SERVICE_PROXY, "proxy:8000", "h0", "1"),
    "prefill": Resource(sc.SERVICE_PREFILL, "prefill-0", "h1", "2"),
    "decode": Resource(sc.SERVICE_DECODE, "decode-0", "h2", "3"),
}
TRACE = "cd" * 16


def span(
    name: str,
    side: str,
    start_ms: float,
    end_ms: float,
    error: str | None = None,
    message: str = "",
    *,
    attrs: dict[str, Any] | None = None,
    first_token_ms: float | None = None,
) -> Span:
    """One span of request "req-1" (push); `error` fails it with that error.type."""
    a = {sc.MODE: "push", sc.ROLE: side, sc.REQUEST_ID: "req-1", **(attrs or {})}
    if error:
        a[sc.ERROR_TYPE] = error
    events = [] if first_token_ms is None else [Event(sc.EVENT_FIRST_TOKEN, ms(first_token_ms), {})]
    return Span(
        TRACE,
        f"{abs(hash((name, side, start_ms))) % 2**63:016x}",
        "",
        name,
        1,
        ms(start_ms),
        ms(end_ms),
        RES[side],
        a,
        events,
        2 if error else 0,
        message,
    )


def ms(t: float) -> int:
    return BASE + round(t * 1e6)


def root(end_ms: float, error: str | None = None, message: str = "", status: int = 200) -> Span:
    return span(sc.SPAN_REQUEST, "proxy", 0, end_ms, error, message, attrs={sc.HTTP_STATUS: status})


def one(*spans: Span) -> Any:
    (r,) = analyze(list(spans)).requests
    return r


def cancelled_decode():
    """D's leg as the proxy leaves it in push mode when P's leg fails first."""
    return span(
        sc.SPAN_PROXY_DECODE, "proxy", 1, 55, sc.ERR_UPSTREAM, "cancelled: the prefill leg failed"
    )


# ------------------------------------------------------------------- which span


def test_push_prefill_failure_is_not_blamed_on_the_cancelled_decode_leg() -> None:
    # push starts D's leg first; the proxy cancels it when P's leg fails
    msg = "prefill leg: http://p:8100 answered 500: boom"
    r = one(
        root(60, sc.ERR_UPSTREAM, msg, status=502),
        cancelled_decode(),
        span(sc.SPAN_PROXY_PREFILL, "proxy", 1.5, 50, sc.ERR_UPSTREAM, msg),
        span(sc.SPAN_PREFILL, "prefill", 2, 70, sc.ERR_UPSTREAM, "prefill ended FINISHED_ABORTED"),
    )
    f = r.failure
    assert (f.leg, f.type, f.message, f.span) == ("prefill", sc.ERR_UPSTREAM, msg, "proxy.prefill")
    assert f.at_ms == pytest.approx(50.0)
    assert r.error == "proxy.prefill: upstream_error"
    assert "failed: proxy.prefill: upstream_error" in r.problems
    assert r.ttft_ms is None


def test_engine_aborts_after_the_client_left_are_consequences() -> None:
    r = one(
        root(101, sc.ERR_CLIENT_DISCONNECT, "client disconnected", status=499),
        span(
            sc.SPAN_PROXY_DECODE, "proxy", 1, 100, sc.ERR_CLIENT_DISCONNECT, "client disconnected"
        ),
        span(sc.SPAN_DECODE, "decode", 2, 105, sc.ERR_UPSTREAM, "finished before first token"),
    )
    assert (r.failure.leg, r.failure.type, r.failure.span) == (
        "client",
        "client_disconnected",
        "proxy.decode",
    )


def test_a_failed_write_before_the_client_gave_up_is_where_it_failed() -> None:
    # D's kv.notify was closed by a timeout (its end is when it gave up); P's WRITE failed;
    # the client left long after: the WRITE is the failure, not the waits around it
    r = one(
        root(20_000, sc.ERR_CLIENT_DISCONNECT, "client disconnected", status=499),
        span(
            sc.SPAN_PROXY_DECODE,
            "proxy",
            1,
            20_000,
            sc.ERR_CLIENT_DISCONNECT,
            "client disconnected",
        ),
        span(
            sc.SPAN_KV_NOTIFY, "decode", 160, 160, sc.ERR_NOTIFY_TIMEOUT, "no notification arrived"
        ),
        span(sc.SPAN_KV_WRITE, "prefill", 1100, 1280, sc.ERR_TRANSFER, "transfer never completed"),
    )
    f = r.failure
    assert (f.leg, f.type, f.message, f.span, f.service) == (
        "prefill",
        sc.ERR_TRANSFER,
        "transfer never completed",
        "kv.write",
        sc.SERVICE_PREFILL,
    )


def test_waits_alone_name_the_side_that_waited() -> None:
    r = one(
        root(30_000, sc.ERR_UPSTREAM_TIMEOUT, "decode leg: no answer in 30 s", status=504),
        span(
            sc.SPAN_PROXY_DECODE,
            "proxy",
            1,
            30_000,
            sc.ERR_UPSTREAM_TIMEOUT,
            "decode leg: no answer in 30 s",
        ),
    )
    assert (r.failure.leg, r.failure.type) == ("decode", sc.ERR_UPSTREAM_TIMEOUT)


@pytest.mark.parametrize(
    ("message", "leg"),
    [
        ("prefill leg: http://p:8100 did not report its NIXL coordinates", "prefill"),
        ("decode leg: cannot connect to http://d:8200", "decode"),
        ("no healthy decode instance (of 1)", "proxy"),
    ],
)
def test_a_failed_root_alone_names_the_leg_in_its_message(message: str, leg: str) -> None:
    r = one(root(5, sc.ERR_UPSTREAM, message, status=503))
    assert (r.failure.leg, r.failure.span, r.failure.message) == (leg, sc.SPAN_REQUEST, message)


def test_the_root_is_preferred_to_a_cancelled_leg() -> None:
    # P's leg span was lost: the root still says which leg failed
    msg = "prefill leg: http://p:8100 answered 500"
    r = one(
        root(60, sc.ERR_UPSTREAM, msg, status=502),
        cancelled_decode(),
    )
    assert (r.failure.leg, r.failure.span, r.failure.message) == ("prefill", sc.SPAN_REQUEST, msg)


def test_relay_failure() -> None:
    msg = "prefill leg: http://p:8100 returned kv_transfer_params the decode engine cannot take"
    r = one(
        root(40, sc.ERR_UPSTREAM, msg, status=502),
        span(sc.SPAN_PROXY_PREFILL, "proxy", 1, 30),
        span(sc.SPAN_KV_RELAY, "proxy", 30, 31, sc.ERR_UPSTREAM, msg),
    )
    assert (r.failure.leg, r.failure.span) == ("relay", sc.SPAN_KV_RELAY)


def test_a_request_the_proxy_refused_failed_at_the_proxy() -> None:
    r = one(root(1, status=400))
    assert (r.failure.leg, r.failure.type, r.failure.span) == ("proxy", "400", sc.SPAN_REQUEST)
    assert r.error == "tracedpush.request: 400"


def test_an_error_relayed_in_the_decode_stream_is_a_failure() -> None:
    r = one(
        span(sc.SPAN_REQUEST, "proxy", 0, 100, attrs={sc.HTTP_STATUS: 200}, first_token_ms=20),
        span(sc.SPAN_PROXY_DECODE, "proxy", 1, 99, sc.ERR_UPSTREAM, "decode stream error: oom"),
    )
    assert (r.failure.leg, r.failure.message) == ("decode", "decode stream error: oom")


def test_answered_despite_a_failed_span_is_recovered_not_failed() -> None:
    # push: P's answer failed after D streamed the whole answer to the client
    run = analyze(
        [
            span(sc.SPAN_REQUEST, "proxy", 0, 100, attrs={sc.HTTP_STATUS: 200}, first_token_ms=20),
            span(sc.SPAN_PROXY_DECODE, "proxy", 1, 99, first_token_ms=19),
            span(sc.SPAN_PROXY_PREFILL, "proxy", 1.5, 80, sc.ERR_UPSTREAM, "prefill leg: reset"),
        ]
    )
    (r,) = run.requests
    assert r.failure is None and r.error == "proxy.prefill: upstream_error"
    f = run.failures()
    assert (f.total, f.recovered) == (0, 1)
    assert run_json(run)["requests"][0]["failure"] is None


def test_without_the_proxy_span_an_engine_error_is_a_failure() -> None:
    run = analyze([span(sc.SPAN_DECODE, "decode", 2, 50, sc.ERR_NOTIFY_TIMEOUT, "never scheduled")])
    (r,) = run.requests
    assert not r.proxy_seen
    assert (r.failure.leg, r.failure.type) == ("decode", sc.ERR_NOTIFY_TIMEOUT)
    assert run.failures().to_json()["no_proxy_span"] == 0  # failed, so counted as failed


# ------------------------------------------------------------ reports on a run


FAILED = {
    # request id: (faults, HTTP status, leg, type)
    "push-00004": (
        [
            (
                sc.SPAN_PROXY_PREFILL,
                sc.ERR_UPSTREAM,
                "prefill leg: http://p-host:8100 answered 500",
            ),
            (sc.SPAN_PROXY_DECODE, sc.ERR_UPSTREAM, "cancelled: the prefill leg failed"),
            (sc.SPAN_REQUEST, sc.ERR_UPSTREAM, "prefill leg: http://p-host:8100 answered 500"),
        ],
        502,
        "prefill",
        sc.ERR_UPSTREAM,
    ),
    "push-00009": (
        [
            (sc.SPAN_KV_WRITE, sc.ERR_TRANSFER, "transfer reported failed"),
            (sc.SPAN_PROXY_DECODE, sc.ERR_UPSTREAM_TIMEOUT, "decode leg: no token in 30 s"),
            (sc.SPAN_REQUEST, sc.ERR_UPSTREAM_TIMEOUT, "decode leg: no token in 30 s"),
        ],
        504,
        "prefill",
        sc.ERR_TRANSFER,
    ),
    "pull-00006": (
        [
            (
                sc.SPAN_PROXY_DECODE,
                sc.ERR_UPSTREAM,
                "decode leg: cannot connect to http://d-host:8200",
            ),
            (sc.SPAN_REQUEST, sc.ERR_UPSTREAM, "decode leg: cannot connect to http://d-host:8200"),
        ],
        502,
        "decode",
        sc.ERR_UPSTREAM,
    ),
    "pull-00011": (
        [
            (sc.SPAN_PROXY_DECODE, sc.ERR_CLIENT_DISCONNECT, "client disconnected"),
            (sc.SPAN_REQUEST, sc.ERR_CLIENT_DISCONNECT, "client disconnected"),
        ],
        499,
        "client",
        sc.ERR_CLIENT_DISCONNECT,
    ),
}


def failed_run(seed: int = 3) -> synthetic.SyntheticRun:
    """40 synthetic requests: the FAILED ones failed, some others lost their kv.notify."""
    run = synthetic.generate(40, seed=seed, drop_spans={sc.SPAN_KV_NOTIFY: 0.1})
    for rid, (faults, status, _leg, _type) in FAILED.items():
        fail_request(run, rid, *faults, status=status)
    return run


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, synthetic.SyntheticRun]:
    d = tmp_path_factory.mktemp("failed")
    run = failed_run()
    run.write(d)
    return d, run


def test_json_reports_each_failure_and_the_account(
    traces: tuple[Path, synthetic.SyntheticRun], tmp_path: Path
) -> None:
    d, gen = traces
    out = tmp_path / "report.json"
    assert cli_main(["report", "--traces", str(d), "--format", "json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 2
    by_id = {r["request_id"]: r for r in doc["requests"]}
    for rid, (faults, _status, leg, kind) in FAILED.items():
        f = by_id[rid]["failure"]
        message = next(m for name, t, m in faults if t == kind)
        assert f["leg"] == leg and f["type"] == kind and f["message"] == message, (rid, f)
        assert set(f) == {"leg", "type", "message", "span", "service", "at_ms"}
        assert by_id[rid]["error"] == f"{f['span']}: {f['type']}"
    assert all(r["failure"] is None for rid, r in by_id.items() if rid not in FAILED)
    lost = [r.request_id for r in gen.requests if r.dropped and r.request_id not in FAILED]
    assert lost
    assert doc["failures"] == {
        "total": 4,
        "by_leg": {"prefill": 2, "decode": 1, "client": 1},
        "by_type": {sc.ERR_UPSTREAM: 2, sc.ERR_TRANSFER: 1, sc.ERR_CLIENT_DISCONNECT: 1},
        "recovered": 0,
        "incomplete": len(lost),
        "missing_spans": {sc.SPAN_KV_NOTIFY: len(lost)},
        "no_proxy_span": 0,
    }


def test_text_report_has_a_failed_requests_section(
    traces: tuple[Path, synthetic.SyntheticRun], capsys: pytest.CaptureFixture[str]
) -> None:
    d, gen = traces
    assert cli_main(["report", "--traces", str(d)]) == 0
    text = capsys.readouterr().out
    assert "failed: 4 (prefill 2, decode 1, client 1)" in text
    section = text.split("Failed requests (4 of 40)\n")[1].split("\n\n\n")[0]
    counts = [line.split() for line in section.splitlines()[3:7]]
    assert counts == [  # legs in order, then the most frequent type, then by name
        ["prefill", sc.ERR_TRANSFER, "1"],
        ["prefill", sc.ERR_UPSTREAM, "1"],
        ["decode", sc.ERR_UPSTREAM, "1"],
        ["client", sc.ERR_CLIENT_DISCONNECT, "1"],
    ]
    for rid, (faults, _status, _leg, kind) in FAILED.items():
        message = next(m for _name, t, m in faults if t == kind)
        line = next(ln for ln in section.splitlines() if ln.startswith(rid))
        assert kind in line and message in line
    ok = [r.request_id for r in gen.requests if r.request_id not in FAILED]
    assert not any(ln.startswith(rid + " ") for ln in section.splitlines() for rid in ok)
    lost = sum(1 for r in gen.requests if r.dropped and r.request_id not in FAILED)
    assert f"{lost} request(s) the proxy saw did not fail but have an incomplete trace" in section
    assert f"missing spans: {sc.SPAN_KV_NOTIFY} {lost}" in section


def test_a_healthy_run_prints_no_failed_section(tmp_path: Path) -> None:
    synthetic.generate(10, seed=5, engine_steps=False).write(tmp_path)
    run = analyze(TraceStore.from_path(tmp_path))
    text = render(run)
    assert "failed: 0;" in text and "Failed requests" not in text
    assert run_json(run)["failures"]["total"] == 0
    assert all(r.failure is None and r.error is None for r in run.requests)
