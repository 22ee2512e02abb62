"""Helpers the e2e tests share: waiting for a run's traces to be complete.

(Process checks from /proc live in `tracedpush.testing.processes`.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tracedpush.analysis import RequestAnalysis, RunAnalysis, TraceStore, analyze


def wait_for_traces(
    traces_dir: Path,
    ids: set[str],
    *,
    timeout_s: float = 120.0,
    ready: Callable[[RequestAnalysis], bool] = lambda r: r.complete,
) -> TraceStore:
    """Exporters flush in the background: re-read `traces_dir` until every request in
    `ids` has a trace that is `ready` (default: complete); the store, loaded."""
    store = TraceStore.from_path(traces_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        mine = requests_in(analyze(store, spans=False), ids)
        if len(mine) == len(ids) and all(ready(r) for r in mine):
            return store
        if time.monotonic() > deadline:
            problems = {r.request_id: r.problems for r in mine if not ready(r)}
            pytest.fail(
                f"{len(mine)}/{len(ids)} traces after {timeout_s:.0f} s; not ready: {problems}"
            )
        time.sleep(1.0)
        store.refresh()


def requests_in(run: RunAnalysis, ids: set[str]) -> list[RequestAnalysis]:
    return [r for r in run.requests if r.request_id in ids]
