"""`tracedpush index`: real indexes under a real TRACEDPUSH_INDEX_ROOT, built by
`tracedpush report`; list says what each is, prune removes exactly the worthless, the
old and the least recently used, never one a process has open, and nothing that is not
the index's own."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracedpush.analysis import index_cache as cache
from tracedpush.analysis import index_child, skew
from tracedpush.analysis.index import AnalysisIndex, default_dir
from tracedpush.cli import main
from tracedpush.testing import synthetic

DAY = 86400.0


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "indexes"
    monkeypatch.setenv("TRACEDPUSH_INDEX_ROOT", str(r))
    return r


def _run(tmp_path: Path, name: str, n: int = 6, seed: int = 1) -> Path:
    """A run's traces, and its index under the root, built by `tracedpush report`."""
    d = tmp_path / name
    synthetic.generate(n, seed=seed).write(d)
    out = tmp_path / f"{name}.txt"
    assert main(["report", "--traces", str(d), "--index", "--out", str(out)]) == 0
    assert (default_dir([d]) / "index.sqlite").is_file()
    return d


def _age(index: Path, seconds: float) -> None:
    """Make an index look unused for `seconds` (every file's mtime)."""
    then = time.time() - seconds
    for f in index.iterdir():
        os.utime(f, (then, then))


def _json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["index", "list", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_says_what_each_index_is(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _run(tmp_path, "a", n=6)
    b = _run(tmp_path, "b", n=9, seed=2)
    monkeypatch.setattr(skew, "WINDOWS", 7)  # other tuning: an index made with it is of
    c = _run(tmp_path, "c", n=4, seed=3)  # another analysis (`format_key`), rebuilt here
    monkeypatch.undo()
    monkeypatch.setenv("TRACEDPUSH_INDEX_ROOT", str(root))
    shutil.rmtree(b)
    doc = _json(capsys)
    by_trace = {Path(i["paths"][0]).name: i for i in doc["indexes"]}
    assert doc["root"] == str(root.resolve())
    assert {k: v["status"] for k, v in by_trace.items()} == {
        "a": cache.OK,
        "b": cache.MISSING,
        "c": cache.OTHER_VERSION,
    }
    idx = AnalysisIndex([a])
    idx.update()
    assert by_trace["a"]["traces"] == len(idx._kept) >= 6  # every trace it keeps
    idx.close()
    assert by_trace["b"]["missing_paths"] == [str(b.resolve())]
    for name, d in (("a", a), ("c", c)):
        files = list(default_dir([d]).iterdir())
        assert by_trace[name]["bytes"] > 0
        assert by_trace[name]["bytes"] <= sum(f.stat().st_size for f in files)
    assert main(["index", "list"]) == 0
    table = capsys.readouterr().out
    assert "traces gone" in table and "other version" in table
    assert "3 indexes" in table and str(root.resolve()) in table


def test_prune_removes_the_worthless_and_keeps_the_rest(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture
) -> None:
    keep, gone = _run(tmp_path, "keep"), _run(tmp_path, "gone", seed=2)
    shutil.rmtree(gone)
    stray = root / "notes"  # not an index: never touched
    stray.mkdir()
    (stray / "x.txt").write_text("mine")
    dead = root / "dead-000000000000"  # a build that died before saving any state
    dead.mkdir()
    sqlite3.connect(dead / "index.sqlite").execute("CREATE TABLE meta (k, v)").connection.close()
    (dead / "spans-0.sqlite").write_bytes(b"\0" * 4096)
    building = root / "building-000000000000"  # the same, written to a minute ago
    shutil.copytree(dead, building)
    _age(dead, 2 * cache.INCOMPLETE_AFTER_S)
    _age(building, 60)
    statuses = {i.path.name: i.status for i in cache.scan(root)}
    assert statuses[dead.name] == cache.INCOMPLETE and statuses[building.name] == cache.BUILDING

    assert main(["index", "prune", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert f"would remove {default_dir([gone])}" in said and "traces gone" in said
    assert default_dir([gone]).exists() and dead.exists()  # a dry run removes nothing

    assert main(["index", "prune"]) == 0
    said = capsys.readouterr().out
    assert not default_dir([gone]).exists() and not dead.exists()
    assert default_dir([keep]).exists() and building.exists()
    assert (stray / "x.txt").read_text() == "mine"
    assert "left: 2 indexes" in said
    # the index kept still answers warm
    idx = AnalysisIndex([keep])
    assert not idx.needs_build()
    idx.close()


def test_prune_by_age_and_size_least_recently_used_first(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture
) -> None:
    old, mid, new = (_run(tmp_path, n, seed=s) for s, n in enumerate(("old", "mid", "new")))
    _age(default_dir([old]), 30 * DAY)
    _age(default_dir([mid]), 2 * DAY)
    sizes = {d.name: cache.describe(default_dir([d])).bytes for d in (old, mid, new)}

    assert main(["index", "prune", "--older-than", "14d"]) == 0
    assert "unused for 30d" in capsys.readouterr().out
    assert not default_dir([old]).exists() and default_dir([mid]).exists()

    budget = sizes["new"] + sizes["mid"] // 2  # both do not fit: the older one goes
    assert main(["index", "prune", "--max-size", str(budget)]) == 0
    assert "over --max-size" in capsys.readouterr().out
    assert not default_dir([mid]).exists() and default_dir([new]).exists()


def test_a_warm_open_stamps_last_used(tmp_path: Path, root: Path) -> None:
    d = _run(tmp_path, "run")
    index = default_dir([d])
    _age(index, 30 * DAY)
    idx = AnalysisIndex([d])
    idx.update()  # warm: nothing new to write
    idx.close()
    assert time.time() - cache.describe(index).last_used < DAY
    assert cache.select(cache.scan(root), older_than_s=14 * DAY) == []


def test_an_index_in_use_is_never_removed(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture
) -> None:
    d = _run(tmp_path, "run")
    index = default_dir([d])
    shutil.rmtree(d)  # worthless: prune would take it, but another process has it open
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
         "db.execute('SELECT 1 FROM meta').fetchall(); print('open', flush=True); "
         "sys.stdin.read()", str(index / "index.sqlite")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        if not Path("/proc").is_dir():
            pytest.skip("which process has a file open comes from /proc (Linux)")
        capsys.readouterr()
        assert main(["index", "list"]) == 0  # its status names the process
        assert f", in use (pid {holder.pid})" in capsys.readouterr().out
        assert main(["index", "list", "--json"]) == 0
        (doc,) = json.loads(capsys.readouterr().out)["indexes"]
        (who,) = doc["in_use_by"]
        assert who.startswith(f"{holder.pid} {sys.executable} -c "), who
        assert main(["index", "prune", "--all"]) == 0
        assert f"kept {index}: in use by {holder.pid} " in capsys.readouterr().out
        assert main(["index", "remove", str(index)]) == 1
        assert "not removed" in capsys.readouterr().err
        assert index.exists()
    finally:
        holder.communicate("")
    assert main(["index", "remove", str(index)]) == 0
    assert not index.exists()


def test_remove_takes_a_traces_directory_and_keeps_what_is_not_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("TRACEDPUSH_INDEX_ROOT", raising=False)
    d = _run(tmp_path, "run")  # the index beside the traces
    index = default_dir([d])
    assert index.parent == d
    (index / "mine.txt").write_text("not the index's")
    assert main(["index", "remove", str(d)]) == 0
    assert f"removed {index}" in capsys.readouterr().out
    assert [p.name for p in index.iterdir()] == ["mine.txt"]  # and so the directory stays
    assert any(f.is_file() for f in (d / "push").iterdir())  # the traces stay
    assert main(["index", "remove", str(tmp_path)]) == 1
    assert "not an analysis index" in capsys.readouterr().err


def test_cli_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("TRACEDPUSH_INDEX_ROOT", raising=False)
    assert main(["index", "list"]) == 2
    assert "set $TRACEDPUSH_INDEX_ROOT or give --root" in capsys.readouterr().err
    assert main(["index"]) == 2
    assert main(["index", "list", "--root", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    for bad in (["--max-size", "lots"], ["--older-than", "soon"]):
        with pytest.raises(SystemExit) as exc:
            main(["index", "prune", "--root", str(tmp_path), *bad])
        assert exc.value.code == 2
    assert "bad duration" in capsys.readouterr().err
    assert main(["index", "list", "--root", str(tmp_path)]) == 0
    assert "no analysis indexes under" in capsys.readouterr().out


def test_sizes() -> None:
    assert cache.parse_size("50G") == 50_000_000_000
    assert cache.parse_size("500mb") == 500_000_000
    assert cache.parse_size("1234") == 1234
    with pytest.raises(ValueError):
        cache.parse_size("-1G")
    assert cache.human_bytes(2_048_000_000) == "2.0 GB"


def test_a_build_keeps_the_root_under_its_cap(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRACEDPUSH_INDEX_MAX_SIZE: each build under the root removes the least recently
    used others until the root fits (`tracedpush report`'s build and the console's build
    child alike), never the one it built; without a cap, or for an index elsewhere,
    nothing goes."""
    old, mid = _run(tmp_path, "old", seed=1), _run(tmp_path, "mid", seed=2)
    _age(default_dir([old]), 3 * DAY)
    _age(default_dir([mid]), 2 * DAY)
    size = cache.describe(default_dir([mid])).bytes
    new = _run(tmp_path, "new", seed=3)  # no cap yet: all three stay
    assert all(default_dir([d]).exists() for d in (old, mid, new))

    # room for three and a half: the build of a fourth removes the oldest of the others
    monkeypatch.setenv("TRACEDPUSH_INDEX_MAX_SIZE", str(int(size * 3.5)))
    capsys.readouterr()
    fourth = _run(tmp_path, "fourth", seed=4)
    err = capsys.readouterr().err
    assert f"removed the index {default_dir([old])} (over TRACEDPUSH_INDEX_MAX_SIZE=" in err
    assert not default_dir([old]).exists()
    assert all(default_dir([d]).exists() for d in (mid, new, fourth)), err
    assert sum(i.bytes for i in cache.scan(root)) <= size * 3.5
    assert _json(capsys)["max_size"] == int(size * 3.5)  # `index list` says the cap
    assert main(["index", "list"]) == 0
    assert "(kept under " in capsys.readouterr().out.splitlines()[-1]

    # the console's build child does the same; a cap below one index keeps only its own
    monkeypatch.setenv("TRACEDPUSH_INDEX_MAX_SIZE", "1")
    fifth = tmp_path / "fifth"
    synthetic.generate(6, seed=5).write(fifth)
    assert index_child.main([str(fifth)]) == 0
    assert "over TRACEDPUSH_INDEX_MAX_SIZE=1 B" in capsys.readouterr().err
    only = [default_dir([fifth])]
    assert [i.path for i in cache.scan(root)] == only

    # an index beside its traces is not the root's: the cap leaves the root alone
    monkeypatch.delenv("TRACEDPUSH_INDEX_ROOT")
    _run(tmp_path, "beside", seed=6)
    assert [i.path for i in cache.scan(root)] == only


def test_a_cap_that_does_not_parse_stops_before_anything_starts(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "run"
    synthetic.generate(4, seed=1).write(d)
    monkeypatch.setenv("TRACEDPUSH_INDEX_MAX_SIZE", "lots")
    assert main(["report", "--traces", str(d), "--index"]) == 2
    assert "TRACEDPUSH_INDEX_MAX_SIZE='lots': bad size" in capsys.readouterr().err
    assert not root.exists()  # no index was built
    with pytest.raises(SystemExit) as exc:
        main(["console", "--traces", str(d)])
    assert exc.value.code == 2
    assert "tracedpush console: TRACEDPUSH_INDEX_MAX_SIZE='lots'" in capsys.readouterr().err
    root.mkdir()
    assert main(["index", "list"]) == 2
    assert "tracedpush index: TRACEDPUSH_INDEX_MAX_SIZE='lots'" in capsys.readouterr().err


def _grow(traces: Path, tmp_path: Path, seed: int, n: int = 30) -> None:
    """Append another run's spans (other trace ids) to the files of `traces`."""
    more = tmp_path / f"more-{seed}"
    synthetic.generate(n, seed=seed).write(more)
    for f in more.rglob("*.jsonl"):
        with (traces / f.relative_to(more)).open("ab") as out:
            out.write(f.read_bytes())


def test_a_report_that_grows_an_index_keeps_the_root_under_its_cap(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only a build: a warm report that reads new spans into its index removes the
    least recently used others when the root no longer fits; one that read nothing new
    leaves them."""
    old, live = _run(tmp_path, "old", seed=1), _run(tmp_path, "live", seed=2)
    _age(default_dir([old]), 3 * DAY)
    total = sum(i.bytes for i in cache.scan(root))
    monkeypatch.setenv("TRACEDPUSH_INDEX_MAX_SIZE", str(total + 4096))  # both fit, just
    capsys.readouterr()
    assert main(["report", "--traces", str(live), "--out", str(tmp_path / "r.txt")]) == 0
    assert "removed" not in capsys.readouterr().err
    assert default_dir([old]).exists()

    _grow(live, tmp_path, seed=3)
    assert main(["report", "--traces", str(live), "--out", str(tmp_path / "r.txt")]) == 0
    err = capsys.readouterr().err
    assert "building" not in err  # warm: grown, not rebuilt
    assert f"removed the index {default_dir([old])} (over TRACEDPUSH_INDEX_MAX_SIZE=" in err
    assert [i.path for i in cache.scan(root)] == [default_dir([live])]
