"""The whole cost of tracing in one run, from the OS's CPU counters (not latency).

Latency on this 2-core machine spreads far more than the 1% we want to resolve, so this
measures CPU time instead, in one traced run:

  * our threads: every thread of the engine processes whose OS name starts with
    `tracedpush` (builder, exporters; `name_os_thread` names them), CPU from
    /proc/<pid>/task/<tid>/stat, read from outside the engines before and after the
    workload;
  * our hooks on vLLM's threads: they run inside vLLM's own threads, so no counter
    separates them. Their cost is the number of events the engines recorded (each
    process's `tracedpush.events.recorded`, from its `engine.threads` spans) times the
    per-hook cost measured in this same run with the real hook code (see
    bench_events.py: one engine step's worth of connector calls through
    `TracedConnectorMixin`, per hook call);
  * the engines: CPU of every thread of every process of P's and D's trees (API
    server, EngineCore, worker).

It prints per-request figures and the ratio (ours + hooks) / engines, and writes
docs/benchmarks/cost.json. Note that vLLM's CPU workers busy-poll their core, so the
engines' CPU is close to wall time x 2 cores whatever the load.

    python benchmarks/bench_cost.py [--mode push] [--requests 48] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench_events import HOOKS_PER_STEP, FakeUpstream, per_call_us, step_hooks, traced_connector
from bench_overhead import PORTS  # the benchmarks' engine ports, away from `tracedpush up`'s

from tracedpush import semconv as sc
from tracedpush.bench.argtypes import positive
from tracedpush.bench.workload import PromptMaker, run_workload, summarize
from tracedpush.launcher import Deployment, DeploymentConfig
from tracedpush.launcher.processes import session_members, stop_on_sigterm
from tracedpush.model.build import ensure_model
from tracedpush.telemetry.events import Recorder

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def thread_cpu(pids: list[int]) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, tid) -> (OS thread name, user+system CPU ms) for every thread of `pids`."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            comm = raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode("utf-8", "replace")
            fields = raw[raw.rfind(b")") + 2 :].split()
            out[(pid, int(tid))] = (comm, (int(fields[11]) + int(fields[12])) * TICK_MS)
    return out


def events_recorded(traces: Path) -> dict[int, int]:
    """pid -> the latest cumulative event count its engine.threads spans reported."""
    latest: dict[int, tuple[int, int]] = {}
    for path in traces.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for rs in doc.get("resourceSpans", ()):
                pid = next(
                    (
                        int(a["value"]["intValue"])
                        for a in rs["resource"]["attributes"]
                        if a["key"] == sc.RES_PROCESS_PID
                    ),
                    0,
                )
                for ss in rs.get("scopeSpans", ()):
                    for span in ss.get("spans", ()):
                        if span["name"] != sc.SPAN_ENGINE_THREADS:
                            continue
                        end = int(span["endTimeUnixNano"])
                        for a in span["attributes"]:
                            if a["key"] == sc.EVENTS_RECORDED:
                                n = int(a["value"]["intValue"])
                                if end >= latest.get(pid, (0, 0))[0]:
                                    latest[pid] = (end, n)
    return {pid: n for pid, (_, n) in latest.items()}


def hook_cost_us() -> float:
    """Per hook call: the real mixin over a do-nothing connector, minus the bare calls."""
    rec = Recorder()
    plain, traced = FakeUpstream(), traced_connector(rec)
    direct = per_call_us(lambda k: step_hooks(plain, k, None), 20_000)
    with_hooks = per_call_us(lambda k: step_hooks(traced, k, rec), 20_000)
    return max(0.0, with_hooks - direct) / HOOKS_PER_STEP


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", choices=("push", "pull"), default="push", help="KV handoff (%(default)s)"
    )
    parser.add_argument(
        "--requests", type=positive(int), default=48, help="requests per side (%(default)s)"
    )
    parser.add_argument(
        "--concurrency",
        type=positive(int),
        default=8,
        help="requests in flight at once (%(default)s)",
    )
    parser.add_argument(
        "--lengths", default="512,1024", help="prompt lengths in tokens, mixed (%(default)s)"
    )
    parser.add_argument(
        "--max-tokens",
        type=positive(int),
        default=16,
        help="output tokens per request (%(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/benchmarks/cost.json"),
        help="JSON to write (%(default)s)",
    )
    args = parser.parse_args()
    stop_on_sigterm()  # SIGTERM stops the engines like Ctrl-C: nothing is left running
    model = ensure_model(None)
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = PromptMaker(model, seed=3).mix(lengths, args.requests)
    base = Path(tempfile.mkdtemp(prefix="tracedpush-cost-"))
    config = DeploymentConfig(mode=args.mode, model=model, run_dir=base, trace=True, **PORTS)
    deployment = Deployment(config, log=lambda m: print(f"[cost] {m}", file=sys.stderr))
    with deployment:
        engines = [p.pid for p in deployment.processes if p.pid and p.name != "proxy"]
        pids = sorted(session_members(set(engines)))
        run_workload(deployment.proxy_url, prompts[:2], 1, args.max_tokens)  # warm-up
        time.sleep(2.5)  # a thread sample and a sweep after the warm-up
        ev0 = events_recorded(deployment.traces_dir)
        cpu0, t0 = thread_cpu(pids), time.monotonic()
        print(f"[cost] {args.requests} requests, {args.concurrency} in flight", file=sys.stderr)
        results = run_workload(deployment.proxy_url, prompts, args.concurrency, args.max_tokens)
        time.sleep(2.5)  # the builders' last sweep and thread sample of the workload
        cpu1, wall = thread_cpu(pids), time.monotonic() - t0
        ev1 = events_recorded(deployment.traces_dir)
    per_hook = hook_cost_us()
    n = sum(r.ok for r in results)
    delta = {k: cpu1[k][1] - cpu0.get(k, ("", 0.0))[1] for k in cpu1}
    engines_ms = sum(delta.values())
    ours_ms = sum(d for k, d in delta.items() if cpu1[k][0].startswith("tracedpush"))
    events = sum(ev1.get(p, 0) - ev0.get(p, 0) for p in ev1)
    hooks_ms = events * per_hook / 1000.0
    ratio = (ours_ms + hooks_ms) / engines_ms if engines_ms else float("nan")
    by_name: dict[str, float] = {}
    for k, d in delta.items():
        if cpu1[k][0].startswith("tracedpush"):
            by_name[cpu1[k][0]] = by_name.get(cpu1[k][0], 0.0) + d / n
    rows = {
        "requests ok": n,
        "wall s": wall,
        "engine processes CPU ms / request": engines_ms / n,
        "tracedpush threads CPU ms / request": ours_ms / n,
        "events recorded / request": events / n,
        "per-hook cost us (measured now)": per_hook,
        "hook CPU ms / request": hooks_ms / n,
        "tracing / engines (ratio)": ratio,
    }
    for k, v in rows.items():
        print(f"{k:38s} {v:12.4f}")
    for name, ms in sorted(by_name.items()):
        print(f"  {name:36s} {ms:12.4f} ms / request")
    print(f"=> tracing costs {ratio * 100:.3f}% of the engines' CPU (target <= 1%)")
    out = {
        "mode": args.mode,
        "concurrency": args.concurrency,
        "lengths": lengths,
        "max_tokens": args.max_tokens,
        "figures": rows,
        "our_threads_ms_per_request": by_name,
        "client": summarize(results),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
