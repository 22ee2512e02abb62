"""Every page opened by its URL on a console just started, before the root page was ever
visited: the page runs inside the app (titled navigation, the sidebar's trace source),
not as a file on its own. A ``pages/`` folder beside ``app.py`` broke this: Streamlit's
legacy file-based pages ran ``pages/phases.py`` alone, listing "app", "export", "live",
... and no Reload / Change source."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import ARTIFACTS

from tracedpush.testing import browser
from tracedpush.testing.console_server import ConsoleServer

pytestmark = pytest.mark.browser

# URL path -> the page's own title (st.title)
PAGES = {
    "": "Push vs pull",
    "requests": "Requests",
    "timeline": "Request timeline",
    "phases": "Phases",
    "sweep": "Sweep",
    "live": "Live",
    "export": "Export",
}
NAVIGATION = [
    "Overview",
    "Requests",
    "Request timeline",
    "Phases",
    "Sweep",
    "Live",
    "Export",
]  # app.py's titles

SHOWN = """
const texts = css => [...document.querySelectorAll(css)].map(e => e.innerText.trim());
const sidebar = document.querySelector("[data-testid='stSidebarUserContent']");
return {
    nav: texts("[data-testid='stSidebarNav'] [data-testid='stSidebarNavLink']"),
    titles: texts("[data-testid='stMain'] h1"),
    sidebar: sidebar ? sidebar.innerText : "",
    body: document.body.innerText,
};
"""


def _shown_when_loaded(driver: Any, title: str, timeout: float = 120.0) -> dict[str, Any]:
    """What the page shows once its title, the navigation and the sidebar's source
    controls are drawn and the script has finished (or an exception is shown). The Live
    page reruns every few seconds, so a snapshot mid-rerun can miss a widget: wait for
    all of them rather than for the first idle moment."""
    deadline = time.monotonic() + timeout
    shown: dict[str, Any] = {}
    while time.monotonic() < deadline:
        shown = driver.execute_script(SHOWN)
        if browser.exception_text(driver):
            return shown
        idle = driver.find_elements("css selector", browser.APP_IDLE)
        drawn = shown["nav"] and any(t.startswith(title) for t in shown["titles"])
        if idle and drawn and "Reload" in shown["sidebar"]:
            return shown
        time.sleep(0.1)
    raise TimeoutError(f"{title!r} not drawn in {timeout} s: {shown}")


@pytest.mark.parametrize("path", list(PAGES), ids=lambda p: p or "root")
def test_a_fresh_console_serves_each_page_by_its_url(traces, driver, path):
    ARTIFACTS.mkdir(exist_ok=True)
    name = path or "overview"
    with ConsoleServer(
        ["--traces", str(traces[0])], log_path=ARTIFACTS / f"console-deep-link-{name}.log"
    ) as server:
        driver.get(f"{server.url}/{path}")  # the first page this server is asked for
        shown = _shown_when_loaded(driver, PAGES[path])
        browser.screenshot(driver, ARTIFACTS / f"console-deep-link-{name}.png")
        assert not browser.exception_text(driver)
        assert "Traceback" not in shown["body"]
    labels = [label.splitlines()[-1].strip() for label in shown["nav"]]  # after the icon
    assert labels == NAVIGATION, shown["nav"]
    assert any(t.startswith(PAGES[path]) for t in shown["titles"]), shown["titles"]
    sidebar = shown["sidebar"]
    assert str(traces[0]) in sidebar and "Reload" in sidebar and "Change source" in sidebar
