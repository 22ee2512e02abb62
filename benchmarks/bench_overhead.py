"""End-to-end cost of tracing: traced vs vLLM's own connectors, same machine, one run.

For each mode it starts the local 1P1D twice - once with vLLM's untraced NIXL
connectors, once with tracedpush's - warms both up, sends the identical streamed
workload through the proxy, and reports client TTFT and TPOT p50/p90 with the
traced/untraced ratio. `--rounds 2` runs A B B A to cancel slow drift of the machine.
The proxy traces in both arms: what is compared is the engines' connectors.

    python benchmarks/bench_overhead.py [--modes push pull] [--requests 48] [--rounds 1]

Prints a table and writes docs/benchmarks/overhead.json. Takes ~3 min per arm here.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from tracedpush.bench.argtypes import positive
from tracedpush.bench.workload import PromptMaker, percentile, run_workload
from tracedpush.launcher import Deployment, DeploymentConfig
from tracedpush.model.build import ensure_model

PORTS = {
    "proxy_port": 19000,
    "prefill_port": 19100,
    "decode_port": 19200,
    "prefill_side_channel_port": 16600,
    "decode_side_channel_port": 16700,
}


def run_arm(mode: str, trace: bool, model: Path, prompts, args, base: Path) -> list:
    label = f"{mode}-{'traced' if trace else 'untraced'}"
    run_dir = base / f"{label}-{time.strftime('%H%M%S')}"
    config = DeploymentConfig(mode=mode, model=model, run_dir=run_dir, trace=trace, **PORTS)
    print(f"[{label}] starting engines ...", flush=True)
    with Deployment(config) as d:
        warm = PromptMaker(model, seed=99).mix(args.lengths, 2 * len(args.lengths))
        run_workload(d.proxy_url, warm, concurrency=1, max_tokens=4, model=d.model_name)
        t0 = time.monotonic()
        results = run_workload(
            d.proxy_url,
            prompts,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            model=d.model_name,
        )
        errors = [r.error for r in results if not r.ok]
        print(
            f"[{label}] {len(results)} requests in {time.monotonic() - t0:.0f}s, "
            f"{len(errors)} errors",
            flush=True,
        )
        if errors:
            raise SystemExit(f"{label}: requests failed: {errors[:3]}")
    return results


def stats(results: list) -> dict[str, float]:
    ttft = [r.ttft_s * 1000 for r in results if r.ttft_s is not None]
    tpot = [r.tpot_s * 1000 for r in results if r.tpot_s is not None]
    return {
        "n": len(results),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p90_ms": percentile(ttft, 90),
        "tpot_p50_ms": percentile(tpot, 50),
        "tpot_p90_ms": percentile(tpot, 90),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["push", "pull"],
        choices=["push", "pull"],
        help="KV handoffs (push pull)",
    )
    parser.add_argument(
        "--requests", type=positive(int), default=48, help="requests per side (%(default)s)"
    )
    parser.add_argument(
        "--concurrency",
        type=positive(int),
        default=2,
        help="requests in flight at once (%(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive(int),
        default=32,
        help="output tokens per request (%(default)s)",
    )
    parser.add_argument(
        "--lengths",
        type=positive(int),
        nargs="+",
        default=[100, 1000, 3000],
        help="prompt lengths in tokens, mixed (100 1000 3000)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        choices=[1, 2],
        help="1: tracing off, on; 2: off, on, on, off (%(default)s)",
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory (default: the tiny local one)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/benchmarks/overhead.json"),
        help="JSON to write (%(default)s)",
    )
    args = parser.parse_args()

    model = ensure_model(args.model)
    prompts = PromptMaker(model, seed=1).mix(args.lengths, args.requests)
    order = [False, True] if args.rounds == 1 else [False, True, True, False]
    report: dict = {
        "machine": {"python": platform.python_version(), "cores": 2},
        "workload": {
            k: getattr(args, k) for k in ("requests", "concurrency", "max_tokens", "lengths")
        },
        "modes": {},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    with tempfile.TemporaryDirectory(prefix="tp-overhead-") as tmp:
        for mode in args.modes:
            arms: dict[bool, list] = {False: [], True: []}
            for trace in order:
                arms[trace] += run_arm(mode, trace, model, prompts, args, Path(tmp))
            untraced, traced = stats(arms[False]), stats(arms[True])
            ratios = {
                k.replace("_ms", "_ratio"): traced[k] / untraced[k]
                for k in untraced
                if k.endswith("_ms") and untraced[k]
            }
            report["modes"][mode] = {"untraced": untraced, "traced": traced, "ratios": ratios}

    print()
    print(f"{'mode':6} {'metric':12} {'untraced':>10} {'traced':>10} {'ratio':>7}")
    for mode, r in report["modes"].items():
        for k in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"):
            ratio = r["ratios"].get(k.replace("_ms", "_ratio"), float("nan"))
            print(f"{mode:6} {k:12} {r['untraced'][k]:10.1f} {r['traced'][k]:10.1f} {ratio:7.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
