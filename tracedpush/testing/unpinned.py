"""A push 1P1D of its own for the e2e tests that run one outside the shared deployments:
`test_contention`, which needs the engines unpinned (their API servers and EngineCores
floating over both cores, as the launcher's old partial pinning left them), and
`test_late_registration`, which holds D's API server itself (and `test_api_key`, whose
engines need a key). Each runs before the shared deployments start, on these ports, under
the session's engines lock. All also check,
with the report's trace completeness, that the stop let every process flush
(`check_flushed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis.export_health import ExportHealth
from tracedpush.launcher import Deployment, DeploymentConfig
from tracedpush.launcher.affinity import PIN_ENV
from tracedpush.launcher.servers import traced_connectors_available
from tracedpush.model.build import ensure_model

PORTS = {
    "proxy_port": 18300,
    "prefill_port": 18400,
    "decode_port": 18500,
    "prefill_side_channel_port": 15800,
    "decode_side_channel_port": 15900,
}


def push_config(tmp_path: Path, **more: Any) -> DeploymentConfig:
    """A traced push deployment with tree pinning off (`more`: other config fields);
    skips the test where the traced connectors are not installed."""
    if not traced_connectors_available():
        pytest.skip("the traced connectors are not installed")
    return DeploymentConfig(
        mode="push",
        model=ensure_model(None),
        run_dir=tmp_path / "run",
        traces_dir=tmp_path / "traces",
        trace=True,
        env={PIN_ENV: "0"},
        **PORTS,
        **more,
    )


def check_flushed(health: ExportHealth, d: Deployment) -> None:
    """Every engine process of the 1P1D (P and D, scheduler and worker) and the proxy
    wrote its final export record as the deployment `d` stopped; the message names what
    vLLM killed (an EngineCore killed when its --shutdown-timeout ran out loses that
    record; a worker it killed has usually flushed)."""
    engines = [a for a in health.accounts if a.service != sc.SERVICE_PROXY]
    assert len(engines) == 4 and len(health.accounts) == 5, health.lines()  # + the proxy
    assert health.unflushed == [], (health.lines(), {"vLLM killed": d.vllm_killed})
    cores_killed = {n: k for n, k in d.vllm_killed.items() if k != ["workers"]}
    assert cores_killed == {}, d.vllm_killed  # each lost its scheduler's last spans
