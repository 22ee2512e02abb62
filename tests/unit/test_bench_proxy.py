"""benchmarks/bench_proxy.py with a few requests: A B B A order, each side's own proxy
(its checkout, not the installed tracedpush), the figures it writes. Real git worktrees,
real `tracedpush proxy` processes, stub engines; the timings are not asserted (that is
the script's job)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling benches
import bench_abba  # noqa: E402
import bench_proxy  # noqa: E402

from tracedpush.testing.stub_processes import stub_engines  # noqa: E402

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode,
    reason="needs the repository's git history (a clone, not an exported tree)",
)


def test_head_against_itself_in_abba_order(tmp_path: Path) -> None:
    out = tmp_path / "proxy.json"
    argv = ["--a", "HEAD", "--b", "HEAD", "--requests", "3", "--warm", "1", "--rounds", "1"]
    assert bench_proxy.main([*argv, "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert got["sides"]["A"]["commit"] == got["sides"]["B"]["commit"] == head
    runs = {name: side["runs"] for name, side in got["sides"].items()}
    assert [len(r) for r in runs.values()] == [2, 2]  # A B B A
    assert all(r["wall_ms_per_request"] > 0 for side in runs.values() for r in side)
    a, b = (sum(r["cpu_ms_per_request"] for r in runs[s]) / 2 for s in ("A", "B"))
    # three requests can cost less than the kernel's CPU tick: then there is no ratio (CI
    # once divided by zero here)
    assert got["cpu_ratio_b_over_a"] == (pytest.approx(b / a, abs=1e-3) if a else None)
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert "bench-proxy-" not in listed  # the checkouts are gone


def test_each_side_runs_its_own_proxy(tmp_path: Path) -> None:
    """Side A is HEAD with its proxy's ready line changed: were both sides run from the
    installed tracedpush, neither log would have it."""
    a = bench_abba._checkout("A", "HEAD", tmp_path)
    b = bench_abba._checkout("B", "HEAD", tmp_path)
    try:
        command = a.code / "tracedpush" / "proxy" / "command.py"
        text = command.read_text()
        assert "tracedpush proxy ready on" in text
        command.write_text(text.replace("tracedpush proxy ready on", "side A's proxy ready on"))
        with stub_engines("push") as stubs:
            for side in (a, b):
                got = bench_proxy._measure(side, "push", stubs, 2, 1)
                assert got["cpu_ms_per_request"] >= 0 and got["wall_ms_per_request"] > 0
        logs = {s.name: next(s.work.glob("run-*/proxy.log")).read_text() for s in (a, b)}
        assert "side A's proxy ready on" in logs["A"]
        assert "side A's" not in logs["B"] and "tracedpush proxy ready on" in logs["B"]
        # each wrote its trace files in its own run directory
        assert all(any(s.work.glob("run-*/traces/*")) for s in (a, b))
    finally:
        bench_abba._remove(a)
        bench_abba._remove(b)
