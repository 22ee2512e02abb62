"""The workload client against a stand-in OpenAI server: what it sends (request ids,
streaming with usage, fixed output length) and what it measures (TTFT, TPOT, errors)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from tracedpush.bench.workload import Prompt, PromptMaker, percentile, run_workload, summarize
from tracedpush.testing.net import free_port

TOKEN_GAP_S = 0.02  # the stand-in's inter-token delay


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict], list[str | None]]]:
    seen: list[dict] = []  # each completion: its request id, body and Authorization
    listed: list[str | None] = []  # each /v1/models: its Authorization

    async def models(req: web.Request) -> web.Response:
        listed.append(req.headers.get("Authorization"))
        return web.json_response({"data": [{"id": "tiny"}]})

    async def completions(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        auth = req.headers.get("Authorization")
        seen.append({"id": req.headers.get("X-Request-Id"), "body": body, "auth": auth})
        if "bad" in body["prompt"]:
            return web.json_response({"error": {"message": "bad prompt"}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for i in range(body["max_tokens"]):
            await asyncio.sleep(TOKEN_GAP_S)
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}], "usage": None}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": i + 1}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", seen, listed
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()


def test_streams_measures_and_tags_requests(server):
    url, seen, _listed = server
    prompts = [Prompt("a b c", 3, "short"), Prompt("a " * 50, 50, "long"), Prompt("bad", 1, "x")]
    results = run_workload(
        url + "/v1", prompts, concurrency=2, max_tokens=5, request_id_prefix="run7"
    )

    assert [r.request_id for r in results] == ["run7-0000", "run7-0001", "run7-0002"]
    assert sorted(s["id"] for s in seen) == ["run7-0000", "run7-0001", "run7-0002"]
    body = seen[0]["body"]
    assert body["model"] == "tiny" and body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}

    ok, bad = results[:2], results[2]
    assert [r.prompt_tokens for r in ok] == [3, 50]  # from the server's usage
    assert all(r.output_tokens == 5 and r.ok for r in ok)
    # TTFT cannot be shorter than the server's wait before the first token; TPOT spreads
    # the time from first to last token over the 4 later tokens.
    assert all(r.ttft_s >= TOKEN_GAP_S and r.tpot_s > 0 for r in ok)
    assert all(r.latency_s >= r.ttft_s + 4 * r.tpot_s for r in ok)
    assert bad.status == 400 and "bad prompt" in bad.error and bad.ttft_s is None

    s = summarize(results)
    assert s["requests"] == 3 and s["errors"] == 1 and s["ttft_ms_p50"] > 0


def test_the_key_in_openai_api_key_goes_with_every_request(server, monkeypatch):
    """As vLLM's benchmark client: engines started with --api-key need it, and the
    proxy passes it on; without the variable no Authorization is sent."""
    url, seen, listed = server
    prompts = [Prompt("a b c", 3, "short")]
    run_workload(url + "/v1", prompts, concurrency=1, max_tokens=2)
    monkeypatch.setenv("OPENAI_API_KEY", "k3y")
    run_workload(url + "/v1", prompts, concurrency=1, max_tokens=2)
    assert [s["auth"] for s in seen] == [None, "Bearer k3y"]
    assert listed == [None, "Bearer k3y"]  # the model name, asked first


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 20.0], 90) == pytest.approx(19.0)


def test_prompts_have_exact_token_lengths():
    pytest.importorskip("tokenizers")
    from tracedpush.model.build import ensure_model

    maker = PromptMaker(ensure_model())
    prompts = maker.mix([100, 1500, 3000], 6)
    assert [p.tokens for p in prompts] == [100, 1500, 3000] * 2
    assert [maker.count(p.text) for p in prompts] == [100, 1500, 3000] * 2
    assert len({p.text[:40] for p in prompts}) == 6  # no shared prefixes
    assert PromptMaker(ensure_model()).make(100, 3) == maker.make(100, 3)  # deterministic
