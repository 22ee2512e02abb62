"""Test helpers: a stand-in for a vLLM OpenAI server, and a proxy in front of some.

It speaks just enough of vLLM's protocol: a prefill answers one token with the
``kv_transfer_params`` vLLM's NIXL ``request_finished`` returns (push or pull shape);
a decode answers JSON or SSE chunks shaped like vLLM's. It records every request and
notices when the proxy closes a connection (which is how vLLM learns to abort), and
can be told to fail, hang or answer slowly. It moves no KV and checks nothing else:
the real-engine end-to-end tests cover that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracedpush.proxy.app import STATE, ProxyConfig, create_app
from tracedpush.proxy.coords import parse_instance


@dataclass
class Recorded:
    path: str
    headers: CIMultiDict[str]
    body: dict[str, Any]
    seen_at: float = field(default_factory=time.monotonic)
    seen_ns: int = field(default_factory=time.time_ns)  # unix ns, comparable to span times


@dataclass
class StubEngine:
    role: str  # "prefill" | "decode"
    mode: str = "pull"  # shape of the kv_transfer_params a prefill returns
    engine_id: str = "stub-engine"
    side_host: str = "127.0.0.1"
    side_port: int = 5600
    tokens: tuple[str, ...] = ("Hello", " world", "!")
    status: int = 200  # answer generate requests with this status
    hang: bool = False  # never answer generate requests
    head_delay: float = 0.0  # seconds before answering
    token_delay: float = 0.0  # seconds after each SSE chunk
    tail_delay: float = 0.0  # seconds between [DONE] and the end of the stream
    healthy: bool = True
    health_delay: float = 0.0  # seconds before /health answers (a busy engine)
    models_delay: float = 0.0  # seconds before /v1/models answers (a busy engine)
    models: tuple[str, ...] = ("stub-model",)  # the served names /v1/models lists
    model_root: str | None = None  # the cards' "root" (vLLM: the model directory)
    models_status: int = 200  # answer /v1/models with this status
    models_asked: int = 0  # /v1/models requests seen
    api_key: str | None = None  # as vLLM's --api-key: /v1 routes need "Bearer <key>"
    kv_params: Callable[[dict[str, Any], str], dict[str, Any] | None] | None = None
    before_answer: Callable[[], Awaitable[None]] | None = None
    requests: list[Recorded] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_count: int = 0
    answered_at: list[float] = field(default_factory=list)  # monotonic, per answer
    open_streams: int = 0  # SSE answers being written now

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stub/state", self._state)
        return app

    async def _state(self, request: web.Request) -> web.Response:
        """What a test in another process needs to know (not a vLLM route)."""
        state = {"requests": len(self.requests), "open_streams": self.open_streams}
        return web.json_response(state | {"cancel_count": self.cancel_count})

    # ------------------------------------------------------------------ handlers
    async def _health(self, request: web.Request) -> web.Response:
        if self.health_delay:
            await asyncio.sleep(self.health_delay)
        return web.Response(status=200 if self.healthy else 503)

    def _refused(self, request: web.Request) -> web.Response | None:
        """vLLM's answer to a /v1 request without the server's key (--api-key)."""
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        return web.json_response({"error": "Unauthorized"}, status=401)

    async def _models(self, request: web.Request) -> web.Response:
        self.models_asked += 1
        if (refused := self._refused(request)) is not None:
            return refused
        if self.models_delay:
            await asyncio.sleep(self.models_delay)
        if self.models_status != 200:
            error = {"error": {"message": "stub models failure", "code": self.models_status}}
            return web.json_response(error, status=self.models_status)
        cards = [{"id": name, "object": "model", "root": self.model_root} for name in self.models]
        return web.json_response({"object": "list", "data": cards})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        self.requests.append(Recorded(request.path, CIMultiDict(request.headers), body))
        self.received.set()
        try:
            if self.hang:
                await asyncio.sleep(3600)
            if self.head_delay:
                await asyncio.sleep(self.head_delay)
            if self.before_answer is not None:
                await self.before_answer()
            if self.status != 200:
                error = {"error": {"message": f"stub {self.role} failure", "code": self.status}}
                return web.json_response(error, status=self.status)
            request_id = request.headers.get("X-Request-Id", "none")
            if self.role == "prefill":
                answer = self._prefill_answer(request.path, body, request_id)
            elif body.get("stream"):
                return await self._stream(request, body)
            else:
                answer = self._decode_answer(request.path, body)
            self.answered_at.append(time.monotonic())
            return web.json_response(answer)
        except asyncio.CancelledError:
            self.cancel_count += 1
            self.cancelled.set()
            raise

    # ------------------------------------------------------------------- answers
    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        prompt = body.get("prompt") or json.dumps(body.get("messages"))
        return len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))

    def default_kv_params(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """What vLLM's NIXL request_finished returns on P (0.32, push or pull)."""
        params: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[1, 2, 3]],
            "remote_engine_id": self.engine_id,
            "remote_request_id": f"cmpl-{request_id}-0-abcdef12",
            "remote_host": self.side_host,
            "remote_port": self.side_port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": self._prompt_tokens(body),
            "transfer_mode": self.mode,
        }
        if self.mode == "pull":
            params["remote_blocks_expiry_time"] = time.perf_counter() + 30
        return params

    def _prefill_answer(self, path: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        make = self.kv_params or self.default_kv_params
        answer = self._decode_answer(path, body, tokens=self.tokens[:1])
        answer["kv_transfer_params"] = make(body, request_id)
        return answer

    def _decode_answer(
        self, path: str, body: dict[str, Any], tokens: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        tokens = self.tokens if tokens is None else tokens
        text = "".join(tokens)
        chat = path.endswith("/chat/completions")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": "cmpl-stub",
            "object": "chat.completion" if chat else "text_completion",
            "model": body.get("model"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": self._prompt_tokens(body),
                "completion_tokens": len(tokens),
                "total_tokens": self._prompt_tokens(body) + len(tokens),
            },
            "kv_transfer_params": None,
        }

    def stream_chunks(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON chunks a stream carries, vLLM-shaped, in order."""
        chat = path.endswith("/chat/completions")
        obj = "chat.completion.chunk" if chat else "text_completion"
        chunks: list[dict[str, Any]] = []
        if chat:
            delta = {"role": "assistant", "content": ""}
            chunks.append({"object": obj, "choices": [{"index": 0, "delta": delta}]})
        for i, token in enumerate(self.tokens):
            last = i == len(self.tokens) - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            if chat:
                choice["delta"] = {"content": token}
            else:
                choice["text"] = token
            chunks.append({"object": obj, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = self._prompt_tokens(body)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": len(self.tokens),
                "total_tokens": prompt + len(self.tokens),
            }
            chunks.append({"object": obj, "choices": [], "usage": usage})
        return chunks

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self.open_streams += 1
        try:
            await response.prepare(request)
            for chunk in self.stream_chunks(request.path, body):
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
            await response.write(b"data: [DONE]\n\n")
            if self.tail_delay:
                await asyncio.sleep(self.tail_delay)
            await response.write_eof()
        finally:
            self.open_streams -= 1
        self.answered_at.append(time.monotonic())
        return response


@dataclass
class Rig:
    """A running proxy in front of stub engines, with the proxy's spans in memory."""

    client: TestClient
    prefill: list[StubEngine]
    decode: list[StubEngine]
    exporter: InMemorySpanExporter
    config: ProxyConfig

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        spans = self.exporter.get_finished_spans()
        return [s for s in spans if name is None or s.name == name]


@contextlib.asynccontextmanager
async def proxy_rig(
    mode: str,
    prefill: list[StubEngine] | None = None,
    decode: list[StubEngine] | None = None,
    *,
    coordinates: bool = True,
    prefill_urls: list[str] | None = None,
    ready: bool = True,
    **config: Any,
) -> AsyncIterator[Rig]:
    """Start stub engines and the proxy (aiohttp TestServer: handler cancellation on).

    ``ready``: yield once the proxy has learnt the engines' models at its start, as its
    /health waits for (False: at once, the lookup maybe still in flight).

    ``coordinates`` puts each stub P's coordinates in its --prefill fragment (as the
    launcher does); without them the proxy has to learn them. ``prefill_urls``
    replaces the stub prefill URLs (e.g. with one nobody listens on).
    """
    prefill = prefill if prefill is not None else [StubEngine("prefill", mode=mode)]
    decode = decode if decode is not None else [StubEngine("decode", mode=mode)]
    servers = [TestServer(stub.app()) for stub in (*prefill, *decode)]
    for server in servers:
        await server.start_server()
    urls = [str(server.make_url("")).rstrip("/") for server in servers]
    p_urls, d_urls = urls[: len(prefill)], urls[len(prefill) :]
    if coordinates:
        p_urls = [
            f"{url}#engine_id={stub.engine_id},host={stub.side_host},port={stub.side_port}"
            for url, stub in zip(p_urls, prefill, strict=True)
        ]
    if prefill_urls is not None:
        p_urls = prefill_urls
    config.setdefault("health_interval", 0)
    proxy_config = ProxyConfig(
        mode=mode,
        prefill=[parse_instance(u, "prefill") for u in p_urls],
        decode=[parse_instance(u, "decode") for u in d_urls],
        **config,
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = TestClient(TestServer(create_app(proxy_config, provider)))
    await client.start_server()
    warm = client.app[STATE].models_warm
    if ready and warm is not None:
        await asyncio.wait({warm}, timeout=10)
    try:
        yield Rig(client, prefill, decode, exporter, proxy_config)
    finally:
        await client.close()
        for server in servers:
            await server.close()
        provider.shutdown()
