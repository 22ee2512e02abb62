"""`forked.ordered_map`: work in forked processes, results in order, children ended;
an analysis index in a child opens its own SQLite connections."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracedpush.analysis import forked
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.testing import synthetic
from tracedpush.testing.processes import sigint_default

pytestmark = pytest.mark.skipif(not forked.can_fork(), reason="needs fork")


def _square_where(x: int) -> tuple[int, int]:
    time.sleep(0.01 * (x % 3))  # out of step, so order is the map's, not the finish's
    return x * x, os.getpid()


def _children_ended() -> bool:
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not multiprocessing.active_children()


def test_results_in_order_from_other_processes():
    got = list(forked.ordered_map(_square_where, range(40), 2))
    assert [v for v, _pid in got] == [x * x for x in range(40)]
    pids = {pid for _v, pid in got}
    assert pids and os.getpid() not in pids
    assert _children_ended()
    assert [v for v, _ in forked.ordered_map(_square_where, range(5), 1)] == [0, 1, 4, 9, 16]


def _fails_at_7(x: int) -> int:
    if x == 7:
        raise ValueError("seven")
    return x


def test_an_error_in_a_child_is_raised_here_and_ends_the_children():
    with pytest.raises(ValueError, match="seven"):
        list(forked.ordered_map(_fails_at_7, range(100), 2))
    assert _children_ended()
    assert list(forked.ordered_map(_fails_at_7, range(3), 2)) == [0, 1, 2]  # usable again


def test_stopping_early_ends_the_children():
    taken = forked.ordered_map(_square_where, range(10_000), 2)
    assert [next(taken)[0] for _ in range(3)] == [0, 1, 4]
    taken.close()
    assert _children_ended()


def test_an_index_in_a_child_opens_its_own_connections(tmp_path: Path):
    """Connections the parent opened are not used in a child (SQLite forbids it): the
    child's index has none until it opens its own, reads through them, and the
    parent's still work afterwards."""
    d = tmp_path / "traces"
    synthetic.generate(12, seed=5).write(d)
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    run = idx.update()
    tids = [r.trace_id for r in run.requests]
    parent_db, parent_shard = idx._connect(), idx.span_db(0)

    def job(tid: str) -> tuple[bool, int]:
        n = len(idx._load_spans([tid])[tid])  # through connections of its own
        inherited = idx._db is parent_db or parent_shard in idx._span_dbs.values()
        return inherited, n

    got = list(forked.ordered_map(job, tids, 2))
    assert not any(inherited for inherited, _n in got)
    assert [n for _f, n in got] == [len(idx._load_spans([t])[t]) for t in tids]
    assert idx._db is parent_db and idx.span_db(0) is parent_shard
    assert parent_db.execute("SELECT count(*) FROM meta").fetchone()[0] > 0
    idx.close()


_CTRL_C = """
import sys, time
from tracedpush.analysis import forked

def slow(x):
    time.sleep(0.05)
    return x

for i, _ in enumerate(forked.ordered_map(slow, range(100_000), 2)):
    if i == 3:
        print("started", flush=True)
"""


def test_ctrl_c_is_the_parents_alone_and_ends_the_children():
    """A terminal sends SIGINT to the whole process group: the children ignore it (each
    printed a traceback before), the parent stops and ends them; none is left."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
        preexec_fn=sigint_default,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert "ForkPoolWorker" not in err
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    assert left.stdout.split() == []
