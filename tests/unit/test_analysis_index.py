"""The analysis index gives exactly `analyze()`'s results, request by request: cold,
warm (a new process reading the kept index), after files grow (line by line, torn
lines, offsets moving), with failures, and on a real run's traces."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tracedpush.analysis import TraceStore, analyze, run_json
from tracedpush.analysis.index import INDEX_DIRNAME, AnalysisIndex, index_run
from tracedpush.analysis.results import RunAnalysis
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


def reference(paths: list[Path], **kwargs: Any) -> RunAnalysis:
    return analyze(TraceStore.from_paths(paths), spans=False, **kwargs)


@pytest.fixture(scope="module")
def skewed() -> synthetic.SyntheticRun:
    # clocks off by tens of ms, one host per instance (untied), spans dropped, steps
    return synthetic.generate(
        160,
        seed=7,
        batch=8,
        clock_offsets_ms={synthetic.DECODE_INSTANCE: 35.0, synthetic.PREFILL_INSTANCE: -12.0},
        hosts={
            synthetic.PROXY_INSTANCE: "h-proxy",
            synthetic.PREFILL_INSTANCE: "h-prefill",
            synthetic.DECODE_INSTANCE: "h-decode",
        },
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
        for fmt in ("json", "table", "perfetto"):
            out = tmp_path / f"{name}.{fmt}"
            assert (
                main(["report", "--traces", str(d), "--format", fmt, "--out", str(out), *extra])
                == 0
            )
            outs[name, fmt] = out.read_text()
    assert not (tmp_path / "idx").exists() or (tmp_path / "idx").is_dir()
    for fmt in ("json", "table", "perfetto"):
        for name in ("cold", "warm", "elsewhere"):
            a, b = outs["plain", fmt], outs[name, fmt]
            if fmt == "json":  # the load counters say what this invocation read
                ja, jb = json.loads(a), json.loads(b)
                del ja["load_stats"], jb["load_stats"]
                assert ja == jb
            elif fmt == "table":
                assert _no_load_line(a) == _no_load_line(b)
            else:
                assert a == b
    assert (d / INDEX_DIRNAME).is_dir()


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
    idx.close()
    warm = AnalysisIndex([d])
    same(warm.update(), want)
    assert warm.last_new == 0
    warm.close()
