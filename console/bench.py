"""Benchmark results for the Sweep page: loading, caching, one row per sweep cell and mode.

The figures need only the result files (`tracedpush.analysis.bench_results`): the client's
own TTFT and TPOT per request, summarised here per (mode, input length, QPS) the way
``vllm bench serve`` summarises them (linear-interpolated percentiles over the successful
requests; TPOT of requests with more than one output token), so a median drawn is the
``median_ttft_ms`` vLLM printed and the join's client percentile for the same cell.
Why a cell differs needs the traces too: `tracedpush.analysis.bench.join` says it,
cached here per results and trace snapshot.

The loaded results are kept with ``st.cache_resource`` (shared, never mutated) keyed on
every result file's path, mtime and size, so a cell a running sweep just finished shows on
the next rerun; ``cache_data`` would pickle every request's generated text on each rerun.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from tracedpush.analysis import bench as ab
from tracedpush.analysis import bench_results as br
from tracedpush.analysis.compare import summary
from tracedpush.console.selection import mode_order

STATS = ("p50", "p90", "p99", "mean")
METRICS = ("ttft", "tpot")
CELL_COLUMNS = [
    "mode", "input_len", "qps", "requests", "ok", "failed",
    *(f"{m}_{s}" for m in METRICS for s in STATS), "file",
]  # fmt: skip
_CELL_NAME = re.compile(r"^(?P<mode>[a-z]+)-qps[0-9.]+-in[0-9]+(-pass[0-9]+)?\.json$")
Stamp = tuple[tuple[str, int, int], ...]


def mode_of(result: br.BenchResult) -> str | None:
    """Our block's mode, else the mode a sweep cell's file name starts with (a file
    `vllm bench serve` wrote itself, named like our cells). The join may name a mode
    from the traces instead; the figures must not need traces."""
    if result.mode:
        return str(result.mode)
    found = _CELL_NAME.match(result.name)
    return found["mode"] if found else None


def cell_row(mode: str, results: Sequence[br.BenchResult]) -> dict[str, Any]:
    """One cell and mode as a row of `cell_frame`: the client's TTFT and TPOT summaries
    over the successful requests of its files (`compare.summary`, as the join makes them)."""
    rows = [row for r in results for row in r.rows]
    ok = [row for row in rows if row.ok]
    ttft = summary(row.ttft_s * 1000.0 for row in ok if row.ttft_s is not None)
    tpot = summary(row.tpot_s * 1000.0 for row in ok if row.tpot_s is not None)
    first = results[0]
    return {
        "mode": mode,
        "input_len": first.input_len,
        "qps": first.qps,
        "requests": len(rows),
        "ok": len(ok),
        "failed": len(rows) - len(ok),
        **{f"ttft_{k}": ttft[k] for k in STATS},
        **{f"tpot_{k}": tpot[k] for k in STATS},
        "file": ", ".join(r.name for r in results),
    }


def cell_frame(results: Sequence[br.BenchResult]) -> pd.DataFrame:
    """One row per (mode, input length, QPS) of the results that name a sweep cell (a
    mode, an input length and a finite rate; `unplaced` lists the others), sorted by
    input length, mode (push, pull, ...) and QPS. Several files of one cell (a cell
    measured again into the same directory) make one row, as the join counts them."""
    groups: dict[tuple[str, int, float], list[br.BenchResult]] = {}
    for r in results:
        if r.input_len is not None and r.qps is not None and _placed(r):
            groups.setdefault((str(mode_of(r)), r.input_len, r.qps), []).append(r)
    rank = {m: i for i, m in enumerate(mode_order(m for m, _, _ in groups))}
    keys = sorted(groups, key=lambda k: (k[1], rank[k[0]], k[2]))
    return pd.DataFrame([cell_row(k[0], groups[k]) for k in keys], columns=CELL_COLUMNS)


def _placed(result: br.BenchResult) -> bool:
    return (
        mode_of(result) is not None
        and result.input_len is not None
        and result.qps is not None
        and math.isfinite(result.qps)
    )


def unplaced(results: Sequence[br.BenchResult]) -> list[str]:
    """Result files the figures cannot place: no mode, no input length or an infinite
    rate (``--request-rate inf``: not a point on a QPS axis)."""
    out = []
    for r in results:
        if _placed(r):
            continue
        missing = [
            what
            for what, ok in (
                ("mode", mode_of(r) is not None),
                ("input length", r.input_len is not None),
                ("finite request rate", r.qps is not None and math.isfinite(r.qps)),
            )
            if not ok
        ]
        out.append(f"{r.path}: no {', '.join(missing)}")
    return out


@dataclass
class BenchLoad:
    """Everything read from one --bench path: results, the files skipped, and why."""

    path: str
    results: list[br.BenchResult]
    skipped: list[str] = field(default_factory=list)  # not result files: one message each
    key: Stamp = ()  # `stamp` of the files when they were read

    @cached_property
    def cells(self) -> pd.DataFrame:
        """`cell_frame` of the results."""
        return cell_frame(self.results)

    @cached_property
    def notes(self) -> list[str]:
        """Result files read but not drawn (`unplaced`)."""
        return unplaced(self.results)


def stamp(path: str) -> Stamp:
    """(file, mtime ns, size) of every result file under ``path``: the cache key, so new
    or rewritten cells are read again and nothing else is."""
    root = Path(path)
    if not root.exists():
        return ()
    out = []
    for f in br.result_files(root):
        try:
            st_ = f.stat()
        except OSError:
            continue
        out.append((str(f), st_.st_mtime_ns, st_.st_size))
    return tuple(out)


def load(path: str, key: Stamp = ()) -> BenchLoad:
    """Every result under ``path``; FileNotFoundError, or BenchFormatError for a single
    file that is not a result (a directory's odd files are `BenchLoad.skipped`)."""
    results, skipped = br.load_results(Path(path))
    return BenchLoad(path, results, skipped, key)


@st.cache_resource(show_spinner="Reading benchmark results…", max_entries=4)
def _load_cached(path: str, key: Stamp) -> BenchLoad:
    return load(path, key)


def loaded(path: str) -> BenchLoad:
    """`load`, cached per path and files' mtimes (see the module docstring)."""
    return _load_cached(path, stamp(path))


@st.cache_data(show_spinner="Joining results with traces…", max_entries=8)
def _joined(
    path: str, key: Stamp, source: Any, generation: int, _load: BenchLoad, _run: Any
) -> dict[str, Any]:
    return ab.join(_load.results, _run, skipped=_load.skipped).to_json()


def joined(got: BenchLoad, snap: Any) -> dict[str, Any]:
    """`tracedpush.analysis.bench.join(...).to_json()` of the results and a trace
    snapshot (`console.data.Snapshot`), cached per results (path, files' stamp) and
    snapshot (source, generation): a rerun that changes only the picked cell joins nothing."""
    return _joined(got.path, got.key, snap.source, snap.generation, got, snap.run)


def cell_of(doc: dict[str, Any], input_len: int, qps: float) -> dict[str, Any] | None:
    """The join's cell (`BenchCell.to_json()`) for one input length and rate."""
    for cell in doc.get("cells") or ():
        q = cell.get("qps")
        if cell.get("input_len") == input_len and q is not None and math.isclose(q, qps):
            return cell
    return None
