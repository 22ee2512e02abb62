"""End a child process with its parent: Linux's ``PR_SET_PDEATHSIG``, in one place.

Why: the launcher's servers and the console's index-build child must not outlive the
process that started them, even one SIGKILLed before it could tear down. The kernel
sends the child a signal when its parent thread ends; this module asks for it.
Dependency-free (ctypes only), so any layer may use it, a child between fork and exec
included.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent(sig: int = signal.SIGTERM) -> bool | None:
    """Have the kernel send `sig` to this process when its parent ends.

    True: set, and the parent is alive. False: the parent had already ended (this
    process was re-parented to init before the call), so nobody will send it: the
    caller should exit. None: not available here (not Linux), the caller's own wait
    on its parent is all there is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return os.getppid() != 1
