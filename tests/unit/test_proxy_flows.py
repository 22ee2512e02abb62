"""The proxy's push and pull flows against stub engines.

vLLM cannot run in unit tests, so small in-process aiohttp servers
(``tracedpush.testing.stub_engine.StubEngine``) stand in for the prefill and decode
servers: they answer like vLLM 0.32 (P's kv_transfer_params, D's SSE chunks), record
what they receive, and notice when the proxy drops a connection. Real engines are
exercised by the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tracedpush.proxy.app import STATE
from tracedpush.proxy.upstream import Timeouts
from tracedpush.testing.stub_engine import StubEngine, proxy_rig

BODY = {"model": "stub-model", "prompt": "a b c d", "max_tokens": 7}
CHAT = {
    "model": "stub-model",
    "messages": [{"role": "user", "content": "hi there"}],
    "max_tokens": 5,
    "stream": True,
}
FAST = Timeouts(connect=2.0, first_byte=0.3, total=10.0)


def run(scenario: Callable[[], Any], limit: float = 30) -> None:
    """Run an async scenario; the outer bound only keeps a broken proxy from hanging."""
    asyncio.run(asyncio.wait_for(scenario(), limit))


async def until(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.01)


def sse_chunks(text: str) -> list[Any]:
    """The data of each SSE event: parsed JSON, or the raw string ([DONE])."""
    out = []
    for event in text.split("\n\n"):
        if event.startswith("data: "):
            data = event[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


_HELD: list[socket.socket] = []  # the ports `dead_url` gave out, bound and never listened on


async def dead_url() -> str:
    """A URL nobody listens on: its port bound, never listened on (a connection is
    refused), and held until the tests end. A port freed instead (a server's, after it
    closed) was handed to the next server that asked, the rig's own stubs among them,
    which then answered."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return f"http://127.0.0.1:{s.getsockname()[1]}"


# ------------------------------------------------------------------------------ pull
def test_pull_sends_p_then_d_with_p_params():
    async def scenario():
        async with proxy_rig("pull") as rig:
            resp = await rig.client.post(
                "/v1/completions", json=BODY, headers={"X-Request-Id": "client-42"}
            )
            assert resp.status == 200
            assert resp.headers["X-Request-Id"] == "client-42"
            assert (await resp.json())["choices"][0]["text"] == "Hello world!"
            (p_req,), (d_req,) = rig.prefill[0].requests, rig.decode[0].requests
            assert p_req.headers["X-Request-Id"] == d_req.headers["X-Request-Id"] == "client-42"
            assert p_req.body["max_tokens"] == 1 and p_req.body["stream"] is False
            p_kv = p_req.body["kv_transfer_params"]
            assert p_kv["do_remote_decode"] is True and p_kv["do_remote_prefill"] is False
            # D got P's params (relayed, plus trace context) and the client's settings.
            assert d_req.seen_at >= rig.prefill[0].answered_at[0]
            d_kv = d_req.body["kv_transfer_params"]
            assert d_kv["remote_request_id"] == "cmpl-client-42-0-abcdef12"
            assert d_kv["remote_block_ids"] == [[1, 2, 3]]
            assert d_kv["remote_engine_id"] == rig.prefill[0].engine_id
            assert d_kv["transfer_mode"] == "pull"
            assert d_req.body["max_tokens"] == 7 and d_req.body["prompt"] == "a b c d"

    run(scenario)


def test_pull_stream_relays_d_events_and_hides_the_added_usage_chunk():
    async def scenario():
        async with proxy_rig("pull") as rig:
            resp = await rig.client.post("/v1/completions", json=BODY | {"stream": True})
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            chunks = sse_chunks(await resp.text())
            d_req = rig.decode[0].requests[0]
            assert d_req.body["stream"] is True
            assert d_req.body["stream_options"] == {"include_usage": True}  # for token counts
            stub_chunks = rig.decode[0].stream_chunks("/v1/completions", {})  # without usage
            assert chunks == [*stub_chunks, "[DONE]"]
            assert rig.prefill[0].requests[0].body["stream"] is False

    run(scenario)


def test_stream_keeps_the_usage_chunk_the_client_asked_for():
    async def scenario():
        async with proxy_rig("pull") as rig:
            body = BODY | {"stream": True, "stream_options": {"include_usage": True}}
            chunks = sse_chunks(await (await rig.client.post("/v1/completions", json=body)).text())
            assert chunks[-2]["usage"]["completion_tokens"] == 3 and chunks[-2]["choices"] == []

    run(scenario)


def test_xpyd_spreads_requests_over_instances():
    async def scenario():
        prefill = [StubEngine("prefill", engine_id=f"p{i}") for i in range(2)]
        decode = [StubEngine("decode") for _ in range(2)]
        async with proxy_rig("pull", prefill, decode) as rig:
            for _ in range(4):
                assert (await rig.client.post("/v1/completions", json=BODY)).status == 200
            assert [len(s.requests) for s in (*prefill, *decode)] == [2, 2, 2, 2]
            # D was told to read from the P that actually computed the prompt.
            for d in decode:
                engines = {r.body["kv_transfer_params"]["remote_engine_id"] for r in d.requests}
                assert engines == {"p0", "p1"} or len(engines) == 1

    run(scenario)


# ------------------------------------------------------------------------------ push
def test_push_sends_both_legs_at_once_with_p_coordinates():
    async def scenario():
        decode = StubEngine("decode", mode="push")

        async def wait_for_decode() -> None:  # P answers only once D has the request
            await asyncio.wait_for(decode.received.wait(), 5)

        prefill = StubEngine(
            "prefill",
            mode="push",
            engine_id="prefill-7",
            side_port=5611,
            before_answer=wait_for_decode,
        )
        async with proxy_rig("push", [prefill], [decode]) as rig:
            resp = await rig.client.post(
                "/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "push-1"}
            )
            assert resp.status == 200
            chunks = sse_chunks(await resp.text())
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert (
                "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
                == "Hello world!"
            )
            (p_req,), (d_req,) = prefill.requests, decode.requests
            assert p_req.headers["X-Request-Id"] == d_req.headers["X-Request-Id"] == "push-1"
            assert d_req.seen_at < prefill.answered_at[0]  # D did not wait for P's answer
            assert p_req.body["kv_transfer_params"]["do_remote_decode"] is True
            d_kv = d_req.body["kv_transfer_params"]
            assert {k: v for k, v in d_kv.items() if k != "tracedpush_trace"} == {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": "prefill-7",
                "remote_host": "127.0.0.1",
                "remote_port": 5611,
                "remote_request_id": "push-1",
                "remote_block_ids": [],
                "tp_size": 1,
                "pp_size": 1,
            }
            assert d_req.body["max_tokens"] == 5 and d_req.body["stream"] is True

    run(scenario)


def test_push_learns_unknown_coordinates_from_p_then_goes_parallel():
    async def scenario():
        decode = StubEngine("decode", mode="push")
        prefill = StubEngine("prefill", mode="push", engine_id="learned-p", side_port=5622)

        async def second_waits_for_decode() -> None:
            if len(prefill.requests) == 2:
                await until(lambda: len(decode.requests) == 2)

        prefill.before_answer = second_waits_for_decode
        async with proxy_rig("push", [prefill], [decode], coordinates=False) as rig:
            for _ in range(2):
                resp = await rig.client.post("/v1/completions", json=BODY)
                assert resp.status == 200, await resp.text()
            first, second = decode.requests
            await until(lambda: len(prefill.answered_at) == 2)
            assert first.seen_at >= prefill.answered_at[0]  # first contact: sequential
            assert second.seen_at < prefill.answered_at[1]  # then: parallel
            for d_req in (first, second):
                kv = d_req.body["kv_transfer_params"]
                assert (kv["remote_engine_id"], kv["remote_port"]) == ("learned-p", 5622)
                assert kv["remote_block_ids"] == []
            health = await (await rig.client.get("/health")).json()
            assert health["prefill"][0]["kv_coordinates"]["learned_from"] == "response"

    run(scenario)


def test_push_probe_discovers_coordinates_before_the_first_request():
    async def scenario():
        prefill = StubEngine("prefill", mode="push", engine_id="probed-p", side_port=5633)
        decode = StubEngine("decode", mode="push")

        async def real_request_waits_for_decode() -> None:
            if len(prefill.requests) == 2:
                await until(lambda: len(decode.requests) == 1)

        prefill.before_answer = real_request_waits_for_decode
        async with proxy_rig(
            "push", [prefill], [decode], coordinates=False, kv_discovery="probe"
        ) as rig:
            await until(lambda: rig.client.app[STATE].prefill.instances[0].coords.learned)
            (probe,) = prefill.requests
            assert probe.body["max_tokens"] == 1 and probe.body["model"] == "stub-model"
            assert probe.headers["X-Request-Id"].startswith("tp-probe-")
            assert (await rig.client.post("/v1/completions", json=BODY)).status == 200
            await until(lambda: len(prefill.answered_at) == 2)
            assert decode.requests[0].seen_at < prefill.answered_at[1]  # parallel at once
            assert decode.requests[0].body["kv_transfer_params"]["remote_port"] == 5633

    run(scenario)


# ------------------------------------------------------------------- client mistakes
@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({**BODY, "kv_transfer_params": {"do_remote_prefill": True}}, "remote_request_id"),
        ({"prompt": "x"}, "model"),
        ({**BODY, "max_tokens": 0}, "max_tokens"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_bad_requests_get_400_before_any_engine_sees_them(payload, needle):
    async def scenario():
        async with proxy_rig("push") as rig:
            if isinstance(payload, bytes):
                resp = await rig.client.post("/v1/completions", data=payload)
            else:
                resp = await rig.client.post("/v1/completions", json=payload)
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert needle in error["message"] and error["code"] == 400
            assert error["type"] == "invalid_request_error"
            assert not rig.prefill[0].requests and not rig.decode[0].requests

    run(scenario)


def test_insane_client_request_id_is_replaced_on_both_legs():
    async def scenario():
        async with proxy_rig("push") as rig:
            headers = {"X-Request-Id": "has space,comma"}
            resp = await rig.client.post("/v1/completions", json=BODY, headers=headers)
            rid = resp.headers["X-Request-Id"]
            assert rid.startswith("tp-")
            assert rig.prefill[0].requests[0].headers["X-Request-Id"] == rid
            assert rig.decode[0].requests[0].headers["X-Request-Id"] == rid

    run(scenario)


def test_a_request_id_in_flight_is_never_reused():
    async def scenario():
        async with proxy_rig("push") as rig:
            state = rig.client.app[STATE]
            assert state.claim_request_id("dup") == "dup"
            second = state.claim_request_id("dup")
            assert second != "dup" and second.startswith("tp-")

    run(scenario)


# ------------------------------------------------------------------ upstream failures
async def error_of(resp: aiohttp.ClientResponse) -> str:
    return (await resp.json())["error"]["message"]


def test_pull_prefill_500_is_a_502_naming_prefill_and_d_is_never_called():
    async def scenario():
        async with proxy_rig("pull", [StubEngine("prefill", status=500)]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 502
            message = await error_of(resp)
            assert message.startswith("prefill leg:") and "500" in message
            assert not rig.decode[0].requests

    run(scenario)


def test_pull_bad_params_from_p_never_reach_d():
    def broken(body, request_id):
        params = StubEngine("prefill").default_kv_params(body, request_id)
        del params["remote_request_id"]
        params["remote_port"] = "5600"
        return params

    async def scenario():
        async with proxy_rig("pull", [StubEngine("prefill", kv_params=broken)]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 502
            message = await error_of(resp)
            assert message.startswith("prefill leg:")
            assert "kv_transfer_params.remote_request_id" in message
            assert "kv_transfer_params.remote_port" in message
            assert not rig.decode[0].requests

    run(scenario)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_prefill_running_the_other_connector_is_a_502(mode):
    other = "pull" if mode == "push" else "push"

    async def scenario():
        prefill = StubEngine("prefill", mode=other)
        decode = StubEngine("decode", mode=mode, hang=True)  # a push D waits for KV forever
        async with proxy_rig(mode, [prefill], [decode]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 502
            assert "prefill leg" in (message := await error_of(resp))
            assert "transfer_mode" in message
            if mode == "push":
                await asyncio.wait_for(decode.cancelled.wait(), 5)
            else:
                assert not decode.requests

    run(scenario)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_decode_500_is_a_502_naming_decode(mode):
    async def scenario():
        async with proxy_rig(mode, decode=[StubEngine("decode", status=500)]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY | {"stream": True})
            assert resp.status == 502
            assert (await error_of(resp)).startswith("decode leg:")

    run(scenario)


def test_decode_4xx_is_relayed_with_the_leg_named():
    async def scenario():
        async with proxy_rig("pull", decode=[StubEngine("decode", status=400)]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 400
            assert "decode leg" in (message := await error_of(resp))
            assert "stub decode failure" in message

    run(scenario)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_refused_connection_is_a_502_naming_the_leg(mode):
    async def scenario():
        spec = f"{await dead_url()}#engine_id=p,port=5600"
        async with proxy_rig(mode, prefill_urls=[spec], timeouts=FAST) as rig:
            for _ in range(2):  # no health checks: nothing excludes it
                resp = await rig.client.post("/v1/completions", json=BODY)
                assert resp.status == 502
                message = await error_of(resp)
                assert message.startswith("prefill leg:") and "cannot connect" in message
            if mode == "pull":
                assert not rig.decode[0].requests

    run(scenario)


def test_with_health_checks_a_refused_instance_is_skipped_until_healthy():
    async def scenario():
        good, bad = StubEngine("decode"), StubEngine("decode")
        async with proxy_rig("pull", decode=[good, bad], health_interval=3600) as rig:
            bad_inst, statuses = await second_dies_then_four_requests(rig, "decode")
            # round robin hits the dead one once; after that it is skipped
            assert statuses.count(502) == 1 and statuses.count(200) == 3
            assert bad_inst.healthy is False and "connect failed" in bad_inst.last_error
            assert len(good.requests) == 3

    run(scenario)


async def second_dies_then_four_requests(rig: Any, role: str) -> tuple[Any, list[int]]:
    """Once every instance passed a check, the second of `role` goes away (its URL now
    refuses connections); then four requests, one at a time: (that instance, statuses)."""
    state = rig.client.app[STATE]
    await until(lambda: all(i.healthy for i in state.instances))
    dead = getattr(state, role).instances[1]
    dead.url = await dead_url()  # the engine went away after its check
    statuses = [(await rig.client.post("/v1/completions", json=BODY)).status for _ in range(4)]
    return dead, statuses


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_a_request_whose_prefill_refuses_the_connection_goes_to_another(mode):
    """A P that died since its last health check refuses the connection. In pull mode
    (and in push mode while P's coordinates are unknown) nothing has reached D yet, so
    the request goes to the other P and the client never sees the dead one. In push
    mode with known coordinates D already has the request, waiting for that P's KV: a
    502 naming the prefill leg, as before (docs/proxy.md)."""

    async def scenario():
        prefill = [StubEngine("prefill", mode=mode), StubEngine("prefill", mode=mode)]
        async with proxy_rig(mode, prefill=prefill, health_interval=3600) as rig:
            state = rig.client.app[STATE]
            dead, statuses = await second_dies_then_four_requests(rig, "prefill")
            assert dead.healthy is False and "connect failed" in dead.last_error
            rerouted = [
                s
                for s in rig.spans("tracedpush.request")
                if any(e.name == "prefill_rerouted" for e in s.events)
            ]
            if mode == "pull":
                assert statuses == [200] * 4 and len(prefill[0].requests) == 4
                (root,) = rerouted
                (event,) = [e for e in root.events if e.name == "prefill_rerouted"]
                assert event.attributes["tracedpush.upstream"] == state.prefill.instances[0].url
                assert root.attributes["http.response.status_code"] == 200
            else:
                assert sorted(statuses) == [200, 200, 200, 502] and not rerouted

    run(scenario)


def test_no_usable_instance_is_a_503():
    async def scenario():
        async with proxy_rig("pull", health_interval=3600) as rig:
            state = rig.client.app[STATE]
            await until(lambda: all(i.healthy for i in state.instances))
            state.prefill.instances[0].mark(False, "down")
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 503 and "no healthy prefill" in await error_of(resp)

    run(scenario)


def test_push_slow_prefill_is_a_504_naming_prefill_and_cancels_decode():
    async def scenario():
        prefill = StubEngine("prefill", mode="push", hang=True)
        decode = StubEngine("decode", mode="push", hang=True)  # waits for KV forever
        async with proxy_rig("push", [prefill], [decode], timeouts=FAST) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 504
            error = (await resp.json())["error"]
            assert error["message"].startswith("prefill leg:")
            assert "first-byte timeout" in error["message"]
            await asyncio.wait_for(decode.cancelled.wait(), 5)
            await asyncio.wait_for(prefill.cancelled.wait(), 5)

    run(scenario)


def test_pull_slow_decode_is_a_504_naming_decode():
    async def scenario():
        decode = StubEngine("decode", hang=True)
        async with proxy_rig("pull", decode=[decode], timeouts=FAST) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY | {"stream": True})
            assert resp.status == 504
            assert (await error_of(resp)).startswith("decode leg:")
            await asyncio.wait_for(decode.cancelled.wait(), 5)

    run(scenario)


def test_stream_cut_by_the_total_timeout_ends_with_an_error_event():
    async def scenario():
        decode = StubEngine("decode", tokens=("a",) * 50, token_delay=0.2)  # 10 s in all
        timeouts = Timeouts(connect=2.0, first_byte=5.0, total=1.0)
        async with proxy_rig("pull", decode=[decode], timeouts=timeouts) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY | {"stream": True})
            assert resp.status == 200  # the stream had started
            chunks = sse_chunks(await resp.text())
            assert chunks[0]["choices"][0]["text"] == "a"
            error = chunks[-1]["error"]
            assert error["code"] == 504 and error["message"].startswith("decode leg:")
            assert "total timeout" in error["message"]
            await asyncio.wait_for(decode.cancelled.wait(), 5)

    run(scenario)


def test_push_prefill_failure_cancels_the_waiting_decode():
    async def scenario():
        decode = StubEngine("decode", mode="push", hang=True)
        prefill = StubEngine("prefill", mode="push", status=500)
        async with proxy_rig("push", [prefill], [decode]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY | {"stream": True})
            assert resp.status == 502
            assert (await error_of(resp)).startswith("prefill leg:")
            await asyncio.wait_for(decode.cancelled.wait(), 5)

    run(scenario)


@pytest.mark.serial  # a latency bound
def test_push_decode_failure_lets_prefill_finish():
    """Push: once D has the request, P's leg runs to its end even when D's leg fails, so
    P's WRITE lands and a live D frees the blocks it registered (vLLM 0.32 frees them
    only then). The client still gets its 502 at once."""

    async def scenario():
        decode = StubEngine("decode", mode="push", status=500)
        prefill = StubEngine("prefill", mode="push", head_delay=0.5)
        async with proxy_rig("push", [prefill], [decode]) as rig:
            t0 = asyncio.get_running_loop().time()
            resp = await rig.client.post("/v1/completions", json=BODY)
            assert resp.status == 502
            assert (await error_of(resp)).startswith("decode leg:")
            assert asyncio.get_running_loop().time() - t0 < 0.4  # not held for P
            state = rig.client.app[STATE]
            await until(lambda: not state.finishing)
            assert len(prefill.answered_at) == 1 and not prefill.cancelled.is_set()

    run(scenario)


def test_push_client_leaving_lets_prefill_finish():
    async def scenario():
        prefill = StubEngine("prefill", mode="push", head_delay=1.0)
        decode = StubEngine("decode", mode="push", hang=True)
        async with proxy_rig("push", [prefill], [decode]) as rig:
            with pytest.raises(TimeoutError):
                await rig.client.post(
                    "/v1/completions",
                    json=BODY | {"stream": True},
                    timeout=aiohttp.ClientTimeout(total=0.3),
                )
            await asyncio.wait_for(decode.cancelled.wait(), 5)
            state = rig.client.app[STATE]
            await until(lambda: state.metrics.in_flight == 0 and not state.finishing)
            assert len(prefill.answered_at) == 1 and not prefill.cancelled.is_set()

    run(scenario)


@pytest.mark.parametrize(("mode", "stream"), [("push", True), ("push", False), ("pull", False)])
def test_client_disconnect_cancels_both_legs(mode, stream):
    async def scenario():
        prefill = StubEngine("prefill", mode=mode, hang=mode == "pull")
        decode = StubEngine("decode", mode=mode, hang=True)
        async with proxy_rig(mode, [prefill], [decode]) as rig:
            with pytest.raises(TimeoutError):
                await rig.client.post(
                    "/v1/completions",
                    json=BODY | {"stream": stream},
                    timeout=aiohttp.ClientTimeout(total=0.5),
                )
            if mode == "push":
                await asyncio.wait_for(decode.cancelled.wait(), 5)
            else:
                await asyncio.wait_for(prefill.cancelled.wait(), 5)
                assert not decode.requests
            state = rig.client.app[STATE]
            await until(lambda: state.metrics.in_flight == 0)
            assert all(i.outstanding == 0 for i in state.instances)

    run(scenario)


def test_client_leaving_mid_stream_cancels_decode():
    async def scenario():
        decode = StubEngine("decode", mode="push", tokens=("a",) * 100, token_delay=0.1)
        async with proxy_rig("push", decode=[decode]) as rig:
            resp = await rig.client.post("/v1/completions", json=BODY | {"stream": True})
            assert resp.status == 200
            assert (await resp.content.readany()).startswith(b"data: ")
            resp.close()  # the client goes away after the first token
            await asyncio.wait_for(decode.cancelled.wait(), 5)
            state = rig.client.app[STATE]
            await until(lambda: state.metrics.in_flight == 0)
            assert state.metrics.requests[("499", "none")] == 1

    run(scenario)


# -------------------------------------------------------------- other routes
def test_health_needs_one_healthy_prefill_and_decode():
    async def scenario():
        decode = StubEngine("decode", healthy=False)
        async with proxy_rig("pull", decode=[decode]) as rig:
            resp = await rig.client.get("/health")
            body = await resp.json()
            assert resp.status == 503 and body["status"] == "unavailable"
            assert body["prefill"][0]["healthy"] is True
            assert body["decode"][0]["healthy"] is False
            decode.healthy = True
            resp = await rig.client.get("/health")
            assert resp.status == 200 and (await resp.json())["mode"] == "pull"

    run(scenario)


def test_models_come_from_a_decode_instance():
    async def scenario():
        async with proxy_rig("push") as rig:
            resp = await rig.client.get("/v1/models")
            assert resp.status == 200
            assert (await resp.json())["data"][0]["id"] == "stub-model"

    run(scenario)


def test_models_are_relayed_with_the_clients_key():
    """Engines started with --api-key refuse GET /v1/models without it: the relay passes
    the client's Authorization on, as the generate legs do."""

    async def scenario():
        decode = StubEngine("decode", api_key="k3y")
        async with proxy_rig("push", decode=[decode], model_check=False) as rig:
            assert (await rig.client.get("/v1/models")).status == 401
            auth = {"Authorization": "Bearer k3y"}
            resp = await rig.client.get("/v1/models", headers=auth)
            assert resp.status == 200
            assert (await resp.json())["data"][0]["id"] == "stub-model"

    run(scenario)


def test_metrics_count_requests_by_status_and_leg():
    async def scenario():
        async with proxy_rig("pull") as rig:
            assert (await rig.client.post("/v1/completions", json=BODY)).status == 200
            rig.decode[0].status = 500
            assert (await rig.client.post("/v1/completions", json=BODY)).status == 502
            text = await (await rig.client.get("/metrics")).text()
            assert 'tracedpush_proxy_requests_total{mode="pull",status="200",leg="none"} 1' in text
            assert (
                'tracedpush_proxy_requests_total{mode="pull",status="502",leg="decode"} 1' in text
            )
            assert 'tracedpush_proxy_ttft_seconds_count{mode="pull"} 1' in text
            assert 'tracedpush_proxy_requests_in_flight{mode="pull"} 0' in text

    run(scenario)


def test_idle_engine_connections_are_dropped_before_vllm_drops_them():
    """vLLM's API server closes an idle keep-alive connection after
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE; a proxy that kept it longer could send a leg on a
    connection being closed ("Server disconnected", a lost request)."""
    from vllm import envs

    async def scenario():
        async with proxy_rig("pull") as rig:
            session = rig.client.app[STATE].upstream.session
            keepalive = session.connector._keepalive_timeout
        assert 0 < keepalive < envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE

    run(scenario)
