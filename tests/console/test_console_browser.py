"""The console in a real headless Chromium, served by `streamlit run` on synthetic traces:
pages render their Plotly charts without exceptions, a click on a request opens its
timeline, and screenshots land in artifacts/ for a human to look at."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from conftest import ARTIFACTS

from tracedpush.console import export
from tracedpush.testing import browser
from tracedpush.testing.console_server import ConsoleServer

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def served(traces):
    missing = browser.available()
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"browser test needs {missing}")
    ARTIFACTS.mkdir(exist_ok=True)
    with ConsoleServer(
        ["--traces", str(traces[0])], log_path=ARTIFACTS / "console-synthetic-server.log"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def driver(served):
    with browser.chromium() as d:
        yield d


def _svg_count(driver, css: str) -> int:
    return driver.execute_script(f"return document.querySelectorAll({css!r}).length")


def test_overview_renders_all_charts(served, driver):
    driver.get(served.url)
    browser.wait_rendered(driver, charts=4, timeout=120)
    assert not browser.exception_text(driver)
    assert _svg_count(driver, "[data-testid='stPlotlyChart']") == 4
    assert _svg_count(driver, "[data-testid='stPlotlyChart'] .scatterlayer .js-line") >= 4
    assert _svg_count(driver, "[data-testid='stPlotlyChart'] .barlayer .point") > 20
    browser.screenshot(driver, ARTIFACTS / "console-overview.png")


def test_timeline_renders_push_beside_pull(served, driver, expected, tp_request):
    """The push request's P runs at TP 2 (conftest.py): its ranks are drawn as lanes."""
    req = tp_request
    driver.get(f"{served.url}/timeline?request={req.trace_id}")
    browser.wait_rendered(driver, charts=1, timeout=120)
    assert not browser.exception_text(driver)
    titles = driver.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot .annotation-text')]"
        ".map(e => e.textContent)"
    )
    assert any(req.request_id in t and t.startswith("push") for t in titles)
    assert any(t.startswith("pull") for t in titles)
    bars = len(req.critical_path) + len(req.hidden) + len(req.spans)
    assert _svg_count(driver, ".js-plotly-plot .barlayer .point") >= bars
    ticks = driver.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot .ytick text')]"
        ".map(e => e.textContent)"
    )
    for rank in (0, 1):
        assert f"P prefill-0 · push_writer · tp{rank}" in ticks
    browser.screenshot(driver, ARTIFACTS / "console-timeline.png")


def test_timeline_shows_the_engine_step_lane(served, driver, expected):
    """P's and D's engine steps under the critical path: the lanes are labelled, every
    step bar the figure holds is drawn, and the screenshot shows the prefill chunks."""
    push = [r for r in expected.by_mode("push") if r.complete and (r.prefill_steps or 0) >= 3]
    req = max(push, key=lambda r: r.prompt_tokens)
    driver.get(f"{served.url}/timeline?request={req.trace_id}")
    browser.wait_rendered(driver, charts=1, timeout=120)
    assert not browser.exception_text(driver)
    ticks = driver.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot .ytick text')]"
        ".map(e => e.textContent)"
    )
    assert "P engine steps" in ticks and "D engine steps" in ticks
    steps = driver.execute_script(
        """
        const gd = document.querySelector("[data-testid='stPlotlyChart'] .js-plotly-plot");
        return gd.data.filter(t => t.meta && t.meta.kind === 'steps')
            .reduce((n, t) => n + t.x.length, 0);
        """
    )
    assert steps > req.prefill_steps
    legend = driver.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot .legendtext')]"
        ".map(e => e.textContent)"
    )
    assert "step: prefill" in legend and "step handoff" in legend
    browser.screenshot(driver, ARTIFACTS / "console-timeline-steps.png")


def test_clicking_a_request_opens_its_timeline(served, driver):
    driver.get(f"{served.url}/requests")
    browser.wait_rendered(driver, charts=1, timeout=120)
    browser.screenshot(driver, ARTIFACTS / "console-requests.png")
    # The "every request" scatter is the page's only chart; select its first point.
    custom = browser.select_point(
        driver,
        """
        return [document.querySelector("[data-testid='stPlotlyChart'] .js-plotly-plot"), 0, 0];
        """,
    )
    picked = custom[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "timeline" not in driver.current_url:
        time.sleep(0.1)
    assert "/timeline" in driver.current_url and f"request={picked}" in driver.current_url
    browser.wait_rendered(driver, charts=1, timeout=120)
    assert not browser.exception_text(driver)


def test_clicking_an_outlier_opens_its_timeline(served, driver):
    driver.get(f"{served.url}/phases")
    browser.wait_rendered(driver, charts=1, timeout=120)
    custom = browser.select_point(
        driver,
        """
        const gd = document.querySelector("[data-testid='stPlotlyChart'] .js-plotly-plot");
        const c = gd.data.findIndex(t => t.meta && t.meta.kind === 'phase_top'
            && t.meta.phase === 'prefill compute' && t.meta.mode === 'push');
        return [gd, c, 0];
        """,
    )
    picked = custom[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "timeline" not in driver.current_url:
        time.sleep(0.1)
    assert f"/timeline?request={picked}" in driver.current_url


@pytest.mark.parametrize("page", ["phases", "live", "export"])
def test_other_pages_render(served, driver, page):
    driver.get(f"{served.url}/{page}")
    browser.wait_rendered(driver, charts=0 if page == "export" else 1, timeout=120)
    assert not browser.exception_text(driver)
    browser.screenshot(driver, ARTIFACTS / f"console-{page}.png")


def test_export_offers_a_time_window(served, driver, expected):
    """In the browser too, "a time window" says which requests it takes (the run's last
    minute), in the browser's time zone, and offers them, without an exception."""
    # a browser in India: the window is shown in its time zone (UTC +5:30)
    driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
    try:
        text, n = _export_window(served, driver)
    finally:
        driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})
    assert 0 < n <= len(expected.requests)
    assert f"{n} requests arrived from " in text
    width, starts = export.window_buckets(pd.DataFrame(expected.table()))
    end_utc = datetime.fromtimestamp(starts[-1] + width, tz=UTC)  # the last bucket's end
    kolkata = (end_utc + timedelta(hours=5, minutes=30)).strftime("%Y-%m-%d %H:%M")
    shown = re.search(r" to (\S+ \S+) (\S+) \(the end excluded\)", text)
    assert shown is not None and shown.group(1) == kolkata
    assert shown.group(2) in ("Asia/Kolkata", "Asia/Calcutta")  # Chromium says the old name


# the Requests chart once its x axis is a date: (axis title, first x, its trace id)
ARRIVAL_AXIS = """
const g = document.querySelector("[data-testid='stPlotlyChart'] .js-plotly-plot");
if (!g || g.layout.xaxis.type !== 'date') return null;
return [g.layout.xaxis.title.text, g.data[0].x[0], g.data[0].customdata[0].at(-1)];
"""


def test_requests_and_timeline_show_arrival_in_the_browsers_zone(served, driver, expected):
    """A browser in India: the Requests page's arrival axis and the Timeline's arrival
    time are its wall clock (UTC +5:30), and say so."""
    from selenium.webdriver.common.by import By

    driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Kolkata"})
    try:
        driver.get(f"{served.url}/requests")
        browser.wait_rendered(driver, charts=1, timeout=120)
        driver.find_elements(By.CSS_SELECTOR, "[data-testid='stSelectbox']")[1].click()
        option = "//*[@role='option'][starts-with(normalize-space(.), 'arrival')]"
        _click_when_there(driver, option, timeout=30)
        title, x0, tid = browser.wait_for(driver, ARRIVAL_AXIS)
        assert not browser.exception_text(driver)
        assert title in ("arrival (Asia/Kolkata)", "arrival (Asia/Calcutta)")
        start = datetime.fromtimestamp(expected.get(tid).start_unix_ms / 1000, tz=UTC)
        kolkata = start + timedelta(hours=5, minutes=30)
        assert x0[:19] == kolkata.strftime("%Y-%m-%dT%H:%M:%S")
        browser.screenshot(driver, ARTIFACTS / "console-requests-arrival.png")
        driver.get(f"{served.url}/timeline?request={tid}")
        browser.wait_rendered(driver, charts=1, timeout=120)
        main = driver.find_element(By.TAG_NAME, "main").text
    finally:
        driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})
    assert f"arrived {kolkata:%Y-%m-%d %H:%M:%S}." in main


def _click_when_there(driver, xpath: str, timeout: float = 60.0) -> None:
    """Click the element at `xpath` once the page has it (a rerun can add it later)."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not driver.find_elements(By.XPATH, xpath):
        time.sleep(0.1)
    driver.find_element(By.XPATH, xpath).click()


def _export_window(served, driver) -> tuple[str, int]:
    """Choose "a time window" on the Export page: (the page's text, the requests the
    Perfetto button offers)."""
    from selenium.webdriver.common.by import By

    driver.get(f"{served.url}/export")
    browser.wait_rendered(driver, charts=0, timeout=120)
    # "not running" is also the state before the first run: wait for the page itself
    _click_when_there(driver, "//*[@data-testid='stRadio']//label[contains(., 'a time window')]")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "requests arrived from" not in driver.page_source:
        time.sleep(0.1)
    browser.wait_rendered(driver, charts=0, timeout=60)
    assert not browser.exception_text(driver)
    buttons = [
        b.text for b in driver.find_elements(By.CSS_SELECTOR, "[data-testid='stDownloadButton']")
    ]
    n = int(re.search(r"Perfetto JSON \((\d+) requests\)", " ".join(buttons)).group(1))
    browser.screenshot(driver, ARTIFACTS / "console-export-window.png")
    return driver.find_element(By.TAG_NAME, "main").text, n
