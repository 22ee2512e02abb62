"""Whether a process lives, and what it holds open, by pid, in one place. Dependency-free,
so any layer may use it: the launcher sweeping its dead launchers' temp directories
(`launcher.engine_tmp`) and its engines' leaked shared memory (`launcher.shm`), the
analysis telling a live index lease from a dead one (`analysis.index_lease`) and an
index in use from one that is not (`analysis.index_cache`)."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Signal 0 reaches it (another user's process counts as alive). POSIX only: on
    Windows, signal 0 is CTRL_C_EVENT, so callers there must not ask."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def open_files(pid_dir: Path) -> list[str]:
    """What the descriptors of the process at ``/proc/<pid>`` point at (none: it ended,
    or is not ours to read). Linux."""
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(fd))
        except OSError:  # closed meanwhile
            pass
    return out
