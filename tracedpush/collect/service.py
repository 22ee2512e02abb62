"""A running collector: the `Collector` and its listeners, started and stopped together.

`CollectService` runs inside an asyncio loop (the command's `serve`); `BackgroundCollect`
runs one on a background thread with its own loop, for embedding and for tests.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aiohttp import web

from tracedpush.collect.assemble import DEFAULT_MAX_PENDING, DEFAULT_TIMEOUT_S
from tracedpush.collect.collector import Collector
from tracedpush.collect.forward import DEFAULT_QUEUE
from tracedpush.collect.forward import DEFAULT_TIMEOUT_S as FORWARD_TIMEOUT_S
from tracedpush.collect.receivers import TRACES_PATH, grpc_server, metrics_app, otlp_http_app

OTLP_HTTP_PORT = 4318  # OTLP's registered ports
OTLP_GRPC_PORT = 4317
METRICS_PORT = 9464  # OpenTelemetry's Prometheus exporter's default


@dataclass
class CollectConfig:
    traces_dir: Path | None = None  # None: store nothing (metrics and forwarding only)
    host: str = "0.0.0.0"
    http_port: int = OTLP_HTTP_PORT  # 0: disabled
    grpc_port: int = OTLP_GRPC_PORT  # 0: disabled
    metrics_port: int = METRICS_PORT  # 0: disabled
    forward: str | None = None
    forward_queue: int = DEFAULT_QUEUE
    forward_timeout_s: float = FORWARD_TIMEOUT_S
    trace_timeout_s: float = DEFAULT_TIMEOUT_S
    max_pending: int = DEFAULT_MAX_PENDING
    any_port: bool = False  # tests: bind free ports (the *_port fields only say on/off)


def display_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


@dataclass
class Endpoints:
    """What is listening where (bound ports; None: disabled)."""

    host: str
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    traces_file: Path | None = None
    forward: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def http_url(self) -> str | None:
        h = display_host(self.host)
        return f"http://{h}:{self.http_port}" if self.http_port else None

    @property
    def metrics_url(self) -> str | None:
        h = display_host(self.host)
        return f"http://{h}:{self.metrics_port}/metrics" if self.metrics_port else None

    def urls(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.http_port:
            out["OTLP/HTTP"] = f"{self.http_url}{TRACES_PATH}"
        if self.grpc_port:
            out["OTLP/gRPC"] = f"{display_host(self.host)}:{self.grpc_port}"
        if self.metrics_port:
            out["metrics"] = str(self.metrics_url)
        out["traces"] = str(self.traces_file) if self.traces_file else "(not stored)"
        if self.forward:
            out["forward"] = self.forward
        return out


class CollectService:
    def __init__(self, config: CollectConfig) -> None:
        self.config = config
        self.collector = Collector(
            config.traces_dir,
            forward=config.forward,
            forward_queue=config.forward_queue,
            forward_timeout_s=config.forward_timeout_s,
            trace_timeout_s=config.trace_timeout_s,
            max_pending=config.max_pending,
        )
        self._runners: list[web.AppRunner] = []
        self._grpc: grpc.Server | None = None

    async def _site(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, self.config.host, 0 if self.config.any_port else port)
        await site.start()
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                return int(address[1])
        return port

    async def start(self) -> Endpoints:
        """Bind every enabled listener; OSError (everything closed again) when one cannot."""
        c = self.config
        ep = Endpoints(
            c.host, forward=self.collector.forwarder.url if self.collector.forwarder else None
        )
        try:
            if c.metrics_port:
                ep.metrics_port = await self._site(metrics_app(self.collector), c.metrics_port)
            if c.http_port:
                ep.http_port = await self._site(otlp_http_app(self.collector), c.http_port)
            if c.grpc_port:
                self._grpc, ep.grpc_port = grpc_server(
                    self.collector, c.host, 0 if c.any_port else c.grpc_port
                )
        except BaseException:
            await self.stop()
            raise
        if self.collector.store is not None:
            ep.traces_file = self.collector.store.path
        return ep

    async def stop(self) -> None:
        """Stop listening (requests in flight get a second), then drain and close."""
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(2.0)
            self._grpc = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
        await asyncio.get_running_loop().run_in_executor(None, self.collector.close)


class BackgroundCollect:
    """A `CollectService` on a background thread with its own event loop."""

    def __init__(self, config: CollectConfig) -> None:
        self.service = CollectService(config)
        self.collector = self.service.collector
        self.endpoints: Endpoints | None = None
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="tracedpush-collect-loop", daemon=True
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.endpoints = self._loop.run_until_complete(self.service.start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.service.stop())
        self._loop.close()

    def __enter__(self) -> BackgroundCollect:
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
