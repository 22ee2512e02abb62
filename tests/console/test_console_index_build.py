"""The console builds a big run's cold index in a process of its own (`index_child`).

Streamlit's server is threaded, so the console never forks build workers itself; a
run big enough for them (`index.PARALLEL_BYTES`, lowered here so a small run counts)
is built by a child process that may, and the console then opens the index warm.
Real processes throughout: the child, its forked workers, a parent killed under it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tracedpush.analysis import (
    TraceStore,
    analyze,
    build_progress,
    index_cache,
    index_child,
    index_lease,
)
from tracedpush.analysis import index as index_mod
from tracedpush.console import data
from tracedpush.console.source import Source
from tracedpush.testing import synthetic
from tracedpush.testing.processes import python_tree, wait_ended


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    synthetic.generate(60, seed=3, batch=4).write(d)
    return d


def _feed_run(traces: Path) -> tuple[data.Feed, list[object]]:
    feed = data.Feed(Source.traces([str(traces)]))
    return feed, list(feed.snapshot().run.requests)


def test_a_big_cold_run_is_built_by_a_child_and_opened_warm(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 0)
    built: list[str | None] = []
    real = index_child.build
    monkeypatch.setattr(index_child, "build", lambda p, **kw: built.append(real(p, **kw)))
    feed, got = _feed_run(traces)
    assert built == [None]  # the child built it, and said nothing went wrong
    assert not feed._index.rebuilt  # the console opened what the child built
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)
    _feed_run(traces)  # warm now: no child
    assert built == [None]


def test_the_child_builds_where_the_source_keeps_its_index(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--index-dir`: the child builds the index there, and the console opens it warm;
    nothing is written beside the traces."""
    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 0)
    where = tmp_path / "elsewhere"
    feed = data.Feed(Source.traces([str(traces)], index_dir=str(where)))
    got = list(feed.snapshot().run.requests)
    assert feed._index.dir == where and not feed._index.rebuilt  # the child's, warm
    assert (where / "index.sqlite").is_file()
    assert not (traces / index_mod.INDEX_DIRNAME).exists()
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)


def test_a_small_run_is_built_in_the_console_itself(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_child, "build", lambda *_a, **_k: pytest.fail("a child"))
    feed, got = _feed_run(traces)  # 60 requests: far below PARALLEL_BYTES
    assert feed._index.rebuilt
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)


def test_a_child_that_fails_leaves_the_build_to_the_console(
    traces: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(index_child.sys, "executable", "/bin/false")  # a real exit 1
    feed, got = _feed_run(traces)
    assert feed._index.rebuilt
    assert got == list(analyze(TraceStore.from_paths([traces]), spans=False).requests)
    assert "the index build process failed (exit 1)" in caplog.text


def test_the_child_and_its_workers_end_with_their_parent(slow_build_traces: Path) -> None:
    """A console killed (SIGKILL: no cleanup of its own) while the child builds: the
    kernel sends the child SIGTERM, and it stops its build workers and ends, the index
    left unbuilt (a child that went on would have finished it). The child and workers
    are frozen (SIGSTOP) from before the kill until after it, so the build cannot
    finish first."""
    d = slow_build_traces
    code = (
        "import sys; from pathlib import Path; from tracedpush.analysis import index_child;"
        "index_child.build([Path(sys.argv[1])])"
    )
    with python_tree(code, str(d), below=3) as (parent, below):  # the child, its 2 workers
        for pid in sorted(below):  # the child first
            os.kill(pid, signal.SIGSTOP)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        for pid in below:
            os.kill(pid, signal.SIGCONT)
        wait_ended(below)
        assert index_mod.AnalysisIndex([d]).needs_build()


@pytest.mark.parametrize(
    "parallel_bytes", [0, 1 << 40], ids=["in its child", "in the console's process"]
)
def test_the_build_progress_reaches_the_console(
    slow_build_traces: Path, monkeypatch: pytest.MonkeyPatch, capsys, parallel_bytes: int
) -> None:
    """While the index builds (a minute of silence at 200,000 requests before), the Feed
    keeps its latest progress line for the pages (`Feed.building`) and the server's
    terminal gets a line as each stage starts; after it, `building` is None again. The
    same whether the child builds it (a big run) or the console's own process (a smaller
    one, or where the child failed or nothing forks)."""
    import threading
    import time

    monkeypatch.setattr(index_mod, "PARALLEL_BYTES", parallel_bytes)
    feed = data.Feed(Source.traces([str(slow_build_traces)]))
    seen: set[str] = set()
    loading = threading.Thread(target=feed.snapshot)
    loading.start()
    while loading.is_alive():
        line = feed.building
        if line is not None:
            seen.add(line)
        time.sleep(0.01)
    loading.join()
    assert feed.building is None and feed.snapshot().run.requests
    assert feed._index.rebuilt == bool(parallel_bytes)  # the child's is opened warm
    counted = [line for line in seen if "%)" in line]
    assert counted, seen  # e.g. "1 s: storing spans by trace 21,504 of 61,000 (35%)"
    terminal = [line for line in capsys.readouterr().err.splitlines() if " s: " in line]
    assert [build_progress.stage_of(line) for line in terminal] == [
        "reading the traces",
        "storing spans by trace",
        "estimating clock offsets",
        "analysing requests",
    ], terminal
    assert all(line.startswith("tracedpush console: ") for line in terminal)


def test_an_idle_console_keeps_its_index_lease(traces: Path) -> None:
    """A server nobody visits (its index not updated for hours) still has its index's
    lease touched every `index_lease.KEEP_S` (an hour; woken at once here), so other
    hosts sharing the index root, which count a lease `LEASE_S` after its last touch,
    keep counting it."""
    import time

    feed = data.Feed(Source.traces([str(traces)]))
    feed.snapshot()
    (lease,) = index_lease.files(feed.index_dir)
    old = time.time() - 2 * index_lease.LEASE_S
    os.utime(lease, (old, old))
    index_lease._tick.set()  # as an hour's wait would
    deadline = time.monotonic() + 10
    while lease.stat().st_mtime < old + 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert time.time() - lease.stat().st_mtime < 60
    feed._index.close()


def test_a_page_waits_for_the_build_then_draws(
    traces: Path, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A visitor who comes while the child builds: the page waits (saying how far the
    build is, in a box it empties after: AppTest sees only the end) and then draws."""
    import threading
    import time

    source = Source.traces([str(traces)])
    feed = data.Feed(source)
    monkeypatch.setitem(data._feeds, source, feed)  # the one the page reads; undone after
    feed.building = "3 s: storing spans by trace 1,024 of 4,096 (25%)"
    done = threading.Timer(1.0, lambda: setattr(feed, "building", None))
    done.start()
    started = time.perf_counter()
    at = app(traces=traces)
    assert time.perf_counter() - started >= 1.0  # it waited for the build
    assert not at.exception
    assert [t.value for t in at.title] == ["Push vs pull"]  # the page drew
    assert not [i for i in at.info if "Building the analysis index" in i.value]  # emptied


def test_a_page_waits_for_another_visits_load_then_draws(
    traces: Path, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A visitor who comes while another visit (or the server's warm-up) opens the run's
    index: the page says for how long it has been opening, waits, then draws."""
    import threading
    import time

    source = Source.traces([str(traces)])
    feed = data.Feed(source)
    monkeypatch.setitem(data._feeds, source, feed)
    feed.loading_since = time.monotonic()
    done = threading.Timer(1.0, lambda: setattr(feed, "loading_since", None))
    done.start()
    started = time.perf_counter()
    at = app(traces=traces)
    assert time.perf_counter() - started >= 1.0  # it waited for the other load
    assert not at.exception
    assert [t.value for t in at.title] == ["Push vs pull"]
    assert not [i for i in at.info if "Opening this run's analysis" in i.value]  # emptied
    assert feed.loading_since is None  # its own load (after the wait) cleared it too


def test_a_live_refresh_that_grows_the_index_keeps_the_root_under_its_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """TRACEDPUSH_INDEX_MAX_SIZE holds while a console follows a growing run, not only
    when it builds: a Live refresh that grew its index removes the least recently used
    others once the root is over the cap, checking at most once a `CAP_EVERY_S`."""
    root = tmp_path / "indexes"
    monkeypatch.setenv("TRACEDPUSH_INDEX_ROOT", str(root))
    old, live = tmp_path / "old", tmp_path / "live"
    synthetic.generate(6, seed=1).write(old)
    synthetic.generate(6, seed=2).write(live)
    idx = index_mod.AnalysisIndex([old])
    idx.update()
    idx.close()
    then = os.path.getmtime(idx.dir) - 3 * 86400
    for f in idx.dir.iterdir():
        os.utime(f, (then, then))
    feed = data.Feed(Source.traces([str(live)]))
    feed.snapshot()
    total = sum(i.bytes for i in index_cache.scan(root))
    monkeypatch.setenv("TRACEDPUSH_INDEX_MAX_SIZE", str(total + 4096))  # both fit, just
    checks: list[Path] = []
    after_growth = index_cache.after_growth
    monkeypatch.setattr(
        index_cache, "after_growth", lambda d, say: (checks.append(d), after_growth(d, say))
    )
    assert feed.refresh() == 0 and not checks  # nothing new: no check
    for seed in (3, 4):  # the second growth comes within CAP_EVERY_S of the first
        more = tmp_path / f"more-{seed}"
        synthetic.generate(30, seed=seed).write(more)
        for f in more.rglob("*.jsonl"):
            with (live / f.relative_to(more)).open("ab") as out:
                out.write(f.read_bytes())
        with caplog.at_level("WARNING"):
            assert feed.refresh() > 0
    assert checks == [feed._index.dir]
    assert f"removed the index {idx.dir} (over TRACEDPUSH_INDEX_MAX_SIZE=" in caplog.text
    assert [i.path for i in index_cache.scan(root)] == [feed._index.dir]
