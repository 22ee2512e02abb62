"""Benchmark `tracedpush report` on 10,000 synthetic requests (target: under 5 s).

Generates realistic push and pull traces (tracedpush.testing.synthetic) as OTLP JSON
lines in a temporary directory, then times what `tracedpush report` does: load the
directory, analyse (clock skew + critical paths), compare push vs pull, render the
table. JSON and Perfetto rendering, and an incremental refresh after the directory
grows, are timed too but are not part of the target. Each stage is repeated and the
median is reported (wall time; CPU time alongside, since other work on this 2-core
machine inflates wall time). Figures are printed and written to
docs/benchmarks/report.json.

    python benchmarks/bench_report.py [--requests 10000] [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracedpush.analysis import TraceStore, analyze, compare, run_json, to_perfetto
from tracedpush.analysis.report import render
from tracedpush.testing import synthetic

TARGET_S = 5.0
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "report.json"


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tracedpush-bench-") as tmp:
        d = Path(tmp) / "traces"
        gen, gen_s, _ = timed(lambda: synthetic.generate(args.requests, seed=args.seed))
        files = gen.write(d)
        size = sum(f.stat().st_size for f in files)
        n_spans = sum(
            len(ss["spans"])
            for doc in gen.documents
            for rs in doc["resourceSpans"]
            for ss in rs["scopeSpans"]
        )
        del gen
        print(
            f"generated {args.requests} requests, {n_spans} spans, {size / 1e6:.1f} MB "
            f"in {len(files)} files ({gen_s:.1f} s)"
        )

        stages: dict[str, list[tuple[float, float]]] = {}

        def record(name: str, wall: float, cpu: float) -> None:
            stages.setdefault(name, []).append((wall, cpu))

        for _ in range(args.repeat):
            store, w, c = timed(lambda: TraceStore.from_path(d))
            record("load", w, c)
            run, w, c = timed(lambda: analyze(store))  # noqa: B023
            record("analyze", w, c)
            cmp, w, c = timed(lambda: compare(run))  # noqa: B023
            record("compare", w, c)
            _, w, c = timed(lambda: render(run, cmp=cmp))  # noqa: B023
            record("render_table", w, c)
            _, w, c = timed(lambda: json.dumps(run_json(run)))  # noqa: B023
            record("render_json", w, c)
            _, w, c = timed(lambda: json.dumps(to_perfetto(run)))  # noqa: B023
            record("render_perfetto", w, c)
            assert len(run.requests) == args.requests
            assert all(r.complete for r in run.requests)

        # incremental: 1% more requests appended to the directory, then refresh + re-analyse
        more = synthetic.generate(
            args.requests // 100, seed=args.seed + 1, start_unix_s=1_770_000_000
        )
        for name, docs in more.files.items():
            with (d / name).open("a") as fh:
                for doc in docs:
                    fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
        added, w, c = timed(store.refresh)
        record("refresh_1pct", w, c)
        _, w, c = timed(lambda: analyze(store))
        record("reanalyze_after_refresh", w, c)

    med = {
        k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        for k, v in stages.items()
    }
    total_wall = sum(med[k][0] for k in ("load", "analyze", "compare", "render_table"))
    total_cpu = sum(med[k][1] for k in ("load", "analyze", "compare", "render_table"))
    result = {
        "requests": args.requests,
        "spans": n_spans,
        "bytes": size,
        "repeat": args.repeat,
        "target_s": TARGET_S,
        "report_total_s": round(total_wall, 3),
        "report_total_cpu_s": round(total_cpu, 3),
        "meets_target": total_wall < TARGET_S,
        "stages_s": {k: {"wall": round(w, 3), "cpu": round(c, 3)} for k, (w, c) in med.items()},
        "incremental_new_spans": added,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "platform": platform.platform(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(f"\n{'stage':<26}{'wall s':>9}{'cpu s':>9}")
    for k, (w, c) in med.items():
        print(f"{k:<26}{w:>9.3f}{c:>9.3f}")
    print(
        f"{'report (load..table)':<26}{total_wall:>9.3f}{total_cpu:>9.3f}   target < {TARGET_S} s: "
        f"{'met' if total_wall < TARGET_S else 'MISSED'} "
        f"(load average {result['machine']['loadavg_1m']})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
