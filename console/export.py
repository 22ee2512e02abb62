"""Bytes for the Export page's downloads (no Streamlit, so tests can check them)."""

from __future__ import annotations

import io
import shlex
from collections.abc import Iterable
from datetime import UTC, datetime, tzinfo
from typing import Any

import numpy as np
import pandas as pd

from tracedpush.analysis import write_perfetto
from tracedpush.console.source import Source

# Streamlit holds a download in memory (a Perfetto file is about 10 kB per request:
# 2.15 GB for 205,560), so the page offers at most this many requests in one file; the
# CLI streams a whole run to disk (`perfetto_command`).
PERFETTO_MAX = 10_000
PERFETTO_FILE = "tracedpush-perfetto.json"
# A time window is chosen by bucket: a minute, else wider when the run spans more
# buckets than a slider can show.
WINDOW_WIDTHS_S = {60: "minute", 300: "5 minutes", 900: "15 minutes", 3_600: "hour", 86_400: "day"}
WINDOW_BUCKETS_MAX = 1_500


def rows_of(table: pd.DataFrame, trace_ids: list[str] | None) -> pd.DataFrame:
    """The table's rows of `trace_ids` (every row when None), in the table's order."""
    if trace_ids is None:
        return table
    return table[table["trace_id"].isin(trace_ids)]


def table_csv(table: pd.DataFrame) -> bytes:
    """RunAnalysis.table() as CSV, columns as the analysis names them."""
    return table.to_csv(index=False).encode()


def perfetto_json(run: Any, trace_ids: Iterable[str] | None = None) -> bytes:
    """analysis.to_perfetto for the chosen requests (all when None), compact JSON, written
    a request at a time (`write_perfetto`): no list of every event is held."""
    buf = io.BytesIO()  # not a StringIO: that keeps 4 bytes a character until read
    with io.TextIOWrapper(buf, encoding="utf-8", write_through=True) as out:
        write_perfetto(run, out, None if trace_ids is None else list(trace_ids))
        out.flush()
        return buf.getvalue()


def window_buckets(table: pd.DataFrame) -> tuple[int, list[int]]:
    """The time buckets a window is chosen from: (bucket width s, the start (unix s) of
    each bucket some request arrived in, ascending). Only buckets with requests, so a
    directory holding runs days apart gives a usable slider; the narrowest width of
    `WINDOW_WIDTHS_S` with at most `WINDOW_BUCKETS_MAX` of them."""
    s = table["start_unix_ms"].to_numpy(dtype="float64") / 1000.0
    s = s[np.isfinite(s)]
    for width in WINDOW_WIDTHS_S:
        starts = np.unique(np.floor(s / width).astype(np.int64)) * width
        if len(starts) <= WINDOW_BUCKETS_MAX:
            break
    return width, starts.tolist()


def bucket_label(start_s: int, width: int, tz: tzinfo = UTC) -> str:
    """A bucket's start in `tz`, to its width's precision ("2026-12-04 03:34"; a UTC
    day's date only in UTC, elsewhere it starts at some local time)."""
    when = datetime.fromtimestamp(start_s, tz=tz)
    return when.strftime("%Y-%m-%d" if width >= 86_400 and tz is UTC else "%Y-%m-%d %H:%M")


def window_ids(table: pd.DataFrame, from_s: float, to_s: float) -> list[str]:
    """The trace ids of the requests that arrived from `from_s` (included) to `to_s`
    (excluded), unix seconds, in the table's order."""
    s = table["start_unix_ms"].to_numpy(dtype="float64") / 1000.0
    return table["trace_id"][(s >= from_s) & (s < to_s)].tolist()


def perfetto_command(source: Source, window: tuple[float, float] | None = None) -> str | None:
    """The `tracedpush report` command that writes the requests of `source` (those that
    arrived in `window`, unix seconds [from, to), if given) as one Perfetto file,
    streamed to disk. None: a source the CLI cannot name."""
    if source.kind == "traces":
        args = [a for p in source.trace_paths for a in ("--traces", p)]
    elif source.kind == "jaeger":
        args = ["--jaeger", source.location, "--lookback", source.lookback]
        args += ["--service", source.service] if source.service else []
    else:
        return None
    if window is not None:
        args += ["--since", _iso(window[0]), "--until", _iso(window[1])]
    return shlex.join(
        ["tracedpush", "report", *args, "--format", "perfetto", "--out", PERFETTO_FILE]
    )


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
