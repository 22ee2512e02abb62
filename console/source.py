"""Where the console reads traces from: a directory/file, or a Jaeger query endpoint.

The app gets its source from the arguments after ``--`` (``streamlit run console/app.py
-- --traces DIR``), else from ``TRACEDPUSH_TRACES`` / ``TRACEDPUSH_JAEGER`` (how tests and
scripts configure it without a command line); the sidebar can switch it at run time.
Several ``--traces`` (or ``TRACEDPUSH_TRACES=A:B``, separated like PATH) are read as one
store: e.g. the engines' traces_dir and the proxy's, when they differ.

``--index-dir DIR`` keeps the analysis index of trace files there instead of beside them
(`AnalysisIndex`'s ``index_dir``, `tracedpush report --index-dir`); without it,
``TRACEDPUSH_INDEX_ROOT`` moves every run's index under one directory
(`analysis.index.default_dir`). For traces in a directory this user cannot write, where
the console would otherwise read every span into memory at each load.

``--bench PATH`` (``TRACEDPUSH_BENCH``) names benchmark results for the Sweep page: a
``tracedpush bench sweep`` directory or one result file. A sweep keeps its traces beside
its results (``<sweep>/traces``), so with ``--bench`` and no other source that is the
trace source too: the cell a Sweep page explains is in the traces the other pages show.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENV_TRACES = "TRACEDPUSH_TRACES"
ENV_JAEGER = "TRACEDPUSH_JAEGER"
ENV_JAEGER_SERVICE = "TRACEDPUSH_JAEGER_SERVICE"
ENV_LOOKBACK = "TRACEDPUSH_JAEGER_LOOKBACK"
ENV_BENCH = "TRACEDPUSH_BENCH"
BENCH_TRACES = "traces"  # where `tracedpush bench sweep` writes a sweep's traces
DEFAULT_LOOKBACK = "1h"


@dataclass(frozen=True)
class Source:
    """A hashable description of a trace source; the cache key for everything loaded."""

    kind: str  # "traces" | "jaeger" | "none"
    location: str = ""  # several trace paths: all of them, comma-separated (the label)
    service: str | None = None
    lookback: str = DEFAULT_LOOKBACK
    paths: tuple[str, ...] = ()  # several trace paths; () means just `location`
    index_dir: str | None = None  # trace files: their analysis index (None: the default)

    @classmethod
    def traces(cls, paths: Sequence[str], index_dir: str | None = None) -> Source:
        """A source of one trace path, or of several read as one store; `index_dir`: where
        their analysis index is kept (None: `analysis.index.default_dir`)."""
        resolved = tuple(dict.fromkeys(_absolute(p) for p in paths))
        where = _absolute(index_dir) if index_dir else None
        if len(resolved) == 1:
            return cls("traces", resolved[0], index_dir=where)
        return cls("traces", ", ".join(resolved), paths=resolved, index_dir=where)

    @property
    def trace_paths(self) -> tuple[str, ...]:
        return self.paths or (self.location,)

    @property
    def label(self) -> str:
        if self.kind == "traces":
            return self.location
        if self.kind == "jaeger":
            return f"Jaeger {self.location} (last {self.lookback})"
        return "no source"

    @classmethod
    def parse(cls, text: str, lookback: str = DEFAULT_LOOKBACK) -> Source:
        """A source typed by a user: a URL means Jaeger, anything else a path, or several
        comma-separated paths (as the label of a several-path source shows them)."""
        text = text.strip()
        if not text:
            return cls("none")
        if text.startswith(("http://", "https://")):
            return cls("jaeger", text.rstrip("/"), lookback=lookback)
        return cls.traces([p.strip() for p in text.split(",") if p.strip()])


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False, allow_abbrev=False)
    p.add_argument("--traces", action="append")
    p.add_argument("--jaeger")
    p.add_argument("--service")
    p.add_argument("--lookback")
    p.add_argument("--bench")
    p.add_argument("--index-dir")
    return p


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    try:
        ns, _ = _parser().parse_known_args(list(argv))
    except argparse.ArgumentError:
        ns = argparse.Namespace(
            traces=None, jaeger=None, service=None, lookback=None, bench=None, index_dir=None
        )
    return ns


def bench_from_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The benchmark results to show (absolute path), from ``--bench`` or ``TRACEDPUSH_BENCH``."""
    env = os.environ if env is None else env
    path = _parse(argv).bench or env.get(ENV_BENCH)
    return _absolute(path) if path else None


def bench_traces(bench: str | None) -> str | None:
    """A sweep's own traces: ``<dir>/traces`` (for one result file, beside it), if there."""
    if not bench:
        return None
    root = Path(bench)
    found = (root if not root.is_file() else root.parent) / BENCH_TRACES
    return str(found) if found.is_dir() else None


def from_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Source:
    """The configured source: command-line flags first, then environment variables, then
    the traces of the ``--bench`` sweep."""
    env = os.environ if env is None else env
    ns = _parse(argv)
    lookback = ns.lookback or env.get(ENV_LOOKBACK) or DEFAULT_LOOKBACK
    service = ns.service or env.get(ENV_JAEGER_SERVICE) or None
    index_dir = ns.index_dir
    if ns.traces:
        return Source.traces(ns.traces, index_dir)
    if ns.jaeger:
        return Source("jaeger", ns.jaeger.rstrip("/"), service, lookback)
    if env.get(ENV_TRACES):
        return Source.traces([p for p in env[ENV_TRACES].split(os.pathsep) if p], index_dir)
    if env.get(ENV_JAEGER):
        return Source("jaeger", env[ENV_JAEGER].rstrip("/"), service, lookback)
    beside = bench_traces(bench_from_args(argv, env))
    if beside is not None:
        return Source.traces([beside], index_dir)
    return Source("none")
