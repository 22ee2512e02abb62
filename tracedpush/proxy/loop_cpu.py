"""How long the proxy's event loop waited for a CPU, per leg.

Why. The proxy's own time on a request's critical path (receipt -> a leg's bytes out)
is its work on that request, its work on the requests ahead of it on the one event
loop, and any time the loop thread was runnable but had no CPU. On a machine whose
cores the engines busy-poll, the last can be most of it: the legs of a burst of four
requests left 26-220 ms after their receipt here (781 ms once in CI), for work that takes
the proxy a few ms on an idle core. Those are different causes with different cures (a
faster proxy, or a core for it), so each ``request_sent`` event says how the loop spent
the time since the request's receipt.

How. Linux's per-thread ``/proc/thread-self/schedstat`` gives the thread's time runnable
on a run queue (``run_delay``), cumulative, in ns, up to date whenever the thread itself
reads it (it is added as the thread gets a CPU). The file is opened once, from the
loop's thread (``thread-self`` is resolved at open), and read with ``pread`` at offset
0, once at a request's receipt and once at each leg's send: about 3 us a sample here,
with the thread's time on a CPU from ``time.thread_time_ns()`` (schedstat's own run time
lags the running thread by up to a scheduler tick, 4 ms here).
Where the file is missing (macOS, Windows, a kernel without schedstats) the samples are
None and the events carry no CPU attributes.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

SCHEDSTAT = "/proc/thread-self/schedstat"


class CpuSample(NamedTuple):
    """Cumulative ns of one thread: on a CPU, and runnable without one."""

    run_ns: int
    wait_ns: int


class LoopCpu:
    """The schedstat of the thread that first samples it (the event loop's)."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self._path = path
        self._fd: int | None = None
        self._thread: int | None = None
        self._failed = False

    def sample(self) -> CpuSample | None:
        """Now's sample, or None when this system cannot say. Only from the opening thread
        (another thread's sample would be the loop's, read at an unrelated moment)."""
        if self._failed:
            return None
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self._failed = True
                return None
            self._thread = threading.get_ident()
        if threading.get_ident() != self._thread:
            return None
        try:
            run_delay = int(os.pread(self._fd, 128, 0).split()[1])
            return CpuSample(time.thread_time_ns(), run_delay)
        except (OSError, ValueError, IndexError):
            self.close()
            self._failed = True
            return None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def spent_ms(since: CpuSample | None, until: CpuSample | None) -> tuple[float, float] | None:
    """(ms on a CPU, ms waiting for one) between two samples of the same thread."""
    if since is None or until is None:
        return None
    return (until.run_ns - since.run_ns) / 1e6, (until.wait_ns - since.wait_ns) / 1e6
