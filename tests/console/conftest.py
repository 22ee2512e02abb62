"""Fixtures for the console tests: synthetic traces with known answers, and AppTest
helpers that read the plotted figures back as JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tracedpush.analysis import RequestAnalysis, RunAnalysis, TraceStore, analyze
from tracedpush.analysis.bench_results import OURS, REQUEST_IDS, SWEEP_MANIFEST, cell_filename
from tracedpush.console.source import ENV_JAEGER, ENV_TRACES
from tracedpush.envs import INDEX_ROOT
from tracedpush.testing import browser
from tracedpush.testing.synthetic import SyntheticRun, generate
from tracedpush.testing.synthetic.ranks import add_prefill_rank

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "console" / "app.py"
ARTIFACTS = REPO / "artifacts"
DECODE_SKEW_MS = 25.0  # decode-0's clock runs this far ahead in the synthetic traces


def tp_trace_id(run: SyntheticRun) -> str:
    """The push request whose P runs at TP 2 (`synthetic.ranks`): the 6th by arrival."""
    push = sorted((r for r in run.requests if r.mode == "push"), key=lambda r: r.start_unix_ns)
    return push[5].trace_id


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SyntheticRun]:
    run = generate(
        120, seed=7, clock_offsets_ms={"decode-0": DECODE_SKEW_MS}, start_unix_s=time.time() - 600
    )
    add_prefill_rank(run, tp_trace_id(run))
    directory = tmp_path_factory.mktemp("console-traces")
    run.write(directory)
    return directory, run


@pytest.fixture(scope="session")
def expected(traces: tuple[Path, SyntheticRun]) -> RunAnalysis:
    """What the analysis says about the traces the app is shown: the console must draw it."""
    return analyze(TraceStore.from_path(traces[0]))


@pytest.fixture(scope="session")
def tp_request(traces: tuple[Path, SyntheticRun], expected: RunAnalysis) -> RequestAnalysis:
    """The push request with two prefill ranks, as the analysis sees it."""
    req = expected.get(tp_trace_id(traces[1]))
    assert req is not None
    return req


AppFactory = Callable[..., AppTest]


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[AppFactory]:
    """``app(traces=DIR | jaeger=URL, page="views/x.py", query={...}, index_root=DIR)`` ->
    an AppTest that has run that page (the console reads its source from the environment
    here)."""

    def make(
        *,
        traces: str | Path | None = None,
        jaeger: str | None = None,
        page: str | None = None,
        query: dict[str, str] | None = None,
        index_root: str | Path | None = None,
    ) -> AppTest:
        monkeypatch.delenv(ENV_TRACES, raising=False)
        monkeypatch.delenv(ENV_JAEGER, raising=False)
        monkeypatch.delenv(INDEX_ROOT, raising=False)
        if traces is not None:
            monkeypatch.setenv(ENV_TRACES, str(traces))
        if index_root is not None:
            monkeypatch.setenv(INDEX_ROOT, str(index_root))
        if jaeger is not None:
            monkeypatch.setenv(ENV_JAEGER, jaeger)
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.run()
        if page is not None:
            at.switch_page(page)
        if query:
            at.query_params.update(query)
        if page is not None or query:
            at.run()
        return at

    yield make


# ------------------------------------------------------------------ a synthetic sweep

SWEEP_QPS = (1.0, 4.0)
SWEEP_LENS = (256, 2048)
SWEEP_PER_CELL = 6
CLIENT_EXTRA_S = 0.0008  # the client sees its first token this long after the proxy sends it


def sweep_prefix(mode: str, qps: float, input_len: int) -> str:
    """What `tracedpush bench sweep` names a cell's requests: prefix + row index."""
    return f"sweep-t3st-{cell_filename(mode, qps, input_len).removesuffix('.json')}-"


def write_sweep(directory: Path, *, seed: int = 11) -> tuple[Path, SyntheticRun]:
    """A `tracedpush bench sweep` results directory: one `vllm bench serve --save-detailed`
    file per (mode, QPS, input length) with our ``request_ids`` and block, the synthetic
    traces of the same requests under ``traces/<mode>/`` (their request ids renamed to the
    cells' ``prefix + i``), and ``sweep.json``. Client TTFTs are the traces' plus 0.8 ms."""
    cells = [(n, q) for n in SWEEP_LENS for q in SWEEP_QPS]
    prompts = [n for n, _ in cells for _ in range(SWEEP_PER_CELL)]
    run = generate(
        2 * len(prompts), seed=seed, prompt_tokens=prompts, output_tokens=(8, 24),
        start_unix_s=time.time() - 900,
    )  # fmt: skip
    renamed: dict[str, str] = {}
    for mode in ("push", "pull"):
        ours = sorted((r for r in run.requests if r.mode == mode), key=lambda r: r.request_id)
        for j, (n, q) in enumerate(cells):
            rows = ours[j * SWEEP_PER_CELL : (j + 1) * SWEEP_PER_CELL]
            prefix = sweep_prefix(mode, q, n)
            for i, r in enumerate(rows):
                renamed[r.request_id] = f"{prefix}{i}"
                r.request_id = f"{prefix}{i}"
            _write_cell(directory, mode, q, n, prefix, rows)
    traces = directory / "traces"
    run.write(traces)
    pattern = re.compile(r"\b(?:push|pull)-\d{5}\b")
    for path in traces.rglob("*.jsonl"):
        path.write_text(pattern.sub(lambda m: renamed.get(m[0], m[0]), path.read_text()))
    manifest = {"modes": ["push", "pull"], "qps": list(SWEEP_QPS), "input_lens": list(SWEEP_LENS)}
    (directory / SWEEP_MANIFEST).write_text(json.dumps(manifest))
    return directory, run


def _write_cell(
    directory: Path, mode: str, qps: float, n: int, prefix: str, rows: list[Any]
) -> None:
    ttfts = [r.ttft_ms / 1000 + CLIENT_EXTRA_S for r in rows]
    itls = [[r.tpot_ms / 1000] * (r.output_tokens - 1) for r in rows]
    lat = [t + sum(i) for t, i in zip(ttfts, itls, strict=True)]
    tpots = [(x - t) / (r.output_tokens - 1) for x, t, r in zip(lat, ttfts, rows, strict=True)]
    data: dict[str, Any] = {
        "date": "20250101-000000", "endpoint_type": "openai", "backend": "vllm",
        "model_id": "tiny", "num_prompts": len(rows), "request_rate": qps,
        "burstiness": 1.0, "max_concurrency": None, "duration": 10.0,
        "completed": len(rows), "failed": 0,
        "input_lens": [n] * len(rows),
        "output_lens": [r.output_tokens for r in rows],
        "ttfts": ttfts, "itls": itls, "latencies": lat,
        "start_times": [r.start_unix_ns / 1e9 for r in rows],
        "generated_texts": ["x" * r.output_tokens for r in rows],
        "errors": [""] * len(rows),
        REQUEST_IDS: [f"{prefix}{i}" for i in range(len(rows))],
        OURS: {"version": 1, "complete": True, "mode": mode, "qps": qps, "input_len": n,
               "output_len": 24, "request_id_prefix": prefix, "traces": f"traces/{mode}"},
    }  # fmt: skip
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("e2el", lat)):
        data[f"mean_{name}_ms"] = float(np.mean(values)) * 1000
        data[f"median_{name}_ms"] = float(np.median(values)) * 1000
        data[f"p99_{name}_ms"] = float(np.percentile(values, 99)) * 1000
    (directory / cell_filename(mode, qps, n)).write_text(json.dumps(data))


@pytest.fixture(scope="session")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SyntheticRun]:
    """A synthetic sweep directory (`write_sweep`), 2 QPS x 2 lengths x 2 modes."""
    return write_sweep(tmp_path_factory.mktemp("console-sweep"))


@pytest.fixture
def captured_streamlit(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Popen replaced: the streamlit command line the CLI would run, under "cmd"."""
    seen: dict = {}

    class Proc:
        def __init__(self, cmd, env):
            seen["cmd"] = cmd

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Proc)
    return seen


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """Headless Chromium for the browser tests (a skip here, a failure in CI, without it)."""
    missing = browser.available()
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"browser test needs {missing}")
    with browser.chromium() as d:
        yield d
