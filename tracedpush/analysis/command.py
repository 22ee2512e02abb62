"""`tracedpush report`: critical path, clock skew and push vs pull from traces."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from tracedpush import envs, tuning
from tracedpush.analysis import index_cache, perfetto
from tracedpush.analysis.analyze import analyze
from tracedpush.analysis.bench import join, render_bench
from tracedpush.analysis.bench_results import BenchFormatError, BenchResult, load_results
from tracedpush.analysis.build_progress import BuildProgress
from tracedpush.analysis.compare import compare
from tracedpush.analysis.index import (
    INDEX_DIRNAME,
    NO_INDEX_YET,
    AnalysisIndex,
    default_dir,
    parallel_pays,
)
from tracedpush.analysis.jaeger import parse_duration
from tracedpush.analysis.load import FileSource, TraceStore
from tracedpush.analysis.perfetto import write_perfetto
from tracedpush.analysis.report import render
from tracedpush.analysis.report_json import export_workers, take_tuning, write_json
from tracedpush.analysis.results import RunAnalysis


def _edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(sorted(int(x) for x in text.split(",") if x.strip()))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc
    if not edges:
        raise argparse.ArgumentTypeError("need at least one edge")
    return edges


def _duration(text: str) -> str:
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


EPILOG = """sources: --traces DIR or --jaeger URL; or --bench PATH alone, whose traces are
the directories its result files name, else PATH/traces.

--bench joins each request of benchmark result files (`tracedpush bench sweep`, or
`vllm bench serve --save-result --save-detailed`) to its trace by request id, and
compares push vs pull per input length x QPS cell: client TTFT/TPOT percentiles and
ratios, client vs proxy TTFT agreement, where the TTFT difference goes. vLLM's own
files carry no ids: the prefix their rows were sent with is inferred from the traces
or given with --request-id-prefix. See docs/report.md."""

EPILOG += "\n\n" + tuning.HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    # --traces or --jaeger is required unless --bench names results that say where their
    # traces are: argparse cannot say "one of these, or that", so `run` checks it.
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--traces",
        metavar="DIR",
        action="append",
        help="traces directory or file (OTLP JSON lines); repeat to read several as one "
        "store, e.g. the engines' traces_dir and the proxy's --traces when they differ",
    )
    src.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query service, e.g. http://localhost:16686"
    )
    parser.add_argument(
        "--bench",
        metavar="PATH",
        action="append",
        help="benchmark results (`vllm bench serve --save-result --save-detailed` JSON, "
        "or a `tracedpush bench sweep` directory): join each request to its trace and "
        "compare push vs pull per input length x QPS cell; repeatable. Traces: --traces / "
        "--jaeger, else the directories the results name, else PATH/traces",
    )
    parser.add_argument(
        "--request-id-prefix",
        metavar="PREFIX",
        help="--bench: the --request-id-prefix a result file without request ids was "
        "sent with (row i had id PREFIX<i>); default: inferred from the traces",
    )
    parser.add_argument("--service", help="Jaeger service to search (default: the proxy's)")
    parser.add_argument(
        "--lookback", default="1h", type=_duration, help="Jaeger search window (default 1h)"
    )
    parser.add_argument(
        "--trace-id", action="append", default=[], help="only this trace (repeatable)"
    )
    parser.add_argument(
        "--since",
        metavar="TIME",
        type=_when,
        help="only requests the proxy received at TIME or later: ISO 8601 (e.g. "
        "2026-12-04T03:30; UTC unless it gives an offset), unix seconds, or how long ago "
        "(15m: the last 15 minutes). Their load is "
        "still counted over the whole run. --jaeger searches from TIME (to --until, else "
        "now) instead of --lookback",
    )
    parser.add_argument(
        "--until", metavar="TIME", type=_when, help="only requests received before TIME"
    )
    parser.add_argument(
        "--format",
        choices=("table", "json", "perfetto"),
        default="table",
        help="output format (--bench: table or json)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="write here instead of stdout (beside it, then renamed onto it when whole)",
    )
    parser.add_argument(
        "--no-skew-correction",
        action="store_true",
        help="estimate clock offsets but do not apply them",
    )
    parser.add_argument(
        "--skew-policy",
        choices=("midpoint", "zero"),
        default="midpoint",
        help="offset inside the evidence interval: its midpoint (default; shifting a clock "
        "changes no attribution) or 0 whenever the evidence allows it",
    )
    parser.add_argument("--slowest", type=int, default=10, help="slowest requests listed (table)")
    parser.add_argument(
        "--spans", action="store_true", help="json: include every span of every request"
    )
    parser.add_argument(
        "--buckets",
        type=_edges,
        default=None,
        help="prompt-length bucket edges, e.g. 256,1024,4096",
    )
    parser.add_argument(
        "--load-buckets", type=_edges, default=None, help="load bucket edges, e.g. 1,2,4,8,16,32"
    )
    parser.add_argument(
        "--index",
        action="store_true",
        help="--traces: build (or extend) the analysis index and answer from it, so the "
        "next report or the console reads only what arrived since. Without it an index "
        "already there is used, and one is built for traces of 64 MiB or more on a "
        "machine with 2 or more cores that can fork (not Windows; faster than reading "
        "without it, even the first time); smaller runs are read without one and nothing "
        "is written beside them",
    )
    parser.add_argument(
        "--index-dir",
        metavar="DIR",
        help=f"--traces: where the analysis index is (default: {INDEX_DIRNAME}/ in the "
        f"first traces directory, or a directory per set of traces under ${envs.INDEX_ROOT} "
        "when that is set); use this when that one is read-only. A directory holds the "
        "index of one set of trace paths: given for another, it is rebuilt for that one",
    )
    parser.add_argument(
        "--no-index",
        action="store_true",
        help="--traces: read and analyse every span again, ignoring any analysis index",
    )
    tuning.add_arguments(parser)


def _when(text: str) -> float:
    """--since / --until: unix ms from ISO 8601 (UTC when naive), unix seconds, or a
    duration before now ("15m", "2h", "1h30m")."""
    try:
        return float(text) * 1000.0
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            return (time.time() - parse_duration(text)) * 1000.0
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time: give ISO 8601 (2026-12-04T03:30, UTC unless it "
                "has an offset such as +01:00), unix seconds, or how long ago (15m, 2h)"
            ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000.0


def _utc(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat(timespec="seconds")


def _chosen(args: argparse.Namespace, result: RunAnalysis) -> list[int] | None:
    """The positions --trace-id (with --traces: Jaeger searched only those) and --since /
    --until keep, in run order; None when they keep all."""
    ids = args.trace_id if args.traces else None
    named = result.positions(ids) if ids else None
    if args.since is None and args.until is None:
        return named
    window = result.arrived(args.since, args.until)
    if named is None:
        return window
    inside = set(window)
    return [i for i in named if i in inside]


def _error(message: str, code: int = 2) -> int:
    print(f"tracedpush report: {message}", file=sys.stderr)
    return code


def _store(args: argparse.Namespace, traces: list[str] | None) -> TraceStore | int:
    """The trace store, or the exit status after saying why there is none."""
    if traces:
        missing = [p for p in traces if not Path(p).exists()]
        if missing:
            for p in missing:
                _error(f"{p}: no such file or directory")
            return 2
        return TraceStore.from_paths(traces)
    store = TraceStore.from_jaeger(
        args.jaeger,
        service=args.service,
        lookback=args.lookback,
        trace_ids=args.trace_id or None,
        since=None if args.since is None else args.since / 1000.0,
        until=None if args.until is None else args.until / 1000.0,
    )
    if store.last_error:
        return _error(store.last_error, 1)
    return store


def _big(paths: list[str]) -> bool:
    """Whether `paths` are big enough for a cold index build on every core, which beats
    reading them without one even the first time (20,000 requests: 7.5-8.1 s and 0.45 GB
    against 13.4-19.3 s and 1.26 GB; 200,000, once each: 59 s, 2.4 GB against 132 s, 9.4 GB)."""
    return parallel_pays(FileSource(*paths).files())


def _index(args: argparse.Namespace, kwargs: dict) -> AnalysisIndex | None:
    """The analysis index of ``--traces`` (None: --no-index, Jaeger, missing paths, or
    an index that cannot be written, which is said and then done without)."""
    if not args.traces or args.no_index or not all(Path(p).exists() for p in args.traces):
        return None
    where = Path(args.index_dir) if args.index_dir else default_dir(args.traces)
    if not args.index and not where.is_dir() and not _big(args.traces):
        return None  # a small one-off report: reading without an index is faster
    try:
        idx = AnalysisIndex(
            args.traces,
            index_dir=args.index_dir,
            correct_skew=not args.no_skew_correction,
            skew_policy=args.skew_policy,
            **kwargs,
        )
        idx.stats  # noqa: B018  (opens it: an unwritable place fails here, not later)
    except (OSError, sqlite3.Error) as exc:
        _without_index(exc)
        return None
    return idx


def _without_index(exc: Exception) -> None:
    """Say on stderr that this report reads the traces without its index, and the way out."""
    _error(
        f"analysis index unavailable ({exc}); reading without it (--index-dir DIR keeps it "
        "in a directory you can write)",
        0,
    )


def _write(args: argparse.Namespace, report: str | Callable[[TextIO], None], what: str) -> int:
    """The report to --out or stdout: its text, or what writes it to a stream (the JSON
    report of a big run, never held whole: `write_json`). 0, or 1 when --out could not
    be written (said on stderr)."""

    def write(fh: TextIO) -> None:
        if isinstance(report, str):
            fh.write(report)
        else:
            report(fh)
        fh.write("\n")

    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists() and not out.is_file():  # /dev/null, a pipe: written as it is
            with out.open("w") as fh:
                write(fh)
        else:  # written beside, then renamed: a report stopped or failed midway (^C, a
            # full disk, a minute into a big JSON export) leaves no torn file, and an
            # earlier report at --out as it was
            tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
            try:
                with tmp.open("w") as fh:
                    write(fh)
                os.replace(tmp, out)
            except OSError as exc:
                return _error(f"could not write {out}: {exc}", 1)
            finally:
                tmp.unlink(missing_ok=True)
        print(f"wrote {args.out} ({what}, format {args.format})", file=sys.stderr)
        if args.format == "perfetto":
            _perfetto_note(out)
    else:
        write(sys.stdout)
    return 0


def _perfetto_note(out: Path) -> None:
    """Say when the document may be too big for ui.perfetto.dev, and what opens it."""
    size = out.stat().st_size if out.is_file() else 0
    if size > perfetto.UI_BYTES:
        _error(
            f"{out} is {index_cache.human_bytes(size)}: ui.perfetto.dev may not open it "
            "(the browser holds a trace in about 2 GB, several times its size); open it "
            f"with Perfetto's own trace_processor (`trace_processor --httpd {out}`, then "
            "ui.perfetto.dev), or export fewer requests (--since/--until, --trace-id)",
            0,
        )


def _update(idx: AnalysisIndex) -> RunAnalysis:
    """`idx.update()`, saying so on stderr when it builds the index from nothing (a minute
    at 200,000 requests: the one slow report)."""
    reason = idx.build_reason()
    if not reason:
        result = idx.update()
        if idx.last_new:  # it grew: the root's cap holds after growth as after a build
            index_cache.after_growth(idx.dir, _say)
        return result
    why = "" if reason == NO_INDEX_YET else f"; {reason}"
    print(
        f"tracedpush report: building the analysis index in {idx.dir} (once{why}) ...",
        file=sys.stderr,
    )
    started = time.perf_counter()
    idx.progress = shown = BuildProgress(sys.stderr)
    try:
        result = idx.update()
    finally:
        idx.progress = None
        shown.end()
    took = time.perf_counter() - started
    print(
        f"tracedpush report: analysis index built: {len(result.requests):,} requests "
        f"in {took:.1f} s; later reports read it warm",
        file=sys.stderr,
    )
    index_cache.after_growth(idx.dir, _say)
    return result


def _say(line: str) -> None:
    print(f"tracedpush report: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    take_tuning(tuning.put_in_force(args))  # and the processes it starts: the environment
    if args.bench:
        if args.since is not None or args.until is not None:
            return _error("--since and --until do not apply to --bench")
        return run_bench(args)
    if not (args.traces or args.jaeger):
        return _error("one of --traces, --jaeger or --bench is required")
    if args.request_id_prefix is not None:
        return _error("--request-id-prefix needs --bench")
    if args.since is not None and args.until is not None and args.since >= args.until:
        return _error(f"--since {_utc(args.since)} is not before --until {_utc(args.until)}")
    try:
        index_cache.max_size()  # checked before anything starts, not after a build
    except ValueError as exc:
        return _error(str(exc))
    kwargs = {}
    if args.buckets:
        kwargs["buckets"] = args.buckets
    if args.load_buckets:
        kwargs["load_buckets"] = args.load_buckets
    with_spans = args.spans or args.format == "perfetto"  # only these draw span views
    idx = _index(args, kwargs)
    store: TraceStore | AnalysisIndex | int
    if isinstance(idx, AnalysisIndex):
        try:
            result = _update(idx)
        except sqlite3.Error as exc:  # e.g. another report holds it: do without
            _without_index(exc)
            idx.close()
            idx = None
    if isinstance(idx, AnalysisIndex):
        store = idx
    else:
        store = _store(args, args.traces)
        if isinstance(store, int):
            return store
        result = analyze(
            store,
            correct_skew=not args.no_skew_correction,
            skew_policy=args.skew_policy,
            spans=with_spans,
            **kwargs,
        )
    chosen = _chosen(args, result)
    said = False  # why there is no request
    if chosen is not None:
        if not chosen and result.requests:
            window = " and ".join(
                f"{name} {_utc(ms)}"
                for name, ms in (("since", args.since), ("until", args.until))
                if ms is not None
            )
            _error(
                f"none of the {len(result.requests):,} requests is chosen ({window or 'ids'})", 0
            )
            said = True
        steps, source = result.engine_steps, result.source  # the run's, as its offsets are
        result = result.subset(chosen)  # by column from the index: no request is read
        result.engine_steps = steps
        if args.since is not None or args.until is not None:  # the header says which
            since = "the start" if args.since is None else _utc(args.since)
            until = "the end" if args.until is None else _utc(args.until)
            result.source = f"{source}, requests received from {since} until {until}"
    if isinstance(store, AnalysisIndex) and with_spans:
        result.with_requests(store.with_spans(result.requests))
    try:
        failed = _render(args, result, store, said)
    finally:
        if isinstance(store, AnalysisIndex):  # closed once written: the JSON report
            store.close()  # reads its requests from it as it writes them
    return failed or (0 if result.requests else 1)


def _progress(written: int, total: int) -> None:
    """The JSON report's progress on a terminal, on one line (a minute at 200,000)."""
    end = "\n" if written == total else ""
    line = f"\rtracedpush report: {written:,} of {total:,} requests written"
    print(line, end=end, file=sys.stderr, flush=True)


def _render(
    args: argparse.Namespace,
    result: RunAnalysis,
    store: TraceStore | AnalysisIndex,
    said: bool = False,
) -> int:
    """`result` in the asked format, to --out or stdout (`_write`'s code). `said`: why
    there is no request was said already."""
    if not result.requests and not said:
        print(
            f"tracedpush report: no requests found in {store.describe()} "
            f"({store.stats.spans} spans, {store.stats.malformed} malformed skipped)",
            file=sys.stderr,
        )
    text: str | Callable[[TextIO], None]  # a big run's JSON is written as it is made
    progress = _progress if args.out and sys.stderr.isatty() else None
    if args.format == "table":
        text = render(result, slowest=args.slowest, cmp=compare(result))
    elif args.format == "json":
        text = functools.partial(write_json, result, spans=args.spans, progress=progress)
    else:
        workers = export_workers(len(result.requests))  # a whole run on every core
        text = functools.partial(write_perfetto, result, progress=progress, workers=workers)
    return _write(args, text, f"{len(result.requests)} requests")


def bench_traces(paths: list[str], results: list[BenchResult]) -> list[Path]:
    """Where the traces of `results` are when --traces / --jaeger are not given: the
    directories the files name (our block), else ``PATH/traces`` (a file: beside it)."""
    named = sorted({r.traces for r in results if r.traces is not None and r.traces.exists()})
    if named:
        return named
    found = []
    for p in map(Path, paths):
        d = (p if p.is_dir() else p.parent) / "traces"
        if d.exists() and d not in found:
            found.append(d)
    return found


def run_bench(args: argparse.Namespace) -> int:
    """``report --bench``: results joined to traces, push vs pull per cell."""
    if args.format == "perfetto":
        return _error("--bench writes table or json, not perfetto")
    try:
        results, skipped = load_results(args.bench)
    except (FileNotFoundError, BenchFormatError) as exc:
        return _error(str(exc))
    for msg in skipped:
        _error(f"skipped {msg}", 0)
    if not results:
        return _error(f"no benchmark result files in {', '.join(args.bench)}")
    traces: list[str] | None = args.traces
    if not traces and not args.jaeger:
        named = [r.traces for r in results if r.traces is not None]
        found = bench_traces(args.bench, results)
        if not found:
            gone = f" ({', '.join(sorted({str(p) for p in named}))} named but absent)"
            return _error(
                "no traces for the benchmark results"
                + (gone if named else "")
                + ": pass --traces DIR (or --jaeger URL)"
            )
        for p in sorted({str(p) for p in named if not p.exists()}):
            _error(f"{p}: named by a result file but absent", 0)
        traces = [str(p) for p in found]
    store = _store(args, traces)
    if isinstance(store, int):
        return store
    run = analyze(
        store, correct_skew=not args.no_skew_correction, skew_policy=args.skew_policy, spans=False
    )
    bj = join(results, run, args.request_id_prefix, skipped=skipped)
    if not bj.joined:
        why = "; ".join(bj.notes) or "no request id of the results is in the traces"
        return _error(
            f"no benchmark request joined to a trace ({bj.rows} requests in "
            f"{len(results)} files, {len(run.requests)} requests in {store.describe()}): "
            f"{why}; check --traces, or pass --request-id-prefix",
            1,
        )
    text = json.dumps(bj.to_json(), indent=1) if args.format == "json" else render_bench(bj)
    return _write(args, text, f"{bj.rows} requests in {len(results)} files, {bj.joined} joined")
