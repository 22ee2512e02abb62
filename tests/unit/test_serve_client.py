"""tracedpush.bench.serve_client, the vLLM-free stand-in for ``vllm bench serve``, against a
fake OpenAI-compatible streaming server.

The fake server stands in for an engine: it streams ``max_tokens`` tokens ``TOKEN_GAP_S``
apart, ends with a usage message (prompt tokens counted with the model's tokenizer) and
records each request's ``x-request-id``, body and arrival time. The real-engine run of a
sweep is in the e2e tests.

Where vLLM is importable, its own client (``vllm.benchmarks.serve.main_async`` from its own
argument parser, and its RandomDataset and get_request) runs against the same fake server,
and the two must agree: the same result keys in the same order, the same request bodies per
request id, the same counts, the same errors, the same arrival schedule. Without vLLM those
comparisons skip, saying so; the rest runs anyway.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tracedpush.bench.serve_client import arrival_offsets, random_requests, run_cell
from tracedpush.model import ensure_model
from tracedpush.testing.fake_engine import FakeEngine, fake_engine
from tracedpush.testing.net import free_port

TOKEN_GAP_S = 0.01  # the fake server's wait before each token
NUM = 6
INPUT_LEN = 32
OUTPUT_LEN = 4
RATE = 50.0
PREFIX = "x-"
METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)


def _vllm_serve() -> Any:
    """vllm.benchmarks.serve, or a skip that says why the comparison cannot run. Installed
    but failing to import is a failure, not a skip."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here: no vLLM client to compare with")
    from vllm.benchmarks import serve

    return serve


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return ensure_model()


@pytest.fixture(scope="module")
def engine_server(model_dir: Path) -> Iterator[FakeEngine]:
    with fake_engine(model_dir, token_gap_s=TOKEN_GAP_S) as engine:
        yield engine


@pytest.fixture
def engine(engine_server: FakeEngine) -> FakeEngine:
    engine_server.reset()
    return engine_server


def ours(engine: FakeEngine, model_dir: Path, **overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        base_url=engine.url,
        model="tiny-qwen2",
        tokenizer_path=model_dir,
        num_prompts=NUM,
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        request_rate=RATE,
        seed=0,
        request_id_prefix=PREFIX,
        percentiles=PERCENTILES,
        metrics=METRICS,
    )
    return asyncio.run(run_cell(**(kwargs | overrides)))


def vllms(
    engine: FakeEngine, model_dir: Path, result_dir: Path, *extra: str, rate: float = RATE
) -> dict[str, Any]:
    """vLLM's own client, from its own CLI parser, with the flags ``ours`` mirrors."""
    serve = _vllm_serve()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend=vllm",
            f"--base-url={engine.url}",
            "--dataset-name=random",
            f"--random-input-len={INPUT_LEN}",
            f"--random-output-len={OUTPUT_LEN}",
            f"--num-prompts={NUM}",
            f"--request-rate={rate}",
            "--burstiness=1",
            "--seed=0",
            "--save-result",
            "--save-detailed",
            f"--result-dir={result_dir}",
            f"--tokenizer={model_dir}",
            "--model=tiny-qwen2",
            f"--request-id-prefix={PREFIX}",
            "--ignore-eos",
            "--temperature=0",
            "--num-warmups=0",
            f"--percentile-metrics={','.join(METRICS)}",
            f"--metric-percentiles={','.join(map(str, PERCENTILES))}",
            "--disable-tqdm",
            *extra,
        ]
    )
    try:
        return asyncio.run(serve.main_async(args))
    finally:
        gc.unfreeze()  # main_async freezes the GC heap for its run; not for the test session


# ------------------------------------------------------------------ parity with vLLM


def test_same_result_keys_bodies_and_counts_as_vllm(engine, model_dir, tmp_path):
    theirs = vllms(engine, model_dir, tmp_path)
    their_bodies = engine.bodies()
    engine.seen.clear()
    mine = ours(engine, model_dir)

    assert list(mine) == list(theirs)  # the same keys, in the same order
    # vLLM's file on disk is the dict it returned; ours serialises to the same JSON types
    (saved,) = tmp_path.glob("*.json")
    their_file, my_file = json.loads(saved.read_text()), json.loads(json.dumps(mine))
    assert {k: type(v) for k, v in my_file.items()} == {k: type(v) for k, v in their_file.items()}
    # Byte-identical requests: same prompts (RandomDataset, same seed), same parameters
    assert engine.bodies() == their_bodies
    for key in ("num_prompts", "completed", "failed", "input_lens", "output_lens", "errors"):
        assert mine[key] == theirs[key], key
    for key in ("total_input_tokens", "total_output_tokens", "request_rate", "burstiness"):
        assert mine[key] == theirs[key], key


def test_same_prompts_as_vllm_random_dataset(model_dir):
    _vllm_serve()
    from vllm.benchmarks.datasets import RandomDataset
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(model_dir))
    for input_len, output_len, seed in [(32, 4, 0), (700, 16, 7), (2, 1, 3)]:
        theirs = RandomDataset(random_seed=seed).sample(
            tokenizer=tokenizer,
            num_requests=12,
            input_len=input_len,
            output_len=output_len,
            request_id_prefix="r-",
        )
        mine = random_requests(model_dir, 12, input_len, output_len, seed, "r-")
        assert [(r.prompt, r.prompt_len, r.expected_output_len, r.request_id) for r in theirs] == [
            (r.prompt, r.prompt_len, r.output_len, r.request_id) for r in mine
        ]


def test_same_arrival_schedule_as_vllm_get_request(monkeypatch):
    """vLLM's get_request on a fake clock (its sleeps advance it) sends at our offsets."""
    serve = _vllm_serve()
    clock = SimpleNamespace(now=1000.0)

    async def sleep(seconds: float) -> None:
        clock.now += seconds

    monkeypatch.setattr(serve, "asyncio", SimpleNamespace(sleep=sleep))
    monkeypatch.setattr(serve, "time", SimpleNamespace(time=lambda: clock.now))

    async def vllm_offsets(n: int, rate: float, seed: int, burstiness: float) -> list[float]:
        np.random.seed(seed)  # as main_async does
        sent = []
        async for _request, _rate in serve.get_request(list(range(n)), rate, burstiness):
            sent.append(clock.now - 1000.0)
        return sent

    for n, rate, seed, burstiness in [(200, 50.0, 0, 1.0), (30, 3.0, 5, 1.0), (40, 8.0, 1, 0.5)]:
        clock.now = 1000.0
        theirs = asyncio.run(vllm_offsets(n, rate, seed, burstiness))
        assert arrival_offsets(n, rate, seed, burstiness) == pytest.approx(theirs, abs=1e-9)


def test_a_failed_request_is_counted_like_vllm(engine, model_dir, tmp_path):
    engine.fail_ids.add(PREFIX + "2")
    mine = ours(engine, model_dir)

    assert (mine["completed"], mine["failed"]) == (NUM - 1, 1)
    assert mine["errors"][2] == "Internal Server Error"  # the HTTP reason, as vLLM records it
    assert [e for i, e in enumerate(mine["errors"]) if i != 2] == [""] * (NUM - 1)
    assert (mine["output_lens"][2], mine["ttfts"][2], mine["itls"][2]) == (0, 0.0, [])
    assert mine["latencies"][2] == 0.0 and mine["generated_texts"][2] == ""
    assert mine["total_output_tokens"] == (NUM - 1) * OUTPUT_LEN

    engine.seen.clear()
    theirs = vllms(engine, model_dir, tmp_path)
    for key in ("completed", "failed", "errors", "output_lens", "input_lens"):
        assert mine[key] == theirs[key], key


def test_max_concurrency_and_served_name_like_vllm(engine, model_dir, tmp_path):
    """The sweep's warm-up form: all at once (rate inf) but at most C in flight, with the
    model directory as --model and the served name apart."""
    served = ("--model", str(model_dir), "--served-model-name", "tiny-qwen2")
    theirs = vllms(engine, model_dir, tmp_path, *served, "--max-concurrency=2", rate=math.inf)
    their_bodies, their_peak = engine.bodies(), engine.max_in_flight
    engine.reset()
    mine = ours(
        engine, model_dir, request_rate=math.inf, max_concurrency=2, model_id=str(model_dir)
    )

    assert list(mine) == list(theirs)
    assert engine.bodies() == their_bodies
    assert engine.max_in_flight == their_peak == 2
    for key in ("model_id", "tokenizer_id", "max_concurrency", "request_rate", "output_lens"):
        assert mine[key] == theirs[key], key
    # all arrive at once: the later ones wait in the client for a free slot
    assert sorted(mine["queue_times"])[-1] >= OUTPUT_LEN * TOKEN_GAP_S


# ------------------------------------------------------------------ on its own


def test_counts_ids_and_timings(engine, model_dir):
    calls: list[tuple[int, int]] = []
    result = ours(engine, model_dir, progress=lambda done, total: calls.append((done, total)))

    assert sorted(engine.ids()) == sorted(PREFIX + str(i) for i in range(NUM))
    per_request = [k for k, v in result.items() if isinstance(v, list)]
    assert set(per_request) == {
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "start_times",
        "queue_times",
        "generated_texts",
        "errors",
    }
    assert all(len(result[k]) == NUM for k in per_request)
    assert result["completed"] + result["failed"] == NUM == result["completed"]
    assert calls == [(i + 1, NUM) for i in range(NUM)]

    body = engine.bodies()[PREFIX + "0"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["max_tokens"] == OUTPUT_LEN and body["model"] == "tiny-qwen2"

    # Lengths: the server's usage (prompt tokens as its tokenizer counts them)
    expected = [r.prompt_len for r in random_requests(model_dir, NUM, INPUT_LEN, OUTPUT_LEN)]
    assert result["input_lens"] == expected and all(n >= INPUT_LEN for n in expected)
    assert result["output_lens"] == [OUTPUT_LEN] * NUM
    assert result["generated_texts"][0] == "".join(f" t{i}" for i in range(OUTPUT_LEN))
    # Timings in seconds: the server waits TOKEN_GAP_S before each token
    timings = zip(result["ttfts"], result["itls"], result["latencies"], strict=True)
    for ttft, itl, latency in timings:
        assert ttft >= TOKEN_GAP_S and len(itl) == OUTPUT_LEN - 1
        assert latency == pytest.approx(ttft + sum(itl))
        assert latency >= 0.9 * OUTPUT_LEN * TOKEN_GAP_S
    assert result["mean_tpot_ms"] >= 0.9 * TOKEN_GAP_S * 1000
    assert result["p99_e2el_ms"] >= result["p50_e2el_ms"] > 0
    assert result["request_rate"] == RATE and result["max_concurrency"] is None


def test_poisson_schedule_has_the_requested_rate():
    rate, n = 20.0, 2000
    offsets = arrival_offsets(n, rate, seed=1)
    gaps = np.diff([0.0, *offsets])
    # vLLM rescales so the last request goes at n / rate: the mean gap is exact
    assert offsets[-1] == pytest.approx(n / rate)
    assert gaps.mean() == pytest.approx(1 / rate)
    # and the gaps are exponential: coefficient of variation 1, P(gap < mean) = 1 - 1/e
    assert 0.9 < gaps.std() / gaps.mean() < 1.1
    assert abs((gaps < gaps.mean()).mean() - (1 - np.exp(-1))) < 0.04
    assert arrival_offsets(n, rate, seed=1) == offsets != arrival_offsets(n, rate, seed=2)
    assert arrival_offsets(5, float("inf")) == [0.0] * 5
    assert np.diff(arrival_offsets(5, 2.0, burstiness=float("inf"))) == pytest.approx([0.5] * 4)


@pytest.mark.serial  # a latency bound
def test_requests_reach_the_server_on_schedule(engine, model_dir):
    """200 arrivals at 100/s on a server that answers at once: the server sees them at the
    requested rate, each near its scheduled offset (the client sleeps to absolute times,
    so a late request does not delay the rest)."""
    engine.token_gap_s = 0.0
    n, rate = 200, 100.0
    result = ours(engine, model_dir, num_prompts=n, request_rate=rate, output_len=1)

    assert result["completed"] == n
    arrived = {s["id"]: s["t"] for s in engine.seen}
    times = np.array([arrived[PREFIX + str(i)] for i in range(n)])
    scheduled = np.array(arrival_offsets(n, rate, seed=0))  # mean gap exactly 1 / rate
    # Seen arrival time against scheduled offset: slope 1 is the requested rate. A fit,
    # not first-to-last, as the first request also opens a connection (here up to 0.3 s
    # late on a loaded machine).
    slope = np.polyfit(scheduled, times, 1)[0]
    assert slope == pytest.approx(1.0, abs=0.05)
    lag = times - scheduled  # offsets count from the client's start: a constant lag
    drift = np.abs(lag - np.median(lag))  # seen: median 0.5 ms, 95th percentile 3-60 ms
    assert np.median(drift) < 0.02


def test_no_server_fails_every_request_without_raising(model_dir):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = asyncio.run(
        run_cell(
            base_url=url,
            model="m",
            tokenizer_path=model_dir,
            num_prompts=3,
            input_len=8,
            output_len=2,
            request_rate=float("inf"),
            request_id_prefix="n-",
            progress=True,  # a tqdm bar, as vLLM's
        )
    )
    assert (result["completed"], result["failed"]) == (0, 3)
    assert all("ClientConnectorError" in e for e in result["errors"])
    assert result["request_rate"] == "inf" and result["mean_ttft_ms"] == 0.0
    assert result["max_output_tokens_per_s"] == 0.0 and result["max_concurrent_requests"] == 0


def test_runs_where_neither_vllm_nor_torch_imports(model_dir, engine):
    """The laptop case: with vLLM and torch made unimportable, a whole cell runs."""
    code = (
        "import asyncio, sys\n"
        "sys.modules['vllm'] = sys.modules['torch'] = None  # import vllm: ImportError\n"
        "from tracedpush.bench.serve_client import run_cell\n"
        f"r = asyncio.run(run_cell(base_url={engine.url!r}, model='m', tokenizer_path="
        f"{str(model_dir)!r}, num_prompts=3, input_len=16, output_len=2, request_rate=100.0,"
        " request_id_prefix='p-'))\n"
        "print(r['completed'], r['output_lens'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3 [2, 2, 2]"
    assert sorted(engine.ids()) == ["p-0", "p-1", "p-2"]
