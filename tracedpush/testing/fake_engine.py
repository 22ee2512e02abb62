"""A fake streaming OpenAI completions server, standing in for an engine behind a proxy.

For benchmark clients (``tracedpush.bench.serve_client``, vLLM's own, ``bench sweep``):
it streams ``max_tokens`` tokens ``token_gap_s`` apart, ends with a usage message (prompt
tokens counted with the model's tokenizer), and records each request's ``x-request-id``,
body and arrival time; chosen ids get a 500. It computes nothing: the real-engine runs
are in the e2e tests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tracedpush.testing.net import free_port


@dataclass
class FakeEngine:
    url: str
    token_gap_s: float
    fail_ids: set[str] = field(default_factory=set)
    fail_if: Callable[[str], bool] | None = None  # also fail ids this says yes to
    seen: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    default_gap_s: float = 0.0

    def reset(self) -> None:
        self.fail_ids.clear()
        self.fail_if = None
        self.token_gap_s = self.default_gap_s
        self.seen.clear()
        self.max_in_flight = 0

    def ids(self) -> list[str]:
        return [s["id"] for s in self.seen]

    def bodies(self) -> dict[str, dict[str, Any]]:
        return {s["id"]: s["body"] for s in self.seen}


@contextmanager
def fake_engine(model_dir: Path, token_gap_s: float = 0.01) -> Iterator[FakeEngine]:
    """Serve `/v1/completions` on a free port in a thread; the engine's record."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    port = free_port()
    engine = FakeEngine(f"http://127.0.0.1:{port}", token_gap_s, default_gap_s=token_gap_s)

    async def completions(req: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await req.json()
        rid = req.headers.get("x-request-id")
        engine.seen.append({"id": rid, "body": body, "t": arrived})
        if rid in engine.fail_ids or (engine.fail_if is not None and engine.fail_if(rid or "")):
            return web.Response(status=500, text="engine fell over")
        engine.in_flight += 1
        engine.max_in_flight = max(engine.max_in_flight, engine.in_flight)
        try:
            return await stream(req, body)
        finally:
            engine.in_flight -= 1

    async def stream(req: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for i in range(body["max_tokens"]):
            if engine.token_gap_s:
                await asyncio.sleep(engine.token_gap_s)
            chunk = {"choices": [{"index": 0, "text": f" t{i}"}], "usage": None}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        prompt_tokens = len(tokenizer.encode(body["prompt"], add_special_tokens=False).ids)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": body["max_tokens"]}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
