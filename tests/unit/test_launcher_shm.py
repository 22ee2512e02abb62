"""`launcher.shm`: the shared-memory segments a deployment's engines leaked are removed
when it stops, and nothing else is. Real files in a directory standing for /dev/shm,
real processes mapping or holding them (read from the real /proc)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracedpush.launcher import shm

pytestmark = pytest.mark.skipif(not shm.PROC.is_dir(), reason="which process uses a file: /proc")


def _segment(root: Path, name: str) -> Path:
    path = root / name
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return path


def test_only_new_segments_no_live_process_uses_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    _segment(root, "psm_before")  # there when the deployment started: not its
    before = shm.names(root)
    leaked = _segment(root, "psm_leaked")  # its engine was killed: nobody uses it
    mapped = _segment(root, "psm_mapped")  # mapped by a live process (this one)
    held = _segment(root, "psm_held")  # open in another live process
    _segment(root, "other_file")  # not multiprocessing's
    lock = _segment(root, "sem.mp-leaked")  # a named semaphore, leaked too
    with mapped.open("r+b") as fh:
        view = mmap.mmap(fh.fileno(), 0)  # the descriptor closes; the mapping stays
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; f = open(sys.argv[1]); print(1, flush=True); input()",
         str(held)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "1\n"
        assert {"psm_mapped", "psm_held"} <= shm.in_use(root)
        assert shm.remove_new(before, root) == ["psm_leaked", "sem.mp-leaked"]
        assert not leaked.exists() and not lock.exists()
        assert sorted(p.name for p in root.iterdir()) == [
            "other_file", "psm_before", "psm_held", "psm_mapped"
        ]  # fmt: skip
    finally:
        holder.communicate("\n")
        view.close()
    assert shm.remove_new(before, root) == ["psm_held", "psm_mapped"]  # unused now


def test_another_users_segment_is_left(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a file another user's needs root")
    root = tmp_path / "shm"
    root.mkdir()
    theirs = _segment(root, "psm_theirs")
    os.chown(theirs, 12345, 12345)
    assert shm.remove_new(set(), root) == []
    assert theirs.exists()


def test_without_proc_or_the_directory_nothing_happens(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    _segment(root, "psm_new")
    assert shm.remove_new(set(), root, proc=tmp_path / "no-proc") == []
    assert shm.names(tmp_path / "no-such-dir") == set()
    assert shm.remove_new(set(), tmp_path / "no-such-dir") == []
