"""A leg sent on a kept-alive connection that the engine closes unanswered is sent again.

vLLM's API server (uvicorn) closes a connection idle for 5 s. When its event loop runs
late (a starved API server; seen on real engines in tests/e2e/test_late_registration.py),
that timer fires before it reads the request that arrived meanwhile, and the kernel
resets the connection with the request unread. The engine here is a raw asyncio server
that does exactly that to the second request on its first connection (closing with
the body unread makes Linux send a reset), so the proxy's real aiohttp client meets a
real reset, not a mock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracedpush import semconv as sc
from tracedpush.proxy import spans as proxy_spans
from tracedpush.proxy.coords import parse_instance
from tracedpush.proxy.errors import UpstreamFailure
from tracedpush.proxy.metrics import ProxyMetrics
from tracedpush.proxy.routing import Instance, Pool
from tracedpush.proxy.upstream import SendClock, Timeouts, UpstreamClient, send_clock_trace

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class ClosingEngine:
    """Answers every request, except those `reset(connection, request)` names: for them
    it closes the connection with the request's body unread (a reset)."""

    def __init__(self, reset: set[tuple[int, int]]) -> None:
        self.reset = reset
        self.connections = 0
        self.answered = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        for k in range(1, 100):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if (conn, k) in self.reset:
                writer.transport.close()  # the body is still unread: the kernel resets
                return
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(ANSWER)
            await writer.drain()
            self.answered += 1
        writer.close()


@asynccontextmanager
async def engine(reset: set[tuple[int, int]]) -> AsyncIterator[tuple[ClosingEngine, Instance]]:
    eng = ClosingEngine(reset)
    server = await asyncio.start_server(eng.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield eng, Instance.from_spec(parse_instance(f"http://127.0.0.1:{port}", "decode"))
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def upstream() -> AsyncIterator[UpstreamClient]:
    session = aiohttp.ClientSession(trace_configs=[send_clock_trace()])
    client = UpstreamClient(session, Timeouts(connect=2, first_byte=5, total=10))
    try:
        yield client
    finally:
        await client.close()
        await session.close()


async def post(client: UpstreamClient, inst: Instance, clock: SendClock) -> int:
    resp = await client.post(
        "decode", inst, "/v1/completions", {"prompt": "x"}, {}, deadline=client.deadline(),
        sent=clock,
    )  # fmt: skip
    await resp.read()
    resp.release()
    return resp.status


def test_a_reset_kept_alive_connection_is_sent_again_on_a_new_one() -> None:
    async def scenario() -> None:
        async with engine({(1, 2)}) as (eng, inst), upstream() as client:
            assert await post(client, inst, SendClock()) == 200  # opens connection 1
            clock = SendClock()
            assert await post(client, inst, clock) == 200  # kept-alive 1 is reset: again
            assert (eng.connections, eng.answered, inst.resent) == (2, 2, 1)
            assert clock.ns is not None and clock.resent_ns is not None
            assert clock.ns < clock.resent_ns
            assert "reset" in clock.reset.lower() or "disconnect" in clock.reset.lower()
            text = ProxyMetrics("push").render([Pool("decode", [inst])])
            assert (
                f'tracedpush_proxy_upstream_resent_total{{role="decode",url="{inst.url}"}} 1'
                in (text.splitlines())
            )
            # the leg's span says both sends, and why
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            span = provider.get_tracer("t").start_span(sc.SPAN_PROXY_DECODE)
            proxy_spans.sent(span, clock)
            span.end()
            (done,) = exporter.get_finished_spans()
            first, again = (e for e in done.events)
            assert (first.name, again.name) == (sc.EVENT_REQUEST_SENT, sc.EVENT_REQUEST_RESENT)
            assert first.timestamp < again.timestamp
            assert again.attributes[sc.RESENT_REASON] == clock.reset

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_new_connection_reset_unanswered_is_a_failure_not_sent_again() -> None:
    """Only a kept-alive connection may have been closed by the engine's idle timer; a
    reset on a new one is the engine's failure, and the request is not sent twice."""

    async def scenario() -> None:
        async with engine({(1, 1)}) as (eng, inst), upstream() as client:
            clock = SendClock()
            with pytest.raises(UpstreamFailure, match="decode leg"):
                await post(client, inst, clock)
            assert (eng.connections, eng.answered, inst.resent) == (1, 0, 0)
            assert clock.resent_ns is None

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_second_reset_is_a_failure() -> None:
    """Sent again once, on a new connection: if that one is reset too, the leg fails."""

    async def scenario() -> None:
        async with engine({(1, 2), (2, 1)}) as (eng, inst), upstream() as client:
            assert await post(client, inst, SendClock()) == 200
            with pytest.raises(UpstreamFailure):
                await post(client, inst, SendClock())
            assert (eng.connections, inst.resent) == (2, 1)

    asyncio.run(asyncio.wait_for(scenario(), 30))
