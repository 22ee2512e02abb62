"""What vLLM's stop of an engine may take, and what its log says it killed.

The log lines (tests/data/vllm-stop) are vLLM 0.32's own: a real prefill engine's stop
(session 53), and for the kills, which a stop within its budget does not print, the
format strings of `vllm.v1.utils.shutdown` and `MultiprocExecutor`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tracedpush.launcher import Deployment, DeploymentConfig, engine_stop
from tracedpush.launcher.processes import ManagedProcess, latest_start

LOGS = Path(__file__).parents[1] / "data" / "vllm-stop"
STOP_IN_ORDER = (LOGS / "in-order.log").read_text()
CORE_KILLED = (LOGS / "core-killed.log").read_text()
WORKERS_KILLED = (LOGS / "workers-killed.log").read_text()
STARTED = "# 2026-12-07 03:51:33 python -m tracedpush.launcher.vllm_entry --model m\n"


def test_the_budget_covers_the_drain_and_vllms_teardown(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(engine_stop.WORKER_GRACE_ENV, raising=False)
    assert engine_stop.teardown_s() == 5 + 4 + 8  # workers' grace, SIGTERM, EngineCore
    assert engine_stop.shutdown_timeout(10) == 27
    assert engine_stop.shutdown_timeout(10, {engine_stop.WORKER_GRACE_ENV: "1"}) == 23
    assert engine_stop.teardown_s({engine_stop.WORKER_GRACE_ENV: "-3"}) == 12


@pytest.mark.parametrize(
    ("text", "killed"),
    [
        (STOP_IN_ORDER, []),
        (STOP_IN_ORDER + WORKERS_KILLED + CORE_KILLED, ["EngineCore", "workers"]),
        (STOP_IN_ORDER + CORE_KILLED, ["EngineCore"]),
        # a kill in an earlier stop of the same log (a respawned engine) is not this one's
        (CORE_KILLED + STOP_IN_ORDER, []),
        # nor one before the engine's latest start (a run directory used again), even
        # when this run's engine left no stop line (killed by the launcher)
        (STOP_IN_ORDER + CORE_KILLED + STARTED + "INFO serving\n", []),
        (STOP_IN_ORDER + STARTED + WORKERS_KILLED, ["workers"]),
        ("", []),
    ],
)
def test_what_vllm_killed_is_read_from_the_last_stop_in_its_log(
    tmp_path: Path, text: str, killed: list[str]
):
    log = tmp_path / "prefill.log"
    log.write_text("INFO serving\n" * 1000 + text)
    assert engine_stop.forced_kills(log) == killed
    assert engine_stop.forced_kills(tmp_path / "none.log") == []


def test_the_stop_names_an_engine_vllm_killed_and_what_that_lost(model: Path, tmp_path: Path):
    """An EngineCore killed by vLLM loses its scheduler's final export record without a
    word in the launcher's output; the stop says so, per engine. The engines here are
    never started (their logs stand in for a real stop's: see the module docstring)."""
    lines: list[str] = []
    d = Deployment(
        DeploymentConfig(mode="push", model=model, run_dir=tmp_path), log=lines.append, lock=False
    )
    d.processes = [d.engine_process(e)[0] for e in d.engines]
    d.run_dir.mkdir(parents=True, exist_ok=True)
    d.logs["prefill"].write_text(STOP_IN_ORDER + WORKERS_KILLED + CORE_KILLED)
    d.logs["decode"].write_text(STOP_IN_ORDER)
    d.stop()
    assert d.vllm_killed == {"prefill": ["EngineCore", "workers"]}
    said = [line for line in lines if "vLLM killed" in line]
    assert len(said) == 2 and all(line.startswith("prefill: ") for line in said), lines
    budget = d.config.shutdown_timeout_for("prefill")
    assert any(f"--shutdown-timeout of {budget}s" in s and "final export" in s for s in said)
    assert any("--prefill-arg=--shutdown-timeout=N" in s for s in said)
    d.stop()  # a second stop says nothing again
    assert len([line for line in lines if "vLLM killed" in line]) == 2


def test_a_servers_latest_start_is_found_in_its_appended_log(tmp_path: Path):
    """The line `ManagedProcess.start` writes is what `latest_start` finds: a server
    started twice into one log (a respawn) has only its second run after it."""
    proc = ManagedProcess("x", [sys.executable, "-c", "print('served')"], tmp_path / "x.log")
    for start in (lambda: proc.start(dict(os.environ)), proc.restart):
        start()
        assert proc.popen is not None and proc.popen.wait(30) == 0
    text = (tmp_path / "x.log").read_text()
    assert text.count("served\n") == 2 and latest_start(text).count("served\n") == 1
    assert latest_start(text).startswith("# ") and latest_start("no start\n") == "no start\n"
