"""Load OTLP spans into columns: tracedpush's own decoding against DuckDB, Polars and
pyarrow, measured on the same files in the same run.

Why: the analysis index decodes spans with msgspec and `otlp.Decoder` into `Span`
objects, not with a columnar engine; docs/benchmarks.md ("Engine choice, by
measurement") says why, and this script is the measurement behind it. The task timed is
what the index does first: every span's trace id, span id, parent id, name, start and
end (ns), service (resource attribute ``service.name``) and span attributes, in a form
grouped or sortable by trace id; then one per-trace aggregate (first start, last end,
span count), so the query cost shows beside the load.

How: a synthetic run (`tracedpush.testing.synthetic`, seed 1, written in chunks of
10,000 requests as bench_report.py does) in a temporary directory; then, for each
repeat, every engine in its own fresh process, in ABBA order (A B C ... C B A ...).
Each process imports its engine, then times the load and the aggregate (wall and CPU:
`time.process_time` counts every thread of the process), reads its peak RSS (VmHWM,
interpreter and engine imports included; the RSS after the imports is given too), and
only then computes what the check compares: span count, the set of (trace id, span id)
pairs, durations, attribute count, spans per service, the aggregate's totals. Every
engine must agree with `TraceStore` (the project's decoder) or the script exits 1.
Engines that are not installed are listed as such.

DuckDB and Polars are not dependencies of tracedpush (pyarrow comes only with the console
extra, through streamlit); install them apart from the project's environment, never
into .venv, and put them on the path for the run:

    .venv/bin/pip install --target /tmp/engines-pkgs duckdb polars pyarrow
    PYTHONPATH=/tmp/engines-pkgs nice -n 10 .venv/bin/python benchmarks/bench_engines.py \\
        --requests 20000 --repeats 3
    PYTHONPATH=/tmp/engines-pkgs nice -n 10 .venv/bin/python benchmarks/bench_engines.py \\
        --requests 50000 --repeats 1 --synthetic-chunks 1 --name engines-50k

Writes ``engines.md`` and ``engines.json`` (``--name``) under ``--out``. The index
worker row is one process; the cold build runs two, each scanning every line.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench_report import CHUNK, _replay_synthetic, _spans_bytes, _synthetic

from tracedpush.analysis import load as load_mod
from tracedpush.analysis.index_build import _peak_kb, _Worker
from tracedpush.analysis.load import FileSource, TraceStore
from tracedpush.analysis.model import Span

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "benchmarks"
SERVICE_NAME = "service.name"
REFERENCE = "store"


@dataclass(frozen=True)
class Engine:
    """One row of the table: what runs, what it builds, what must be installed."""

    key: str
    label: str
    builds: str
    modules: tuple[str, ...]  # importable modules it needs ("" for the project's own)
    dists: tuple[str, ...]  # distributions whose versions are reported
    checked: str = "all"  # "all" fields, or "count" only (a scan that keeps no fields)


ENGINES = (
    Engine(
        REFERENCE,
        "tracedpush TraceStore",
        "msgspec typed lines (otlp_fast.document_line) -> Span objects, dict by trace id "
        "(the sequential load and a Live refresh's read, `TraceStore.from_path`)",
        ("msgspec",),
        ("msgspec",),
    ),
    Engine(
        "store-json",
        "tracedpush TraceStore, json.loads",
        "the same with json.loads per line + otlp.Decoder (as before 2026-12-07, and "
        "for any line document_line leaves to it)",
        (),
        (),
    ),
    Engine(
        "worker",
        "tracedpush index worker",
        "msgspec typed lines, spans raw, each decoded typed (otlp_fast.fields) and packed "
        "to a spill file, then read back -> Span, dict by trace id (one index-build worker "
        "given every shard)",
        ("msgspec",),
        ("msgspec",),
    ),
    Engine(
        "scan",
        "msgspec Raw scan only",
        "the index worker's scan: msgspec typed lines, each span left raw, its trace id "
        "read; decodes no span (a floor, not the task)",
        ("msgspec",),
        ("msgspec",),
        checked="count",
    ),
    Engine(
        "duckdb",
        "DuckDB",
        "read_ndjson (explicit OTLP schema) -> unnest resourceSpans, scopeSpans, spans "
        "-> in-memory table; attributes kept as a list of key/value structs",
        ("duckdb",),
        ("duckdb",),
    ),
    Engine(
        "polars",
        "Polars",
        "scan_ndjson (explicit OTLP schema) -> explode resourceSpans, scopeSpans, spans "
        "-> DataFrame; attributes kept as a list of key/value structs",
        ("polars",),
        ("polars", "polars-runtime-32"),
    ),
    Engine(
        "pyarrow",
        "pyarrow",
        "pyarrow.json.read_json per file (explicit OTLP schema) -> list flatten + parent "
        "indices -> Table; attributes kept as a list of key/value structs",
        ("pyarrow", "numpy"),
        ("pyarrow",),
    ),
)
BY_KEY = {e.key: e for e in ENGINES}


# --------------------------------------------------------------------------- checks
def _facts(
    pairs: Iterable[str | None], duration_ns: int, attributes: int, services: dict[Any, int]
) -> dict[str, Any]:
    """What every engine's spans must agree on (computed after the timing)."""
    keys = ["<null>" if p is None else p for p in pairs]
    distinct = sorted(set(keys))
    return {
        "rows": len(keys),
        "distinct_pairs": len(distinct),
        "pairs_sha256": hashlib.sha256("\n".join(distinct).encode()).hexdigest(),
        "duration_sum_ns": int(duration_ns),
        "span_attributes": int(attributes),
        "services": {str(k): int(v) for k, v in sorted(services.items(), key=str)},
    }


def _agg_facts(groups: int, span_ns: int, counted: int) -> dict[str, int]:
    """The aggregate's totals: traces, sum of (last end - first start), sum of counts."""
    return {"groups": int(groups), "trace_span_sum_ns": int(span_ns), "count_sum": int(counted)}


# --------------------------------------------------------------------------- runners
class Runner:
    """An engine in the child process: set up (imports) untimed, then load, aggregate."""

    threads = 1

    def load(self, files: list[Path], directory: Path) -> Any:
        raise NotImplementedError

    def aggregate(self, data: Any) -> Any:
        return None

    def facts(self, data: Any) -> dict[str, Any]:
        raise NotImplementedError

    def agg_facts(self, agg: Any) -> dict[str, int] | None:
        return None


class _SpanDicts(Runner):
    """The project's form: trace id -> span id -> `Span`; aggregates in Python."""

    def aggregate(self, data: dict[str, dict[str, Span]]) -> dict[str, tuple[int, int, int]]:
        out = {}
        for tid, spans in data.items():
            vals = spans.values()
            out[tid] = (min(s.start_ns for s in vals), max(s.end_ns for s in vals), len(spans))
        return out

    def facts(self, data: dict[str, dict[str, Span]]) -> dict[str, Any]:
        spans = [s for by_id in data.values() for s in by_id.values()]
        return _facts(
            (s.trace_id + s.span_id for s in spans),
            sum(s.end_ns - s.start_ns for s in spans),
            sum(len(s.attributes) for s in spans),
            Counter(s.resource.service for s in spans),
        )

    def agg_facts(self, agg: dict[str, tuple[int, int, int]]) -> dict[str, int]:
        vals = agg.values()
        return _agg_facts(len(agg), sum(t1 - t0 for t0, t1, _ in vals), sum(n for *_, n in vals))


class StoreRunner(_SpanDicts):
    def load(self, files: list[Path], directory: Path) -> dict[str, dict[str, Span]]:
        return TraceStore.from_path(directory).traces


class JsonStoreRunner(_SpanDicts):
    def load(self, files: list[Path], directory: Path) -> dict[str, dict[str, Span]]:
        load_mod.document_line = None  # every line through json.loads and `Decoder`
        return TraceStore.from_path(directory).traces


def _worker(directory: Path) -> _Worker:
    """An index-build worker given every shard, its spill file in `directory` (it asks
    the index only for that)."""
    return _Worker(SimpleNamespace(dir=directory), 0, 1)


class WorkerRunner(_SpanDicts):
    def load(self, files: list[Path], directory: Path) -> dict[str, dict[str, Span]]:
        gc.disable()  # as the build's workers run
        w = _worker(directory)
        w.read([(f, f.stat().st_size) for f in files])
        # the worker spills each span's packed record as it reads it: its spans read back
        out = {tid: {s.span_id: s for s in spans} for tid, _p, spans in w.traces(list(w.spans))}
        w.close()
        return out


class ScanRunner(Runner):
    """`_Worker.read` where no trace is the worker's: every line is decoded by msgspec and
    every span's trace id read, then the span is skipped (counted here)."""

    def load(self, files: list[Path], directory: Path) -> int:
        gc.disable()
        seen = [0]

        def mine(tid: str) -> bool:
            seen[0] += 1
            return False

        w = _worker(directory)
        w.mine = mine
        w.read([(f, f.stat().st_size) for f in files])
        w.close()
        return seen[0]

    def facts(self, data: int) -> dict[str, Any]:
        return {"rows": data}


# The OTLP JSON shape read by the engines: only the fields the task needs (the engines
# ignore the others). Ids and int64s are strings in OTLP JSON.
_ANY_FIELDS = (("stringValue", "s"), ("intValue", "s"), ("doubleValue", "f"), ("boolValue", "b"))
_SPAN_FIELDS = ("traceId", "spanId", "parentSpanId", "name", "startTimeUnixNano", "endTimeUnixNano")


class DuckRunner(Runner):
    def __init__(self) -> None:
        import duckdb

        self.con = duckdb.connect()
        self.threads = int(self.con.execute("SELECT current_setting('threads')").fetchone()[0])
        sql = {"s": "VARCHAR", "f": "DOUBLE", "b": "BOOLEAN"}
        scalars = ", ".join(f"{k} {sql[t]}" for k, t in _ANY_FIELDS)
        value = f'STRUCT({scalars}, arrayValue STRUCT("values" STRUCT({scalars})[]))'
        kv = f"STRUCT(key VARCHAR, value {value})[]"
        span = ", ".join(f"{k} VARCHAR" for k in _SPAN_FIELDS)
        self.rs = (
            f"STRUCT(resource STRUCT(attributes {kv}), "
            f"scopeSpans STRUCT(spans STRUCT({span}, attributes {kv})[])[])[]"
        )

    def load(self, files: list[Path], directory: Path) -> Any:
        self.con.execute(
            f"""
            CREATE TABLE spans AS
            WITH rs AS (
                SELECT unnest(resourceSpans) AS rs
                FROM read_ndjson($files, columns = {{'resourceSpans': '{self.rs}'}},
                                 maximum_object_size = 268435456)),
            ss AS (
                SELECT list_filter(rs.resource.attributes,
                                   lambda a: a.key = '{SERVICE_NAME}')[1].value.stringValue
                           AS service,
                       unnest(rs.scopeSpans) AS ss
                FROM rs),
            sp AS (SELECT service, unnest(ss.spans) AS s FROM ss)
            SELECT s.traceId AS trace_id, s.spanId AS span_id, s.parentSpanId AS parent_id,
                   s.name AS name, CAST(s.startTimeUnixNano AS BIGINT) AS start_ns,
                   CAST(s.endTimeUnixNano AS BIGINT) AS end_ns, service,
                   s.attributes AS attributes
            FROM sp
            """,
            {"files": [str(f) for f in files]},
        )
        return self.con

    def aggregate(self, data: Any) -> dict[str, Any]:
        return self.con.execute(
            "SELECT trace_id, min(start_ns) AS t0, max(end_ns) AS t1, count(*) AS n "
            "FROM spans GROUP BY trace_id"
        ).fetchnumpy()

    def facts(self, data: Any) -> dict[str, Any]:
        q = self.con.execute
        pairs = [r[0] for r in q("SELECT trace_id || span_id FROM spans").fetchall()]
        dur, attrs = q("SELECT sum(end_ns - start_ns), sum(len(attributes)) FROM spans").fetchone()
        services = dict(q("SELECT service, count(*) FROM spans GROUP BY service").fetchall())
        return _facts(pairs, dur, attrs, services)

    def agg_facts(self, agg: dict[str, Any]) -> dict[str, int]:
        return _agg_facts(len(agg["n"]), (agg["t1"] - agg["t0"]).sum(), agg["n"].sum())


class PolarsRunner(Runner):
    def __init__(self) -> None:
        import polars as pl

        self.pl = pl
        self.threads = pl.thread_pool_size()
        typ = {"s": pl.String, "f": pl.Float64, "b": pl.Boolean}
        any_ = {k: typ[t] for k, t in _ANY_FIELDS}
        value = pl.Struct({**any_, "arrayValue": pl.Struct({"values": pl.List(pl.Struct(any_))})})
        kv = pl.List(pl.Struct({"key": pl.String, "value": value}))
        span = pl.Struct({**dict.fromkeys(_SPAN_FIELDS, pl.String), "attributes": kv})
        scope = pl.Struct({"spans": pl.List(span)})
        rs = pl.Struct({"resource": pl.Struct({"attributes": kv}), "scopeSpans": pl.List(scope)})
        self.schema = {"resourceSpans": pl.List(rs)}

    def load(self, files: list[Path], directory: Path) -> Any:
        pl = self.pl
        rs, s = pl.col("rs"), pl.col("s").struct
        service = (
            rs.struct.field("resource")
            .struct.field("attributes")
            .list.filter(pl.element().struct.field("key") == SERVICE_NAME)
            .list.first()
            .struct.field("value")
            .struct.field("stringValue")
        )
        return (
            pl.scan_ndjson(files, schema=self.schema)
            .select(rs=pl.col("resourceSpans"))
            .explode("rs")
            .select(service=service, ss=rs.struct.field("scopeSpans"))
            .explode("ss")
            .select("service", s=pl.col("ss").struct.field("spans"))
            .explode("s")
            .filter(pl.col("s").is_not_null())  # an empty list explodes to one null row
            .select(
                trace_id=s.field("traceId"),
                span_id=s.field("spanId"),
                parent_id=s.field("parentSpanId"),
                name=s.field("name"),
                start_ns=s.field("startTimeUnixNano").cast(pl.Int64),
                end_ns=s.field("endTimeUnixNano").cast(pl.Int64),
                service=pl.col("service"),
                attributes=s.field("attributes"),
            )
            .collect()
        )

    def aggregate(self, data: Any) -> Any:
        pl = self.pl
        return data.group_by("trace_id").agg(
            t0=pl.col("start_ns").min(), t1=pl.col("end_ns").max(), n=pl.len()
        )

    def facts(self, data: Any) -> dict[str, Any]:
        return _facts(
            (data["trace_id"] + data["span_id"]).to_list(),
            (data["end_ns"] - data["start_ns"]).sum(),
            data["attributes"].list.len().sum(),
            dict(data.group_by("service").len().iter_rows()),
        )

    def agg_facts(self, agg: Any) -> dict[str, int]:
        return _agg_facts(agg.height, (agg["t1"] - agg["t0"]).sum(), agg["n"].sum())


class ArrowRunner(Runner):
    def __init__(self) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as paj

        self.np, self.pa, self.pc, self.paj = np, pa, pc, paj
        self.threads = pa.cpu_count()
        typ = {"s": pa.string(), "f": pa.float64(), "b": pa.bool_()}
        any_ = [(k, typ[t]) for k, t in _ANY_FIELDS]
        value = pa.struct(
            [*any_, ("arrayValue", pa.struct([("values", pa.list_(pa.struct(any_)))]))]
        )
        kv = pa.list_(pa.struct([("key", pa.string()), ("value", value)]))
        span = pa.struct([*((k, pa.string()) for k in _SPAN_FIELDS), ("attributes", kv)])
        scope = pa.struct([("spans", pa.list_(span))])
        rs = pa.struct(
            [("resource", pa.struct([("attributes", kv)])), ("scopeSpans", pa.list_(scope))]
        )
        self.parse = paj.ParseOptions(
            explicit_schema=pa.schema([("resourceSpans", pa.list_(rs))]),
            unexpected_field_behavior="ignore",
        )

    def load(self, files: list[Path], directory: Path) -> Any:
        np, pa, pc = self.np, self.pa, self.pc
        tables = [self.paj.read_json(f, parse_options=self.parse) for f in files]
        rs = pa.concat_tables(tables).column("resourceSpans").combine_chunks().flatten()
        # service.name per resource: the matching attribute, placed at its resource's row
        attrs = rs.field("resource").field("attributes")
        flat = attrs.flatten()
        match = pc.equal(flat.field("key"), SERVICE_NAME)
        names = flat.field("value").field("stringValue").filter(match)
        owner = pc.list_parent_indices(attrs).filter(match).to_numpy()
        at = np.zeros(len(rs), np.int64)
        has = np.zeros(len(rs), bool)
        at[owner], has[owner] = np.arange(len(owner)), True
        service = names.take(pa.array(at, mask=~has))
        scopes = rs.field("scopeSpans")
        lists = scopes.flatten().field("spans")
        sp = lists.flatten()
        owner_rs = pc.list_parent_indices(scopes).take(pc.list_parent_indices(lists))
        return pa.table(
            {
                "trace_id": sp.field("traceId"),
                "span_id": sp.field("spanId"),
                "parent_id": sp.field("parentSpanId"),
                "name": sp.field("name"),
                "start_ns": pc.cast(sp.field("startTimeUnixNano"), pa.int64()),
                "end_ns": pc.cast(sp.field("endTimeUnixNano"), pa.int64()),
                "service": service.take(owner_rs),
                "attributes": sp.field("attributes"),
            }
        )

    def aggregate(self, data: Any) -> Any:
        return data.group_by("trace_id").aggregate(
            [("start_ns", "min"), ("end_ns", "max"), ([], "count_all")]
        )

    def facts(self, data: Any) -> dict[str, Any]:
        pc = self.pc
        counts = data.group_by("service").aggregate([([], "count_all")])
        return _facts(
            pc.binary_join_element_wise(data["trace_id"], data["span_id"], "").to_pylist(),
            pc.sum(pc.subtract(data["end_ns"], data["start_ns"])).as_py(),
            pc.sum(pc.list_value_length(data["attributes"])).as_py(),
            dict(zip(counts["service"].to_pylist(), counts["count_all"].to_pylist(), strict=True)),
        )

    def agg_facts(self, agg: Any) -> dict[str, int]:
        pc = self.pc
        span = pc.sum(pc.subtract(agg["end_ns_max"], agg["start_ns_min"])).as_py()
        return _agg_facts(agg.num_rows, span, pc.sum(agg["count_all"]).as_py())


RUNNERS: dict[str, Callable[[], Runner]] = {
    REFERENCE: StoreRunner,
    "store-json": JsonStoreRunner,
    "worker": WorkerRunner,
    "scan": ScanRunner,
    "duckdb": DuckRunner,
    "polars": PolarsRunner,
    "pyarrow": ArrowRunner,
}


def _child(key: str, directory: Path) -> dict[str, Any]:
    """One measurement, in this (fresh) process; the result is printed as JSON."""
    files = FileSource(directory).files()
    runner = RUNNERS[key]()  # imports the engine: not timed
    base_kb = _peak_kb()
    w0, c0 = time.perf_counter(), time.process_time()
    data = runner.load(files, directory)
    w1, c1 = time.perf_counter(), time.process_time()
    agg = runner.aggregate(data)
    w2, c2 = time.perf_counter(), time.process_time()
    peak_kb = _peak_kb()  # before the checks, which build their own lists
    facts = runner.facts(data)
    agg_facts = runner.agg_facts(agg)
    if agg_facts is not None:
        facts["aggregate"] = agg_facts
    return {
        "load_wall_s": round(w1 - w0, 3),
        "load_cpu_s": round(c1 - c0, 3),
        "aggregate_wall_s": round(w2 - w1, 3) if agg is not None else None,
        "aggregate_cpu_s": round(c2 - c1, 3) if agg is not None else None,
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "rss_after_imports_mb": round(base_kb / 1024, 1),
        "threads": runner.threads,
        "facts": facts,
    }


# --------------------------------------------------------------------------- parent
def _installed(engine: Engine) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in engine.modules)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in sorted({d for e in ENGINES for d in e.dists}):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _measure(key: str, directory: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", key, "--traces", str(directory)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _generate(directory: Path, requests: int, seed: int, chunks: int | None) -> None:
    """bench_report's synthetic chunks (10,000 requests each), one after the other; past
    `chunks` chunks, copies of those (new trace ids, later times) as bench_report makes."""
    done, start_s = 0, 1_700_000_000.0
    while done < requests:
        if chunks is not None and done >= chunks * CHUNK:
            _replay_synthetic(directory / "synthetic", requests - done, done)
            return
        n = min(CHUNK, requests - done)
        t0 = time.perf_counter()
        start_s = _synthetic(directory, n, seed + done, start_s)
        done += n
        print(f"  generated {done:,}/{requests:,} requests ({time.perf_counter() - t0:.0f} s)")


def _check(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every engine's facts against the reference's (the project's decoder)."""
    ref_runs = [r for r in runs.get(REFERENCE, []) if "facts" in r]
    if not ref_runs:
        return ["the reference (TraceStore) produced nothing to compare with"]
    ref = ref_runs[0]["facts"]
    problems = []
    for key, results in runs.items():
        for i, r in enumerate(results):
            if "error" in r:
                problems.append(f"{key} repeat {i + 1} failed: {r['error']}")
                continue
            got = r["facts"]
            names = ("rows",) if BY_KEY[key].checked == "count" else tuple(ref)
            for name in names:
                if got.get(name) != ref[name]:
                    problems.append(
                        f"{key} repeat {i + 1}: {name} {got.get(name)!r} != {ref[name]!r}"
                    )
    return problems


def _median(results: list[dict[str, Any]], name: str) -> float | None:
    vals = [r[name] for r in results if r.get(name) is not None]
    return statistics.median(vals) if vals else None


def _summary(engine: Engine, results: list[dict[str, Any]] | None) -> dict[str, Any]:
    if results is None:
        return {"key": engine.key, "engine": engine.label, "status": "not installed"}
    ok = [r for r in results if "facts" in r]
    if not ok:
        return {"key": engine.key, "engine": engine.label, "status": "failed"}
    return {
        "key": engine.key,
        "engine": engine.label,
        "status": "ok" if len(ok) == len(results) else "failed in some repeats",
        "threads": ok[0]["threads"],
        **{
            name: _median(ok, name)
            for name in ("load_wall_s", "load_cpu_s", "aggregate_wall_s", "aggregate_cpu_s")
        },
        "per_repeat": [(r["load_wall_s"], r["load_cpu_s"], r["loadavg_1m"]) for r in ok],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ok),
        "rss_after_imports_mb": max(r["rss_after_imports_mb"] for r in ok),
        "spans": ok[0]["facts"]["rows"],
        "checked": engine.checked,
    }


def _fmt(x: Any, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    head = (
        "| engine | threads | load s wall | load s CPU | aggregate s | peak RSS MB "
        "| RSS after imports MB | spans | checked |"
    )
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["status"] in ("not installed", "failed"):
            out.append(f"| {r['engine']} | {r['status']} |" + " |" * 7)
            continue
        checked = "count only" if r["checked"] == "count" else "all fields"
        out.append(
            f"| {r['engine']} | {r['threads']} | {_fmt(r['load_wall_s'], '.2f')} "
            f"| {_fmt(r['load_cpu_s'], '.2f')} | {_fmt(r['aggregate_wall_s'], '.3f')} "
            f"| {r['peak_rss_mb']:.0f} | {r['rss_after_imports_mb']:.0f} | {r['spans']:,} "
            f"| {checked} |"
        )
    return out


def _markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    la0, la1 = result["loadavg_start"], result["loadavg_end"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    lines = [
        f"# Loading spans into columns: {result['requests']:,} requests",
        "",
        "Generated by `benchmarks/bench_engines.py` (its docstring says why and how); "
        'the figures behind docs/benchmarks.md\'s "Engine choice, by measurement".',
        "",
        f"- Command: `{result['command']}` ({result['when']})",
        f"- Data: {result['requests']:,} requests ({result['source']}), "
        f"{result['spans_in_files']:,} spans, {result['bytes'] / 1e6:.0f} MB of OTLP JSON "
        f"lines in {result['files']} files",
        f"- Machine: {m['cpus']} CPUs ({m['cpu']}), {m['platform']}; niceness {m['nice']}",
        f"- Versions: {versions}",
        f"- Load average (1, 5, 15 min) when the measurements started {la0[0]:.2f}, "
        f"{la0[1]:.2f}, {la0[2]:.2f}; at the end {la1[0]:.2f}, {la1[1]:.2f}, {la1[2]:.2f} "
        "(other jobs share this machine: wall times swing with them, CPU times much less)",
        "",
        f"Medians of {result['repeats']} repeat(s); each engine in its own fresh process, "
        "engines in ABBA order across repeats (A B C ... C B A ...).",
        "",
        *_table(result["rows"]),
        "",
        "- **load**: from the files to the engine's table or the project's spans by trace "
        "(trace id, span id, parent id, name, start/end ns, service.name, span attributes); "
        "CPU is the process's, every thread included. **aggregate**: per trace id, first "
        "start, last end and span count, as the engine's own result (DuckDB: fetched as "
        "numpy arrays). **peak RSS**: the process's VmHWM after the aggregate, interpreter "
        "and engine imports included (the RSS after the imports is the next column).",
        "- **checked**: every repeat's span count, set of (trace id, span id) pairs, sum of "
        "durations, number of span attributes, spans per service and the aggregate's totals "
        "equal those of the TraceStore row (the scan row: span count only).",
        "",
        "What each row does:",
        "",
        *(f"- {e.label}: {e.builds}." for e in ENGINES),
        "",
        "Not equivalent, in the engines' favour: they keep each "
        "attribute value as an OTLP AnyValue struct (undecoded, arrays nested), read only "
        "the fields named (events, kind and status are not read), and take ids as written; "
        "the project's decoder also decodes every event, kind and status, turns each "
        "attribute into a Python value, lower-cases and base64-decodes ids, and accepts "
        "other document shapes (Jaeger, snake_case protobuf JSON) and bad lines.",
        "",
        "Each repeat: load s wall / load s CPU (1-minute load average as it started):",
        "",
        "| engine | " + " | ".join(f"repeat {i + 1}" for i in range(result["repeats"])) + " |",
        "|---|" + "---:|" * result["repeats"],
    ]
    for r in result["rows"]:
        if "per_repeat" in r:
            cells = " | ".join(f"{w:.2f} / {c:.2f} ({la:.1f})" for w, c, la in r["per_repeat"])
            lines.append(f"| {r['engine']} | {cells} |")
    if result["problems"]:
        lines += ["", "**Check failed:**", "", *(f"- {p}" for p in result["problems"])]
    return "\n".join(lines) + "\n"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    env = f"PYTHONPATH={os.environ['PYTHONPATH']} " if os.environ.get("PYTHONPATH") else ""
    nice = f"nice -n {os.nice(0)} " if os.nice(0) else ""
    script = os.path.relpath(__file__, REPO)
    return env + nice + shlex.join([os.path.relpath(sys.executable, REPO), script, *args])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000, help="synthetic requests")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per engine")
    ap.add_argument("--out", type=Path, default=OUT, help="where NAME.md and NAME.json go")
    ap.add_argument("--name", default="engines", help="file name of the results, no suffix")
    ap.add_argument(
        "--seed", type=int, default=1, help="seed of the synthetic requests (%(default)s)"
    )
    ap.add_argument(
        "--synthetic-chunks",
        type=int,
        help=f"generate at most this many chunks of {CHUNK:,} requests, then copy them "
        "(whole copies: the run may get more than --requests)",
    )
    ap.add_argument("--traces", type=Path, help="use (or generate into and keep) this directory")
    ap.add_argument("--only", help="comma-separated engine keys: " + ",".join(BY_KEY))
    ap.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.traces)))
        return 0

    keys = args.only.split(",") if args.only else list(BY_KEY)
    if REFERENCE not in keys:
        keys.insert(0, REFERENCE)
    engines = [BY_KEY[k] for k in keys]
    tmp = None if args.traces else tempfile.mkdtemp(prefix="tracedpush-bench-engines-")
    directory = args.traces or Path(tmp or ".") / "traces"
    try:
        source = f"{directory}, reused"
        if not any(directory.rglob("*.jsonl")):
            source = f"synthetic, seed {args.seed}"
            if args.synthetic_chunks is not None and args.requests > args.synthetic_chunks * CHUNK:
                source += f", {args.synthetic_chunks * CHUNK:,} generated and copied"
            print(f"generating {args.requests:,} synthetic requests in {directory} ...")
            _generate(directory, args.requests, args.seed, args.synthetic_chunks)
        spans, size = _spans_bytes(directory)
        requests = sum(
            f.read_bytes().count(b'"name":"tracedpush.request"')
            for f in directory.rglob("tracedpush-proxy-*.jsonl")
        )
        files = FileSource(directory).files()
        print(f"{requests:,} requests, {spans:,} spans, {size / 1e6:.0f} MB in {len(files)} files")
        loadavg_start = os.getloadavg()
        installed = [e for e in engines if _installed(e)]
        for e in engines:
            if e not in installed:
                print(f"{e.label}: not installed")
        runs: dict[str, list[dict[str, Any]]] = {e.key: [] for e in installed}
        for rep in range(args.repeats):
            order = installed if rep % 2 == 0 else installed[::-1]
            for e in order:
                loadavg = os.getloadavg()[0]
                r = {**_measure(e.key, directory), "loadavg_1m": round(loadavg, 2)}
                runs[e.key].append(r)
                msg = r.get("error") or (
                    f"load {r['load_wall_s']:.2f} s wall, {r['load_cpu_s']:.2f} s CPU, "
                    f"aggregate {_fmt(r['aggregate_wall_s'], '.3f')} s, "
                    f"peak {r['peak_rss_mb']:.0f} MB, {r['facts']['rows']:,} spans"
                )
                print(f"repeat {rep + 1}/{args.repeats} {e.label}: {msg}", flush=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    problems = _check(runs)
    result = {
        "requests": requests,  # request spans (tracedpush.request) in the proxy's files
        "source": source,
        "repeats": args.repeats,
        "spans_in_files": spans,  # '"spanId"' counted in the files: no decoder involved
        "bytes": size,
        "files": len(files),
        "command": _command(argv),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": _cpu_model(),
            "platform": platform.platform(),
            "nice": os.nice(0),
        },
        "versions": _versions(),
        "loadavg_start": [round(x, 2) for x in loadavg_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "rows": [_summary(e, runs.get(e.key)) for e in engines],
        "runs": runs,
        "problems": problems,
    }
    text = _markdown(result)
    print()
    print("\n".join(_table(result["rows"])))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text(text)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out / (args.name + '.md')} and {args.name}.json")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
