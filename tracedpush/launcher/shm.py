"""Shared-memory segments the engines leave behind, removed when a deployment stops.

vLLM's message queues between an engine's processes are POSIX shared-memory segments
(``/dev/shm/psm_<hex>``, 240 MB each as `ls` shows them, sparse), created by Python's
`multiprocessing.shared_memory` and unlinked on a clean exit only; its locks are named
semaphores (``/dev/shm/sem.mp-<name>``). An engine killed outright (a crash, the OOM
killer, a fault test) leaves them: two segments for each decode engine the fault tests
kill, and about 90 segments and 40 semaphores in /dev/shm after a day of runs and tests
here.

So a deployment lists the segments there as it starts (`names`) and, once it has
stopped with no process left, removes the new ones (`remove_new`) that belong to its
user and that no live process maps or holds open: those are the leaked ones; a segment
another program is using is never touched. Linux only (``/proc``); elsewhere nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from tracedpush import pids

SHM = Path("/dev/shm")
# multiprocessing's names: shared_memory segments, and named semaphores (locks)
PREFIXES = ("psm_", "sem.mp-")
PROC = Path("/proc")


def names(root: Path = SHM) -> set[str]:
    """The shared-memory segments and named semaphores there now."""
    try:
        return {p.name for p in root.iterdir() if p.name.startswith(PREFIXES)}
    except OSError:
        return set()


def in_use(root: Path = SHM, proc: Path = PROC) -> set[str]:
    """Names of the segments under `root` some live process maps or has open (the
    processes this user may look into)."""
    where = str(root) + os.sep
    used: set[str] = set()
    try:
        procs = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return used
    for pid in procs:
        try:
            with (pid / "maps").open() as fh:
                for line in fh:
                    at = line.find(where)
                    if at >= 0:
                        used.add(line[at + len(where) :].split()[0])
        except OSError:
            pass
        for target in pids.open_files(pid):
            if target.startswith(where):
                used.add(target[len(where) :].split()[0])
    return used


def remove_new(before: set[str], root: Path = SHM, proc: Path = PROC) -> list[str]:
    """Remove the segments that were not there `before`, are this user's and are in no
    live process's use; their names."""
    if not proc.is_dir():
        return []
    new = names(root) - before
    if not new:
        return []
    used = in_use(root, proc)
    gone = []
    for name in sorted(new - used):
        path = root / name
        try:
            if path.stat().st_uid != os.getuid():
                continue
            path.unlink()
        except OSError:
            continue
        gone.append(name)
    return gone
