"""A cold index build says how far it is: on every core, real forked workers report
bytes read, traces stored and requests analysed to `AnalysisIndex.progress`; a build in
one process (a small run, or where nothing forks) reports the same; `tracedpush report`
shows it (a line rewritten on a terminal, a line per stage in a log)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tracedpush.analysis import build_progress
from tracedpush.analysis import index as index_mod
from tracedpush.analysis.build_progress import ANALYSE, OFFSETS, READ, STORE, BuildProgress
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.cli import main
from tracedpush.testing import synthetic


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    synthetic.generate(40, seed=5, batch=4).write(d)
    return d


def test_the_workers_progress_adds_up(traces: Path, tmp_path: Path) -> None:
    idx = AnalysisIndex([traces], index_dir=tmp_path / "idx", parallel=True)
    heard: list[tuple[str, int, int]] = []
    idx.progress = lambda *a: heard.append(a)
    run = idx.update()
    idx.close()
    order = [s for i, (s, _, _) in enumerate(heard) if i == 0 or heard[i - 1][0] != s]
    assert order == [READ, STORE, OFFSETS, ANALYSE]
    last = {stage: (done, total) for stage, done, total in heard}
    trace_bytes = sum(f.stat().st_size for f in traces.rglob("*.jsonl"))
    assert last[READ] == (trace_bytes, trace_bytes)  # every byte, counted once
    assert last[STORE] == (len(idx._kept), len(idx._kept))  # every trace, both shards
    assert last[ANALYSE] == (len(run.requests), len(run.requests))
    for stage, done, total in heard:
        assert 0 <= done <= total, (stage, done, total)
        if stage in (STORE, ANALYSE):  # every worker's total from the first count on
            assert total == last[stage][1], (stage, done, total)
    read = [done for stage, done, _ in heard if stage == READ]
    assert read == sorted(read) and len(read) >= 2  # between files too, never back


def test_a_build_in_one_process_tells_the_same(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sequential build (under 64 MiB, one core, no fork: Windows) tells the same
    stages, in order, with the same totals as the parallel one, counts that never go back,
    and each stage's last; the refresh after it, nothing."""
    monkeypatch.setattr(build_progress, "EVERY_S", 0.0)  # every count it looks at
    monkeypatch.setattr(index_mod, "_TELL_EVERY", 7)
    idx = AnalysisIndex([traces], index_dir=tmp_path / "idx", parallel=False)
    heard: list[tuple[str, int, int]] = []
    idx.progress = lambda *a: heard.append(a)
    run = idx.update()
    order = [s for i, (s, _, _) in enumerate(heard) if i == 0 or heard[i - 1][0] != s]
    assert order == [READ, STORE, OFFSETS, ANALYSE]
    trace_bytes = sum(f.stat().st_size for f in traces.rglob("*.jsonl"))
    totals = {READ: trace_bytes, STORE: len(idx._kept), ANALYSE: len(run.requests)}
    for stage, total in totals.items():
        counts = [(done, t) for s, done, t in heard if s == stage]
        assert {t for _, t in counts} == {total}, stage
        assert counts[-1] == (total, total) and len(counts) > 2, stage
        assert [d for d, _ in counts] == sorted(d for d, _ in counts), stage
    synthetic.generate(4, seed=9, batch=4).write(traces / "later")  # new spans
    heard.clear()
    assert len(idx.update().requests) == len(run.requests) + 4
    assert heard == []  # a refresh is not a build
    idx.close()


def test_listening_changes_nothing_built(traces: Path, tmp_path: Path) -> None:
    """The same requests with and without a listener (the console's own builds and the
    benchmarks' Python opens have none: their workers send no progress)."""
    quiet_idx = AnalysisIndex([traces], index_dir=tmp_path / "quiet", parallel=True)
    quiet = list(quiet_idx.update().requests)
    quiet_idx.close()
    loud_idx = AnalysisIndex([traces], index_dir=tmp_path / "loud", parallel=True)
    loud_idx.progress = lambda *a: None
    assert list(loud_idx.update().requests) == quiet
    loud_idx.close()


@pytest.mark.parametrize("parallel_bytes", [0, 1 << 40], ids=["every core", "one process"])
def test_report_says_each_stage_in_a_log(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, parallel_bytes: int
) -> None:
    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", parallel_bytes)
    out = str(tmp_path / "r.txt")  # a small run gets an index when asked (--index)
    assert main(["report", "--traces", str(traces), "--index", "--out", out]) == 0
    err = capsys.readouterr().err.splitlines()
    stages = [line for line in err if line.endswith(" ...") and " s: " in line]
    assert [line.split(" s: ")[1] for line in stages] == [
        "reading the traces ...",
        "storing spans by trace ...",
        "estimating clock offsets ...",
        "analysing requests ...",
    ], err
    assert err[-2].startswith("tracedpush report: analysis index built: 40 requests")


class _Terminal(io.StringIO):
    """A stream that says it is a terminal (none here under pytest)."""

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_one_line_is_rewritten() -> None:
    out = _Terminal()
    shown = BuildProgress(out)
    shown(READ, 1_500_000_000, 3_000_000_000)
    shown(STORE, 12_345, 200_000)
    shown(OFFSETS, 0, 0)
    shown.end()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended once
    frames = text.rstrip("\n").split("\r")[1:]
    assert frames[0] == "tracedpush report: reading the traces 1.50 of 3.00 GB (50%)"
    assert frames[1].startswith("tracedpush report: storing spans by trace 12,345 of 200,000 (6%)")
    # a shorter line clears what the longer one before it left
    assert len(frames[2]) == len(frames[1]) and frames[2].rstrip().endswith("offsets ...")
