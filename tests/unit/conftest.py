"""Fixtures shared by the unit tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory as the launcher reads it (its config's context length alone)."""
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    return d
