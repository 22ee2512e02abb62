"""Batches of work in forked processes, their results in order, a few in flight.

An export of a whole run from the analysis index spends most of its time making each
request again from its stored spans and encoding it, all of it in Python on one core
(a JSON report of 200,000 requests: about 50 s; a Perfetto file: about 100 s). A
forked child inherits the index as it is (nothing to pickle or load again) and hands
back only its batch's result (text, or a Perfetto file's events before their ids).
SQLite connections are not carried over: `AnalysisIndex` forgets its own in a child,
which opens new ones.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

AHEAD = 2  # batches in flight per worker: bounds what waits in the parent's memory
_JOB: Callable[[Any], Any] | None = None  # the function the children run (set before they fork)


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``map(fn, items)``, with `fn` run in `workers` forked processes (in this one when
    `workers` <= 1 or fork is not available). The children are forked when the first
    result is asked for, so they see this process as it is then. Stopping early (an
    error in `fn`, raised here, or Ctrl-C, which only this process takes) ends the
    children."""
    if workers <= 1 or not can_fork():
        yield from map(fn, items)
        return
    global _JOB
    if _JOB is not None:
        raise RuntimeError("ordered_map is already running in this process")
    _JOB = fn
    try:
        with multiprocessing.get_context("fork").Pool(workers, _quiet) as pool:
            todo = iter(items)
            pending: deque[Any] = deque()
            for item in todo:
                pending.append(pool.apply_async(_run, (item,)))
                if len(pending) >= workers * AHEAD:
                    break
            while pending:
                got = pending.popleft().get()
                for item in todo:  # one more for the one done
                    pending.append(pool.apply_async(_run, (item,)))
                    break
                yield got
    finally:
        _JOB = None


def reported(
    parts: Iterable[tuple[int, R]],
    total: int,
    every: int,
    progress: Callable[[int, int], None] | None,
) -> Iterator[tuple[int, R]]:
    """`parts` ((how many items, their result), in order, as `ordered_map` of batches
    gives them) passed on, with ``progress(done, total)`` once each part is taken, when
    it passes a multiple of `every` or ends the whole: how an export says how far it is."""
    done = 0
    for n, got in parts:
        yield n, got
        before, done = done, done + n
        if progress is not None and (done // every > before // every or done == total):
            progress(done, total)


def _quiet() -> None:
    """A child leaves Ctrl-C to the parent, which ends it (a terminal sends SIGINT to
    the whole process group: each child printed its own traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(item: Any) -> Any:
    assert _JOB is not None
    return _JOB(item)
