"""Drive the console in headless Chromium (selenium): for the browser tests and the
first-render benchmark, which need what AppTest cannot give: a real render.

Uses the system's Chromium and ChromeDriver (Debian packages chromium, chromium-driver)
through an explicit Service, so selenium never downloads a driver.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
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
    """None if Chromium and ChromeDriver are installed, else what is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    return ", ".join(missing) or None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium WebDriver with a throwaway profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tracedpush-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
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
