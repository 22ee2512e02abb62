"""Drive the console in headless Chromium (selenium): for the browser tests and the
first-render benchmark, which need what AppTest cannot give: a real render.

Uses the system's Chromium and ChromeDriver, found on ``PATH`` like scripts/install.sh
checks them (commands ``chromium`` and ``chromedriver``, Debian packages chromium and
chromium-driver; other distributions' names are tried too), through an explicit
Service, so selenium never downloads a driver. Selenium's own ``SE_CHROMEDRIVER`` and
``SE_BROWSER_PATH`` override the driver and the browser.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Executable:
    """A program found by an environment override, else by its usual names on PATH."""

    env: str
    names: tuple[str, ...]

    def find(self) -> str | None:
        override = os.environ.get(self.env, "").strip()
        if override:
            return shutil.which(override)
        return next((path for name in self.names if (path := shutil.which(name))), None)

    def missing(self) -> str:
        """What to install or set, for a message."""
        override = os.environ.get(self.env, "").strip()
        if override:
            return f"{self.env}={override} (not an executable)"
        return f"{' or '.join(self.names)} on PATH (or set {self.env})"


CHROMIUM = Executable("SE_BROWSER_PATH", ("chromium", "chromium-browser", "google-chrome"))
CHROMEDRIVER = Executable("SE_CHROMEDRIVER", ("chromedriver",))
APP_IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
PLOTLY_CHART = "[data-testid='stPlotlyChart']"
EXCEPTION = "[data-testid='stException']"
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--window-size=1400,1800",
)


def available() -> str | None:
    """None if Chromium, ChromeDriver and selenium are installed, else what is missing."""
    missing = [exe.missing() for exe in (CHROMIUM, CHROMEDRIVER) if exe.find() is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    return ", ".join(missing) or None


def executables() -> tuple[str, str]:
    """Paths of Chromium and ChromeDriver; a RuntimeError says what is missing."""
    browser, driver = CHROMIUM.find(), CHROMEDRIVER.find()
    if browser is None or driver is None:
        missing = [exe.missing() for exe in (CHROMIUM, CHROMEDRIVER) if exe.find() is None]
        raise RuntimeError(
            f"headless Chromium needs {', '.join(missing)}: install the chromium and "
            "chromium-driver packages (scripts/install.sh does it with apt-get)"
        )
    return browser, driver


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium WebDriver with a throwaway profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, chromedriver = executables()
    profile = tempfile.mkdtemp(prefix="tracedpush-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_rendered(driver: Any, *, charts: int = 1, timeout: float = 60.0) -> float:
    """Wait until the script finished and at least ``charts`` Plotly charts have drawn
    their SVG; returns the seconds waited."""
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        idle = driver.find_elements(By.CSS_SELECTOR, APP_IDLE)
        drawn = driver.find_elements(By.CSS_SELECTOR, f"{PLOTLY_CHART} .main-svg")
        if idle and (charts == 0 or len(drawn) >= charts):
            return time.monotonic() - started
        if driver.find_elements(By.CSS_SELECTOR, EXCEPTION):
            raise AssertionError("the page shows an exception: " + exception_text(driver))
        time.sleep(0.05)
    idle = bool(driver.find_elements(By.CSS_SELECTOR, APP_IDLE))
    charts_seen = len(driver.find_elements(By.CSS_SELECTOR, PLOTLY_CHART))
    raise TimeoutError(f"page not rendered in {timeout} s: idle={idle} charts={charts_seen}")


_SELECT = """
let found;
try {
  found = (function () { %s }).apply(null, arguments);
} catch (e) {  // the chart not there yet (a rerun draws it again): said if it lasts
  return {notYet: String(e)};
}
const [gd, c, i] = found;
if (!gd || !gd._ev || gd._ev.listeners('plotly_selected').length === 0) return null;
const t = (gd.data || [])[c];
if (!t || !t.customdata) return null;  // redrawing (e.g. after a resize): not yet
const custom = Array.from(t.customdata[i]);
gd.emit('plotly_selected', {points: [{curveNumber: c, pointNumber: i, pointIndex: i,
    x: t.x[i], y: t.y[i], customdata: custom, data: t, fullData: gd._fullData[c]}]});
return custom;
"""


def select_point(driver: Any, find: str, *args: Any, timeout: float = 30.0) -> list[Any]:
    """Select one point the way plotly.js reports a click (``plotly_selected``), which
    Streamlit turns into a rerun; returns the point's customdata.

    ``find`` is the body of a JavaScript function that returns ``[gd, curveNumber,
    pointIndex]`` (``args`` are its ``arguments``). The event is emitted only once the
    chart listens for it: react-plotly attaches its handlers after the SVG is drawn, so
    an event emitted at once can go to nobody on a busy machine. A chart being drawn
    again (a window resize, a rerun) has no data, or is not in the page, for a moment:
    also waited for (``find`` raising then is retried; its last error is in the
    TimeoutError)."""
    deadline = time.monotonic() + timeout
    error = ""
    while True:
        custom = driver.execute_script(_SELECT % find, *args)
        if isinstance(custom, dict):  # `find` raised
            error, custom = f" (the last try of finding it: {custom['notYet']})", None
        if custom is not None:
            return custom
        if time.monotonic() > deadline:
            raise TimeoutError(f"no chart listened for plotly_selected within {timeout} s{error}")
        time.sleep(0.05)


def wait_for(driver: Any, script: str, timeout: float = 60.0) -> Any:
    """What `script` (JavaScript that returns a value) returns once it is truthy: what a
    page shows can come a moment after `wait_rendered` (a chart's data, a rerun)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = driver.execute_script(script)
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(script)


def exception_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return " | ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, EXCEPTION))


def screenshot(driver: Any, path: str | Path) -> Path:
    """A full-page PNG (the window grows to the page's height first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;"
        "return Math.max(m.scrollHeight, document.body.scrollHeight);"
    )
    driver.set_window_size(1400, min(max(int(height) + 100, 900), 6000))
    time.sleep(0.3)
    driver.save_screenshot(str(path))
    return path
