"""A cold index build in a process of its own, for callers that must not fork.

Why: a cold build forks a worker per core (`index_build`), which a threaded process
must not do (a lock another thread held at the fork stays held in the child), so the
console, inside Streamlit's threaded server, built a big run's index in one process:
385.8 s at 200,000 requests, where `report --index` took about 150 s with the workers
on the same machine. A fresh process has one thread and may fork; the console waits
for it (`build`), then opens the index warm.

The child ends with its parent (``PR_SET_PDEATHSIG``; the signal stops its build
workers too), so a console stopped meanwhile leaves no process behind. A child that
fails leaves the caller to build in its own process, as before.

``python -m tracedpush.analysis.index_child PATH...`` is the child.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tracedpush.parent_death import end_with_parent

PROGRESS_PREFIX = "tracedpush console"  # the child's progress lines (`build`'s progress)


def build(
    paths: Sequence[Path],
    index_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> str | None:
    """Build the index of `paths` (in `index_dir`, else at its default place, with the
    default options, a worker per core) in a child process; None when it did, else why
    not (the child's last words). `progress`: each of the build's progress lines as it
    comes, without the prefix ("12 s: storing spans by trace 45,000 of 102,836 (43%)",
    at most a few a second)."""
    where = ["--index-dir", str(index_dir)] if index_dir is not None else []
    said = ["--progress"] if progress is not None else []
    argv = [sys.executable, "-m", __name__, "--parallel", *said, *where, "--", *map(str, paths)]
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        return f"the index build process did not start: {exc}"
    last = "no output"
    assert child.stderr is not None
    with child:
        for line in child.stderr:
            if progress is not None and line.startswith(f"{PROGRESS_PREFIX}: "):
                progress(line.rstrip("\n").removeprefix(f"{PROGRESS_PREFIX}: "))
            elif line.strip():
                last = line.strip()
    if child.returncode:
        return f"the index build process failed (exit {child.returncode}): {last}"
    return None


def _die_with_parent() -> None:
    """SIGTERM when the parent ends, raised here as SystemExit: `index_build.build`
    then terminates its workers on the way out."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    if end_with_parent(signal.SIGTERM) is False:  # the parent died before we asked
        raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tracedpush.analysis.index_child",
        description="Build the analysis index of trace paths (what the console runs).",
    )
    ap.add_argument("--parallel", action="store_true", help="a build worker per core")
    ap.add_argument("--progress", action="store_true", help="a stderr line per build update")
    ap.add_argument("--index-dir", type=Path, help="where the index is (default: beside them)")
    ap.add_argument("paths", nargs="+", type=Path, help="trace files or directories")
    args = ap.parse_args(argv)
    _die_with_parent()
    from tracedpush.analysis.index import AnalysisIndex  # the signal is set up

    idx = AnalysisIndex(
        args.paths, index_dir=args.index_dir, parallel=True if args.parallel else None
    )
    if args.progress:
        from tracedpush.analysis.build_progress import BuildProgress

        idx.progress = BuildProgress(sys.stderr, prefix=PROGRESS_PREFIX, tty=False, every=True)
    try:
        cold = idx.needs_build()
        idx.update()
    finally:
        idx.close()
    if cold:
        from tracedpush.analysis import index_cache

        index_cache.after_growth(idx.dir, lambda line: print(line, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
