"""The analysis index gives exactly `analyze()`'s results, request by request: cold,
warm (a new process reading the kept index), after files grow (line by line, torn
lines, offsets moving), with failures, and on a real run's traces."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import io
import json
import marshal
import pickle
import random
import re
import shutil
import sqlite3
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import (
    TraceStore,
    analyze,
    perfetto,
    report_json,
    run_json,
    skew,
    to_perfetto,
    write_perfetto,
)
from tracedpush.analysis import contention as contention_mod
from tracedpush.analysis.columns import RunColumns
from tracedpush.analysis.index import INDEX_DIRNAME, AnalysisIndex, default_dir, index_run
from tracedpush.analysis.index_live import SkewEvidence, TraceSlots
from tracedpush.analysis.index_store import SHARDS, open_span_db, wal
from tracedpush.analysis.report_json import write_json
from tracedpush.analysis.results import LazyRequests, RunAnalysis
from tracedpush.analysis.timeline import TraceIndex
from tracedpush.testing import synthetic

REAL = Path(__file__).resolve().parent.parent / "data" / "real-run.jsonl.gz"


def same(a: RunAnalysis, b: RunAnalysis) -> None:
    """Equal request by request (every field), and the whole JSON report but the load
    counters and source name."""
    assert [r.trace_id for r in a.requests] == [r.trace_id for r in b.requests]
    for x, y in zip(a.requests, b.requests, strict=True):
        assert x == y, x.trace_id
    ja, jb = run_json(a), run_json(b)
    for j in (ja, jb):
        del j["load_stats"], j["source"]
    assert ja == jb


def same_columns(a: RunColumns | None, b: RunColumns) -> None:
    """Equal column by column: values, dtypes, shapes, phase order (NaN equals NaN)."""
    assert a is not None
    for f in dataclasses.fields(RunColumns):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        elif f.name != "sampled":
            assert x == y, f.name


def reference(paths: list[Path], **kwargs: Any) -> RunAnalysis:
    return analyze(TraceStore.from_paths(paths), spans=False, **kwargs)


UNTIED = {  # one host per instance: clocks not tied to one offset
    synthetic.PROXY_INSTANCE: "h-proxy",
    synthetic.PREFILL_INSTANCE: "h-prefill",
    synthetic.DECODE_INSTANCE: "h-decode",
}


@pytest.fixture(scope="module")
def skewed() -> synthetic.SyntheticRun:
    # clocks off by tens of ms, one host per instance (untied), spans dropped, steps
    return synthetic.generate(
        160,
        seed=7,
        batch=8,
        clock_offsets_ms={synthetic.DECODE_INSTANCE: 35.0, synthetic.PREFILL_INSTANCE: -12.0},
        hosts=UNTIED,
        drop_spans={"kv.notify": 0.05, "proxy.decode": 0.03},
    )


def test_cold_and_warm_equal_analyze(tmp_path: Path, skewed: synthetic.SyntheticRun) -> None:
    d = tmp_path / "traces"
    skewed.write(d)
    want = reference([d])
    idx = AnalysisIndex([d])
    cold = idx.update()
    assert idx.rebuilt and (d / INDEX_DIRNAME).is_dir()
    same(cold, want)
    # its first save went through a rollback journal (`index._journal`); now back in
    # WAL mode, where a reader (the console) does not wait for a writer
    assert idx._connect().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    idx.close()
    warm_idx = AnalysisIndex([d])
    warm = warm_idx.update()
    assert not warm_idx.rebuilt and warm_idx.last_new == 0 and warm_idx.last_reanalysed == 0
    same(warm, want)
    # span views on demand equal analyze(spans=True)'s
    full = analyze(TraceStore.from_paths([d]))
    for r in warm.requests[:20]:
        got = warm_idx.request(r.trace_id)
        assert got == full.get(r.trace_id)
    # the console's span-duration view, from facts alone
    assert warm_idx.span_durations(warm.requests) == [
        (r.trace_id, r.request_id, r.mode, s.name, s.duration_ms)
        for r in full.requests
        for s in r.spans
    ]
    warm_idx.close()


def test_opening_a_kept_index_pauses_the_collector(
    tmp_path: Path, skewed: synthetic.SyntheticRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report` opens the index through `stats`, outside `update`: loading 200,000
    traces' kept tuples with the collector running cost 6.7 s of a 10 s warm report."""
    import gc

    from tracedpush.analysis import index_store

    d = tmp_path / "traces"
    skewed.write(d)
    AnalysisIndex([d]).update()
    seen: list[bool] = []
    load = index_store.Kept.load.__func__  # type: ignore[attr-defined]

    def spy(cls: type, t: tuple) -> Any:
        seen.append(gc.isenabled())
        return load(cls, t)

    monkeypatch.setattr(index_store.Kept, "load", classmethod(spy))
    assert gc.isenabled()
    idx = AnalysisIndex([d])
    assert idx.stats.spans > 0 and not idx.rebuilt
    assert seen and not any(seen)  # every kept trace loaded with the collector paused
    assert gc.isenabled()  # and it runs again after
    idx.close()


def test_a_cold_build_killed_midway_is_built_again(
    tmp_path: Path, skewed: synthetic.SyntheticRun
) -> None:
    """A build's workers write their span databases without a journal: a kill leaves
    no index state and may leave a torn file. The next open deletes the files (it once
    deleted rows, which fails on a torn file) and builds again."""
    d = tmp_path / "traces"
    skewed.write(d)
    idx = AnalysisIndex([d])
    idx.update()
    idx.close()
    where = d / INDEX_DIRNAME
    (where / "index.sqlite").unlink()  # killed before its state was written
    for f in where.glob("spans-*.sqlite"):
        f.write_bytes(b"\0torn page" * 500)
    again = AnalysisIndex([d])
    assert again.stats.spans == 0 and again.rebuilt
    same(again.update(), reference([d]))
    again.close()
    # a torn index database itself (or a kept segment) is built again too, and said
    (where / "index.sqlite").write_bytes(b"\0torn page" * 500)
    torn = AnalysisIndex([d])
    errors = torn.stats.errors
    assert torn.rebuilt and any("unreadable" in e for e in errors)
    same(torn.update(), reference([d]))
    torn.close()
    # ... as is one with the TPOT breakdown of a trace that no kept segment holds
    with closing(sqlite3.connect(where / "index.sqlite")) as db, db:
        blob = marshal.dumps({"f" * 32: None})
        db.execute("INSERT INTO tpots (seg, v) VALUES (99, ?)", (blob,))
    odd = AnalysisIndex([d])
    errors = odd.stats.errors  # opens it
    assert odd.rebuilt and any("unreadable" in e for e in errors)
    same(odd.update(), reference([d]))
    odd.close()


@pytest.mark.parametrize("damage", ["torn", "gone", "other run's"])
def test_kept_steps_files_that_went_wrong_are_made_again(
    tmp_path: Path, skewed: synthetic.SyntheticRun, damage: str
) -> None:
    """The run's engine steps and their TPOT arrays are kept as files beside the index
    database. One torn, deleted or from another state is not read: the steps are made
    again from the spans, equal to `analyze()`'s, and written again on `close`."""
    d = tmp_path / "traces"
    skewed.write(d)
    want = reference([d])
    idx = AnalysisIndex([d])
    idx.update()
    idx.close()
    files = [idx.dir / "steps.pickle", idx.dir / "steps-tpot.pickle"]
    assert all(f.stat().st_size > 0 for f in files)
    for f in files:
        if damage == "torn":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        elif damage == "gone":
            f.unlink()
        else:
            f.write_bytes(pickle.dumps((("another", []), None)))

    again = AnalysisIndex([d])
    got = again.update()
    same(got, want)
    assert _steps_json(got.engine_steps) == _steps_json(want.engine_steps)
    again.close()
    assert pickle.loads(files[0].read_bytes())[0] is not None  # written again
    third = AnalysisIndex([d])
    assert _steps_json(third.update().engine_steps) == _steps_json(want.engine_steps)
    third.close()


@pytest.mark.parametrize("torn", [False, True])
def test_growing_files_equal_a_fresh_analysis(
    tmp_path: Path, skewed: synthetic.SyntheticRun, torn: bool
) -> None:
    src, d = tmp_path / "full", tmp_path / "traces"
    files = skewed.write(src)
    data = {f: f.read_bytes() for f in files}
    for f in files:
        (d / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
    idx_dir = tmp_path / "index"
    reanalysed = []
    for step in (1, 2, 3, 4):  # a quarter more of every file each time
        for f, blob in data.items():
            cut = len(blob) * step // 4
            if not torn:
                cut = blob.rfind(b"\n", 0, cut) + 1 if step < 4 else cut
            (d / f.relative_to(src)).write_bytes(blob[:cut])
        idx = AnalysisIndex([d], index_dir=idx_dir)  # a new process each time
        run = idx.update()
        reanalysed.append(idx.last_reanalysed)
        idx.close()
        if not torn or step == 4:
            same(run, reference([d]))
    assert reanalysed[0] > 0 and max(reanalysed[1:]) > 0


def test_one_index_object_follows_appends(tmp_path: Path) -> None:
    """The console's way: one object, `update()` after each append; each update
    re-analyses what the new spans touched, not the run (offsets holding still)."""
    gen = synthetic.generate(120, seed=3, batch=4)
    src, d = tmp_path / "full", tmp_path / "traces"
    files = gen.write(src)
    lines = {f: f.read_bytes().splitlines(keepends=True) for f in files}
    for f in files:
        (d / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (d / f.relative_to(src)).write_bytes(b"")
    idx = AnalysisIndex([d])
    longest = max(len(v) for v in lines.values())
    seen = []
    for i in range(0, longest, max(longest // 6, 1)):
        for f, ls in lines.items():
            with (d / f.relative_to(src)).open("ab") as fh:
                fh.writelines(ls[i : i + max(longest // 6, 1)])
        run = idx.update()
        seen.append((idx.last_new, idx.last_reanalysed, len(run.requests)))
        same(run, reference([d]))
    assert seen[-1][2] == 120
    assert all(r <= n for n, r, _ in seen[1:])  # re-analysed at most one per new span
    # nothing new: nothing re-analysed
    idx.update()
    assert idx.last_new == 0 and idx.last_reanalysed == 0
    idx.close()


def test_options_and_rebuilds(tmp_path: Path, skewed: synthetic.SyntheticRun) -> None:
    d = tmp_path / "traces"
    files = skewed.write(d)
    for kwargs in (
        {"correct_skew": False},
        {"skew_policy": "zero"},
        {"buckets": (512, 2048), "load_buckets": (2, 8)},
    ):
        same(index_run([d], **kwargs), reference([d], **kwargs))
    # a file replaced by a shorter one: the index starts over
    victim = files[0]
    victim.write_bytes(b"".join(victim.read_bytes().splitlines(keepends=True)[:2]))
    idx = AnalysisIndex([d])
    same(idx.update(), reference([d]))
    assert idx.rebuilt
    idx.close()
    # an index directory that is not beside the traces; other paths: a new index
    other = tmp_path / "elsewhere"
    same(index_run([d], index_dir=other), reference([d]))
    same(index_run([d / "push"], index_dir=other), reference([d / "push"]))


def test_a_real_run(tmp_path: Path) -> None:
    """Traces recorded from a real vLLM push/pull pair (tests/data/real-run.jsonl.gz:
    the first requests of each mode of a sweep, engine steps and thread samples too)."""
    d = tmp_path / "traces"
    d.mkdir()
    with gzip.open(REAL, "rb") as fh, (d / "run.jsonl").open("wb") as out:
        shutil.copyfileobj(fh, out)
    want = reference([d])
    assert len(want.requests) > 20 and {r.mode for r in want.requests} == {"push", "pull"}
    same(index_run([d]), want)
    same(index_run([d]), want)  # warm
    same(index_run([d], index_dir=tmp_path / "par", parallel=True), want)
    lines = (d / "run.jsonl").read_bytes().splitlines(keepends=True)
    (d / "run.jsonl").write_bytes(b"".join(lines[: len(lines) // 2]))
    idx = AnalysisIndex([d], index_dir=tmp_path / "grown")
    idx.update()
    (d / "run.jsonl").write_bytes(b"".join(lines))
    same(idx.update(), want)
    idx.close()
    assert json.dumps(run_json(want))  # serialisable


# what `test_report_uses_the_index` writes (perfetto and --spans: the span views)
FORMATS = ("json", "json --spans", "table", "perfetto")


def test_build_reason_names_what_was_there(
    tmp_path: Path, skewed: synthetic.SyntheticRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build_reason`: nothing to say of a warm index; else why the next update builds
    from nothing, in the words the report prints, and the same once the index is open."""
    from tracedpush.analysis import index as index_mod

    d = tmp_path / "traces"
    skewed.write(d)
    idx_dir = tmp_path / "idx"
    assert AnalysisIndex([d], index_dir=idx_dir).build_reason() == index_mod.NO_INDEX_YET
    index_run([d], index_dir=idx_dir)
    assert AnalysisIndex([d], index_dir=idx_dir).build_reason() == ""
    with monkeypatch.context() as m:  # as after an upgrade of the analysis code
        m.setattr(index_mod, "format_key", lambda: (index_mod.FORMAT, "other code"))
        why = "the one there was made by another version of the analysis or other tuning"
        assert AnalysisIndex([d], index_dir=idx_dir).build_reason() == why
    biggest = max(d.rglob("*.jsonl"), key=lambda f: f.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])  # rotated
    why = "a trace file it had read shrank, vanished or was replaced"
    assert AnalysisIndex([d], index_dir=idx_dir).build_reason() == why
    opened = AnalysisIndex([d], index_dir=idx_dir)
    opened.stats  # noqa: B018  (opens it: the stale index is reset here)
    assert opened.build_reason() == why


def test_index_root_keeps_each_runs_index_apart(
    tmp_path: Path,
    skewed: synthetic.SyntheticRun,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """TRACEDPUSH_INDEX_ROOT: each set of trace paths gets its own index under it (named
    for the first), nothing beside the traces, and a report of one run leaves another's
    index warm; --index-dir still wins. A directory given for other traces is built
    again for these, and the report says why."""
    from tracedpush.cli import main

    d, other = tmp_path / "traces", tmp_path / "other"
    skewed.write(d)
    synthetic.generate(5, seed=8).write(other)
    root = tmp_path / "indexes"
    monkeypatch.setenv("TRACEDPUSH_INDEX_ROOT", str(root))

    def report(traces: Path, *extra: str) -> str:
        out = tmp_path / "out.txt"
        assert main(["report", "--traces", str(traces), "--index", *extra, "--out", str(out)]) == 0
        return capsys.readouterr().err

    assert "building the analysis index" in report(d)
    assert "building the analysis index" in report(other)
    assert sorted(p.name.split("-")[0] for p in root.iterdir()) == ["other", "traces"]
    assert default_dir([d]).parent == root and (default_dir([d]) / "index.sqlite").is_file()
    assert not (d / INDEX_DIRNAME).exists() and not (other / INDEX_DIRNAME).exists()
    assert "building the analysis index" not in report(d)  # still warm
    assert default_dir([d, other]) != default_dir([d])  # a set of paths is its own run
    given = ["--index-dir", str(tmp_path / "given")]
    assert "building the analysis index" in report(d, *given)
    err = report(other, *given)
    assert f"(once; the one there was of other traces: {d.resolve()})" in err, err


def test_report_uses_the_index(tmp_path: Path, skewed: synthetic.SyntheticRun) -> None:
    """`tracedpush report` writes the same JSON and table with the index (cold with
    --index, then warm: an index already there is used) and with --no-index; Perfetto
    too (span views made on demand); a read-only traces directory takes --index-dir.
    Without --index and without an index, nothing is written beside the traces."""
    from tracedpush.cli import main

    d = tmp_path / "traces"
    skewed.write(d)
    outs = {}
    assert main(["report", "--traces", str(d), "--out", str(tmp_path / "first.txt")]) == 0
    assert not (d / INDEX_DIRNAME).exists()  # a one-off report builds no index
    for name, extra in (
        ("plain", ["--no-index"]),
        ("cold", ["--index"]),
        ("warm", []),
        ("elsewhere", ["--index", "--index-dir", str(tmp_path / "idx")]),
    ):
        for fmt in FORMATS:
            out = tmp_path / f"{name}.{fmt}"
            argv = ["--format", fmt.split()[0], "--out", str(out), *fmt.split()[1:], *extra]
            assert main(["report", "--traces", str(d), *argv]) == 0
            outs[name, fmt] = out.read_text()
    assert not (tmp_path / "idx").exists() or (tmp_path / "idx").is_dir()
    for fmt in FORMATS:
        for name in ("cold", "warm", "elsewhere"):
            a, b = outs["plain", fmt], outs[name, fmt]
            if fmt.startswith("json"):  # the load counters say what this invocation read
                ja, jb = json.loads(a), json.loads(b)
                del ja["load_stats"], jb["load_stats"]
                assert ja == jb
            elif fmt == "table":
                assert _no_load_line(a) == _no_load_line(b)
            else:
                assert a == b
    assert (d / INDEX_DIRNAME).is_dir()


def test_a_report_on_a_big_run_builds_the_index_unasked(
    tmp_path: Path,
    skewed: synthetic.SyntheticRun,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Traces big enough for a build on every core (64 MiB on 2 cores; lowered here, so a
    small run counts as big on any machine) go through the index without --index: it is
    faster than reading without one even the first time. Same report as --no-index."""
    from tracedpush.analysis import index as index_mod
    from tracedpush.cli import main

    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(index_mod, "SHARDS", 1)
    d = tmp_path / "traces"
    skewed.write(d)
    plain, unasked = tmp_path / "plain.txt", tmp_path / "unasked.txt"
    assert main(["report", "--traces", str(d), "--no-index", "--out", str(plain)]) == 0
    assert not (d / INDEX_DIRNAME).exists()
    capsys.readouterr()
    assert main(["report", "--traces", str(d), "--out", str(unasked)]) == 0
    assert f"building the analysis index in {d / INDEX_DIRNAME} (once)" in capsys.readouterr().err
    assert (d / INDEX_DIRNAME).is_dir()
    assert _no_load_line(unasked.read_text()) == _no_load_line(plain.read_text())


def test_where_nothing_forks_big_traces_are_read_without_an_index(
    tmp_path: Path,
    skewed: synthetic.SyntheticRun,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Windows has no fork (simulated here: this machine has it): the build's workers
    and `os.register_at_fork` do not exist there. Big traces are then read without an
    index unless asked (a sequential build is slower than that), and one asked for is
    built without trying the workers."""
    import multiprocessing
    import subprocess

    from tracedpush.analysis import index as index_mod
    from tracedpush.cli import main

    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    d = tmp_path / "traces"
    skewed.write(d)
    out = tmp_path / "report.txt"
    assert main(["report", "--traces", str(d), "--out", str(out)]) == 0
    assert "building the analysis index" not in capsys.readouterr().err
    assert not (d / INDEX_DIRNAME).exists()
    idx = AnalysisIndex([d], parallel=None)
    try:
        run = idx.update()
    finally:
        idx.close()
    assert len(run.requests) == len(analyze(TraceStore.from_paths([d])).requests)
    assert not any("parallel index build" in e for e in idx.stats.errors)
    # the module imports without os.fork and os.register_at_fork (absent on Windows)
    code = "import os; del os.fork, os.register_at_fork; import tracedpush.analysis.index"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_json_report_is_written_a_batch_at_a_time(
    tmp_path: Path, skewed: synthetic.SyntheticRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`write_json` writes `json.dumps(run_json(run), indent=1)` byte for byte (with
    and without spans; requests in a list, the index's made on demand, none at all),
    and keeps none of the results it makes from the index: a JSON report of 200,000
    requests held them all, their dicts and its whole text at once (9 GB). The whole
    run's span views (`with_spans`, `report --spans`) are made the same way, once each,
    and equal those of `analyze(spans=True)`."""
    d = tmp_path / "traces"
    skewed.write(d)
    plain = reference([d])
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    lazy = idx.update()
    assert isinstance(lazy.requests, LazyRequests) and len(lazy.requests) > 20

    def written(run: RunAnalysis, spans: bool) -> str:
        out = io.StringIO()
        write_json(run, out, spans=spans)
        return out.getvalue()

    got = {spans: written(lazy, spans) for spans in (False, True)}
    assert lazy.requests.loaded == 0  # made, written, let go
    par = AnalysisIndex([d], index_dir=tmp_path / "parallel", parallel=True)
    assert written(par.update(), False) == got[False]  # its results made again to write,
    assert all(k.result is None for k in par._kept.values())  # and not kept there either
    par.close()
    batches = list(lazy.requests.stream(step=7))  # batches that do not divide the run
    assert lazy.requests.loaded == 0 and batches == list(lazy.requests)
    for spans in (False, True):
        assert got[spans] == json.dumps(run_json(lazy, spans=spans), indent=1)
        for run in (plain, plain.of([])):
            assert written(run, spans) == json.dumps(run_json(run, spans=spans), indent=1)
    told: list[tuple[int, int]] = []  # its progress (on a terminal: `report --out`)
    monkeypatch.setattr(report_json, "PROGRESS_EVERY", 7)
    write_json(lazy, io.StringIO(), progress=lambda *a: told.append(a))
    n = len(lazy.requests)
    assert told == [(k, n) for k in (*range(7, n, 7), n)]
    lazy.with_requests(idx.with_spans(lazy.requests))
    assert isinstance(lazy.requests, LazyRequests) and lazy.columns() is not None
    whole = json.loads(written(lazy, True))
    assert lazy.requests.loaded == 0
    full = analyze(TraceStore.from_paths([d]), spans=True)
    want = json.loads(json.dumps(run_json(full, spans=True)))
    del whole["load_stats"], want["load_stats"]
    assert whole == want and all(r["spans"] for r in whole["requests"])
    idx.close()


@pytest.mark.parametrize("spans", [False, True])
def test_the_json_report_on_every_core_is_the_same_bytes(
    tmp_path: Path, skewed: synthetic.SyntheticRun, monkeypatch: pytest.MonkeyPatch, spans: bool
) -> None:
    """Requests made and encoded in forked processes, a batch each (`LazyRequests.mapped`),
    give `write_json`'s bytes in one process, the same progress, and leave the parent
    holding none of them; the children open their own connections to the index."""
    d = tmp_path / "traces"
    skewed.write(d)
    # a cold build by forked workers: shards left out of WAL, which two readers switch
    idx = AnalysisIndex([d], index_dir=tmp_path / "index", parallel=True)
    run = idx.update()
    idx.span_db(0), idx._connect()  # open in the parent: not to be used by a child
    if spans:
        run.with_requests(idx.with_spans(run.requests))
    assert isinstance(run.requests, LazyRequests)
    monkeypatch.setattr(report_json, "PARALLEL_STEP", 9)  # many batches, the last short
    monkeypatch.setattr(report_json, "PROGRESS_EVERY", 18)
    told: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
    out = {}
    for workers in (1, 2):
        buf = io.StringIO()
        write_json(
            run, buf, spans=spans, workers=workers, progress=lambda *a, w=workers: told[w].append(a)
        )
        out[workers] = buf.getvalue()
    assert out[2] == out[1]
    n = len(run.requests)
    assert told[2] == told[1] == [(k, n) for k in (*range(18, n, 18), n)]
    assert run.requests.loaded == 0
    assert out[2] == json.dumps(run_json(run, spans=spans), indent=1)
    assert report_json.export_workers(report_json.PARALLEL_MIN - 1) == 1
    idx.close()


def test_wal_waits_for_the_file_instead_of_failing(tmp_path: Path) -> None:
    """Switching a database to WAL needs it alone; a connection that may not wait (SQLite
    fails one of two switching together at once) tries again until the other is done."""
    path = tmp_path / "shard.sqlite"
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("CREATE TABLE t (x)")
        db.execute("INSERT INTO t VALUES (1)")
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()  # holds the file shared
    eager = sqlite3.connect(path, timeout=0)  # no busy wait: fails at once, as in the race
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        eager.execute("PRAGMA journal_mode=WAL")
    threading.Timer(0.3, reader.execute, ("COMMIT",)).start()
    started = time.monotonic()
    wal(eager)
    assert time.monotonic() - started >= 0.25
    assert eager.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    held = sqlite3.connect(tmp_path / "held.sqlite", isolation_level=None)
    held.execute("CREATE TABLE t (x)")
    held.execute("BEGIN EXCLUSIVE")  # never let go: it gives up when told
    with (
        closing(sqlite3.connect(tmp_path / "held.sqlite", timeout=0)) as other,
        pytest.raises(sqlite3.OperationalError, match="locked"),
    ):
        wal(other, wait_s=0.2)
    held.close()
    eager.close(), reader.close()


def test_the_perfetto_report_is_written_a_request_at_a_time(
    tmp_path: Path, skewed: synthetic.SyntheticRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`write_perfetto` writes `to_perfetto`'s compact JSON byte for byte (a list of
    requests, the index's whole run with span views made on demand, a chosen few, none),
    keeping none of the index's requests it made: a Perfetto report of 200,000 requests
    held every event and the whole text at once. On two forked workers (batches of 7
    requests, so tracks, overlaps and flow ids cross batches) it writes the same bytes,
    for the whole run, a time window of it and none, with progress after each batch."""
    d = tmp_path / "traces"
    skewed.write(d)
    plain = analyze(TraceStore.from_paths([d]), spans=True)
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    lazy = idx.update()
    lazy.with_requests(idx.with_spans(lazy.requests))
    assert isinstance(lazy.requests, LazyRequests) and len(lazy.requests) > 20

    def written(
        run: RunAnalysis, ids: list[str] | None = None, workers: int = 1, seen: list | None = None
    ) -> str:
        out = io.StringIO()
        write_perfetto(run, out, ids, None if seen is None else lambda *a: seen.append(a), workers)
        return out.getvalue()

    monkeypatch.setattr(perfetto, "PROGRESS_EVERY", 10)
    monkeypatch.setattr(perfetto, "PARALLEL_STEP", 7)
    serial: list = []
    whole = written(lazy, seen=serial)
    assert lazy.requests.loaded == 0  # made, written, let go
    assert whole == json.dumps(to_perfetto(plain), separators=(",", ":"))
    forked_seen: list = []
    assert written(lazy, workers=2, seen=forked_seen) == whole
    assert lazy.requests.loaded == 0
    n = len(lazy.requests)
    assert serial == [(k, n) for k in [*range(10, n, 10), n]]
    done, batches = 0, []  # after each batch of 7 that passes a multiple of 10, and the last
    for lo in range(0, n, 7):
        before, done = done, min(lo + 7, n)
        if done // 10 > before // 10 or done == n:
            batches.append((done, n))
    assert forked_seen == batches
    events = json.loads(whole)["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "s", "f", "M"}
    few = [r.trace_id for r in plain.requests[3:6]] + [plain.requests[9].request_id]
    for run, ids in ((plain, None), (plain, few), (plain, []), (plain.of([]), None)):
        assert written(run, ids) == json.dumps(to_perfetto(run, ids), separators=(",", ":"))
    # a time window of the index's run (`--since/--until`), both ways; and no request
    window = idx.update().subset(list(range(5, 27)))
    window.with_requests(idx.with_spans(window.requests))
    want = json.dumps(to_perfetto(plain.of(plain.requests[5:27])), separators=(",", ":"))
    assert written(window) == want
    assert written(window, workers=2) == want
    assert written(lazy.of(LazyRequests(0, list)), workers=2) == written(plain.of([]))
    idx.close()


def test_report_says_when_it_builds_the_index(
    tmp_path: Path, skewed: synthetic.SyntheticRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one slow report (a cold build: a minute at 200,000 requests) says on stderr
    that it builds the index, and how long it took; a warm one says nothing of it."""
    from tracedpush.cli import main

    d = tmp_path / "traces"
    skewed.write(d)
    argv = ["report", "--traces", str(d), "--index", "--out", str(tmp_path / "r.txt")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"building the analysis index in {d / INDEX_DIRNAME} (once)" in err
    assert re.search(r"analysis index built: [\d,]+ requests in [\d.]+ s", err), err
    assert main(argv) == 0
    assert "analysis index" not in capsys.readouterr().err


def _no_load_line(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith("loaded:")]


@pytest.mark.parametrize("torn", [False, True])
def test_parallel_cold_build_equals_analyze(
    tmp_path: Path, skewed: synthetic.SyntheticRun, torn: bool
) -> None:
    """The cold build on every core (`index_build`) keeps the same traces in the same
    order, and counts what the sequential read counts; appends afterwards are read
    from where it stopped."""
    d = tmp_path / "traces"
    files = skewed.write(d)
    with (d / "push" / "odd.jsonl").open("w") as fh:  # other shapes and bad lines
        fh.write(json.dumps({"resourceSpans": []}) + "\n")
        fh.write("{not json\n")
        fh.write(json.dumps({"resource_spans": skewed.documents[0]["resourceSpans"]}) + "\n")
    if torn:  # a torn last line stays pending, as FileSource keeps it
        with files[0].open("ab") as fh:
            fh.write(b'{"resourceSpans": [')
    store = TraceStore.from_paths([d])
    want = analyze(store, spans=False)
    idx = AnalysisIndex([d], parallel=True)
    got = idx.update()
    assert idx.rebuilt
    same(got, want)
    mine, theirs = got.stats.to_json(), store.stats.to_json()
    del mine["errors"], theirs["errors"]
    assert mine == theirs
    # what it saved is what it holds, in its order (kept tuples, span durations)
    cold = [(t, k.dump(), idx._durations_packed(t)) for t, k in idx._kept.items()]
    idx.close()
    warm = AnalysisIndex([d])
    same(warm.update(), want)
    assert warm.last_new == 0
    assert [(t, k.dump(), warm._durations_packed(t)) for t, k in warm._kept.items()] == cold
    warm.close()


# ------------------------------------------------------------------ Live updates
Piece = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]  # (resource, scope, span)


def _pieces(docs: list[dict[str, Any]]) -> list[Piece]:
    """Every span of `docs` with its resource and scope, in document order."""
    return [
        (rs["resource"], ss["scope"], span)
        for doc in docs
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


def _line(piece: Piece) -> str:
    """One span as its own OTLP JSON line."""
    res, scope, span = piece
    doc = {"resourceSpans": [{"resource": res, "scopeSpans": [{"scope": scope, "spans": [span]}]}]}
    return json.dumps(doc, separators=(",", ":")) + "\n"


def _res_attr(res: dict[str, Any], key: str) -> Any:
    return next(a["value"] for a in res["attributes"] if a["key"] == key)


def _moved(piece: Piece, shift_ns: int = 0, **res: dict[str, Any]) -> Piece:
    """`piece` with resource attributes replaced and every time moved by `shift_ns`."""
    resource, scope, span = copy.deepcopy(piece)
    for a in resource["attributes"]:
        a["value"] = res.get(a["key"], a["value"])
    for key in ("startTimeUnixNano", "endTimeUnixNano"):
        span[key] = str(int(span[key]) + shift_ns)
    for e in span.get("events") or ():
        e["timeUnixNano"] = str(int(e["timeUnixNano"]) + shift_ns)
    return resource, scope, span


def _service(piece: Piece) -> str:
    return _res_attr(piece[0], sc.RES_SERVICE_NAME)["stringValue"]


def _lowest_prefill_slack(pieces: list[Piece], traces: list[str]) -> str:
    """The trace of `traces` whose proxy.prefill -> prefill start pair has the lowest
    slack: it holds the clock-skew evidence's lowest from the proxy's clock to P's."""
    start: dict[tuple[str, str], int] = {}
    for _r, _s, span in pieces:
        if span["name"] in (sc.SPAN_PROXY_PREFILL, sc.SPAN_PREFILL):
            start[span["traceId"], span["name"]] = int(span["startTimeUnixNano"])
    return min(traces, key=lambda t: start[t, sc.SPAN_PREFILL] - start[t, sc.SPAN_PROXY_PREFILL])


def test_live_updates_equal_a_fresh_analysis(tmp_path: Path) -> None:
    """One index object through what a Live page sees, span by span: new traces; a
    proxy's legs arriving after its root (the trace's causal pairs change: the legs
    replace the root, not add to it); engine spans arriving late; a second P span that
    makes the trace holding the lowest slack of a resource pair give it up (recomputed
    from the other traces); a new process, then a new instance on its own host (a new
    clock domain); clock offsets that move (every trace analysed again); engine steps
    arriving late (TPOT breakdowns redone). After each update the run equals `analyze()`
    of every span so far: request by request, the whole JSON report, and the columns."""
    skew_ms = {synthetic.DECODE_INSTANCE: 20.0, synthetic.PREFILL_INSTANCE: -8.0}
    gen = synthetic.generate(100, seed=21, batch=4, clock_offsets_ms=skew_ms, hosts=UNTIED)
    pieces = _pieces(gen.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    procs = list(dict.fromkeys(p[2]["traceId"] for p in pieces if p[2]["name"] in sc.PROCESS_SPANS))
    t0, t1, t2, t3 = roots[:40], roots[40:60], roots[60:75], roots[75:]
    legs_late, engine_late = t0[3], t0[5]
    lowest = _lowest_prefill_slack(
        pieces, [t for t in t0 + t1 if t not in (legs_late, engine_late)]
    )
    stage_of = {t: i for i, ts in enumerate((t0, t1, t2, t3)) for t in ts}
    stage_of |= {t: 0 if i < len(procs) // 2 else 3 for i, t in enumerate(procs)}
    stages: list[list[Piece]] = [[], [], [], []]
    for piece in pieces:
        span = piece[2]
        tid, stage = span["traceId"], stage_of[span["traceId"]]
        if tid == legs_late and span["name"] in (sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE):
            stage = 1
        elif tid == engine_late and _service(piece) == sc.SERVICE_DECODE:
            stage = 2
        elif stage == 1 and _service(piece) == sc.SERVICE_DECODE:  # a new process
            piece = _moved(piece, **{sc.RES_PROCESS_PID: {"intValue": "9999"}})
        elif stage == 2 and _service(piece) == sc.SERVICE_PREFILL:  # a new clock domain
            new = {
                sc.RES_SERVICE_INSTANCE_ID: {"stringValue": "prefill-1"},
                sc.RES_HOST_NAME: {"stringValue": "h-prefill-1"},
            }
            piece = _moved(piece, 15_000_000, **new)
        elif stage == 3 and _service(piece) == sc.SERVICE_DECODE:  # offsets move: D 1 ms
            # further ahead, within what the pairs allow (4 ms behind, as before
            # `skew.settle`, now leaves the run's offset where it was)
            piece = _moved(piece, 1_000_000)
        if tid == lowest and span["name"] == sc.SPAN_PREFILL:  # a second, later one
            later = _moved(piece, 1_000_000)
            later[2]["spanId"] = "f" + span["spanId"][1:]
            stages[2].append(later)
        stages[stage].append(piece)
    d = tmp_path / "traces"
    d.mkdir()
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    seen, how = [], []
    for stage in [*stages, []]:
        with (d / "run.jsonl").open("a") as fh:
            fh.writelines(_line(p) for p in stage)
        run = idx.update()
        want = reference([d])
        same(run, want)
        same_columns(run.columns(), RunColumns.from_requests(want.requests))
        assert idx.skew_edges() == _collect([d])
        seen.append((idx.last_reanalysed, idx.last_rows_written, run.clock_offsets))
        how.append(idx.last_steps)
    # the steps: placed again where offsets moved (stages 1, 2), and extended also where
    # the other mode's engines arrive under the same ids, their step numbers repeating
    # within seconds (before, those were joined again whole: `steps_columns.extend`)
    assert how == ["joined", "extended", "extended", "extended", "kept"]
    assert len(run.requests) == 100
    assert "prefill-1" in seen[2][2]
    offsets = [{k: o.offset_ms for k, o in s[2].items()} for s in seen]
    assert offsets[3][synthetic.DECODE_INSTANCE] != offsets[2][synthetic.DECODE_INSTANCE]
    assert seen[3][0] > len(t3)  # the offsets moved: earlier traces analysed again
    assert seen[4][:2] == (0, 0)  # nothing new: nothing written
    idx.close()
    warm = AnalysisIndex([d], index_dir=tmp_path / "index")
    same(warm.update(), reference([d]))
    same_columns(warm.update().columns(), RunColumns.from_requests(reference([d]).requests))
    warm.close()


def _collect(paths: list[Path]) -> skew.Edges:
    """`skew.collect` of every trace's request spans, as `analyze` calls it."""
    store = TraceStore.from_paths(paths)
    indexes = []
    for tid, spans in store.traces.items():
        req = [s for s in spans.values() if s.name not in sc.PROCESS_SPANS]
        if req:
            indexes.append(TraceIndex(tid, req))
    resources = {id(s.resource): s.resource for ix in indexes for s in ix.spans}
    return skew.collect(indexes, skew.domains(resources.values()))


def _copies(pieces: list[Piece], traces: list[str], copy_no: int, shift_ns: int) -> list[Piece]:
    """The spans of `traces` as new traces (ids and request ids), `shift_ns` later: the
    same clock-skew evidence, so the offsets hold still."""
    out = []
    for piece in pieces:
        if piece[2]["traceId"] not in traces:
            continue
        res, scope, span = _moved(piece, shift_ns)
        span["traceId"] = f"{copy_no:04x}" + span["traceId"][4:]
        for a in span.get("attributes") or ():
            if a["key"] == sc.REQUEST_ID:
                a["value"] = {"stringValue": f"{a['value']['stringValue']}-c{copy_no}"}
        out.append((res, scope, span))
    return out


def _copyable_run(tmp_path: Path) -> tuple[Path, list[Piece], list[str], int]:
    """A run of 120 requests in one file, its spans, its request traces and a period
    after which `_copies` of them start past its end."""
    gen = synthetic.generate(120, seed=9, batch=4)
    pieces = _pieces(gen.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    ends = [int(p[2]["endTimeUnixNano"]) for p in pieces]
    period = max(ends) - min(int(p[2]["startTimeUnixNano"]) for p in pieces) + 10**9
    d = tmp_path / "traces"
    d.mkdir()
    (d / "run.jsonl").write_text("".join(map(_line, pieces)))
    return d, pieces, roots, period


def test_an_update_writes_the_new_traces_not_the_run(tmp_path: Path) -> None:
    """A Live refresh's per-request Python work follows the new spans: after k new
    traces are appended to a run of n, the update re-analyses k traces and writes k
    rows (facts, result row, TPOT breakdown), whatever n, and still equals `analyze()`."""
    d, pieces, roots, period = _copyable_run(tmp_path)
    idx = AnalysisIndex([d])
    run = idx.update()
    assert len(run.requests) == 120
    assert idx.last_rows_written == len(idx) > 120  # the first: every trace (steps too)
    total = 120
    for copy_no, k in enumerate((1, 4, 9), start=1):
        new = _copies(pieces, roots[:k], copy_no, copy_no * period)
        with (d / "run.jsonl").open("a") as fh:
            fh.writelines(map(_line, new))
        run = idx.update()
        total += k
        assert len(run.requests) == total
        assert idx.last_reanalysed == k and idx.last_rows_written == k
    same(run, reference([d]))
    idx.close()


def _kept_segments(idx: AnalysisIndex) -> list[tuple[int, bytes]]:
    return idx._connect().execute("SELECT seg, v FROM kept ORDER BY seg").fetchall()


def _durations_of(run: RunAnalysis) -> list[tuple[str, str, str, str, float]]:
    """The console's span-duration view (`span_durations`), as `analyze` makes it."""
    return [
        (r.trace_id, r.request_id, r.mode, s.name, s.duration_ms)
        for r in run.requests
        for s in r.spans
    ]


@pytest.mark.parametrize("redo_all", [None, 2, 4])
def test_merging_segments_writes_what_changed_since_the_first_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redo_all: int | None
) -> None:
    """A Live index appends a segment of kept rows per update, and merges them once
    there are `_COMPACT_AFTER`. The merge writes again the rows of the segments after
    the first, as they are now, not every trace's (at 200,000 requests a whole rewrite
    took 2.6 s of a +60-request refresh). Read back, the index equals `analyze()`, its
    span durations too. `redo_all`: the update at that many segments redid every TPOT
    breakdown (as when a solo cost or the clock offsets move): every other trace's
    breakdown is written beside its rows, and merged as breakdowns, not as rows."""
    from tracedpush.analysis import index as index_mod

    monkeypatch.setattr(index_mod, "_COMPACT_AFTER", 4)
    if redo_all:
        rewritten, once = AnalysisIndex._rewritten, [redo_all]

        def and_every_breakdown(self: AnalysisIndex, *args: Any) -> Any:
            if self._state.segments in once:  # type: ignore[union-attr]
                self._save_all = True
                once.clear()
            return rewritten(self, *args)

        monkeypatch.setattr(AnalysisIndex, "_rewritten", and_every_breakdown)
    d, pieces, roots, period = _copyable_run(tmp_path)
    AnalysisIndex([d]).update()
    idx = AnalysisIndex([d])  # warm: its facts hold no span durations
    idx.update()
    ((_, base),) = _kept_segments(idx)
    new: set[str] = set()
    for copy_no in range(1, 6):  # two new traces each
        with (d / "run.jsonl").open("a") as fh:
            fh.writelines(map(_line, _copies(pieces, roots[:2], copy_no, copy_no * period)))
        idx.update()
        new |= {t for t in idx if t.startswith(f"{copy_no:04x}")}
        segments = _kept_segments(idx)
        assert segments[0] == (0, base)  # the first segment never written again
        if copy_no < 4:
            assert [s for s, _ in segments] == list(range(copy_no + 1))
        else:  # 4 segments: the three after the first merged with this update's
            assert [s for s, _ in segments] == list(range(copy_no - 2))
            merged = set(marshal.loads(segments[1][1]))
            assert merged == {t for t in new if t[:4] <= "0004"}
            q = "SELECT seg, v FROM tpots"
            tpots = [(s, set(marshal.loads(v))) for s, v in idx._connect().execute(q)]
            if copy_no == 4:  # and the next update appends after them
                others = [(1, set(idx) - merged)] if redo_all else []
            assert tpots == others, copy_no
    assert len(new) == 10
    want = reference([d])
    full = analyze(TraceStore.from_paths([d]))
    assert idx.span_durations(want.requests) == _durations_of(full)
    idx.close()
    other = AnalysisIndex([d])
    same(other.update(), want)
    assert other.span_durations(want.requests) == _durations_of(full)
    other.close()


def test_a_whole_rewrite_after_a_warm_open_keeps_the_span_durations(tmp_path: Path) -> None:
    """A warm open reads the kept rows without the span durations (the console reads
    them from their own table, when asked). An update that changes more than half the
    traces writes every trace again: the durations of those it did not analyse come
    from that table, read before its rows are replaced (they were lost)."""
    gen = synthetic.generate(120, seed=3)
    d = tmp_path / "traces"
    files = gen.write(d)
    lines = {f: f.read_bytes().splitlines(keepends=True) for f in files}
    for f, ls in lines.items():
        f.write_bytes(b"".join(ls[: len(ls) // 2]))
    AnalysisIndex([d]).update()
    idx = AnalysisIndex([d])
    idx.update()
    for f, ls in lines.items():
        f.write_bytes(b"".join(ls))
    run = idx.update()
    assert len(_kept_segments(idx)) == 1  # written again whole
    want = _durations_of(analyze(TraceStore.from_paths([d])))
    assert idx.span_durations(run.requests) == want
    idx.close()
    other = AnalysisIndex([d])
    assert other.span_durations(other.update().requests) == want
    other.close()


def _saves_noted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`_COMPACT_AFTER` at 3, and how each save writes: "append" (a segment after the
    others), "merge" (the later ones written again as one) or "whole" (every trace)."""
    from tracedpush.analysis import index as index_mod

    monkeypatch.setattr(index_mod, "_COMPACT_AFTER", 3)
    ways: list[str] = []
    rewritten = AnalysisIndex._rewritten

    def noted(self: AnalysisIndex, *args: Any) -> Any:
        got = rewritten(self, *args)
        ways.append("append" if got is None else "merge" if got[2] else "whole")
        return got

    monkeypatch.setattr(AnalysisIndex, "_rewritten", noted)
    return ways


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_appends_and_warm_opens_in_any_order_read_back_as_analyze(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The kept segments under a random order of appends (a few lines of every file),
    updates and warm opens, with `_COMPACT_AFTER` at 3 so that a dozen updates meet
    every way a save writes (a segment appended, the later ones merged, all written
    again): after each update, and read back by a new index, the run and the console's
    span durations equal `analyze()`'s."""
    ways = _saves_noted(monkeypatch)
    rng = random.Random(seed)
    src, d = tmp_path / "full", tmp_path / "traces"
    files = synthetic.generate(60, seed=seed, batch=4).write(src)
    lines = {f: f.read_bytes().splitlines(keepends=True) for f in files}
    read = {f: len(ls) // 2 for f, ls in lines.items()}  # half the run, then a little more
    for f in files:
        (d / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (d / f.relative_to(src)).write_bytes(b"".join(lines[f][: read[f]]))
    idx = AnalysisIndex([d])
    for _ in range(14):
        if rng.random() < 0.3:  # a new process opens the kept index
            idx.close()
            idx = AnalysisIndex([d])
        for f, ls in lines.items():
            more = rng.randint(0, 2)
            with (d / f.relative_to(src)).open("ab") as fh:
                fh.writelines(ls[read[f] : read[f] + more])
            read[f] += more
        run = idx.update()
        full = analyze(TraceStore.from_paths([d]))
        same(run, reference([d]))
        assert idx.span_durations(run.requests) == _durations_of(full)
    idx.close()
    other = AnalysisIndex([d])
    run = other.update()
    same(run, reference([d]))
    assert other.span_durations(run.requests) == _durations_of(full)
    other.close()
    assert {"append", "merge"} <= set(ways), ways


@pytest.mark.parametrize("seed", [4, 5])
def test_moving_offsets_and_budgets_in_any_order_read_back_as_analyze(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """As above, with the clock offsets moving (a quarter of the requests come with D's
    spans 4 ms earlier: a new lowest slack) and Live's budget (`reanalyse_at_most`) or
    none, at random: requests left behind are saved as their breakdowns or rows move.
    Whenever none is behind, and once caught up, the run equals `analyze()`; the span
    durations always do."""
    ways = _saves_noted(monkeypatch)
    rng = random.Random(seed)
    skew_ms = {synthetic.DECODE_INSTANCE: 20.0, synthetic.PREFILL_INSTANCE: -8.0}
    gen = synthetic.generate(80, seed=seed, batch=4, clock_offsets_ms=skew_ms, hosts=UNTIED)
    pieces = _pieces(gen.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    late = set(roots[60:])
    moved = [
        _moved(p, -4_000_000) if p[2]["traceId"] in late and _service(p) == sc.SERVICE_DECODE
        else p
        for p in pieces
    ]  # fmt: skip
    lines = [_line(p) for p in moved]
    d = tmp_path / "traces"
    d.mkdir()
    at = len(lines) // 2
    (d / "run.jsonl").write_text("".join(lines[:at]))
    idx = AnalysisIndex([d])
    idx.update()
    for _ in range(14):
        if rng.random() < 0.3:
            idx.close()
            idx = AnalysisIndex([d])
        more = rng.randint(0, len(lines) // 40)
        with (d / "run.jsonl").open("a") as fh:
            fh.writelines(lines[at : at + more])
        at += more
        run = idx.update(reanalyse_at_most=rng.choice([None, 3, 3]))
        full = analyze(TraceStore.from_paths([d]))
        if not idx.behind:
            same(run, reference([d]))
        assert idx.span_durations(run.requests) == _durations_of(full)
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(lines[at:])
    idx.update(reanalyse_at_most=3)
    idx.close()
    other = AnalysisIndex([d])
    run = other.update()  # no budget: caught up at once
    assert other.behind == 0
    same(run, reference([d]))
    assert other.span_durations(run.requests) == _durations_of(analyze(TraceStore.from_paths([d])))
    other.close()
    assert {"append", "merge"} <= set(ways), ways


def test_a_moved_clock_splits_again_only_the_tpot_its_steps_meet(tmp_path: Path) -> None:
    """Two deployments at the same time: a real one (one host) and a synthetic one
    whose clocks move with new requests. P's steps are placed again and D gets new
    steps; the real engines' steps stay as they were, so an update splits the TPOT of
    the synthetic requests (analysed again, their offsets moved) and not of the real
    ones (their offsets and steps held, though their decode windows meet the changed
    steps' times), and the run equals `analyze()`."""
    skew_ms = {synthetic.DECODE_INSTANCE: 20.0, synthetic.PREFILL_INSTANCE: -8.0}
    real_start_s = 1_796_128_712  # tests/data/real-run.jsonl.gz: push 13-32 s after
    gen = synthetic.generate(
        40,
        seed=22,
        batch=4,
        modes=("push",),
        clock_offsets_ms=skew_ms,
        hosts=UNTIED,
        start_unix_s=real_start_s + 8,
    )
    pieces = _pieces(gen.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    late = set(roots[30:])
    first = [p for p in pieces if p[2]["traceId"] not in late]
    second = [  # a new lowest slack, the pairs still consistent (so one clock moves)
        _moved(p, -1_000_000) if _service(p) == sc.SERVICE_DECODE else p
        for p in pieces
        if p[2]["traceId"] in late
    ]
    d = tmp_path / "traces"
    d.mkdir()
    with gzip.open(REAL, "rb") as fh, (d / "real.jsonl").open("wb") as out:
        shutil.copyfileobj(fh, out)
    (d / "run.jsonl").write_text("".join(map(_line, first)))
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    before = idx.update()
    real = [r for r in before.requests if r.trace_id not in set(roots)]
    assert len(real) > 20 and all(r.tpot_breakdown_ms for r in before.requests if r.tpot_ms)
    ours = [r.start_unix_ms for r in before.requests if r.trace_id in set(roots)]
    assert sum(min(ours) < r.start_unix_ms < max(ours) for r in real) > 5  # at one time
    # a window of changed steps meets the requests of its engine, and those whose
    # engine is none of the run's (split over the only decode engine, if one)
    slots, off = idx._slots, idx._off_ns
    assert slots is not None
    engine = {r.trace_id: idx._kept[r.trace_id].facts.engine for r in before.requests}
    engines = set(engine.values())
    assert len(engines) == 2 and None not in engines
    split = {r.trace_id for r in before.requests if r.tpot_ms}

    def meets(eid: str) -> set[str]:
        return {t for t, _k in slots.at(slots.meeting([(eid, 0, 1 << 62)], off, engines))}

    for eid in engines:
        assert meets(eid) == {t for t in split if engine[t] == eid}
    lost = next(r.trace_id for r in real if r.tpot_ms)
    slots.engine[idx._kept[lost].facts.seq] = None
    assert all(lost in meets(eid) for eid in engines)
    slots.engine[idx._kept[lost].facts.seq] = engine[lost]
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, second))
    run = idx.update()
    was = before.clock_offsets
    moved = [k for k, o in run.clock_offsets.items() if o.offset_ms != was[k].offset_ms]
    # the synthetic proxy's and P's (D's is the synthetic clocks' reference: 0)
    assert sorted(moved) == sorted([synthetic.PROXY_INSTANCE, synthetic.PREFILL_INSTANCE])
    assert idx.last_steps == "extended"
    assert set(idx._tpot_saved) == set(roots) and idx.last_tpot_redone == 40
    same(run, reference([d]))
    idx.close()


def test_moved_offsets_are_caught_up_within_a_budget(tmp_path: Path, monkeypatch) -> None:
    """When the clock offsets move, a Live refresh (``update(reanalyse_at_most=N)``)
    analyses the new traces and at most N of the earlier ones they moved, newest
    first; later updates catch up N at a time with nothing new; once none is behind,
    the run equals `analyze()`. An index closed while behind catches up when opened
    again, and ``update()`` without a budget catches up at once."""
    skew_ms = {synthetic.DECODE_INSTANCE: 20.0, synthetic.PREFILL_INSTANCE: -8.0}
    gen = synthetic.generate(60, seed=21, batch=4, clock_offsets_ms=skew_ms, hosts=UNTIED)
    pieces = _pieces(gen.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    late = set(roots[45:])
    first, second = [], []
    for piece in pieces:
        if piece[2]["traceId"] not in late:
            first.append(piece)
        elif _service(piece) == sc.SERVICE_DECODE:  # a new lowest slack: offsets move
            second.append(_moved(piece, -4_000_000))
        else:
            second.append(piece)
    d = tmp_path / "traces"
    d.mkdir()
    (d / "run.jsonl").write_text("".join(map(_line, first)))
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    before = idx.update(reanalyse_at_most=4).clock_offsets
    assert idx.behind == 0 and idx.last_reanalysed == 45
    seq = {t: k.facts.seq for t, k in idx._kept.items() if k.facts.res}  # requests
    tpot = {t: idx._kept[t].tpot for t in seq}
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, second))
    moved = idx.update(reanalyse_at_most=4).clock_offsets
    assert moved[synthetic.DECODE_INSTANCE].offset_ms != before[synthetic.DECODE_INSTANCE].offset_ms
    assert idx.last_reanalysed == 15 + 4 and idx.behind == 45 - 4
    # the newest earlier requests first
    redone = [t for t in idx._stale_saved if t not in late]
    assert sorted(seq[t] for t in redone) == sorted(seq.values())[-4:]
    # the steps moved with D's clock, but the TPOT of those behind waits with the rest
    left = set(seq) - set(redone)
    assert idx.last_tpot_redone == 15 + 4
    assert all(idx._kept[t].tpot == tpot[t] for t in left) and any(tpot.values())
    scans: list[int] = []  # catching up reads those left behind, not every trace
    every = TraceSlots.traces
    monkeypatch.setattr(TraceSlots, "traces", lambda sl: scans.append(1) or every(sl))
    for _ in range(3):
        idx.update(reanalyse_at_most=4)
        assert idx.last_new == 0 and idx.last_reanalysed == 4
    assert idx.behind == 45 - 16 and not scans
    redone = [t for t in idx._stale_saved if t not in late]  # still the newest first
    assert sorted(seq[t] for t in redone) == sorted(seq.values())[-16:-12]
    idx.close()
    warm = AnalysisIndex([d], index_dir=tmp_path / "index")
    warm.update(reanalyse_at_most=10)
    assert warm.last_reanalysed == 10 and warm.behind == 45 - 26
    while warm.behind:
        run = warm.update(reanalyse_at_most=10)
    same(run, reference([d]))
    assert any(warm._kept[t].tpot != tpot[t] for t in left)  # caught up, TPOT too
    same_columns(run.columns(), RunColumns.from_requests(reference([d]).requests))
    warm.close()
    # without a budget, at once (a report on an index the console left behind)
    d2 = tmp_path / "traces2"
    d2.mkdir()
    (d2 / "run.jsonl").write_text("".join(map(_line, first)))
    idx = AnalysisIndex([d2])
    idx.update(reanalyse_at_most=4)
    with (d2 / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, second))
    idx.update(reanalyse_at_most=4)
    assert idx.behind == 45 - 4
    idx.close()
    report = AnalysisIndex([d2])
    same(report.update(), reference([d2]))
    assert report.behind == 0 and report.last_reanalysed == 45 - 4
    report.close()


def test_an_opened_index_takes_its_kept_skew_evidence(
    tmp_path: Path, skewed: synthetic.SyntheticRun, monkeypatch
) -> None:
    """The index keeps the skew evidence beside it (after a cold build, when traffic
    pauses, at close): opened again, its first update with new spans puts the changed
    traces' evidence into the kept one rather than making it from every trace's facts
    (0.6 s of the first Live refresh at 200,000 requests), and the run equals
    `analyze`'s. Evidence kept for other facts than the index's (updated since, neither
    paused nor closed) is not taken."""
    pieces = _pieces(skewed.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    late, grown = set(roots[120:]), set(roots[100:120])

    def held(p: Piece) -> bool:  # new traces, and the proxy's leg of earlier ones: their
        tid = p[2]["traceId"]  # pairs change (`skew.causal_pairs` takes it once it arrives)
        return tid in late or (tid in grown and p[2]["name"] == sc.SPAN_PROXY_PREFILL)

    first, second = [p for p in pieces if not held(p)], [p for p in pieces if held(p)]
    d = tmp_path / "traces"
    d.mkdir()
    (d / "run.jsonl").write_text("".join(map(_line, first)))
    built = AnalysisIndex([d], parallel=True)
    built.update()
    assert built._stored_key("skew") == 0  # the cold build wrote it
    built.close()
    made: list[int] = []
    init = SkewEvidence.__init__
    monkeypatch.setattr(
        SkewEvidence, "__init__", lambda ev, at, facts: made.append(len(at)) or init(ev, at, facts)
    )
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, second[: len(second) // 2]))
    opened = AnalysisIndex([d])
    run = opened.update()
    assert opened.last_new and not made
    same(run, reference([d]))
    kept = opened._slots.made_evidence
    everything = [k.facts for _t, k in opened._slots.traces()]
    fresh = SkewEvidence(np.array([f.seq for f in everything]), everything)
    assert (kept.low, kept.count) == (fresh.low, fresh.count) and kept.low
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, second[len(second) // 2 :]))
    opened.update()
    opened._close_dbs()  # killed: the evidence kept is the last opening's
    made.clear()
    again = AnalysisIndex([d])
    same(again.update(), reference([d]))  # nothing new: the offsets hold, no evidence
    assert not made and again._stored_key("skew") != again._state.facts_version
    assert again.skew_edges() == opened.skew_edges()
    assert made == [len(again._kept)]  # made from the facts, not taken
    again.close()


def test_results_of_the_parallel_build_are_made_again_when_read(tmp_path: Path) -> None:
    """The parallel cold build stores rows, not results (writing 200,000 results took
    about 5 s of its CPU): a result read is made again from the trace's stored spans
    with the offsets its row was made with. So a request left behind when the offsets
    move reads as it was before the move, as its row still counts it."""
    skew_ms = {synthetic.DECODE_INSTANCE: 20.0, synthetic.PREFILL_INSTANCE: -8.0}
    gen = synthetic.generate(60, seed=21, batch=4, clock_offsets_ms=skew_ms, hosts=UNTIED)
    pieces = _pieces(gen.documents)
    roots = [p[2]["traceId"] for p in pieces if p[2]["name"] == sc.SPAN_REQUEST]
    late = set(roots[45:])
    first = [p for p in pieces if p[2]["traceId"] not in late]
    second = [
        _moved(p, -4_000_000) if _service(p) == sc.SERVICE_DECODE else p  # offsets move
        for p in pieces
        if p[2]["traceId"] in late
    ]
    d = tmp_path / "traces"
    d.mkdir()
    (d / "run.jsonl").write_text("".join(map(_line, first)))
    idx = AnalysisIndex([d], index_dir=tmp_path / "index", parallel=True)
    run = idx.update()
    assert idx.rebuilt and all(k.result is None for k in idx._kept.values())
    for shard in range(SHARDS):
        with closing(open_span_db(idx.dir, shard)) as db:
            assert db.execute("SELECT count(*) FROM results").fetchone() == (0,)
    same(run, reference([d]))  # every result made again
    before = {r.trace_id: r for r in run.requests}
    idx.close()
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, second))
    live = AnalysisIndex([d], index_dir=tmp_path / "index")  # nothing in memory
    moved = live.update(reanalyse_at_most=4)
    assert live.behind == 45 - 4
    left = set(before) - set(live._stale_saved)
    now = {r.trace_id: r for r in reference([d]).requests}
    changed = 0
    for r in moved.requests:
        if r.trace_id in left:
            was = before[r.trace_id]
            run_wide = {"load": was.load, "load_bucket": was.load_bucket, "bucket": was.bucket,
                        "tpot_breakdown_ms": was.tpot_breakdown_ms}  # fmt: skip
            assert dataclasses.replace(r, **run_wide) == was, r.trace_id
            changed += r.critical_path != now[r.trace_id].critical_path
    assert changed  # with the new offsets, some would differ
    live.close()


@pytest.mark.parametrize("epochs", ["one", "eight"])
def test_growing_process_traces_parse_only_new_steps(
    tmp_path: Path, monkeypatch, epochs: str
) -> None:
    """A live run: each engine process's trace of ``engine.steps`` and ``engine.threads``
    spans grows with every update, beside new requests. An update stores and parses only
    the process spans that arrived (not the trace so far); it splits again only the TPOT
    of requests whose decode window meets steps that changed, a step whose epoch's solo
    forward cost moved among them; and the run still equals `analyze()` of every span so
    far, also warm and after `close`.

    The synthetic run lasts seconds, not the minutes of `SOLO_EPOCH_NS`; it is lowered
    here so the run is one epoch (every breakdown split again when the solo cost moves,
    as it does with most updates) or eight (only the last epochs' requests)."""
    from tracedpush.analysis import steps as steps_mod
    from tracedpush.analysis import steps_columns

    one_host = dict.fromkeys(UNTIED, "h")  # one clock: offsets that hold still
    gen = synthetic.generate(  # each process's export account grows too (export_health):
        160,  # drops on one process, no final record from another
        seed=13,
        batch=4,
        modes=("push",),
        hosts=one_host,
        export_dropped={"p_work": 3},
        unflushed=("d_sched",),
    )
    pieces = _pieces(gen.documents)
    roots = sorted(
        int(p[2]["startTimeUnixNano"]) for p in pieces if p[2]["name"] == sc.SPAN_REQUEST
    )
    cuts = roots[20::20]
    epoch_ns = 10**15 if epochs == "one" else (roots[-1] - roots[0]) // 8
    monkeypatch.setattr(steps_columns, "SOLO_EPOCH_NS", epoch_ns)
    stages: list[list[Piece]] = [[] for _ in range(len(cuts) + 1)]
    for piece in pieces:
        stages[sum(int(piece[2]["endTimeUnixNano"]) > c for c in cuts)].append(piece)
    parsed: list[str] = []
    real = steps_mod._span_columns

    def counting(span, origin):
        parsed.append(span.span_id)
        return real(span, origin)

    monkeypatch.setattr(steps_mod, "_span_columns", counting)
    d = tmp_path / "traces"
    d.mkdir()
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    solo_was: dict = {}
    median_was, fewer, redone, median_moved_yet_fewer = None, 0, 0, 0
    for i, part in enumerate(stages):
        with (d / "run.jsonl").open("a") as fh:
            fh.writelines(map(_line, part))
        parsed.clear()
        run = idx.update()
        new_steps = [p[2]["spanId"] for p in part if p[2]["name"] == sc.SPAN_ENGINE_STEPS]
        assert sorted(parsed) == sorted(new_steps), i  # only what arrived
        # ... and only the steps near them were joined again
        assert idx.last_steps == ("extended" if i else "joined"), i
        assert bool(idx._step_cache.parts) == (i == 0)  # every trace's parts let go
        want = reference([d])
        same(run, want)
        ours = want.engine_steps
        solo = {e: ours.step_solo_us(e) for e in ours.columns}  # per step
        median = {e: ours.solo_forward_us(e) for e in ours.columns}  # the engine's, run-wide
        held = all(  # every step the last update knew kept its solo cost
            (v[: len(solo_was[e])] == solo_was[e]).all() for e, v in solo.items() if e in solo_was
        )
        if i and held:  # the steps before the last update's end hold still
            assert idx.last_tpot_redone < len(run.requests), i
            fewer += 1
            other = AnalysisIndex([d], index_dir=tmp_path / "index")  # what it stored
            same(other.update(), want)
            other.close()
        elif i:
            if epochs == "one":  # the run's one solo cost moved: every breakdown again ...
                assert idx.last_tpot_redone == len(run.requests), i
                # ... saved as breakdowns alone, not every trace's row again (unless most
                # rows changed: then all segments were merged into one)
                db = idx._connect()
                segments = db.execute("SELECT count(*) FROM kept").fetchone()[0]
                tpots = db.execute("SELECT count(*) FROM tpots").fetchone()[0]
                assert tpots == (segments > 1), (i, segments, tpots)
                redone += segments > 1
            other = AnalysisIndex([d], index_dir=tmp_path / "index")  # what it stored
            same(other.update(), want)
            other.close()
        if epochs == "eight" and i:  # whether or not the run-wide median moved, only
            assert idx.last_tpot_redone < len(run.requests), i  # the new and latest ones
            median_moved_yet_fewer += median != median_was
        solo_was, median_was = solo, median
        if i:
            db = idx.span_db(0), idx.span_db(1)
            assert sum(x.execute("SELECT count(*) FROM more").fetchone()[0] for x in db) > 0
    if epochs == "one":
        assert fewer >= 2 and redone >= 2, (fewer, redone)
    else:  # the run-wide median moved, and yet only the last epochs' requests were split
        assert median_moved_yet_fewer >= 2, median_moved_yet_fewer

    # the steps themselves are written on `close`: an index opened before reads them anew
    unsaved = AnalysisIndex([d], index_dir=tmp_path / "index")
    assert _steps_json(unsaved.update().engine_steps) == _steps_json(want.engine_steps)
    unsaved.close()
    idx.close()
    warm = AnalysisIndex([d], index_dir=tmp_path / "index")
    same(warm.update(), want)
    assert _steps_json(warm.update().engine_steps) == _steps_json(want.engine_steps)
    # ... or when an update brings nothing (a Live index is seldom closed)
    later = _steps_later(pieces, 10**12)
    samples = _steps_later(pieces, 10**12, sc.SPAN_ENGINE_THREADS)
    with (d / "run.jsonl").open("a") as fh:  # engine steps and thread samples, then a pause
        fh.writelines(map(_line, later + samples))
    parsed.clear()
    warm.update()
    assert warm._steps_unsaved
    # an index opened on stored steps parses and joins in only the new ones, and makes
    # their TPOT arrays from the stored ones' (`TpotSteps`: only what follows their head)
    assert warm.last_steps == "extended"
    assert warm._tpot is not None and warm._tpot[1].base is not None
    assert sorted(parsed) == sorted(p[2]["spanId"] for p in later)
    folded: list[int] = []  # the contention written at the pause folds only new samples
    fold = contention_mod.UsageFold.add
    monkeypatch.setattr(
        contention_mod.UsageFold, "add", lambda f, x: folded.append(len(x)) or fold(f, x)
    )
    warm.update()
    assert not warm._steps_unsaved
    assert samples and folded == [len(samples)], folded
    want = reference([d])
    parsed.clear()
    paused = AnalysisIndex([d], index_dir=tmp_path / "index")
    got = paused.update()
    assert _steps_json(got.engine_steps) == _steps_json(want.engine_steps) and not parsed
    assert got.contention().to_json() == want.contention().to_json()
    health = got.export_health()
    assert len(health.accounts) == 4 and len(health.unflushed) == 1 and len(health.lossy) == 1
    assert health.to_json() == want.export_health().to_json()
    paused.close()
    warm.close()


def _steps_json(store: Any) -> dict[str, list[dict]]:
    """Every engine's steps as JSON, to compare two runs' step by step."""
    return {e: [s.to_json() for s in store.steps[e]] for e in store.columns}


def _steps_later(
    pieces: list[Piece], shift_ns: int, name: str = sc.SPAN_ENGINE_STEPS
) -> list[Piece]:
    """The last ``engine.steps`` (or `name`) span of each process trace again, `shift_ns`
    later with a new span id (its steps' start times too): more steps (or thread
    samples) in the same traces."""
    last: dict[str, Piece] = {}
    for p in pieces:
        if p[2]["name"] == name:
            last[p[2]["traceId"]] = p
    out = []
    for piece in last.values():
        res, scope, span = _moved(piece, shift_ns)
        span["spanId"] = ("f" if span["spanId"][0] == "e" else "e") + span["spanId"][1:]  # a new id
        for a in span["attributes"]:
            if a["key"] == sc.STEP_START_NS:
                for v in a["value"]["arrayValue"]["values"]:
                    v["intValue"] = str(int(v["intValue"]) + shift_ns)
        out.append((res, scope, span))
    return out


def _two_proxies(modes: tuple[str, ...]) -> dict[str, list[Piece]]:
    """A synthetic run of `modes` in sequence (one run each, in that order in time), its
    pull runs' requests through a second proxy on its own host; pieces by mode."""
    gen = synthetic.generate(30 * len(modes), seed=4, batch=4, hosts=UNTIED, modes=modes,
                             engine_steps=False)  # fmt: skip
    second = {
        sc.RES_SERVICE_INSTANCE_ID: {"stringValue": "proxy-b"},
        sc.RES_HOST_NAME: {"stringValue": "h-proxy-b"},
    }
    parts: dict[str, list[Piece]] = {"push": [], "pull": []}
    for piece in _pieces(gen.documents):
        pid = int(_res_attr(piece[0], sc.RES_PROCESS_PID)["intValue"])
        mode = "push" if pid < 2000 else "pull"  # `synthetic.generate`'s pids: 1000 per run
        if mode == "pull" and _service(piece) == sc.SERVICE_PROXY:
            piece = _moved(piece, **second)
        parts[mode].append(piece)
    return parts


@pytest.mark.parametrize("pull_first", [False, True])
def test_tied_proxies_keep_the_reference_of_the_first_requests(
    tmp_path: Path, pull_first: bool
) -> None:
    """Two proxies (one per mode, own hosts) with as many requests each: the reference
    clock is the one whose requests started first, as `analyze` picks it, whichever
    arrived first (a tie among the first requests: the first met by start)."""
    parts = _two_proxies(("push", "pull"))  # push's requests start first
    d = tmp_path / "traces"
    d.mkdir()
    idx = AnalysisIndex([d])
    for mode in ("pull", "push") if pull_first else ("push", "pull"):
        with (d / "run.jsonl").open("a") as fh:
            fh.writelines(map(_line, parts[mode]))
        run = idx.update()
        same(run, reference([d]))
    refs = [x for x, o in run.clock_offsets.items() if o.reference]
    assert refs == [synthetic.PROXY_INSTANCE]
    idx.close()


def test_the_reference_stays_when_another_proxy_gets_more_requests(
    tmp_path: Path, monkeypatch
) -> None:
    """The reference is the proxy with the most of the run's first requests
    (`skew.REFERENCE_REQUESTS`, 10 here): a proxy whose requests come later and
    outnumber the first one's leaves it as it is, so a Live refresh analyses only the new
    requests (over the whole run it moved to that proxy, and every offset with it)."""
    monkeypatch.setattr(skew, "REFERENCE_REQUESTS", 10)
    parts = _two_proxies(("push", "pull", "pull"))  # 30 through the first, then 60
    d = tmp_path / "traces"
    d.mkdir()
    idx = AnalysisIndex([d])
    (d / "run.jsonl").write_text("".join(map(_line, parts["push"])))
    idx.update()
    with (d / "run.jsonl").open("a") as fh:
        fh.writelines(map(_line, parts["pull"]))
    run = idx.update(reanalyse_at_most=0)
    assert [x for x, o in run.clock_offsets.items() if o.reference] == [synthetic.PROXY_INSTANCE]
    assert idx.behind == 0 and idx.last_reanalysed == 60
    same(run, reference([d]))
    idx.close()
