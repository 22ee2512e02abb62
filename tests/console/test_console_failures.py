"""Failed requests in the console: the Overview's block (counts by leg and type, the
failures linking to their timelines) and the timeline's banner (issue 11, item 7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ARTIFACTS

from tracedpush import semconv as sc
from tracedpush.analysis import RunAnalysis, TraceStore, analyze
from tracedpush.testing import browser, synthetic
from tracedpush.testing.console import messages, no_exception
from tracedpush.testing.console_server import ConsoleServer
from tracedpush.testing.synthetic.faults import fail_request

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

P_FAILED = "prefill leg: http://p-host:8100 answered 500: engine core died"
D_REFUSED = "decode leg: cannot connect to http://d-host:8200"
FAILED = {
    "push-00003": [
        (sc.SPAN_PROXY_PREFILL, sc.ERR_UPSTREAM, P_FAILED),
        (sc.SPAN_PROXY_DECODE, sc.ERR_UPSTREAM, "cancelled: the prefill leg failed"),
        (sc.SPAN_REQUEST, sc.ERR_UPSTREAM, P_FAILED),
    ],
    "push-00007": [
        (sc.SPAN_KV_WRITE, sc.ERR_TRANSFER, "transfer reported failed"),
        (sc.SPAN_PROXY_DECODE, sc.ERR_UPSTREAM_TIMEOUT, "decode leg: no token in 30 s"),
        (sc.SPAN_REQUEST, sc.ERR_UPSTREAM_TIMEOUT, "decode leg: no token in 30 s"),
    ],
    "pull-00005": [
        (sc.SPAN_PROXY_DECODE, sc.ERR_UPSTREAM, D_REFUSED),
        (sc.SPAN_REQUEST, sc.ERR_UPSTREAM, D_REFUSED),
    ],
}


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunAnalysis]:
    """30 synthetic requests, three of which failed; what the analysis says of them."""
    run = synthetic.generate(30, seed=11)
    for rid, faults in FAILED.items():
        fail_request(run, rid, *faults)
    directory = tmp_path_factory.mktemp("console-failed")
    run.write(directory)
    return directory, analyze(TraceStore.from_path(directory))


def _failed_table(at):
    frames = [df.value for df in at.dataframe]
    return next(f for f in frames if {"leg", "type", "message", "timeline"} <= set(f.columns))


def test_overview_lists_failed_requests_by_leg_and_type(app, failed):
    directory, expected = failed
    at = app(traces=directory)
    no_exception(at)
    assert "Failed requests: 3 of 30" in [h.value for h in at.subheader]
    counts = next(m.value for m in at.markdown if m.value.startswith("By leg:"))
    assert "`prefill` 2" in counts and "`decode` 1" in counts
    assert f"`{sc.ERR_UPSTREAM}` 2" in counts and f"`{sc.ERR_TRANSFER}` 1" in counts
    table = _failed_table(at)
    want = expected.failures().examples(10)
    assert table["request"].tolist() == [r.request_id for r in want]
    assert sorted(table["request"]) == sorted(FAILED)
    assert table["leg"].tolist() == [r.failure.leg for r in want]
    assert table["type"].tolist() == [r.failure.type for r in want]
    assert table["message"].tolist() == [r.failure.message for r in want]
    # each row links to its request's timeline, as the Phases outliers do
    assert table["timeline"].tolist() == [f"timeline?request={r.trace_id}" for r in want]
    row = table.set_index("request").loc["push-00007"]
    assert (row["leg"], row["type"], row["span"]) == ("prefill", sc.ERR_TRANSFER, "kv.write")


def test_timeline_shows_a_failure_banner(app, failed):
    directory, expected = failed
    req = expected.get("pull-00005")
    at = app(traces=directory, page="views/timeline.py", query={"request": req.trace_id})
    no_exception(at)
    (banner,) = [e.value for e in at.error]
    assert "`pull-00005`" in banner and "failed in the decode leg" in banner
    assert f"`{sc.ERR_UPSTREAM}`" in banner and f"`{D_REFUSED}`" in banner
    assert f"{req.failure.at_ms:,.1f} ms" in banner


def test_timeline_of_a_request_that_did_not_fail_has_no_banner(app, failed):
    directory, expected = failed
    ok = next(r for r in expected.requests if r.request_id not in FAILED and r.mode == "push")
    at = app(traces=directory, page="views/timeline.py", query={"request": ok.trace_id})
    no_exception(at)
    assert not at.error


def test_a_run_without_failures_shows_no_block(app, traces):
    at = app(traces=traces[0])
    no_exception(at)
    assert not any(h.value.startswith("Failed requests") for h in at.subheader)
    assert "failed requests" not in messages(at)


@pytest.mark.browser
def test_failures_in_a_real_browser(failed):
    """Streamlit in headless Chromium: the block and the banner are drawn, no exception;
    screenshots in artifacts/console-failures-*.png."""
    missing = browser.available()
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"browser test needs {missing}")
    directory, expected = failed
    req = expected.get("push-00007")
    log = ARTIFACTS / "console-failures-server.log"
    with (
        ConsoleServer(["--traces", str(directory)], log_path=log) as served,
        browser.chromium() as driver,
    ):
        driver.get(served.url)
        browser.wait_rendered(driver, charts=4, timeout=120)
        assert not browser.exception_text(driver)
        text = driver.find_element("css selector", "[data-testid='stMain']").text
        assert "Failed requests: 3 of 30" in text
        browser.screenshot(driver, ARTIFACTS / "console-failures-overview.png")

        driver.get(f"{served.url}/timeline?request={req.trace_id}")
        browser.wait_rendered(driver, charts=1, timeout=120)
        assert not browser.exception_text(driver)
        alerts = [e.text for e in driver.find_elements("css selector", "[data-testid='stAlert']")]
        assert any("failed in the prefill leg" in a and sc.ERR_TRANSFER in a for a in alerts)
        browser.screenshot(driver, ARTIFACTS / "console-failures-timeline.png")
