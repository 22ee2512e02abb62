"""The proxy's own CPU per request, two revisions side by side in A B B A order.

On this 2-core machine a real engine pair's compute would drown the proxy's cost, so the
engines are stubs (`tracedpush.testing.stub_processes`: mocks of vLLM's OpenAI server,
each in a process of its own, answering at once), shared by every measurement. Each
measurement starts one side's real ``tracedpush proxy`` (its checkout first on the
path, writing trace files, as `tracedpush up` runs it), sends ``--warm`` requests, then
``--requests`` non-streamed completions one after the other from one client, and reads
the proxy process's CPU time (user + system, from /proc) over them. The figure is that
CPU per request; the client's wall time per request is kept beside it. CPU counters, not
latency: the machine's noise moves latency far more than the proxy's cost.

Sides are checked out as bench_abba.py does (``.`` is the working tree). Printed, and
written to docs/benchmarks/proxy.json (``--out``).

    python benchmarks/bench_proxy.py --a HEAD~1 --b .          # push, 400 requests, 3 rounds
    python benchmarks/bench_proxy.py --a main~2 --b main --mode pull --rounds 5
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
import urllib.request
from pathlib import Path
from typing import Any

from bench_abba import REPO, WORKING_TREE, Side, _checkout, _order, _remove

from tracedpush.bench.argtypes import positive
from tracedpush.testing.stub_processes import proc_cpu_s, proxy_process, stub_engines

PROMPT = "hello world " * 300  # ~3,600 characters, a few hundred tokens' worth of text


def _one(url: str, body: bytes) -> None:
    req = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def _measure(
    side: Side, mode: str, stubs: tuple[str, str], requests: int, warm: int
) -> dict[str, float]:
    """One side's proxy, started for this measurement: its CPU per request."""
    run = side.work / f"run-{time.monotonic_ns()}"
    (run / "traces").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(side.code)}
    body = json.dumps({"model": "stub-model", "prompt": PROMPT, "max_tokens": 4}).encode()
    with proxy_process(
        mode, *stubs, run / "proxy.log", traces=run / "traces", env=env, cwd=side.code
    ) as (pid, url):
        for _ in range(warm):
            _one(url, body)
        cpu0, t0 = proc_cpu_s(pid), time.perf_counter()
        for _ in range(requests):
            _one(url, body)
        cpu, wall = proc_cpu_s(pid) - cpu0, time.perf_counter() - t0
    return {
        "cpu_ms_per_request": round(cpu * 1e3 / requests, 4),
        "wall_ms_per_request": round(wall * 1e3 / requests, 4),
    }


def _mean(side: Side, key: str) -> float:
    return statistics.fmean(r[key] for r in side.runs["proxy"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default="HEAD", help="side A: a commit, or . (HEAD)")
    ap.add_argument("--b", default=WORKING_TREE, help="side B: a commit, or . (.)")
    ap.add_argument("--mode", choices=("push", "pull"), default="push", help="(push)")
    ap.add_argument("--requests", type=positive(int), default=400, help="per measurement (400)")
    ap.add_argument("--warm", type=positive(int), default=20, help="untimed first (20)")
    ap.add_argument("--rounds", type=positive(int), default=3, help="A B B A rounds (3)")
    ap.add_argument(
        "--out", type=Path, default=REPO / "docs" / "benchmarks" / "proxy.json",
        help="the JSON figures to write (docs/benchmarks/proxy.json)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        sides = [_checkout("A", args.a, Path(tmp)), _checkout("B", args.b, Path(tmp))]
        try:
            with stub_engines(args.mode) as stubs:
                for side in sides:
                    side.runs["proxy"] = []
                for i in _order(args.rounds):
                    side = sides[i]
                    got = _measure(side, args.mode, stubs, args.requests, args.warm)
                    side.runs["proxy"].append(got)
                    cpu, wall = got["cpu_ms_per_request"], got["wall_ms_per_request"]
                    print(f"  proxy {side.name} {cpu:7.3f} ms of CPU per request "
                          f"({wall:.3f} ms wall)", flush=True)  # fmt: skip
        finally:
            for side in sides:
                _remove(side)
    a, b = (_mean(s, "cpu_ms_per_request") for s in sides)
    result: dict[str, Any] = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "mode": args.mode,
        "requests": args.requests,
        "rounds": args.rounds,
        "sides": {
            s.name: {"rev": s.rev, "commit": s.commit, "runs": s.runs["proxy"]} for s in sides
        },
        "a_cpu_ms_per_request": round(a, 4),
        "b_cpu_ms_per_request": round(b, 4),
        "cpu_ratio_b_over_a": round(b / a, 3) if a else None,
    }
    print(f"proxy CPU per request: A {a:.3f} ms, B {b:.3f} ms, B/A "
          f"{result['cpu_ratio_b_over_a']}")  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
