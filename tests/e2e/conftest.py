"""Shared e2e fixtures: a real local 1P1D (vLLM + NIXL + our proxy) per mode, reused.

How to use
----------
Mark a test with its mode and take the ``pd`` fixture; it is the live
:class:`tracedpush.launcher.Deployment` for that mode::

    @pytest.mark.pd("push")
    def test_something(pd):
        pd.proxy_url        # "http://127.0.0.1:18000"  (OpenAI API under /v1)
        pd.prefill_url      # "http://127.0.0.1:18100"
        pd.decode_url       # "http://127.0.0.1:18200"
        pd.model_name       # the "model" to put in requests
        pd.model            # model directory (tokenizer.json lives there)
        pd.traces_dir       # this mode's OTLP JSON-lines dir: <session tmp>/traces/<mode>
        pd.logs             # {"prefill": Path, "decode": Path, "proxy": Path}
        pd.config.trace     # whether the traced connectors are loaded

Both modes: ``pytest.param(mode, marks=pytest.mark.pd(mode))`` (see tests/conftest.py).

Guarantees
----------
* One deployment alive at a time, cached for the session. Asking for the other mode
  stops the current one first (and records how that went, see ``pd_session``); tests are
  reordered so all push tests run before all pull tests, hence at most one start per mode.
* A deployment found unhealthy (an engine died in an earlier test) is restarted before it
  is handed out, and the restart is recorded in ``pd_session.restarts``. A deployment that
  failed to start fails every later test of its mode at once, with the same message.
* Test ports, so a developer's own `tracedpush up` (8000/8100/8200) is not disturbed:
  proxy 18000, prefill 18100, decode 18200, NIXL side channels 15600 / 15700.
* The engines lock (/tmp/tracedpush-engines.lock) is taken when collection finishes, if
  any e2e test is selected (so waiting for another run does not count against a test's
  timeout), and held until the session ends: no other engine run on this machine
  overlaps. A test that starts engines in a subprocess (e.g. `tracedpush up`) passes
  ``lock_delegation_env()`` in its environment so the child runs under this lock.
* Tracing: the traced connectors (``tracedpush.connector``) are used when that module
  exists; ``TRACEDPUSH_E2E_TRACE=1`` requires them, ``=0`` runs vLLM's own connectors.
* Output: a session tmp dir (``pd_session.base``), or ``TRACEDPUSH_E2E_DIR`` to keep it:
  ``<base>/<mode>/{prefill,decode,proxy}.log`` and ``<base>/traces/<mode>/``. When a
  ``pd`` test fails, the tails of the three logs are attached to its report.

Helpers
-------
``tracedpush.launcher.metrics``: ``external_kv_prompt_tokens(url)`` (D's
``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` summed over label
sets), ``wait_external_kv_tokens(url, at_least)``, ``metric_sum(url, name, **labels)``.
The ``kv_tokens`` fixture is ``external_kv_prompt_tokens``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tracedpush.launcher import Deployment, DeploymentConfig, EnginesLock, TeardownReport
from tracedpush.launcher.metrics import external_kv_prompt_tokens
from tracedpush.launcher.processes import busy_ports, tail
from tracedpush.launcher.servers import traced_connectors_available
from tracedpush.testing.processes import alive

TEST_PORTS = {
    "proxy_port": 18000,
    "prefill_port": 18100,
    "decode_port": 18200,
    "prefill_side_channel_port": 15600,
    "decode_side_channel_port": 15700,
}


@dataclass
class Stopped:
    """How one deployment's teardown went, checked independently of the launcher."""

    mode: str
    pids_before: list[int]  # every process in its sessions just before stopping
    alive_after: list[int]  # of those, still alive afterwards (must be empty)
    ports: list[int]
    bound_after: list[int]  # of its ports, bound afterwards (must be empty)
    report: TeardownReport
    engine_tmp_files: int = 0  # files in the engines' temp directory before
    engine_tmp_after: bool = False  # that directory still there afterwards (must not be)

    @property
    def clean(self) -> bool:
        return bool(self.pids_before) and not self.alive_after and not self.bound_after


def _trace_setting() -> bool:
    value = os.environ.get("TRACEDPUSH_E2E_TRACE", "auto")
    if value == "auto":
        return traced_connectors_available()
    return value not in ("0", "false", "no")


@dataclass
class PDSession:
    """The session's single live deployment, switched by mode on demand."""

    base: Path
    model: Path
    trace: bool
    current: Deployment | None = None
    stopped: list[Stopped] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    _lock: EnginesLock = field(default_factory=EnginesLock)
    _locked: bool = False

    def get(self, mode: str) -> Deployment:
        if mode in self.failed:
            pytest.fail(f"the {mode} deployment failed to start earlier:\n{self.failed[mode]}")
        d = self.current
        if d is not None and d.mode == mode:
            health = d.healthy()
            if all(health.values()):
                return d
            why = f"{mode} deployment unhealthy ({health}); restarting"
            self.restarts.append(why)
            warnings.warn(why, stacklevel=2)
        self.stop()
        if not self._locked:
            self._lock.acquire()
            self._locked = True
        config = DeploymentConfig(
            mode=mode,  # type: ignore[arg-type]
            model=self.model,
            run_dir=self.base / mode,
            traces_dir=self.base / "traces" / mode,
            trace=self.trace,
            **TEST_PORTS,
        )
        d = Deployment(config)
        try:
            d.start()
        except Exception as e:
            self.failed[mode] = str(e)
            raise
        self.current = d
        return d

    def stop(self) -> Stopped | None:
        """Stop the live deployment (if any) and record an independent check of it."""
        d, self.current = self.current, None
        if d is None:
            return None
        pids = d.member_pids()
        ports = list(d.ports())
        where = d.engine_tmp
        files = len(list(where.iterdir())) if where else 0
        report = d.stop()
        record = Stopped(
            d.mode,
            pids,
            [p for p in pids if alive(p)],
            ports,
            busy_ports(ports),
            report,
            files,
            bool(where and where.exists()),
        )
        self.stopped.append(record)
        return record

    def close(self) -> Stopped | None:
        try:
            return self.stop()
        finally:
            if self._locked:
                self._lock.release()
                self._locked = False


_SESSION_LOCK = EnginesLock()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(item.get_closest_marker("e2e") for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    _SESSION_LOCK.on_wait = reporter.write_line if reporter else None
    _SESSION_LOCK.acquire()
    session.config.stash[_LOCK_HELD] = True


def pytest_sessionfinish(session: pytest.Session) -> None:
    if session.config.stash.get(_LOCK_HELD, False):
        _SESSION_LOCK.release()


_LOCK_HELD = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def pd_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PDSession]:
    """The session's deployment manager; ``.stopped`` records each teardown's check."""
    from tracedpush.model.build import ensure_model

    keep = os.environ.get("TRACEDPUSH_E2E_DIR")
    base = Path(keep).absolute() if keep else tmp_path_factory.mktemp("pd")
    model = ensure_model(os.environ.get("TRACEDPUSH_MODEL"))
    session = PDSession(base=base, model=model, trace=_trace_setting())
    yield session
    last = session.close()
    if last is not None and not last.clean:
        pytest.fail(f"final teardown left processes or ports behind: {last}")


@pytest.fixture
def pd(request: pytest.FixtureRequest, pd_session: PDSession) -> Deployment:
    """The live deployment for the test's ``@pytest.mark.pd(mode)``."""
    marker = request.node.get_closest_marker("pd")
    if marker is None:
        pytest.fail('the `pd` fixture needs @pytest.mark.pd("push") or pd("pull")')
    return pd_session.get(marker.args[0] if marker.args else marker.kwargs["mode"])


@pytest.fixture
def kv_tokens() -> Callable[[str], int]:
    """``kv_tokens(url)``: the engine's external_kv_transfer prompt-token counter."""
    return external_kv_prompt_tokens


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "pd" not in getattr(item, "funcargs", {}):
        return
    deployment = item.funcargs["pd"]
    for name, path in deployment.logs.items():
        report.sections.append((f"{name}.log (last lines; {path})", tail(path, 30)))
