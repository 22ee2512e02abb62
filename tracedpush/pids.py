"""Whether a process lives, by pid, in one place. Dependency-free, so any layer may use
it: the launcher sweeping its dead launchers' temp directories (`launcher.engine_tmp`),
the analysis telling a live index lease from a dead one (`analysis.index_lease`)."""

from __future__ import annotations

import os


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
