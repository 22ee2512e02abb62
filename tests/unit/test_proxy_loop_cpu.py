"""The proxy's event-loop CPU clock (tracedpush.proxy.loop_cpu), on this machine's kernel.

The clock is Linux's per-thread schedstat, read for real; the starved thread is a real
process sharing one core with two busy ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tracedpush.proxy.loop_cpu import CpuSample, LoopCpu, spent_ms

# A child pinned to one core beside two busy processes: it busy-loops for WALL_S of wall
# time and prints how it spent them, by the clock under test.
CHILD = """
import json, os, sys, time
from tracedpush.proxy.loop_cpu import LoopCpu, spent_ms
os.sched_setaffinity(0, {int(sys.argv[1])})
clock = LoopCpu()
before, t0 = clock.sample(), time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[2]):
    pass
after, wall = clock.sample(), time.perf_counter() - t0
print(json.dumps({"spent": spent_ms(before, after), "wall_ms": wall * 1e3}))
"""
BUSY = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
WALL_S = 0.6

linux_only = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat"), reason="needs Linux's schedstat"
)


@linux_only
@pytest.mark.serial  # it loads one core on purpose
def test_a_thread_sharing_its_core_with_two_busy_ones_is_seen_waiting() -> None:
    core = max(os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY, str(core)]) for _ in range(2)]
    try:
        time.sleep(0.3)  # both running
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(core), str(WALL_S)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    result = json.loads(out.stdout)
    on_cpu, waited = result["spent"]
    print(f"wall {result['wall_ms']:.0f} ms: on a CPU {on_cpu:.0f} ms, waiting {waited:.0f} ms")
    # a third of the core each: about 2/3 of the wall waiting. Running or runnable, the
    # thread never slept: the two add up to the wall time
    assert waited > 0.3 * result["wall_ms"]
    assert on_cpu + waited == pytest.approx(result["wall_ms"], rel=0.1)


@linux_only
def test_samples_grow_with_the_threads_own_work() -> None:
    clock = LoopCpu()
    first = clock.sample()
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.02:
        pass
    second = clock.sample()
    assert isinstance(first, CpuSample) and isinstance(second, CpuSample)
    spent = spent_ms(first, second)
    assert spent is not None and spent[0] >= 15.0 and spent[1] >= 0.0
    clock.close()


@linux_only
def test_only_the_thread_that_opened_it_samples() -> None:
    """Another thread's read would give the loop's figures at an unrelated moment."""
    clock = LoopCpu()
    assert clock.sample() is not None
    seen: list[CpuSample | None] = []
    thread = threading.Thread(target=lambda: seen.append(clock.sample()))
    thread.start()
    thread.join()
    assert seen == [None]
    clock.close()


def test_a_system_without_schedstat_gives_no_samples() -> None:
    clock = LoopCpu("/nonexistent/schedstat")
    assert clock.sample() is None and clock.sample() is None
    assert spent_ms(None, CpuSample(1, 2)) is None
    assert spent_ms(CpuSample(1_000_000, 0), CpuSample(3_000_000, 500_000)) == (2.0, 0.5)
