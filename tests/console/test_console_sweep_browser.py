"""The Sweep page in a real headless Chromium: `tracedpush console --bench DIR` on a
synthetic sweep (conftest.write_sweep) draws both figures, the picked cell's phase
account and table, links to each mode's typical request that open its timeline, and no
exception; without results it says how to get them."""

from __future__ import annotations

import json
import time

import pytest
from conftest import ARTIFACTS, SWEEP_LENS, SWEEP_QPS

from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis import bench as ab
from tracedpush.console import bench
from tracedpush.testing import browser
from tracedpush.testing.console_server import ConsoleServer

pytestmark = pytest.mark.browser

FIGURES = """
return [...document.querySelectorAll("[data-testid='stPlotlyChart'] .js-plotly-plot")]
    .map(gd => ({kind: ((gd.layout || {}).meta || {}).kind,  // none while drawn again
                 traces: (gd.data || []).map(t => ({meta: t.meta, dash: (t.line || {}).dash,
                                                    x: Array.from(t.x || [])}))}));
"""
LINKS = """
return [...document.querySelectorAll("a[href*='timeline?request=']")]
    .map(a => ({href: a.getAttribute('href'), text: a.innerText}));
"""


@pytest.fixture(scope="module")
def served(sweep):
    ARTIFACTS.mkdir(exist_ok=True)
    with ConsoleServer(
        ["--bench", str(sweep[0])], log_path=ARTIFACTS / "console-sweep-server.log"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def cell(sweep) -> dict:
    """What the join says about the cell the page picks first (longest, fastest)."""
    got = bench.load(str(sweep[0]))
    run = analyze(TraceStore.from_path(sweep[0] / "traces"))
    found = bench.cell_of(ab.join(got.results, run).to_json(), SWEEP_LENS[-1], SWEEP_QPS[-1])
    assert found is not None
    return found


def _figures(driver, kinds: set[str], timeout: float = 60.0) -> dict:
    """kind -> traces of the page's figures, once every one of `kinds` is there (three
    charts can be drawn before the last one's layout names its kind: seen once in CI)."""
    deadline = time.monotonic() + timeout
    while True:
        figs = {f["kind"]: f["traces"] for f in driver.execute_script(FIGURES)}
        if kinds <= figs.keys() or time.monotonic() > deadline:
            return figs
        time.sleep(0.1)


def test_sweep_page_draws_figures_phases_and_typical_links(served, driver, cell):
    driver.get(f"{served.url}/sweep")
    browser.wait_rendered(driver, charts=3, timeout=120)
    assert not browser.exception_text(driver)
    figs = _figures(driver, {"sweep_ttft", "sweep_tpot", "sweep_phase_delta"})
    for kind in ("sweep_ttft", "sweep_tpot"):
        lines = figs[kind]
        assert len(lines) == 2 * len(SWEEP_LENS)
        assert {t["meta"]["mode"]: t["dash"] for t in lines} == {"push": "solid", "pull": "dash"}
        assert all(t["x"] == sorted(SWEEP_QPS) for t in lines)
    assert len(figs["sweep_phase_delta"][0]["x"]) >= 3  # a bar per phase that differs
    drawn = "[data-testid='stPlotlyChart'] .scatterlayer .js-line"
    assert driver.execute_script(f"return document.querySelectorAll({drawn!r}).length") >= 8
    body = driver.execute_script("return document.body.innerText")
    assert "Why they differ here" in body and cell["explanation"] in body
    assert "Phase by phase" in body and "Typical requests" in body
    grids = driver.execute_script(
        "return document.querySelectorAll(\"[data-testid='stDataFrame']\").length"
    )
    assert grids >= 3  # the client's numbers, the phase account, client vs traces
    links = browser.wait_for(driver, LINKS)
    want = {m: cell["modes"][m]["typical"] for m in ("push", "pull")}
    # (a link with a tooltip is in the DOM twice)
    assert {link["href"].split("request=")[1] for link in links} == {
        t["trace_id"] for t in want.values()
    }
    for mode, typ in want.items():
        label = f"{mode}: {typ['request_id']}"  # after the icon's ligature
        assert any(link["text"].splitlines()[-1].strip() == label for link in links)
    browser.screenshot(driver, ARTIFACTS / "console-sweep.png")


def test_a_typical_link_opens_that_requests_timeline(served, driver, cell):
    driver.get(f"{served.url}/sweep")
    browser.wait_rendered(driver, charts=3, timeout=120)
    typ = cell["modes"]["pull"]["typical"]
    link = f"a[href*='request={typ['trace_id']}']"
    # the links can come a moment after the charts (under the full parallel suite, once
    # they were not there yet): wait for this one, then click it
    browser.wait_for(driver, f"return document.querySelector({json.dumps(link)}) !== null")
    driver.execute_script("document.querySelector(arguments[0]).click()", link)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "/timeline" not in driver.current_url:
        time.sleep(0.1)
    assert f"/timeline?request={typ['trace_id']}" in driver.current_url
    browser.wait_rendered(driver, charts=1, timeout=120)
    assert not browser.exception_text(driver)
    titles = driver.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot .annotation-text')]"
        ".map(e => e.textContent)"
    )
    assert any(t.startswith("pull") and typ["request_id"] in t for t in titles)


def test_without_results_the_sweep_page_says_how_to_get_them(traces, driver):
    with ConsoleServer(
        ["--traces", str(traces[0])], log_path=ARTIFACTS / "console-sweep-none-server.log"
    ) as server:
        driver.get(f"{server.url}/sweep")
        browser.wait_rendered(driver, charts=0, timeout=120)
        body = browser.wait_for(
            driver,
            "const t = document.body.innerText; return t.includes('No benchmark results') && t;",
        )
        assert not browser.exception_text(driver)
        assert "tracedpush bench sweep" in body and "--bench" in body
        charts = "[data-testid='stPlotlyChart']"
        assert driver.execute_script(f"return document.querySelectorAll({charts!r}).length") == 0
        browser.screenshot(driver, ARTIFACTS / "console-sweep-none.png")


def test_clicking_a_point_picks_its_cell(served, driver):
    driver.get(f"{served.url}/sweep")
    browser.wait_rendered(driver, charts=3, timeout=120)
    n, q = SWEEP_LENS[0], SWEEP_QPS[0]
    # select the pull point at (n, q)
    browser.select_point(
        driver,
        """
        const gd = [...document.querySelectorAll("[data-testid='stPlotlyChart'] .js-plotly-plot")]
            .find(g => (g.layout.meta || {}).kind === 'sweep_tpot');
        const c = gd.data.findIndex(
            t => t.meta.mode === 'pull' && t.meta.input_len === arguments[0]);
        return [gd, c, Array.from(gd.data[c].x).indexOf(arguments[1])];
        """,
        n,
        q,
    )
    browser.wait_for(
        driver,
        f"return document.body.innerText.includes('{n:,}-token prompts at {q:g} QPS')",
    )
    browser.wait_rendered(driver, charts=3, timeout=120)
    assert not browser.exception_text(driver)


# A page whose chart comes 0.5 s late, as after a rerun: until then `find` raises. The
# stand-in has what `browser.select_point` uses of a plotly.js chart (listeners, emit,
# data); the real charts are the tests above.
LATE_CHART = """<html><body><script>
setTimeout(() => {
  const gd = document.createElement('div');
  gd.className = 'late';
  gd.data = [{x: [1, 2], y: [3, 4], customdata: [['a'], ['b']]}];
  gd._fullData = gd.data;
  gd._ev = {listeners: () => [() => {}]};
  gd.emit = (name, ev) => { window.picked = ev.points[0].customdata; };
  document.body.appendChild(gd);
}, 500);
</script></body></html>"""


def test_selecting_a_point_waits_for_a_chart_that_is_not_there_yet(driver, tmp_path):
    """The sweep page's charts are drawn again as a rerun ends: a `find` that raises
    meanwhile (CI once: "Cannot read properties of undefined (reading 'data')") is tried
    again, and its last error is named if the chart never comes."""
    page = tmp_path / "late.html"
    page.write_text(LATE_CHART)
    driver.get(page.as_uri())
    find = "const gd = document.querySelector('.late'); return [gd, 0, gd.data[0].x.length - 1];"
    assert browser.select_point(driver, find, timeout=10) == ["b"]
    assert driver.execute_script("return window.picked") == ["b"]
    driver.get(page.as_uri())
    never = "const gd = document.querySelector('.never'); return [gd, 0, gd.data.length];"
    with pytest.raises(TimeoutError, match="Cannot read properties of null"):
        browser.select_point(driver, never, timeout=1)
