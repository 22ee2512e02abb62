"""Suite-wide pytest setup: markers, and the order that lets e2e tests share engines.

Markers
-------
``e2e``
    Launches real vLLM engines with NIXL (slow, about a minute per deployment). Every
    test under tests/e2e/ has it. ``pytest -m "not e2e"`` runs the unit tests only.
``serial``
    Asserts a latency or CPU bound, so it must not share the machine with other tests:
    ``make test`` (scripts/run_tests.sh) runs the other unit and console tests on a
    pytest-xdist worker per core, then the ``serial`` and ``e2e`` tests in one process.
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

Figures
-------
The ``figures`` fixture records a test's measured figures (``figures.record(name=value)``)
as one JSON line per test in ``$TRACEDPUSH_FIGURES`` when that is set, and does nothing
otherwise (tracedpush/testing/figures.py; read by benchmarks/reliability.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tracedpush import envs
from tracedpush.testing.figures import Figures

PD_MODES = ("push", "pull")
E2E_DIR = Path(__file__).parent / "e2e"


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
        in_e2e = E2E_DIR in item.path.parents
        if (in_e2e or pd_mode(item) is not None) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: rank[pd_mode(item)])


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item, for ``figures`` to say how the test went."""
    outcome = yield
    report = outcome.get_result()
    item.stash.setdefault(_REPORTS, {})[report.when] = report


def run_outcome(item: pytest.Item) -> str:
    """The call's outcome (passed, failed, skipped); "error" if setup failed; else "unknown"."""
    reports = item.stash.get(_REPORTS, {})
    if "call" in reports:
        return reports["call"].outcome
    setup = reports.get("setup")
    if setup is None:
        return "unknown"
    return "error" if setup.failed else setup.outcome


@pytest.fixture
def slow_build_traces(tmp_path: Path) -> Path:
    """A traces directory whose parallel index build takes a second or two (60 requests,
    each span 40 times over): long enough to stop or kill mid-build."""
    from tracedpush.testing import synthetic

    d = tmp_path / "traces"
    synthetic.generate(60, seed=4, batch=8).write(d)
    for f in d.rglob("*.jsonl"):
        f.write_bytes(f.read_bytes() * 40)
    return d


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """The test's measured figures: one JSON line in ``$TRACEDPUSH_FIGURES`` if set."""
    callspec = getattr(request.node, "callspec", None)
    recorder = Figures.from_env(
        request.node.nodeid,
        request.node.originalname,
        dict(callspec.params) if callspec else None,
    )
    yield recorder
    recorder.write(run_outcome(request.node))


@pytest.fixture(autouse=True)
def _no_index_dir_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TRACEDPUSH_INDEX_ROOT in the shell that runs the tests would move every report's
    and console's analysis index (tests that want one set it themselves)."""
    monkeypatch.delenv(envs.INDEX_ROOT, raising=False)
