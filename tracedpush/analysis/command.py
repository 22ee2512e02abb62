"""`tracedpush report`: critical path, clock skew and push vs pull from traces."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracedpush.analysis.analyze import analyze
from tracedpush.analysis.compare import compare
from tracedpush.analysis.jaeger import parse_duration
from tracedpush.analysis.load import TraceStore
from tracedpush.analysis.perfetto import to_perfetto
from tracedpush.analysis.report import render
from tracedpush.analysis.report_json import run_json


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
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
    parser.add_argument("--service", help="Jaeger service to search (default: the proxy's)")
    parser.add_argument(
        "--lookback", default="1h", type=_duration, help="Jaeger search window (default 1h)"
    )
    parser.add_argument(
        "--trace-id", action="append", default=[], help="only this trace (repeatable)"
    )
    parser.add_argument(
        "--format", choices=("table", "json", "perfetto"), default="table", help="output format"
    )
    parser.add_argument("--out", metavar="FILE", help="write here instead of stdout")
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


def run(args: argparse.Namespace) -> int:
    if args.traces:
        missing = [p for p in args.traces if not Path(p).exists()]
        if missing:
            for p in missing:
                print(f"tracedpush report: {p}: no such file or directory", file=sys.stderr)
            return 2
        store = TraceStore.from_paths(args.traces)
    else:
        store = TraceStore.from_jaeger(
            args.jaeger,
            service=args.service,
            lookback=args.lookback,
            trace_ids=args.trace_id or None,
        )
        if store.last_error:
            print(f"tracedpush report: {store.last_error}", file=sys.stderr)
            return 1
    kwargs = {}
    if args.buckets:
        kwargs["buckets"] = args.buckets
    if args.load_buckets:
        kwargs["load_buckets"] = args.load_buckets
    result = analyze(
        store,
        correct_skew=not args.no_skew_correction,
        skew_policy=args.skew_policy,
        spans=args.format != "json" or args.spans or args.format == "perfetto",
        **kwargs,
    )
    if args.trace_id and args.traces:
        keep = set(args.trace_id)
        result.requests = [r for r in result.requests if r.trace_id in keep or r.request_id in keep]
        result._reindex()
    if not result.requests:
        print(
            f"tracedpush report: no requests found in {store.describe()} "
            f"({store.stats.spans} spans, {store.stats.malformed} malformed skipped)",
            file=sys.stderr,
        )
    if args.format == "table":
        text = render(result, slowest=args.slowest, cmp=compare(result))
    elif args.format == "json":
        text = json.dumps(run_json(result, spans=args.spans), indent=1)
    else:
        text = json.dumps(to_perfetto(result), separators=(",", ":"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        print(
            f"wrote {args.out} ({len(result.requests)} requests, format {args.format})",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text + "\n")
    return 0 if result.requests else 1
