"""Local P/D deployments: vLLM prefill/decode engines plus the proxy (`tracedpush up`).

``Deployment`` / ``DeploymentConfig`` are the Python API; ``servers`` builds the command
lines, ``processes`` owns starting, health waits and leftover-free teardown.
"""

from tracedpush.launcher.deployment import Deployment, DeploymentConfig
from tracedpush.launcher.processes import EnginesLock, LaunchError, TeardownReport

__all__ = ["Deployment", "DeploymentConfig", "EnginesLock", "LaunchError", "TeardownReport"]
