"""The OS view of a thread: its wait for a CPU, read as the kernel keeps it.

Two real busy processes share one core, so each waits for it about half the time; the
sample's wait must be the kernel's `schedstat` run delay of that thread (read again
right after, as an outside check), and CPU plus wait must cover the time they ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracedpush.telemetry.threads import sample_process
from tracedpush.testing.kernel import thread_wait_ms

BUSY_S = 1.5  # each child spins this long on the shared core
SAMPLE_AFTER_S = 1.0
# a thread's run delay grows when a wait ends (as it gets a CPU), by the whole wait: one
# in progress at a read shows up at once later (a scheduler period or so; this is ample)
STRETCH_MS = 100.0

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/schedstat").exists(), reason="the kernel keeps no schedstats"
)


def test_two_spinners_on_one_core_each_wait_about_half_the_time() -> None:
    core = min(os.sched_getaffinity(0))
    spin = (
        f"import os, time; os.sched_setaffinity(0, {{{core}}}); t = time.monotonic()\n"
        f"while time.monotonic() - t < {BUSY_S}: pass"
    )
    kids = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        time.sleep(SAMPLE_AFTER_S)
        read_from = time.monotonic()
        rows = {k.pid: sample_process(k.pid, "api_server", None) for k in kids}
        kernel = {k.pid: thread_wait_ms(k.pid, k.pid) for k in kids}  # the oracle, just after
        between_ms = (time.monotonic() - read_from) * 1000
    finally:
        for k in kids:
            k.wait(timeout=30)
    for pid, got in rows.items():
        (main,) = [r for r in got if r.tid == pid]
        assert main.role == "api_server" and main.affinity == str(core)
        # ours was read first, the kernel's a moment later: a wait grows no faster than
        # the clock, but the kernel adds a waiting stretch when it ends (`STRETCH_MS`)
        grown = kernel[pid] - main.wait_ms
        assert 0 <= grown <= between_ms + STRETCH_MS, (main.wait_ms, kernel[pid])
        # sharing a core, each spun for about half the time it was runnable
        assert main.wait_ms > 0.2 * SAMPLE_AFTER_S * 1000, main
        assert main.cpu_ms > 0.2 * SAMPLE_AFTER_S * 1000, main


def test_a_thread_that_is_gone_has_no_row() -> None:
    kid = subprocess.Popen([sys.executable, "-c", "pass"])
    kid.wait(timeout=30)
    assert sample_process(kid.pid, "worker", None) == []
