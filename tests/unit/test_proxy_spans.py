"""The proxy's spans, read back from an in-memory exporter.

Stub aiohttp servers stand in for vLLM's prefill and decode servers (vLLM cannot run in
unit tests); the spans are the proxy's own, produced exactly as in production.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from tracedpush import semconv
from tracedpush.proxy.upstream import Timeouts
from tracedpush.testing.stub_engine import StubEngine, proxy_rig

BODY = {"model": "stub-model", "prompt": "a b c d", "max_tokens": 7}


def run(scenario, limit: float = 30) -> None:
    asyncio.run(asyncio.wait_for(scenario(), limit))


def traceparent(span) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def by_name(spans) -> dict:
    names = [s.name for s in spans]
    assert len(names) == len(set(names)), names
    return {s.name: s for s in spans}


async def all_spans(rig, count: int) -> dict:
    """The request's spans once ``count`` have ended (P's may end after the response)."""
    async with asyncio.timeout(5):
        while len(rig.spans()) < count:
            await asyncio.sleep(0.01)
    return by_name(rig.spans())


def test_pull_stream_spans_form_one_tree_and_carry_the_contract():
    async def scenario():
        async with proxy_rig("pull") as rig:
            headers = {"X-Request-Id": "span-req-1"}
            body = BODY | {"stream": True}
            resp = await rig.client.post("/v1/completions", json=body, headers=headers)
            await resp.read()
            spans = await all_spans(rig, 4)
        assert set(spans) == {
            semconv.SPAN_REQUEST,
            semconv.SPAN_PROXY_PREFILL,
            semconv.SPAN_PROXY_DECODE,
            semconv.SPAN_KV_RELAY,
        }
        root = spans[semconv.SPAN_REQUEST]
        prefill, decode = spans[semconv.SPAN_PROXY_PREFILL], spans[semconv.SPAN_PROXY_DECODE]
        relay = spans[semconv.SPAN_KV_RELAY]
        assert root.kind == SpanKind.SERVER and root.parent is None
        assert (prefill.kind, decode.kind, relay.kind) == (
            SpanKind.CLIENT,
            SpanKind.CLIENT,
            SpanKind.INTERNAL,
        )
        for child in (prefill, decode, relay):
            assert child.context.trace_id == root.context.trace_id
            assert child.parent.span_id == root.context.span_id
        # relay sits exactly between P's answer and D's request
        assert prefill.end_time == relay.start_time
        assert relay.end_time == decode.start_time
        assert root.start_time <= prefill.start_time and decode.end_time <= root.end_time

        a = root.attributes
        assert a[semconv.MODE] == "pull" and a[semconv.ROLE] == "proxy"
        assert a[semconv.REQUEST_ID] == "span-req-1"
        assert a[semconv.STREAM] is True
        assert a[semconv.HTTP_METHOD] == "POST"
        assert a[semconv.HTTP_ROUTE] == "/v1/completions"
        assert a[semconv.HTTP_STATUS] == 200
        assert a[semconv.PROMPT_TOKENS] == 4 and a[semconv.OUTPUT_TOKENS] == 3
        first = [e for e in root.events if e.name == semconv.EVENT_FIRST_TOKEN]
        assert len(first) == 1
        assert a[semconv.TTFT_MS] == pytest.approx((first[0].timestamp - root.start_time) / 1e6)
        d_first = [e for e in decode.events if e.name == semconv.EVENT_FIRST_TOKEN]
        assert len(d_first) == 1 and d_first[0].timestamp <= first[0].timestamp

        for leg, stub in ((prefill, rig.prefill[0]), (decode, rig.decode[0])):
            assert leg.attributes[semconv.UPSTREAM_URL].startswith("http://127.0.0.1:")
            assert leg.attributes[semconv.SERVER_ADDRESS] == "127.0.0.1"
            assert isinstance(leg.attributes[semconv.SERVER_PORT], int)
            assert leg.attributes[semconv.HTTP_STATUS] == 200
            # each engine's trace context names its own leg as parent
            (request,) = stub.requests
            kv = request.body["kv_transfer_params"]
            assert kv[semconv.KV_PARAMS_TRACE_KEY] == {"traceparent": traceparent(leg)}
            assert request.headers["traceparent"] == traceparent(leg)
        assert prefill.attributes[semconv.ENGINE_ID] == rig.prefill[0].engine_id

    run(scenario)


def test_push_legs_overlap_and_no_relay_span():
    async def scenario():
        decode = StubEngine("decode", mode="push")

        async def wait_for_decode() -> None:
            await asyncio.wait_for(decode.received.wait(), 5)

        prefill = StubEngine("prefill", mode="push", before_answer=wait_for_decode)
        async with proxy_rig("push", [prefill], [decode]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 200
            spans = await all_spans(rig, 3)
        assert set(spans) == {
            semconv.SPAN_REQUEST,
            semconv.SPAN_PROXY_PREFILL,
            semconv.SPAN_PROXY_DECODE,
        }
        p, d = spans[semconv.SPAN_PROXY_PREFILL], spans[semconv.SPAN_PROXY_DECODE]
        assert d.start_time < p.end_time  # sent together
        assert p.attributes[semconv.ENGINE_ID] == prefill.engine_id
        root = spans[semconv.SPAN_REQUEST]
        assert root.attributes[semconv.MODE] == "push"
        assert root.attributes[semconv.STREAM] is False
        assert root.attributes[semconv.TTFT_MS] > 0
        assert [e.name for e in root.events] == [semconv.EVENT_FIRST_TOKEN]
        d_kv = decode.requests[0].body["kv_transfer_params"]
        assert d_kv[semconv.KV_PARAMS_TRACE_KEY]["traceparent"] == traceparent(d)

    run(scenario)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_each_leg_records_when_its_bytes_left(mode):
    """`request_sent` (the start of `network`) lies between the leg's start and the
    engine's handler having the whole body, once per leg. It says how the proxy's event
    loop spent the time since the request's receipt (Linux): on a CPU and waiting for
    one, together no longer than that time."""

    async def scenario():
        decode = StubEngine("decode", mode=mode)
        prefill = StubEngine("prefill", mode=mode)
        async with proxy_rig(mode, [prefill], [decode]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 200
            spans = await all_spans(rig, 3 if mode == "push" else 4)
        for name, engine in (
            (semconv.SPAN_PROXY_PREFILL, prefill),
            (semconv.SPAN_PROXY_DECODE, decode),
        ):
            leg = spans[name]
            events = [e for e in leg.events if e.name == semconv.EVENT_REQUEST_SENT]
            assert len(events) == 1, leg.events
            sent = events[0].timestamp
            assert leg.start_time <= sent <= engine.requests[0].seen_ns, name
            if os.path.exists("/proc/thread-self/schedstat"):
                on_cpu = events[0].attributes[semconv.LOOP_ON_CPU_MS]
                waited = events[0].attributes[semconv.LOOP_CPU_WAIT_MS]
                since_receipt = (sent - spans[semconv.SPAN_REQUEST].start_time) / 1e6
                assert on_cpu > 0.0 and waited >= 0.0, events[0].attributes
                # each sample is read just after its time stamp
                assert on_cpu + waited <= since_receipt + 1.0, events[0].attributes
        if mode == "pull" and os.path.exists("/proc/thread-self/schedstat"):
            # kv.relay: the same figures at P's answer, between the legs' (none later than
            # D's send, none earlier than P's), so D's less the relay's is the relay's own
            relay = spans[semconv.SPAN_KV_RELAY].attributes
            legs = [
                next(e for e in spans[n].events if e.name == semconv.EVENT_REQUEST_SENT)
                for n in (semconv.SPAN_PROXY_PREFILL, semconv.SPAN_PROXY_DECODE)
            ]
            for key in (semconv.LOOP_ON_CPU_MS, semconv.LOOP_CPU_WAIT_MS):
                p_said, d_said = (e.attributes[key] for e in legs)
                assert p_said <= relay[key] <= d_said, (key, p_said, relay[key], d_said)
            assert relay[semconv.LOOP_ON_CPU_MS] < legs[1].attributes[semconv.LOOP_ON_CPU_MS]
        if os.path.exists("/proc/thread-self/schedstat"):
            # the first token: in from D (proxy.decode's first_token), then out to the
            # client (the root's), both with the figures since receipt, in that order
            d_sent, d_in, out = (
                next(e for e in spans[n].events if e.name == ev).attributes
                for n, ev in (
                    (semconv.SPAN_PROXY_DECODE, semconv.EVENT_REQUEST_SENT),
                    (semconv.SPAN_PROXY_DECODE, semconv.EVENT_FIRST_TOKEN),
                    (semconv.SPAN_REQUEST, semconv.EVENT_FIRST_TOKEN),
                )
            )
            for key in (semconv.LOOP_ON_CPU_MS, semconv.LOOP_CPU_WAIT_MS):
                assert d_sent[key] <= d_in[key] <= out[key], (key, d_sent, d_in, out)
            assert d_in[semconv.LOOP_ON_CPU_MS] < out[semconv.LOOP_ON_CPU_MS]

    run(scenario)


def test_client_traceparent_is_continued():
    async def scenario():
        trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        async with proxy_rig("pull") as rig:
            headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
            await (await rig.client.post("/v1/completions", json=BODY, headers=headers)).read()
            spans = await all_spans(rig, 4)
        root = spans[semconv.SPAN_REQUEST]
        assert f"{root.context.trace_id:032x}" == trace_id
        assert f"{root.parent.span_id:016x}" == parent_id
        assert all(f"{s.context.trace_id:032x}" == trace_id for s in spans.values())

    run(scenario)


def test_no_trace_context_leaves_kv_params_clean():
    async def scenario():
        async with proxy_rig("pull", trace_context=False) as rig:
            await (await rig.client.post("/v1/completions", json=BODY)).read()
        for stub in (rig.prefill[0], rig.decode[0]):
            kv = stub.requests[0].body["kv_transfer_params"]
            assert semconv.KV_PARAMS_TRACE_KEY not in kv
            assert "traceparent" in stub.requests[0].headers  # the standard header stays

    run(scenario)


def test_failed_leg_marks_leg_and_root_with_the_error_type():
    async def scenario():
        async with proxy_rig("pull", [StubEngine("prefill", status=503)]) as rig:
            assert (await rig.client.post("/v1/completions", json=BODY)).status == 502
            spans = await all_spans(rig, 2)
        assert set(spans) == {semconv.SPAN_REQUEST, semconv.SPAN_PROXY_PREFILL}
        for span in spans.values():
            assert span.status.status_code == StatusCode.ERROR
            assert span.attributes[semconv.ERROR_TYPE] == semconv.ERR_UPSTREAM
            assert "prefill leg" in span.status.description
        assert spans[semconv.SPAN_PROXY_PREFILL].attributes[semconv.HTTP_STATUS] == 503
        assert spans[semconv.SPAN_REQUEST].attributes[semconv.HTTP_STATUS] == 502

    run(scenario)


def test_timeout_marks_upstream_timeout_and_the_cancelled_leg():
    async def scenario():
        prefill = StubEngine("prefill", mode="push", hang=True)
        decode = StubEngine("decode", mode="push", hang=True)
        timeouts = Timeouts(connect=2, first_byte=0.3, total=10)
        async with proxy_rig("push", [prefill], [decode], timeouts=timeouts) as rig:
            assert (await rig.client.post("/v1/completions", json=BODY)).status == 504
            spans = await all_spans(rig, 3)
        root, p = spans[semconv.SPAN_REQUEST], spans[semconv.SPAN_PROXY_PREFILL]
        d = spans[semconv.SPAN_PROXY_DECODE]
        assert root.attributes[semconv.ERROR_TYPE] == semconv.ERR_UPSTREAM_TIMEOUT
        assert p.attributes[semconv.ERROR_TYPE] == semconv.ERR_UPSTREAM_TIMEOUT
        assert "prefill leg" in root.status.description
        # D hit the same bound at the same moment, or was cancelled because P failed.
        assert d.status.status_code == StatusCode.ERROR
        assert d.attributes[semconv.ERROR_TYPE] in (
            semconv.ERR_UPSTREAM_TIMEOUT,
            semconv.ERR_UPSTREAM,
        )

    run(scenario)


def test_client_disconnect_is_recorded_on_root_and_legs():
    """Push: the root and D's leg record the disconnect; P's leg runs to its end after
    (so that P's WRITE frees the blocks D registered) and records that it finished."""

    async def scenario():
        prefill = StubEngine("prefill", mode="push", head_delay=1.0)
        decode = StubEngine("decode", mode="push", hang=True)
        async with proxy_rig("push", [prefill], [decode]) as rig:
            with pytest.raises(TimeoutError):
                await rig.client.post(
                    "/v1/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.3)
                )
            spans = await all_spans(rig, 3)
        for name in (semconv.SPAN_REQUEST, semconv.SPAN_PROXY_DECODE):
            assert spans[name].status.status_code == StatusCode.ERROR
            assert spans[name].attributes[semconv.ERROR_TYPE] == semconv.ERR_CLIENT_DISCONNECT
        p_leg = spans[semconv.SPAN_PROXY_PREFILL]
        assert p_leg.status.status_code is not StatusCode.ERROR, p_leg.status.description
        assert p_leg.end_time > spans[semconv.SPAN_REQUEST].end_time

    run(scenario)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_a_client_hanging_up_right_after_done_was_served(mode):
    """OpenAI clients close the connection on [DONE]; that is success, not a disconnect."""

    async def scenario():
        decode = [StubEngine("decode", mode=mode, tail_delay=0.3)]  # D lingers after [DONE]
        async with proxy_rig(mode, decode=decode) as rig:
            body = BODY | {"stream": True}
            resp = await rig.client.post(
                "/v1/completions", json=body, headers={"X-Request-Id": f"hangup-{mode}"}
            )
            async for line in resp.content:
                if line.strip() == b"data: [DONE]":
                    break
            resp.close()  # hang up before the proxy's end of stream
            spans = await all_spans(rig, 4 if mode == "pull" else 3)
        root = spans[semconv.SPAN_REQUEST]
        assert root.status.status_code is not StatusCode.ERROR, root.status.description
        assert semconv.ERROR_TYPE not in root.attributes
        assert spans[semconv.SPAN_PROXY_DECODE].status.status_code is not StatusCode.ERROR
        assert [e.name for e in root.events] == [semconv.EVENT_FIRST_TOKEN]

    run(scenario)
