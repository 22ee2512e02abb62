"""Measured figures of a test, one JSON line per test, for scripts that report them.

A test takes the ``figures`` fixture (tests/conftest.py) and records what it measured
beside what it prints::

    figures.record(requests_failed=4, answered_within_s=1.7)

With ``TRACEDPUSH_FIGURES=<path.jsonl>`` set, the fixture appends one line per test when
the test ends (also when it fails, with what was recorded up to then)::

    {"nodeid": "tests/e2e/test_faults.py::test_x[push]", "test": "test_x",
     "params": {"mode": "push"}, "outcome": "passed", "when": "2026-12-01T10:00:00",
     "figures": {"requests_failed": 4, "answered_within_s": 1.7}}

Without it nothing is written. benchmarks/reliability.py reads these lines.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

ENV = "TRACEDPUSH_FIGURES"

Scalar = int | float | str | bool | None
_SCALARS = (int, float, str, bool, type(None))


class Figures:
    """The figures one test recorded; written as one JSON line by :meth:`write`."""

    def __init__(
        self,
        nodeid: str,
        test: str,
        params: dict[str, Any] | None = None,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.nodeid = nodeid
        self.test = test
        self.params: dict[str, Scalar] = {
            k: v if isinstance(v, _SCALARS) else str(v) for k, v in (params or {}).items()
        }
        self.path = Path(path) if path else None
        self.values: dict[str, Scalar] = {}

    @classmethod
    def from_env(cls, nodeid: str, test: str, params: dict[str, Any] | None = None) -> Figures:
        """A recorder that writes to ``$TRACEDPUSH_FIGURES`` if set, else nowhere."""
        return cls(nodeid, test, params, os.environ.get(ENV) or None)

    @property
    def enabled(self) -> bool:
        """Whether :meth:`write` appends a line (the env var was set)."""
        return self.path is not None

    def record(self, **figures: Scalar) -> None:
        """Add or overwrite named figures: numbers, strings, booleans or None."""
        for name, value in figures.items():
            if not isinstance(value, _SCALARS):
                raise TypeError(f"figure {name!r}: {type(value).__name__} is not a scalar")
            if isinstance(value, float) and not math.isfinite(value):
                value = None  # JSON has no NaN or infinity
            self.values[name] = value

    def line(self, outcome: str) -> dict[str, Any]:
        """The JSON object :meth:`write` appends."""
        return {
            "nodeid": self.nodeid,
            "test": self.test,
            "params": self.params,
            "outcome": outcome,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "figures": self.values,
        }

    def write(self, outcome: str) -> None:
        """Append this test's line (one ``write`` call) if enabled; otherwise nothing."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(self.line(outcome)) + "\n")


def read_figures(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line a run appended to ``path`` (none if the file does not exist)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]
