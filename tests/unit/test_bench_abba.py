"""benchmarks/bench_abba.py on a small synthetic run: the order it measures in, that each
side runs its own checkout (not the installed tracedpush), and that it notices when the
two sides report different things. Real git worktrees and real `tracedpush report`
processes; the timings themselves are not asserted (that is the script's job)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its sibling benches
import bench_abba  # noqa: E402

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode,
    reason="needs the repository's git history (a clone, not an exported tree)",
)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("abba") / "traces"
    bench_abba._write_traces(300, d)
    return d


def test_head_against_itself_in_abba_order(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "abba.json"
    argv = ["--a", "HEAD", "--b", "HEAD", "--traces", str(traces), "--out", str(out)]
    assert bench_abba.main([*argv, "--stage", "warm", "--stage", "compare", "--calls", "2"]) == 0
    got = json.loads(out.read_text())
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert got["a"]["commit"] == got["b"]["commit"] == head
    assert got["order"] == "ABBA" and list(got["stages"]) == ["warm", "compare"]
    for stage, result in got["stages"].items():
        assert result["same_output"], stage
        means = []
        for side in ("a", "b"):
            runs = got[side]["runs"][stage]
            assert len(runs) == 2 and all(r["wall_s"] > 0 for r in runs)
            means.append(statistics.fmean(r["wall_s"] for r in runs))
        assert result["ratio_b_over_a"] == pytest.approx(means[1] / means[0], abs=1e-3)
    assert got["stages"]["warm"]["a_cpu_s"] > 0
    # the checkouts are gone
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert "tracedpush-abba-" not in listed


def test_each_side_runs_its_own_code(traces: Path, tmp_path: Path) -> None:
    """Side A is HEAD with its report's table changed: were both sides run from the
    installed tracedpush, their outputs would be the same."""
    a = bench_abba._checkout("A", "HEAD", tmp_path)
    try:
        report = a.code / "tracedpush" / "analysis" / "report.py"
        text = report.read_text()
        assert '"TTFT ms",' in text
        report.write_text(text.replace('"TTFT ms",', '"TTFT in ms",', 1))
        b = bench_abba._checkout("B", bench_abba.WORKING_TREE, tmp_path)
        got = bench_abba._stage([a, b], "warm", traces, rounds=1, calls=1)
    finally:
        bench_abba._remove(a)
    assert not got["same_output"]
    a_out, b_out = (s.work / "warm.out" for s in (a, b))
    assert "TTFT in ms" in a_out.read_text() and "TTFT in ms" not in b_out.read_text()
    assert [len(s.runs["warm"]) for s in (a, b)] == [2, 2]


def test_live_stage_follows_the_same_appends_from_the_same_state(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``live``: each measurement starts from a copy of the side's index and appends the
    same slices, so HEAD against itself reports the same run after them, and the figure
    is the sum of the updates (one per slice), not the process; the update after them
    brings nothing (a pause), timed apart."""
    monkeypatch.setattr(bench_abba, "LIVE_SLICES", (6, 24))
    out = tmp_path / "abba.json"
    argv = ["--a", "HEAD", "--b", "HEAD", "--traces", str(traces), "--out", str(out)]
    assert bench_abba.main([*argv, "--stage", "live"]) == 0
    got = json.loads(out.read_text())
    live = got["stages"]["live"]
    assert live["same_output"] and got["order"] == "ABBA"
    for side in ("a", "b"):
        runs = got[side]["runs"]["live"]
        assert len(runs) == 2
        for r in runs:
            assert len(r["updates_s"]) == 2
            assert r["wall_s"] == pytest.approx(sum(r["updates_s"]), abs=1e-5)
            assert r["wall_s"] < r["process"]["wall_s"]  # the opening is not timed
            assert r["requests"] == 300 + 6 + 24  # from the run's state, both slices once
            # what each update did: the slices' requests at least were analysed anew (a
            # slice is cut by time, so a request can straddle two)
            assert sum(u["reanalysed"] for u in r["updates"]) >= 6 + 24
            assert all(u["new_spans"] > 0 and u["offsets_ms"] for u in r["updates"])
            assert r["updates"] == got["a"]["runs"]["live"][0]["updates"]  # same code, same work
            # then a pause: nothing new, and the Live index writes its engine steps
            assert r["pause"]["new_spans"] == 0 and r["pause"]["steps_written"], r["pause"]
            assert not any(u["steps_written"] for u in r["updates"])  # written at the pause
            assert 0 < r["pause_s"] < r["process"]["wall_s"]
    (a_out,) = {r["sha256"] for r in got["a"]["runs"]["live"]}
    assert (a_out,) == tuple({r["sha256"] for r in got["b"]["runs"]["live"]})
    printed = capsys.readouterr().out
    first = got["a"]["runs"]["live"][0]["updates"][0]
    assert f"+{first['new_spans']} spans, {first['reanalysed']} analysed again" in printed
    assert live["a_pause_s"] > 0 and "pause" in printed


def test_live_slices_take_a_list_or_a_repeat() -> None:
    """``--live-slices``: 60x20 is a console left open for twenty refreshes."""
    assert bench_abba._slices("60x3,240") == (60, 60, 60, 240)
    assert bench_abba._slices("7") == (7,)
    for bad in ("", "60x", "x3", "0", "60x0", "sixty"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_abba._slices(bad)


def test_a_revision_that_is_not_a_commit_stops_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped or unfetched revision is named at once (it used to end in a git
    traceback from the worktree it could not add)."""
    out = tmp_path / "abba.json"
    with pytest.raises(SystemExit) as stop:
        bench_abba.main(["--a", "no-such-rev-0000", "--traces", str(tmp_path), "--out", str(out)])
    assert stop.value.code == 2
    assert "--a no-such-rev-0000: not a commit of" in capsys.readouterr().err
    assert not out.exists()


def test_console_stage_times_each_page_on_the_sides_own_index(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``console``: each side's pages run (AppTest, a new session each) on the index it
    built at its own --index-dir, nothing beside the traces; the figure is the pages'
    sum, each page's time kept and printed; the same code shows the same pages."""
    out = tmp_path / "abba.json"
    here = bench_abba.WORKING_TREE  # HEAD may predate the console's --index-dir
    argv = ["--a", here, "--b", here, "--traces", str(traces), "--out", str(out)]
    assert bench_abba.main([*argv, "--stage", "console"]) == 0
    got = json.loads(out.read_text())
    console = got["stages"]["console"]
    assert console["same_output"]
    pages = list(bench_abba.PAGES)
    for side in ("a", "b"):
        for r in got[side]["runs"]["console"]:
            assert list(r["pages_s"]) == pages and all(t > 0 for t in r["pages_s"].values())
            assert r["wall_s"] == pytest.approx(sum(r["pages_s"].values()), abs=1e-3)
            assert r["wall_s"] < r["process"]["wall_s"] and r["load_s"] > 0
    assert list(console["parts"]) == ["warm_s", *(f"pages_s.{p}" for p in pages)]
    assert not (traces / ".tracedpush-index").exists()  # each side's own --index-dir
    printed = capsys.readouterr().out
    assert all(f"  {p:8} " in printed for p in pages)
