"""HTTP calls to the engines, each bounded in time and failing with the leg's name.

Three bounds (docs/proxy.md, "Timeouts"): *connect* (TCP connect to the engine),
*first byte* (request sent -> response head for a non-streamed leg, -> first SSE
event for a streamed one: it covers queueing, prefill and, for D, the KV transfer)
and *total* (the whole client request). Closing an engine connection is how vLLM
learns to abort the request, so every failure or cancellation closes it.

A leg's ``network`` phase starts when its bytes leave, not when the proxy starts
building it: `send_clock_trace` is an aiohttp trace that stamps a `SendClock` when
the request's last chunk is written to the socket.

A leg sent on a kept-alive connection that the engine closes before answering is sent
again, once, on a new connection (as browsers and Go's HTTP client do). vLLM's API
server (uvicorn) closes a connection idle for 5 s; when its event loop runs late (a
starved API server), that timer fires before it reads what arrived meanwhile, and the
kernel resets the connection with the request unread. The clock keeps both sends.

Could a request be run twice? Only if the server read it and then closed without a
response head. uvicorn (httptools and h11 protocols alike, read at e6c7ce7, 2025-09)
never does that while it runs: `data_received` cancels the keep-alive timer before it
parses, so the timer closes only a connection with no request parsed; a graceful
shutdown closes only connections between requests (one mid-request gets
``Connection: close`` after its answer); an application error before the response
starts is answered 500, after it a head was already sent. What is left is the API
server process dying after it read the request: then the new connection is refused,
and the leg fails as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from tracedpush import semconv
from tracedpush.proxy.errors import UpstreamFailure, upstream_error_message
from tracedpush.proxy.loop_cpu import CpuSample, LoopCpu
from tracedpush.proxy.routing import Instance
from tracedpush.proxy.sse import EventSplitter

T = TypeVar("T")
log = logging.getLogger(__name__)


class SendClock:
    """When a request's last chunk was handed to the socket (unix ns), or None; and, for
    a request sent again after the engine closed a kept-alive connection on it, when
    and why (`UpstreamClient.post`)."""

    __slots__ = ("_again", "_loop_cpu", "cpu", "ns", "resent_ns", "reset", "reused")

    def __init__(self, loop_cpu: LoopCpu | None = None) -> None:
        self.ns: int | None = None
        self.cpu: CpuSample | None = None  # the event loop's CPU clock at `ns` (loop_cpu.py)
        self._loop_cpu = loop_cpu
        self.resent_ns: int | None = None
        self.reset = ""  # what the first connection failed with
        self.reused = False  # the current attempt went out on a kept-alive connection
        self._again = False

    def stamp(self, ns: int) -> None:
        if self._again:
            self.resent_ns = ns
        else:
            self.ns = ns
            if self._loop_cpu is not None:
                self.cpu = self._loop_cpu.sample()

    def send_again(self, reason: str) -> None:
        self._again, self.reset, self.reused = True, reason, False


async def _on_chunk_sent(
    _session: aiohttp.ClientSession,
    ctx: Any,
    _params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    clock = ctx.trace_request_ctx
    if isinstance(clock, SendClock):
        clock.stamp(time.time_ns())  # aiohttp calls this just before the write, per chunk


async def _on_reuse(_session: aiohttp.ClientSession, ctx: Any, _params: Any) -> None:
    clock = ctx.trace_request_ctx
    if isinstance(clock, SendClock):
        clock.reused = True


def send_clock_trace() -> aiohttp.TraceConfig:
    """The trace config a session needs for `UpstreamClient.post(sent=...)` to work."""
    config = aiohttp.TraceConfig()
    config.on_request_chunk_sent.append(_on_chunk_sent)
    config.on_connection_reuseconn.append(_on_reuse)
    return config


@dataclass(frozen=True)
class Timeouts:
    connect: float = 5.0
    first_byte: float = 300.0
    total: float = 900.0


class UpstreamClient:
    """Bounded, leg-named requests to engines over one shared aiohttp session."""

    def __init__(
        self, session: aiohttp.ClientSession, timeouts: Timeouts, *, passive_health: bool = True
    ) -> None:
        self.session = session
        self.timeouts = timeouts
        self.passive_health = passive_health  # a refused connection marks the instance down
        self._fresh: aiohttp.ClientSession | None = None
        self._client_timeout = aiohttp.ClientTimeout(
            total=None, connect=timeouts.connect, sock_connect=timeouts.connect
        )

    def deadline(self, now: float | None = None) -> float:
        loop = asyncio.get_running_loop()
        return (loop.time() if now is None else now) + self.timeouts.total

    async def bounded(
        self,
        aw: Awaitable[T],
        leg: str,
        instance: Instance,
        *,
        deadline: float,
        first_byte_at: float | None = None,
    ) -> T:
        """Await ``aw`` within the earlier bound; turn any failure into UpstreamFailure."""
        bound = deadline if first_byte_at is None else min(first_byte_at, deadline)
        try:
            async with asyncio.timeout_at(bound):
                return await aw
        except aiohttp.ServerTimeoutError:  # aiohttp's own: connect timeout
            raise UpstreamFailure(
                leg,
                f"no connection to {instance.url} within the connect timeout "
                f"({self.timeouts.connect:g} s)",
                status=504,
                error_type=semconv.ERR_UPSTREAM_TIMEOUT,
                sent=False,
            ) from None
        except TimeoutError:
            if first_byte_at is not None and first_byte_at < deadline:
                what = f"no response within the first-byte timeout ({self.timeouts.first_byte:g} s)"
            else:
                what = f"request exceeded the total timeout ({self.timeouts.total:g} s)"
            raise UpstreamFailure(
                leg,
                f"{instance.url}: {what}",
                status=504,
                error_type=semconv.ERR_UPSTREAM_TIMEOUT,
            ) from None
        except aiohttp.ClientConnectorError as exc:
            if self.passive_health:
                instance.mark(False, f"connect failed: {exc.os_error or exc}")
            raise UpstreamFailure(
                leg, f"cannot connect to {instance.url}: {exc.os_error or exc}", sent=False
            ) from None
        except aiohttp.ClientError as exc:
            detail = str(exc) or type(exc).__name__
            raise UpstreamFailure(leg, f"{instance.url}: {detail}") from None

    async def post(
        self,
        leg: str,
        instance: Instance,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        deadline: float,
        first_byte_at: float | None = None,
        sent: SendClock | None = None,
    ) -> aiohttp.ClientResponse:
        """Send; return once the response head arrived (status not checked). `sent` is
        stamped when the body leaves (with a session built with `send_clock_trace`)."""
        if first_byte_at is None:
            first_byte_at = asyncio.get_running_loop().time() + self.timeouts.first_byte
        request = self._send_once_more(instance, path, body, headers, sent or SendClock())
        return await self.bounded(
            request, leg, instance, deadline=deadline, first_byte_at=first_byte_at
        )

    async def _send_once_more(
        self,
        instance: Instance,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        clock: SendClock,
    ) -> aiohttp.ClientResponse:
        """POST; again on a new connection if a kept-alive one was closed before any answer
        (the engine never read the request: see the module docstring). Not on another kept
        one: the stall that closed this one is likely to have closed them all."""
        url = instance.url + path
        for again in (False, True):
            session = self._fresh_session() if again else self.session
            try:
                return await session.post(
                    url, json=body, headers=headers, timeout=self._client_timeout,
                    trace_request_ctx=clock,
                )  # fmt: skip
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if again or not clock.reused or isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                reason = str(exc) or type(exc).__name__
                log.info(
                    "%s closed a kept-alive connection unanswered (%s): sent again", url, reason
                )
                instance.resent += 1
                clock.send_again(reason)
        raise AssertionError("unreachable")

    def _fresh_session(self) -> aiohttp.ClientSession:
        """A session whose every request opens its own connection (for a request sent
        again), with the shared session's clock."""
        if self._fresh is None:
            self._fresh = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=None),
                trace_configs=[send_clock_trace()],
            )
        return self._fresh

    async def close(self) -> None:
        """Close what this client opened itself (the shared session is its owner's)."""
        if self._fresh is not None:
            await self._fresh.close()

    async def get(
        self, leg: str, instance: Instance, path: str, headers: dict[str, str], *, deadline: float
    ) -> tuple[int, bytes, str]:
        first_byte_at = asyncio.get_running_loop().time() + self.timeouts.first_byte
        request = self.session.get(
            instance.url + path, headers=headers, timeout=self._client_timeout
        )
        resp = await self.bounded(
            request, leg, instance, deadline=deadline, first_byte_at=first_byte_at
        )
        try:
            raw = await self.bounded(resp.read(), leg, instance, deadline=deadline)
        finally:
            resp.close()
        return resp.status, raw, resp.content_type

    async def read_json(
        self, leg: str, instance: Instance, resp: aiohttp.ClientResponse, *, deadline: float
    ) -> tuple[dict[str, Any], bytes]:
        """Read a whole non-streamed answer; non-200 and non-JSON become failures."""
        try:
            raw = await self.bounded(resp.read(), leg, instance, deadline=deadline)
        except BaseException:
            resp.close()
            raise
        resp.release()
        if resp.status != 200:
            raise status_failure(leg, instance, resp.status, raw)
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise UpstreamFailure(
                leg, f"{instance.url} answered 200 with a body that is not a JSON object"
            )
        return data, raw

    async def events(
        self,
        leg: str,
        instance: Instance,
        resp: aiohttp.ClientResponse,
        *,
        deadline: float,
        first_byte_at: float,
    ) -> AsyncIterator[bytes]:
        """Whole SSE events from a streamed answer; the first within the first-byte bound."""
        splitter = EventSplitter()
        first: float | None = first_byte_at
        while True:
            chunk = await self.bounded(
                resp.content.readany(), leg, instance, deadline=deadline, first_byte_at=first
            )
            if not chunk:
                rest = splitter.rest()
                if rest is not None:
                    yield rest
                return
            for event in splitter.feed(chunk):
                first = None
                yield event


def status_failure(leg: str, instance: Instance, status: int, raw: bytes) -> UpstreamFailure:
    """An engine's non-200 answer: its own 4xx is relayed, anything else is a 502."""
    message = upstream_error_message(raw)
    relay = 400 <= status < 500
    return UpstreamFailure(
        leg,
        f"{instance.url} answered {status}: {message}",
        status=status if relay else 502,
        upstream_status=status,
    )
