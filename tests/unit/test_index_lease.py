"""Leases (`index_lease`): a process with an analysis index open says so in the index
itself, so that `tracedpush index prune` and the size cap leave it alone where ``/proc``
cannot tell: another host sharing the index root, or a system without ``/proc``.

Real indexes, built by `tracedpush report`, real processes holding them open. Another
host cannot be had here: its lease is a file with another host's name, as that host's
process would write it on the shared file system; a system without ``/proc`` is this one
with `index_cache.PROC` pointed at a directory that does not exist.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tracedpush.analysis import index_cache, index_lease
from tracedpush.analysis.index import AnalysisIndex, default_dir
from tracedpush.cli import main
from tracedpush.testing import synthetic


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run's index under a TRACEDPUSH_INDEX_ROOT, its traces then deleted: worthless,
    so `prune` removes it unless something holds it."""
    monkeypatch.setenv("TRACEDPUSH_INDEX_ROOT", str(tmp_path / "indexes"))
    d = tmp_path / "run"
    synthetic.generate(6, seed=1).write(d)
    assert main(["report", "--traces", str(d), "--index", "--out", str(tmp_path / "r")]) == 0
    where = default_dir([d])
    assert index_lease.files(where) == []  # the report closed it: no lease left
    for f in d.rglob("*.jsonl"):
        f.unlink()
    return where


def _lease_of(pid: int, host: str | None = None) -> str:
    return f"{index_lease.PREFIX}{host or socket.gethostname()}-{pid}"


def test_an_open_index_holds_a_lease_until_it_is_closed(tmp_path: Path) -> None:
    d = tmp_path / "run"
    synthetic.generate(6, seed=2).write(d)
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    idx.update()
    leases = index_lease.files(idx.dir)
    assert [f.name for f in leases] == [_lease_of(os.getpid())]
    assert leases[0].read_text() == " ".join(sys.orig_argv)[:200] + "\n"  # its command
    assert index_lease.holders(idx.dir) == []  # its own process is not "another"
    idx.close()
    assert index_lease.files(idx.dir) == []


def test_without_proc_the_lease_says_who_has_it_open(
    index: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A console-like process holds the index open: ``/proc`` shows it once (its lease
    adds no second line); with no ``/proc`` to look into, its lease keeps `prune --all`
    off it while it lives. Killed outright (no close), its
    lease stays behind, says nothing any more, and goes with the index."""
    code = (
        "import sys; from tracedpush.analysis.index import AnalysisIndex\n"
        "idx = AnalysisIndex(['/nonexistent'], index_dir=sys.argv[1]); idx._connect()\n"
        "print('open', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(index)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        if index_cache.PROC.is_dir():  # /proc says it, and the lease adds nothing
            (who,) = index_cache.in_use([index])[index]
            assert (who.pid, who.host) == (holder.pid, ""), who
            assert str(who).startswith(f"{holder.pid} {sys.executable} -c "), who
        monkeypatch.setattr(index_cache, "PROC", index / "no-proc-here")
        (who,) = index_cache.in_use([index])[index]  # the lease alone says it
        assert (who.pid, who.host) == (holder.pid, socket.gethostname()), who
        assert str(who).startswith(f"{socket.gethostname()} {holder.pid} {sys.executable} -c ")
        assert str(who).endswith(" (lease)"), who
        assert main(["index", "prune", "--all"]) == 0
        assert f"kept {index}: in use by {socket.gethostname()} {holder.pid}" in (
            capsys.readouterr().out
        )
        assert index.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert [f.name for f in index_lease.files(index)] == [_lease_of(holder.pid)]
    assert index_cache.in_use([index]) == {}  # its process is gone
    assert main(["index", "prune", "--all"]) == 0
    assert not index.exists()  # the dead lease went with it


def test_another_hosts_lease_protects_the_index_while_it_is_touched(
    index: Path, capsys: pytest.CaptureFixture
) -> None:
    """A console on another host sharing the root: /proc here cannot see it, its lease
    can. Touched within `LEASE_S`, the index is in use; a lease untouched for longer
    (its host's process killed, or suspended) protects nothing."""
    lease = index / _lease_of(4242, host="gpu-node-7")
    lease.write_text("python -m tracedpush console --traces /shared/run\n")
    command = "python -m tracedpush console --traces /shared/run"
    assert index_cache.in_use([index]) == {index: [index_lease.User(4242, command, "gpu-node-7")]}
    assert main(["index", "list"]) == 0
    assert "in use (gpu-node-7 pid 4242)" in capsys.readouterr().out
    assert main(["index", "prune", "--all"]) == 0
    assert f"kept {index}: in use by gpu-node-7 4242" in capsys.readouterr().out
    assert index.exists()

    then = time.time() - index_lease.LEASE_S - 60
    os.utime(lease, (then, then))
    assert index_cache.in_use([index]) == {}
    assert main(["index", "prune", "--all"]) == 0
    assert not index.exists()


def test_a_lease_is_touched_while_the_index_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update touches the lease at most once a `TOUCH_S`, so another host sees a
    console following a run as in use however long it runs."""
    d = tmp_path / "run"
    synthetic.generate(6, seed=3).write(d)
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    idx.update()
    (lease,) = index_lease.files(idx.dir)
    old = time.time() - 3600
    os.utime(lease, (old, old))
    idx.update()  # within TOUCH_S of the last touch: left as it is
    assert lease.stat().st_mtime == pytest.approx(old, abs=1)
    monkeypatch.setattr(index_lease, "TOUCH_S", 0.0)
    idx.update()
    assert time.time() - lease.stat().st_mtime < 60
    idx.close()


def _touched_again(lease: Path, since: float, within_s: float = 10.0) -> bool:
    """Wake this process's lease keeper (as `KEEP_S` would) and wait for its touch."""
    index_lease._tick.set()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if lease.stat().st_mtime > since + 60:
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    return False


def test_the_keeper_touches_held_leases_and_never_brings_one_back(tmp_path: Path) -> None:
    """However idle the process (no update for hours), its keeper thread touches every
    lease it holds each `KEEP_S`, whatever `TOUCH_S` says, so other hosts keep counting
    it; once the index is closed the keeper writes nothing. The real thread, woken
    early."""
    assert index_lease.LEASE_S >= 2 * index_lease.KEEP_S  # a missed touch is no gap
    d = tmp_path / "run"
    synthetic.generate(6, seed=4).write(d)
    idx = AnalysisIndex([d], index_dir=tmp_path / "index")
    idx.update()
    (lease,) = index_lease.files(idx.dir)
    assert any(t.name == "tracedpush-leases" and t.daemon for t in threading.enumerate())
    old = time.time() - 2 * index_lease.LEASE_S
    os.utime(lease, (old, old))
    assert _touched_again(lease, old)
    idx.close()
    assert not _touched_again(lease, old, within_s=0.5)
    assert index_lease.files(idx.dir) == []


def test_a_forked_child_keeps_none_of_its_parents_leases(tmp_path: Path) -> None:
    """A forked build worker inherits its parent's leases as objects: it neither keeps
    them (its keeper would touch another process's lease) nor starts a keeper for them."""
    idx = AnalysisIndex([tmp_path], index_dir=tmp_path / "index")
    idx._connect()
    assert len(index_lease._held) >= 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it holds and whether it keeps, then go
        idx._lease.hold()  # a worker's touch of its parent's lease
        os.write(w, f"{len(index_lease._held)} {index_lease._keeping}".encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode()
    os.waitpid(pid, 0)
    os.close(r)
    assert got == "0 False"
    idx.close()


def test_a_lease_never_fails_an_index(tmp_path: Path) -> None:
    """A directory the lease cannot be written in: the index works without one."""
    lease = index_lease.Lease(tmp_path / "not-there")
    lease.hold()
    lease.release()
    assert not (tmp_path / "not-there").exists()


def test_a_process_that_ends_without_closing_the_index_takes_its_lease(index: Path) -> None:
    """The console's server never closes its index: its lease goes as it exits."""
    code = (
        "import sys; from tracedpush.analysis import index_lease\n"
        "from tracedpush.analysis.index import AnalysisIndex\n"
        "idx = AnalysisIndex(['/nonexistent'], index_dir=sys.argv[1]); idx._connect()\n"
        "assert len(index_lease.files(idx.dir)) == 1"
    )
    done = subprocess.run([sys.executable, "-c", code, str(index)], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert index_lease.files(index) == []


def test_a_keeper_that_cannot_start_leaves_the_lease_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At interpreter shutdown (Python 3.12+) no thread starts: the lease is still
    written and nothing raises into the index; a later lease starts the keeper."""

    def refuse(_self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(index_lease, "_keeping", False)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    (tmp_path / "a").mkdir()
    lease = index_lease.Lease(tmp_path / "a")
    lease.hold()
    assert lease.path.exists()
    assert index_lease._keeping is False
    monkeypatch.undo()
    lease.release()
