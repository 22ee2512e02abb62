"""Suite-wide pytest setup: markers, and the order that lets e2e tests share engines.

Markers
-------
``e2e``
    Launches real vLLM engines with NIXL (slow, about a minute per deployment).
    ``pytest -m "not e2e"`` runs the unit tests only.
``pd(mode)``
    The test uses the live local P/D deployment in ``mode`` ("push" or "pull") through
    the ``pd`` fixture of tests/e2e/conftest.py (so such tests live under tests/e2e/).
    Implies ``e2e``. For both modes, parametrize with marks::

        @pytest.mark.parametrize(
            "mode", [pytest.param(m, marks=pytest.mark.pd(m)) for m in ("push", "pull")]
        )
        def test_x(pd, mode): ...

Ordering
--------
Collection is reordered (stable, otherwise unchanged): tests without ``pd`` first, then
every ``pd("push")`` test, then every ``pd("pull")`` test. With one deployment alive at a
time, a session therefore starts each mode's engines at most once.
"""

from __future__ import annotations

import pytest

PD_MODES = ("push", "pull")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        'pd(mode): needs the live local P/D deployment in mode "push" or "pull" '
        "(fixture `pd`); implies e2e; push tests run before pull tests",
    )


def pd_mode(item: pytest.Item) -> str | None:
    """The mode of an item's ``pd`` marker, or None if it has none."""
    marker = item.get_closest_marker("pd")
    if marker is None:
        return None
    mode = marker.args[0] if marker.args else marker.kwargs.get("mode")
    if mode not in PD_MODES:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.pd needs 'push' or 'pull'")
    return mode


@pytest.hookimpl(tryfirst=True)  # before `-m` deselection sees the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {None: 0, "push": 1, "pull": 2}
    for item in items:
        if pd_mode(item) is not None and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: rank[pd_mode(item)])
