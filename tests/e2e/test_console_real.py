"""The console on real traces from the local 1P1D, both modes, in headless Chromium.

A push-marked step sends traffic through the push deployment (push tests run first);
the pull-marked test sends pull traffic, then serves the console on the session's
traces directory (``<base>/traces/{push,pull}``) and checks a push request's timeline
beside a pull one. Screenshots: artifacts/console-e2e-*.png.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tracedpush.analysis import RunAnalysis, TraceStore, analyze
from tracedpush.bench.workload import PromptMaker, run_workload
from tracedpush.console import selection
from tracedpush.testing import browser
from tracedpush.testing.console_server import ConsoleServer

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
N_REQUESTS = 6
PREFIX = f"console-{uuid.uuid4().hex[:6]}"


def _mine(run: RunAnalysis, mode: str) -> list[Any]:
    return [r for r in run.requests if r.request_id.startswith(f"{PREFIX}-{mode}")]


def _send_and_wait(pd: Any, mode: str, timeout_s: float = 180.0) -> None:
    """Send the requests, then wait until the exporters flushed their traces: all complete,
    or (slow machine) at least one complete by the deadline."""
    if not pd.config.trace:
        pytest.skip("the traced connectors are not loaded (TRACEDPUSH_E2E_TRACE=0)")
    maker = PromptMaker(pd.model, seed=11)
    # A fresh engine's first requests pay its warm-up (minutes on a busy 2-core machine):
    # one request first, outside the set the console is checked on.
    run_workload(pd.proxy_url, maker.mix([64], 1), max_tokens=2, timeout_s=900.0,
                 request_id_prefix=f"warmup-{mode}")  # fmt: skip
    results = run_workload(
        pd.proxy_url,
        maker.mix([120, 600, 1500], N_REQUESTS),
        concurrency=2,
        max_tokens=6,
        request_id_prefix=f"{PREFIX}-{mode}",
        timeout_s=600.0,
    )
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    store = TraceStore.from_path(pd.traces_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        mine = _mine(analyze(store, spans=False), mode)
        complete = [r for r in mine if r.complete]
        if len(complete) == N_REQUESTS or (complete and time.monotonic() > deadline):
            return
        if time.monotonic() > deadline:
            problems = {r.request_id: r.problems[:3] for r in mine}
            pytest.fail(f"no complete {mode} trace after {timeout_s} s: {problems}")
        time.sleep(1.0)
        store.refresh()


@pytest.mark.pd("push")
def test_push_traffic_for_the_console(pd: Any) -> None:
    _send_and_wait(pd, "push")


@pytest.mark.pd("pull")
@pytest.mark.browser
def test_console_shows_both_modes_from_real_traces(pd: Any) -> None:
    missing = browser.available()
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"browser test needs {missing}")
    _send_and_wait(pd, "pull")
    root = Path(pd.traces_dir).parent  # <base>/traces: push/ and pull/
    run = analyze(TraceStore.from_path(root))
    push = [r for r in _mine(run, "push") if r.complete]
    pull = [r for r in _mine(run, "pull") if r.complete]
    if not push:
        pytest.skip("no push traces: run test_push_traffic_for_the_console first (same session)")
    assert pull
    assert {r.mode for r in push} == {"push"} and {r.mode for r in pull} == {"pull"}

    ARTIFACTS.mkdir(exist_ok=True)
    with (
        ConsoleServer(["--traces", str(root)], log_path=ARTIFACTS / "console-e2e-server.log")
        as server,
        browser.chromium() as driver,
    ):  # fmt: skip
        driver.get(server.url)
        browser.wait_rendered(driver, charts=4, timeout=180)
        assert not browser.exception_text(driver)
        browser.screenshot(driver, ARTIFACTS / "console-e2e-overview.png")

        req = selection.typical(push)  # the median TTFT: the first requests pay warm-up
        driver.get(f"{server.url}/timeline?request={req.trace_id}")
        browser.wait_rendered(driver, charts=1, timeout=180)
        assert not browser.exception_text(driver)
        drawn = driver.execute_script(
            "const gd = document.querySelector(\"[data-testid='stPlotlyChart'] .js-plotly-plot\");"
            "return gd.data.filter(t => t.meta && t.meta.kind === 'critical')"
            ".map(t => [t.meta.mode, t.meta.trace_id, Array.from(t.text)]);"
        )
        browser.screenshot(driver, ARTIFACTS / "console-e2e-timeline.png")
    by_mode = {mode: (tid, phases) for mode, tid, phases in drawn}
    assert set(by_mode) == {"push", "pull"}
    tid, phases = by_mode["push"]
    assert tid == req.trace_id
    assert phases == [s.phase for s in req.critical_path]  # drawn = analysed
    pull_tid, pull_phases = by_mode["pull"]
    assert pull_phases == [s.phase for s in run.get(pull_tid).critical_path]
    assert {"relay", "READ"} & set(pull_phases)
    assert {"WRITE", "notification"} & set(phases)
