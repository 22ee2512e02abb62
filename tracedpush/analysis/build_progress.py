"""A cold index build's progress on stderr (`tracedpush report`): a minute at 200,000
requests here, several on a slower machine or a longer run, with nothing said between
"building" and "built" before. On a terminal one line is rewritten (as pip's and
vLLM's bars); in a log, a line as each stage starts, with the time so far."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

# What `AnalysisIndex.progress(stage, done, total)` hears of a cold build: bytes of trace
# files read (on every core, `index_build`: worker 0's, every worker reads them all),
# traces stored and requests analysed (all workers'), and the offsets' stage between
# them (no count)
READ, STORE, OFFSETS, ANALYSE = "read", "store", "offsets", "analyse"
_WORDS = {
    READ: "reading the traces",
    STORE: "storing spans by trace",
    OFFSETS: "estimating clock offsets",
    ANALYSE: "analysing requests",
}


EVERY_S = 0.5  # a build tells its progress at most this often (and each stage's last)


class Throttled:
    """`progress(stage, done, total)` at most once each `EVERY_S`, and whenever `last`:
    how a build tells as it goes (a worker to its parent, the sequential build to
    `AnalysisIndex.progress`), counting often and saying little."""

    def __init__(self, progress: Callable[[str, int, int], None]) -> None:
        self.progress = progress
        self._next = 0.0

    def __call__(self, stage: str, done: int, total: int, last: bool = False) -> None:
        now = time.monotonic()
        if last or now >= self._next:
            self._next = now + EVERY_S
            self.progress(stage, done, total)


class BuildProgress:
    """`AnalysisIndex.progress`: (stage, done, total) -> what the user sees."""

    def __init__(
        self,
        stream: TextIO,
        prefix: str = "tracedpush report",
        tty: bool | None = None,
        every: bool = False,
    ) -> None:
        """`every`: a line for every update, with its count (for a program reading
        them, as the console reads its build child's), not one per stage."""
        self.stream = stream
        self.prefix = prefix
        self.tty = stream.isatty() if tty is None else tty
        self.every = every
        self.started = time.perf_counter()
        self.stage: str | None = None
        self._width = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        words = _WORDS.get(stage, stage)
        if self.tty:
            line = f"{self.prefix}: {words}{_count(stage, done, total)}"
            pad = " " * max(self._width - len(line), 0)  # what a longer line left
            print(f"\r{line}{pad}", end="", file=self.stream, flush=True)
            self._width = len(line)
        elif self.every or stage != self.stage:
            took = time.perf_counter() - self.started
            line = counted(stage, done, total, took) if self.every else f"{took:.0f} s: {words} ..."
            print(f"{self.prefix}: {line}", file=self.stream, flush=True)
        self.stage = stage

    def end(self) -> None:
        """Leave the terminal's line as it stands, and the next print on its own."""
        if self.tty and self.stage is not None:
            print(file=self.stream, flush=True)


def counted(stage: str, done: int, total: int, took_s: float) -> str:
    """One update as a program reads it, `took_s` into the build: "12 s: storing spans
    by trace 45,000 of 102,836 (43%)" (the console's page shows the last)."""
    return f"{took_s:.0f} s: {_WORDS.get(stage, stage)}{_count(stage, done, total)}"


def _count(stage: str, done: int, total: int) -> str:
    if not total:
        return " ..."
    pct = f" ({100 * done // total}%)"
    if stage == READ:
        return f" {done / 1e9:.2f} of {total / 1e9:.2f} GB{pct}"
    return f" {done:,} of {total:,}{pct}"


def stage_of(line: str) -> str | None:
    """The stage a progress line names (its words), or None."""
    return next((words for words in _WORDS.values() if words in line), None)
