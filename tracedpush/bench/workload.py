"""Streaming OpenAI-compatible load client that measures what a user sees: TTFT and TPOT.

Used by `tracedpush demo` and the benchmarks. Every request carries an ``X-Request-Id``
so client-side results join the traces (the proxy and both engines key on that id).

* TTFT: request sent -> first streamed chunk carrying a generated token.
* TPOT: (last token - first token) / (output tokens - 1), i.e. the decode inter-token time.

vLLM streams one chunk per engine step per request, but when its API server falls behind
it merges several tokens into one chunk; token counts therefore come from the response's
``usage``, and a stream whose tokens all arrived in one chunk has TPOT 0 (what the client
saw).

Prompts of a given token length are cut from deterministic text with the served model's
own tokenizer (exact for the tiny model), so prompt-length buckets mean what they say.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

Endpoint = Literal["completions", "chat"]


# ------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # prompt length by the tokenizer (the server's usage is authoritative)
    label: str = ""  # bucket name, e.g. "1000"


class PromptMaker:
    """Deterministic prompts of an exact token length (for the given tokenizer).

    With no tokenizer.json in the model directory it falls back to ~3 characters a
    token, so lengths are then approximate.
    """

    def __init__(self, model_dir: Path | str | None = None, seed: int = 0) -> None:
        self.tokenizer = _load_tokenizer(model_dir)
        self.seed = seed
        from tracedpush.model.corpus import paragraphs

        self._text = " ".join(paragraphs(seed, 400))
        self._ids: list[int] = []
        if self.tokenizer is not None:  # tokenised once; prompts are windows into it
            self._ids = self.tokenizer.encode(self._text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return max(1, math.ceil(len(text) / 3))
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def make(self, n_tokens: int, index: int = 0, label: str = "") -> Prompt:
        """A prompt of ``n_tokens`` tokens; ``index`` varies it (no shared prefixes)."""
        lead = f"Request {index}: "  # a distinct start per index
        label = label or str(n_tokens)
        if self.tokenizer is None:
            start = (index * 7919) % max(1, len(self._text) // 2)
            body = (self._text[start:] + " " + self._text) * (1 + n_tokens * 3 // len(self._text))
            text = (lead + body)[: n_tokens * 3]
            return Prompt(text, self.count(text), label)
        if self.count(lead) * 2 > n_tokens:  # too short for a lead-in
            lead = ""
        ids = self._ids
        start = (index * 7919) % max(1, len(ids) // 2)
        window = (ids[start:] + ids) * (1 + n_tokens // max(1, len(ids)))
        k = max(0, n_tokens - self.count(lead))
        text = lead + self.tokenizer.decode(window[:k])
        for _ in range(8):  # re-tokenising a cut can merge differently: nudge the cut
            got = self.count(text)
            if got == n_tokens:
                break
            k = max(0, k + n_tokens - got)
            text = lead + self.tokenizer.decode(window[:k])
        return Prompt(text, self.count(text), label)

    def mix(self, lengths: Sequence[int], count: int) -> list[Prompt]:
        """``count`` prompts cycling through ``lengths`` (interleaved, so buckets see the
        same conditions)."""
        return [self.make(lengths[i % len(lengths)], index=i) for i in range(count)]


def _load_tokenizer(model_dir: Path | str | None) -> Any:
    if model_dir is None:
        return None
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(str(path))


# ------------------------------------------------------------------------- results


@dataclass
class RequestResult:
    request_id: str
    label: str
    concurrency: int
    prompt_tokens: int  # from the response usage if present, else the prompt's count
    output_tokens: int
    start_s: float  # seconds since the workload started
    latency_s: float
    ttft_s: float | None
    tpot_s: float | None
    status: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    sent_unix_ns: int = 0  # Unix time as the request was sent (ttft_s counts from it)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(results: Iterable[RequestResult]) -> dict[str, Any]:
    """Count, errors and TTFT/TPOT p50/p90 (milliseconds) of one group of results."""
    results = list(results)
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s * 1000 for r in ok if r.tpot_s is not None]
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "prompt_tokens_mean": (sum(r.prompt_tokens for r in ok) / len(ok)) if ok else None,
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p90": percentile(ttft, 90),
        "tpot_ms_p50": percentile(tpot, 50),
        "tpot_ms_p90": percentile(tpot, 90),
    }


# -------------------------------------------------------------------------- client


async def fetch_model_name(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models", headers=auth_headers()) as resp:
        resp.raise_for_status()
        data = await resp.json()
    return data["data"][0]["id"]


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer $OPENAI_API_KEY`` when that is set, as vLLM's benchmark
    client sends it: engines started with ``--api-key`` (or ``VLLM_API_KEY``) refuse
    requests without it, and the proxy passes each client's header on."""
    key = os.environ.get("OPENAI_API_KEY", "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _body(
    endpoint: Endpoint, model: str, prompt: Prompt, max_tokens: int, extra: dict[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # Random weights emit EOS at random; fixed output length keeps TPOT comparable.
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    body.update(extra)
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


def _is_token_chunk(chunk: dict[str, Any]) -> bool:
    """A chunk that carries a generated token. Its text may be empty: a token holding
    part of a multi-byte character is streamed with empty text (common with a tiny
    byte-level tokenizer), and the usage-only final chunk has no choices."""
    return bool(chunk.get("choices"))


async def send_one(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompt: Prompt,
    max_tokens: int,
    request_id: str,
    endpoint: Endpoint = "completions",
    extra_body: dict[str, Any] | None = None,
    t_origin: float | None = None,
    concurrency: int = 1,
) -> RequestResult:
    """One streamed request; never raises for HTTP or stream errors (they land in .error)."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    body = _body(endpoint, model, prompt, max_tokens, extra_body or {})
    t0 = time.perf_counter()
    sent_unix_ns = time.time_ns()
    origin = t0 if t_origin is None else t_origin
    first = last = None
    n_chunks, usage, status, error = 0, None, None, None
    text: list[str] = []
    finish = None
    try:
        headers = {"X-Request-Id": request_id, **auth_headers()}
        async with session.post(base_url + path, json=body, headers=headers) as resp:
            status = resp.status
            if resp.status != 200:
                error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
            else:
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                        break
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    if _is_token_chunk(chunk):
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        n_chunks += 1
                        text.append(_chunk_text(chunk))
                        for choice in chunk["choices"]:
                            finish = choice.get("finish_reason") or finish
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    if error is None and first is None:
        error = "no tokens in the stream"
    output_tokens = int((usage or {}).get("completion_tokens") or n_chunks)
    tpot = None
    if first is not None and last is not None and output_tokens > 1:
        tpot = (last - first) / (output_tokens - 1)
    return RequestResult(
        request_id=request_id,
        label=prompt.label,
        concurrency=concurrency,
        prompt_tokens=int((usage or {}).get("prompt_tokens") or prompt.tokens),
        output_tokens=output_tokens,
        start_s=t0 - origin,
        latency_s=end - t0,
        ttft_s=None if first is None else first - t0,
        tpot_s=tpot,
        status=status,
        error=error,
        extra={"finish_reason": finish, "text": "".join(text), "chunks": n_chunks},
        sent_unix_ns=sent_unix_ns,
    )


async def arun_workload(
    base_url: str,
    prompts: Sequence[Prompt],
    concurrency: int = 1,
    max_tokens: int = 32,
    model: str | None = None,
    endpoint: Endpoint = "completions",
    request_id_prefix: str | None = None,
    extra_body: dict[str, Any] | None = None,
    timeout_s: float = 180.0,
    progress: Callable[[int, int, RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Send ``prompts`` with ``concurrency`` requests in flight (closed loop), in order."""
    base_url = base_url.rstrip("/")
    if base_url.endswith("/v1"):
        base_url = base_url[:-3]
    prefix = request_id_prefix or f"tp-{uuid.uuid4().hex[:8]}"
    results: list[RequestResult | None] = [None] * len(prompts)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=max(1, concurrency))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        name = model or await fetch_model_name(session, base_url)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(prompts)):
            queue.put_nowait(i)
        t_origin = time.perf_counter()
        done = 0

        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                i = queue.get_nowait()
                r = await send_one(
                    session,
                    base_url,
                    name,
                    prompts[i],
                    max_tokens,
                    f"{prefix}-{i:04d}",
                    endpoint,
                    extra_body,
                    t_origin,
                    concurrency,
                )
                results[i] = r
                done += 1
                if progress:
                    progress(done, len(prompts), r)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [r for r in results if r is not None]


def run_workload(
    base_url: str,
    prompts: Sequence[Prompt],
    concurrency: int = 1,
    max_tokens: int = 32,
    **kwargs: Any,
) -> list[RequestResult]:
    """Synchronous wrapper of :func:`arun_workload` (same arguments)."""
    return asyncio.run(arun_workload(base_url, prompts, concurrency, max_tokens, **kwargs))
