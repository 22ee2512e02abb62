"""``vllm bench serve`` without vLLM: one Poisson-arrival cell of a sweep, same result file.

Where vLLM is installed the sweep calls ``vllm.benchmarks.serve.main_async`` itself. On a
laptop with only ``pip install tracedpush[bench]`` (no vLLM, no torch) this module stands in
for what that does with

    vllm bench serve --backend vllm --base-url U --model ID --served-model-name NAME
        --tokenizer DIR --dataset-name random --random-input-len L --random-output-len O
        --num-prompts N --request-rate Q --burstiness 1 [--max-concurrency C] --seed S
        --request-id-prefix P --ignore-eos --temperature 0 --percentile-metrics M
        --metric-percentiles 50,90,99 --save-result --save-detailed

and returns the dict that vLLM writes to the result file (same keys in the same order, same
units: seconds in the per-request arrays, milliseconds in the summary statistics), so the
sweep's readers need not care which client produced a file. Each piece mirrors the vLLM
0.32 code named in its docstring, so that with the same seed and tokenizer both clients send
byte-identical request bodies at the same arrival offsets, with the same request ids (the
traces join on them).

What it leaves out (none of it matters for this sweep): other datasets and backends,
``--random-prefix-len`` and ``--random-range-ratio`` (both at their defaults, 0), goodput
SLOs (``request_goodput`` is null, as vLLM writes it without ``--goodput``), warm-ups, the
ready check (vLLM skips it by default), the re-alignment of prompts to a server-side
tokenizer (a no-op when the tokenizer is the served model's own), the client-queue
statistics (vLLM adds them only when asked for by ``--percentile-metrics``), and the
speculative-decoding figures (only present when the server runs speculative decoding).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import accumulate
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from tracedpush.bench.workload import auth_headers

__all__ = ["RandomRequest", "arrival_offsets", "random_requests", "run_cell"]

# The named special tokens of a Hugging Face tokenizer (PreTrainedTokenizerBase).
_SPECIAL_TOKEN_ATTRS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_METRICS = ("ttft", "tpot", "itl", "e2el")  # the order vLLM writes them in


# ------------------------------------------------------------------------- prompts


class _Tokenizer:
    """The slice of a Hugging Face tokenizer that vLLM's RandomDataset uses, from tokenizer.json.

    ``vocab_size`` excludes added tokens and the special ids are the named ones of
    tokenizer_config.json, as transformers defines them; no decode clean-up (transformers
    skips it for BPE tokenizers, and Qwen-style configs turn it off).
    """

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the benchmark client needs the model's tokenizer")
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=False)
        self.num_special_tokens: int = self._tok.num_special_tokens_to_add(False)
        self.special_ids: list[int] = self._special_ids(model_dir / "tokenizer_config.json")

    def _special_ids(self, config_path: Path) -> list[int]:
        if not config_path.exists():  # no config: the tokens tokenizer.json marks special
            return [i for i, t in self._tok.get_added_tokens_decoder().items() if t.special]
        config = json.loads(config_path.read_text())
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens")
        if isinstance(extra, dict):
            extra = list(extra.values())
        tokens = [config.get(a) for a in _SPECIAL_TOKEN_ATTRS] + list(extra or [])
        names = [t["content"] if isinstance(t, dict) else t for t in tokens if t]
        ids = (self._tok.token_to_id(n) for n in dict.fromkeys(names))
        return [i for i in ids if i is not None]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


@dataclass(frozen=True)
class RandomRequest:
    """One prompt of vLLM's random dataset (its SampleRequest, text-only)."""

    prompt: str
    prompt_len: int  # tokens after the decode/re-encode round trip
    output_len: int  # max_tokens
    request_id: str


def _decode_to_target_len(
    tok: _Tokenizer, ids: list[int], target: int, rng: np.random.Generator, max_retry: int = 10
) -> tuple[str, list[int]]:
    """vLLM's gen_prompt_decode_to_target_len: some token runs re-encode to another length."""
    for remaining in range(max_retry, -1, -1):
        prompt = tok.decode(ids)
        ids = tok.encode(prompt)
        if remaining == 0 or len(ids) == target:
            break
        if len(ids) < target:
            ids.extend(rng.integers(0, tok.vocab_size, size=target - len(ids)).tolist())
        else:
            ids = ids[:target]
    return prompt, ids


def random_requests(
    tokenizer_path: str | Path,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    request_id_prefix: str = "",
) -> list[RandomRequest]:
    """The prompts of vLLM's RandomDataset(random_seed=seed).sample(...), prefix 0, range 0.

    Each is a run of consecutive allowed (non-special) token ids from a random offset,
    decoded with the tokenizer. Same seed and tokenizer, same prompts as vLLM: the draws
    from the generator are the same, in the same order.
    """
    return _sample(
        _Tokenizer(Path(tokenizer_path)),
        num_prompts,
        input_len,
        output_len,
        seed,
        request_id_prefix,
    )


def _sample(
    tok: _Tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    request_id_prefix: str,
) -> list[RandomRequest]:
    rng = np.random.default_rng(seed)
    real_input_len = max(0, int(input_len) - tok.num_special_tokens)
    if real_input_len < 1:
        raise ValueError(f"input_len {input_len} leaves no room for a prompt")
    # vllm.benchmarks.datasets.utils.get_sampling_params with range_ratio 0
    input_lens = rng.integers(real_input_len, real_input_len + 1, size=num_prompts)
    output_lens = rng.integers(max(output_len, 1), max(output_len, 1) + 1, size=num_prompts)
    offsets = rng.integers(0, tok.vocab_size, size=num_prompts)
    # the same expression as vLLM, hence the same order of the allowed ids
    allowed = np.array(list(set(np.arange(tok.vocab_size)) - set(tok.special_ids)))
    requests = []
    for i in range(num_prompts):
        n = int(input_lens[i])
        ids = allowed[(int(offsets[i]) + i + np.arange(n)) % len(allowed)].tolist()
        prompt, ids = _decode_to_target_len(tok, ids, n, rng)
        requests.append(
            RandomRequest(prompt, len(ids), int(output_lens[i]), request_id_prefix + str(i))
        )
    return requests


# ------------------------------------------------------------------------- arrivals


def arrival_offsets(
    num: int, request_rate: float, seed: int = 0, burstiness: float = 1.0
) -> list[float]:
    """Send times in seconds from the start, as vLLM's get_request computes them.

    Gamma-distributed gaps (exponential at burstiness 1: a Poisson process) from numpy's
    global generator as ``vllm bench serve`` seeds it, then rescaled so the last request
    goes at exactly ``num / request_rate``: the offered rate is the requested one for every
    seed.
    """
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, not {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    if math.isinf(burstiness):
        gaps = [1.0 / request_rate] * num
    else:
        state = np.random.RandomState(seed)  # = np.random.seed(seed); np.random.gamma(...)
        scale = 1.0 / (request_rate * burstiness)
        gaps = [float(state.gamma(shape=burstiness, scale=scale)) for _ in range(num)]
    offsets = list(accumulate(gaps))
    if offsets and offsets[-1] != 0:
        factor = (num / request_rate) / offsets[-1]
        offsets = [t * factor for t in offsets]
    return offsets


# ------------------------------------------------------------------------- one request


@dataclass
class _Output:
    """vLLM's RequestFuncOutput, the fields its serve result reads."""

    prompt_len: int
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int | None = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    start_time: float = 0.0  # time.perf_counter()
    client_queue_time: float = 0.0


class _SSEMessages:
    """vLLM's StreamedResponseHandler: complete SSE messages out of arbitrary byte chunks.

    Copied, quirks included (a trailing ``data:`` line that parses as JSON counts as
    complete), so both clients time the same events.
    """

    def __init__(self) -> None:
        self.buffer = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def add(self, chunk: bytes) -> list[str]:
        self.buffer += self._decoder.decode(chunk)
        messages = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            if message := message.strip():
                messages.append(message)
        if self.buffer.startswith("data: "):
            content = self.buffer.removeprefix("data: ").strip()
            if content == "[DONE]" or (content and _is_json(content)):
                messages.append(self.buffer.strip())
                self.buffer = ""
        return messages


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


async def _request(
    session: aiohttp.ClientSession,
    api_url: str,
    payload: dict[str, Any],
    headers: dict[str, str],
    prompt_len: int,
) -> _Output:
    """vLLM's async_request_openai_completions.

    TTFT: sent -> first message with choices; ITL: between such messages; latency: sent ->
    the last of them. Token and prompt counts come from the final usage message. A non-200
    answer's error is its HTTP reason phrase, an exception's its traceback (as vLLM).
    """
    out = _Output(prompt_len=prompt_len)
    text = ""
    st = time.perf_counter()
    out.start_time = most_recent = st
    try:
        async with session.post(url=api_url, json=payload, headers=headers) as response:
            if response.status != 200:
                out.error = response.reason or ""
                return out
            first = True
            sse = _SSEMessages()
            async for chunk in response.content.iter_any():
                chunk = chunk.strip()
                if not chunk:
                    continue
                for message in sse.add(chunk):
                    if message.startswith(":"):  # an SSE comment (a ping)
                        continue
                    data = message.removeprefix("data: ")
                    if data == "[DONE]":
                        continue
                    parsed = json.loads(data)
                    if choices := parsed.get("choices"):
                        now = time.perf_counter()
                        if first:
                            out.ttft = now - st
                            first = False
                        else:
                            out.itl.append(now - most_recent)
                        most_recent = now
                        text += choices[0].get("text") or ""
                    elif usage := parsed.get("usage"):
                        out.output_tokens = usage.get("completion_tokens")
                        if (pt := usage.get("prompt_tokens")) is not None:
                            out.prompt_len = pt
            out.success = not first
            if first:
                out.error = (
                    "Never received a valid chunk to calculate TTFT."
                    "This response will be marked as failed!"
                )
            out.generated_text = text
            out.latency = most_recent - st
    except Exception:
        out.success = False
        out.error = "".join(traceback.format_exception(*sys.exc_info()))
    return out


# ------------------------------------------------------------------------- metrics


def _peaks(outputs: list[_Output]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s and max_concurrent_requests: 1-second buckets."""
    ok = [o for o in outputs if o.success]
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    seconds = int(np.ceil(max(o.start_time + o.latency for o in ok) - t0)) + 1
    tokens = np.zeros(seconds)
    concurrent = np.zeros(seconds)
    for o in ok:
        for t in accumulate(o.itl, initial=o.start_time + o.ttft):
            if 0 <= (bucket := int(t - t0)) < seconds:
                tokens[bucket] += 1
        for s in range(int(o.start_time - t0), int(o.start_time + o.latency - t0) + 1):
            concurrent[s] += 1
    return float(np.max(tokens)), int(np.max(concurrent))


def _stats(
    result: dict[str, Any], name: str, values: list[float], percentiles: Sequence[float]
) -> None:
    """mean/median/std/pN of ``values`` (seconds) in ms; 0 for none, as vLLM's ``or 0``."""
    v = values or 0
    result[f"mean_{name}_ms"] = float(np.mean(v)) * 1000
    result[f"median_{name}_ms"] = float(np.median(v)) * 1000
    result[f"std_{name}_ms"] = float(np.std(v)) * 1000
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        result[f"p{word}_{name}_ms"] = float(np.percentile(v, p)) * 1000


def _summary(
    outputs: list[_Output],
    duration: float,
    tok: _Tokenizer,
    metrics: Sequence[str],
    percentiles: Sequence[float],
) -> dict[str, Any]:
    """vLLM's calculate_metrics plus the result dict benchmark() builds from it."""
    output_lens: list[int] = []
    total_input = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    for o in outputs:
        if not o.success:
            output_lens.append(0)
            continue
        # usage's count; else re-tokenize the text (chunks may bundle several tokens)
        n = o.output_tokens or len(tok.encode(o.generated_text))
        output_lens.append(n)
        total_input += o.prompt_len
        if n > 1:
            tpots.append((o.latency - o.ttft) / (n - 1))
        itls += o.itl
        ttfts.append(o.ttft)
        e2els.append(o.latency)
    completed = len(ttfts)
    total_output = sum(output_lens)
    peak_tokens, peak_concurrent = _peaks(outputs)
    result: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": len(outputs) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration,
        "request_goodput": None,  # no goodput SLOs given
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "queue_times": [o.client_queue_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_concurrent,
        "rtfx": 0.0,  # audio only
    }
    values = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in _METRICS:
        if name in metrics:
            _stats(result, name, values[name], percentiles)
    return result


# ------------------------------------------------------------------------- one cell


class _Progress:
    """``report()`` per finished request: a tqdm bar, a callback, or nothing."""

    def __init__(self, how: bool | Callable[[int, int], None], total: int) -> None:
        self.done, self.total = 0, total
        self._callback = how if callable(how) else None
        self._bar = None
        if how is True:
            from tqdm import tqdm

            self._bar = tqdm(total=total)

    def __call__(self) -> None:
        self.done += 1
        if self._callback is not None:
            self._callback(self.done, self.total)
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def run_cell(
    *,
    base_url: str,
    model: str,
    tokenizer_path: str | Path,
    num_prompts: int,
    input_len: int,
    output_len: int,
    request_rate: float,
    seed: int = 0,
    request_id_prefix: str = "",
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    model_id: str | None = None,
    ignore_eos: bool = True,
    temperature: float | None = 0.0,
    percentiles: Sequence[float] = (50, 90, 99),
    metrics: Sequence[str] = _METRICS,
    label: str | None = None,
    metadata: Mapping[str, str] | None = None,
    extra_headers: Mapping[str, str] | None = None,
    progress: bool | Callable[[int, int], None] = False,
    endpoint: str = "/v1/completions",
) -> dict[str, Any]:
    """One run; returns what ``vllm bench serve --save-result --save-detailed`` writes (the
    flags in the module docstring; ``metrics`` and ``percentiles`` are its
    ``--percentile-metrics`` and ``--metric-percentiles``, ``max_concurrency`` its
    ``--max-concurrency``: arrivals beyond it wait in the client, counted in queue_times).

    ``base_url`` is the server root (``http://host:port``, no ``/v1``), ``model`` the
    served model name (vLLM's ``--served-model-name``, else ``--model``) and ``model_id``
    what the result names the model (vLLM's ``--model``; default ``model``). Request i
    is ``request_id_prefix + str(i)`` in its ``x-request-id`` header. ``progress``: True
    for a tqdm bar on stderr (as vLLM's), or ``progress(done, total)`` called as each
    request finishes. A failed request is counted and its error recorded; nothing here
    raises for it.
    """
    unknown = set(metrics) - set(_METRICS)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {_METRICS}")
    if max_concurrency is not None and max_concurrency <= 0:
        raise ValueError("max_concurrency must be greater than 0")
    tok = _Tokenizer(Path(tokenizer_path))
    requests = _sample(tok, num_prompts, input_len, output_len, seed, request_id_prefix)
    offsets = arrival_offsets(num_prompts, request_rate, seed, burstiness)
    api_url = base_url + endpoint
    headers = auth_headers() | (extra_headers or {})
    sampling = {"temperature": temperature} if temperature is not None else {}
    report = _Progress(progress, num_prompts)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    async def send(req: RandomRequest, arrival: float) -> _Output:
        payload: dict[str, Any] = {
            "model": model,
            "prompt": req.prompt,
            "repetition_penalty": 1.0,
            "max_tokens": req.output_len,
            "logprobs": None,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ignore_eos:
            payload["ignore_eos"] = True
        payload |= sampling
        request_headers = headers | {"x-request-id": req.request_id}
        async with limit:
            out = await _request(session, api_url, payload, request_headers, req.prompt_len)
        out.client_queue_time = out.start_time - arrival  # time waiting for `limit`
        report()
        return out

    # As vLLM: no connection limit but max_concurrency (an open loop must not queue in the
    # client: aiohttp's default would cap it at 100 in flight), connections kept alive.
    connector = aiohttp.TCPConnector(
        limit=max_concurrency or 0,
        limit_per_host=max_concurrency or 0,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
    )
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    async with aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=timeout
    ) as session:
        try:
            start = time.perf_counter()
            tasks = []
            for req, offset in zip(requests, offsets, strict=True):
                if (wait := start + offset - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(send(req, time.perf_counter())))
            outputs = await asyncio.gather(*tasks)
            duration = time.perf_counter() - start
        finally:
            report.close()

    head: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": label,
        "model_id": model_id or model,
        "tokenizer_id": str(tokenizer_path),
        "num_prompts": num_prompts,
        **(metadata or {}),
        "request_rate": float(request_rate) if request_rate < float("inf") else "inf",
        "burstiness": float(burstiness),
        "max_concurrency": max_concurrency,
    }
    return head | _summary(list(outputs), duration, tok, metrics, percentiles)
