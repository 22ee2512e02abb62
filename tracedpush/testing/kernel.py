"""The kernel's own counters of one thread, read straight from /proc: the outside oracle
the tests hold `engine.threads` samples and the engines' `tracedpush_thread_*` metrics
to. Written apart from `tracedpush.telemetry.threads` on purpose (a check of that code
must not run it). Linux only."""

from __future__ import annotations

import os
from pathlib import Path


def thread_cpu_s(pid: int, tid: int) -> float:
    """utime + stime of the thread, in seconds (`stat` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_wait_ms(pid: int, tid: int) -> float:
    """The thread's run delay (`schedstat`'s second field: ns runnable without a CPU), in
    ms. The kernel adds a wait as it ends, when the thread gets a CPU."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1]) / 1e6
