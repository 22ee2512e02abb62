"""Fixtures for the console tests: synthetic traces with known answers, and AppTest
helpers that read the plotted figures back as JSON."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tracedpush.analysis import RequestAnalysis, RunAnalysis, TraceStore, analyze
from tracedpush.console.source import ENV_JAEGER, ENV_TRACES
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
    """``app(traces=DIR | jaeger=URL, page="views/x.py", query={...})`` -> an AppTest that
    has run that page (the console reads its source from the environment here)."""

    def make(
        *,
        traces: str | Path | None = None,
        jaeger: str | None = None,
        page: str | None = None,
        query: dict[str, str] | None = None,
    ) -> AppTest:
        monkeypatch.delenv(ENV_TRACES, raising=False)
        monkeypatch.delenv(ENV_JAEGER, raising=False)
        if traces is not None:
            monkeypatch.setenv(ENV_TRACES, str(traces))
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
