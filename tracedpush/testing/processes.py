"""Process checks for tests, read straight from /proc.

Not through the launcher's own process code, so the launcher (which must never leave
orphans) is checked by something it did not write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


def sigint_default() -> None:
    """`preexec_fn` for a child a test stops with SIGINT, as Ctrl-C: SIGINT at its
    default, so Python turns it into KeyboardInterrupt even when the tests run under a
    parent that ignores SIGINT. A script's background job (``(cmd &)`` in a
    non-interactive shell) starts with SIGINT ignored; the child inherits that and
    Python keeps it, so `up` would never see the test's Ctrl-C (three e2e tests hung
    120 s each that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def descendants(root: int) -> set[int]:
    """Every process below `root` now (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@contextmanager
def python_tree(
    code: str, *args: str, below: int, timeout: float = 60.0
) -> Iterator[tuple[subprocess.Popen, set[int]]]:
    """``python -c code args...``, once at least `below` processes run below it: yields
    it and those, and kills whatever of them is still alive on the way out (a test that
    failed leaves nothing behind)."""
    parent = subprocess.Popen([sys.executable, "-c", code, *args])
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + timeout
        while len(seen := descendants(parent.pid)) < below:
            assert parent.poll() is None and time.monotonic() < deadline, seen
            time.sleep(0.01)
        yield parent, seen
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def wait_ended(pids: Iterable[int], timeout: float = 30.0) -> None:
    """Wait until none of `pids` is alive; fails naming those left after `timeout` s."""
    deadline = time.monotonic() + timeout
    while left := [p for p in pids if alive(p)]:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)
