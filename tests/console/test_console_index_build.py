"""The console builds a big run's cold index in a process of its own (`index_child`).

Streamlit's server is threaded, so the console never forks build workers itself; a
run big enough for them (`index.PARALLEL_BYTES`, lowered here so a small run counts)
is built by a child process that may, and the console then opens the index warm.
Real processes throughout: the child, its forked workers, a parent killed under it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracedpush.analysis import TraceStore, analyze, index_child
from tracedpush.analysis import index as index_mod
from tracedpush.console import data
from tracedpush.console.source import Source
from tracedpush.testing import synthetic
from tracedpush.testing.processes import alive, descendants


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    synthetic.generate(60, seed=3, batch=4).write(d)
    return d


def _feed_run(traces: Path) -> tuple[data.Feed, list[object]]:
    feed = data.Feed(Source.traces([str(traces)]))
    return feed, list(feed.snapshot().run.requests)


def test_a_big_cold_run_is_built_by_a_child_and_opened_warm(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 0)
    built: list[str | None] = []
    real = index_child.build
    monkeypatch.setattr(index_child, "build", lambda p, **kw: built.append(real(p, **kw)))
    feed, got = _feed_run(traces)
    assert built == [None]  # the child built it, and said nothing went wrong
    assert not feed._index.rebuilt  # the console opened what the child built
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)
    _feed_run(traces)  # warm now: no child
    assert built == [None]


def test_a_small_run_is_built_in_the_console_itself(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_child, "build", lambda *_a, **_k: pytest.fail("a child"))
    feed, got = _feed_run(traces)  # 60 requests: far below PARALLEL_BYTES
    assert feed._index.rebuilt
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)


def test_a_child_that_fails_leaves_the_build_to_the_console(
    traces: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(index_child.sys, "executable", "/bin/false")  # a real exit 1
    feed, got = _feed_run(traces)
    assert feed._index.rebuilt
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)
    assert "the index build process failed (exit 1)" in caplog.text


def test_the_child_and_its_workers_end_with_their_parent(tmp_path: Path) -> None:
    """A console killed (SIGKILL: no cleanup of its own) while the child builds: the
    kernel sends the child SIGTERM, and it stops its build workers and ends, the index
    left unbuilt (a child that went on would have finished it). The child and workers
    are frozen (SIGSTOP) from before the kill until after it, so the build cannot
    finish first."""
    d = tmp_path / "traces"
    synthetic.generate(60, seed=4, batch=8).write(d)
    for f in d.rglob("*.jsonl"):  # each span 40 times over: a build of a second or two
        f.write_bytes(f.read_bytes() * 40)
    code = (
        "import sys; from pathlib import Path; from tracedpush.analysis import index_child;"
        "index_child.build([Path(sys.argv[1])])"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(d)])
    below: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(below := descendants(parent.pid)) < 3:  # the child and its 2 workers
            assert parent.poll() is None and time.monotonic() < deadline, below
            time.sleep(0.01)
        for pid in sorted(below):  # the child first
            os.kill(pid, signal.SIGSTOP)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        for pid in below:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while [p for p in below if alive(p)]:
            assert time.monotonic() < deadline, [p for p in below if alive(p)]
            time.sleep(0.1)
        assert index_mod.AnalysisIndex([d]).needs_build()
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in below:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
