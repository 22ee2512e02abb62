"""benchmarks/bench_report.py's measurement of one command: the build's timeline the
command prints (`index_build.BUILD_TIMES`, as `_REPORT` prints it) comes back as seconds
from the command's start, in order, ending at its wall time; a command that prints
none (older code, a warm report) has no timeline. Real processes; a stand-in script
prints the lines, since a real cold build is the script's own job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their sibling benches
import bench_report  # noqa: E402

from tracedpush.analysis import index_build  # noqa: E402

_PRINTS = """import sys, time
t = time.time()
for i, stretch in enumerate({stretches!r}):
    print("build_time", stretch, t + 0.1 * i, file=sys.stderr)
print("VmHWM", 1000, file=sys.stderr)
time.sleep(0.7)
"""


def test_timeline_is_seconds_from_the_command_start() -> None:
    script = _PRINTS.format(stretches=index_build.TIMELINE)
    got = bench_report.measure([sys.executable, "-c", script])
    timeline = got["timeline_s"]
    assert list(timeline) == [*index_build.TIMELINE, "end"]  # as printed
    times = list(timeline.values())
    assert times == sorted(times)  # the stand-in printed them in order
    assert 0 <= timeline["start"] < 5  # from this command's start, not the epoch
    assert timeline["built"] - timeline["start"] == pytest.approx(0.6, abs=0.02)
    assert timeline["end"] == got["wall_s"] and timeline["end"] >= timeline["start"] + 0.7


def test_no_timeline_without_a_build() -> None:
    got = bench_report.measure([sys.executable, "-c", _PRINTS.format(stretches=())])
    assert "timeline_s" not in got
