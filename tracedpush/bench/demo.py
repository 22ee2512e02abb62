"""`tracedpush demo`: push then pull on the same mixed workload, and a TTFT/TPOT table.

One deployment at a time (the machine has two cores: P and D each get one). Each mode
gets a warm-up (the first request pays the NIXL handshake), then the same prompts at each
concurrency level. Results: a table on stdout, ``results.json`` in the run dir, traces of
both modes under ``<run-dir>/traces/{push,pull}``, logs under ``<run-dir>/{push,pull}``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from tracedpush.bench.workload import PromptMaker, RequestResult, run_workload, summarize
from tracedpush.envs import env_str
from tracedpush.launcher.deployment import Deployment, DeploymentConfig
from tracedpush.launcher.processes import EnginesLock, LaunchError, stop_on_sigterm
from tracedpush.launcher.servers import traced_connectors_available

MODES = ("push", "pull")


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Build the tiny model if absent, run a local 1P1D in push mode, send a mixed "
        "streamed workload (prompts of ~100 to ~3000 tokens) through the proxy, stop; "
        "the same in pull mode; then print client-measured TTFT and TPOT (p50, p90) of "
        "both modes per prompt-length bucket. A few minutes on 2 cores."
    )
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument(
        "--model",
        type=Path,
        default=env_str("TRACEDPUSH_MODEL"),
        help="model directory; default the tiny model [TRACEDPUSH_MODEL]",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=env_str("TRACEDPUSH_RUN_DIR"),
        help="output directory; default ./runs/<timestamp>-demo [TRACEDPUSH_RUN_DIR]",
    )
    parser.add_argument(
        "--requests", type=int, default=32, help="measured requests per concurrency level per mode"
    )
    parser.add_argument(
        "--lengths",
        type=_ints,
        default="100,500,1500,3000",
        help="prompt lengths in tokens (comma-separated buckets)",
    )
    parser.add_argument(
        "--concurrency", type=_ints, default="1,4,8", help="concurrency levels (comma-separated)"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=",".join(MODES),
        help="modes to run, in order; a mode may repeat (push,pull,pull,push is an ABBA "
        "run: each pass gets fresh engines, and a mode's passes are pooled)",
    )
    parser.add_argument("--no-trace", action="store_true", help="use vLLM's untraced connectors")
    parser.add_argument(
        "--no-console", action="store_true", help="do not open the console on the traces at the end"
    )
    parser.add_argument("--port", type=int, default=8000, help="proxy port")
    parser.add_argument("--prefill-port", type=int, default=8100)
    parser.add_argument("--decode-port", type=int, default=8200)


def _progress(mode: str, conc: int):
    last = [0.0]

    def report(done: int, total: int, r: RequestResult) -> None:
        now = time.monotonic()
        if r.error:
            _say(f"{mode} c={conc}: request {r.request_id} failed: {r.error}")
        if done == total or now - last[0] > 3.0:
            last[0] = now
            _say(f"{mode} c={conc}: {done}/{total} requests")

    return report


def run_mode(
    mode: str,
    args: argparse.Namespace,
    model: Path,
    run_dir: Path,
    trace: bool,
    prompts,
    tag: str = "",
) -> dict[str, Any]:
    """One pass of `mode` on fresh engines; `tag` names its log dir (default: the mode)."""
    config = DeploymentConfig(
        mode=mode,  # type: ignore[arg-type]
        model=model,
        run_dir=run_dir / (tag or mode),
        traces_dir=run_dir / "traces" / mode,
        trace=trace,
        proxy_port=args.port,
        prefill_port=args.prefill_port,
        decode_port=args.decode_port,
    )
    t0 = time.monotonic()
    results: list[RequestResult] = []
    warmup: list[RequestResult] = []
    deployment = Deployment(config, log=lambda m: _say(f"{mode}: {m}"))
    with deployment:
        startup = deployment.startup_seconds
        # First request per mode pays the NIXL handshake: measured, kept apart.
        warm = PromptMaker(model, seed=1).mix([min(args.lengths), max(args.lengths)], 2)
        _say(f"{mode}: 2 warm-up requests (the first one pays the NIXL handshake)")
        warmup = run_workload(
            deployment.proxy_url,
            warm,
            1,
            args.max_tokens,
            request_id_prefix=f"demo-{mode}-w{int(time.time())}",
            progress=_progress(f"{mode} warm-up", 1),
        )
        for conc in args.concurrency:
            _say(f"{mode}: {len(prompts)} requests at concurrency {conc}")
            results += run_workload(
                deployment.proxy_url,
                prompts,
                conc,
                args.max_tokens,
                request_id_prefix=f"demo-{mode}-c{conc}-{int(time.time())}",
                progress=_progress(mode, conc),
            )
    return {
        "mode": mode,
        "startup_s": startup,
        "seconds": time.monotonic() - t0,
        "teardown": vars(deployment.teardown) if deployment.teardown else None,
        "logs": {k: str(v) for k, v in deployment.logs.items()},
        "traces_dir": str(deployment.traces_dir) if trace else None,
        "warmup": [r.to_dict() for r in warmup],
        "results": results,
    }


def _pool(pooled: dict[str, Any] | None, one: dict[str, Any]) -> dict[str, Any]:
    """A mode's passes (ABBA) as one: results appended, each pass kept under "passes"."""
    summary = {k: v for k, v in one.items() if k != "results"}
    if pooled is None:
        return {**one, "passes": [summary]}
    return {
        **pooled,
        "seconds": pooled["seconds"] + one["seconds"],
        "warmup": pooled["warmup"] + one["warmup"],
        "results": pooled["results"] + one["results"],
        "passes": [*pooled["passes"], summary],
    }


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def table(runs: dict[str, dict[str, Any]], lengths: list[int], levels: list[int]) -> str:
    """Push-vs-pull table: one row per (prompt length, concurrency); cells "p50 / p90" ms."""
    modes = list(runs)
    head = ["prompt", "conc"]
    head += [f"{m} TTFT" for m in modes] + [f"{m} TPOT" for m in modes] + ["errors"]
    rows = [head]
    for conc in levels:
        for n in lengths:
            stats = {
                m: summarize(
                    r for r in runs[m]["results"] if r.label == str(n) and r.concurrency == conc
                )
                for m in modes
            }
            row = [str(n), str(conc)]
            for metric in ("ttft", "tpot"):
                row += [
                    f"{_fmt(stats[m][f'{metric}_ms_p50'])} / {_fmt(stats[m][f'{metric}_ms_p90'])}"
                    for m in modes
                ]
            row.append(str(sum(stats[m]["errors"] for m in modes)))
            rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _console_hook(traces: Path, no_console: bool) -> None:
    hint = f"tracedpush console --traces {traces}"
    if no_console:
        print(f"Explore the traces: {hint}")
        return
    if importlib.util.find_spec("tracedpush.console.command") is None:
        print(f"Explore the traces (once the console is installed): {hint}")
        return
    module = importlib.import_module("tracedpush.console.command")
    serve = getattr(module, "serve", None)
    if serve is None:
        print(f"Explore the traces: {hint}")
        return
    print(f"Opening the console on {traces} (Ctrl-C to quit)", flush=True)
    try:
        serve(traces)
    except KeyboardInterrupt:  # quitting the console is the normal end of the demo
        pass


def _results(
    args: argparse.Namespace,
    model: Path,
    trace: bool,
    runs: dict[str, dict[str, Any]],
    total: float,
    text: str,
) -> dict[str, Any]:
    """results.json: config, per-mode startup and requests, summaries, the table."""
    return {
        "config": {
            "model": str(model),
            "lengths": args.lengths,
            "concurrency": args.concurrency,
            "requests": args.requests,
            "max_tokens": args.max_tokens,
            "traced": trace,
        },
        "total_s": total,
        "modes": {
            m: {**r, "results": [x.to_dict() for x in r["results"]]} for m, r in runs.items()
        },
        "summary": {
            m: {
                f"{n}@c{c}": summarize(
                    x for x in r["results"] if x.label == str(n) and x.concurrency == c
                )
                for c in args.concurrency
                for n in args.lengths
            }
            for m, r in runs.items()
        },
        "table": text,
    }


def run(args: argparse.Namespace) -> int:
    from tracedpush.model.build import ensure_model

    stop_on_sigterm()  # SIGTERM stops the running deployment like Ctrl-C
    t0 = time.monotonic()
    run_dir = (args.run_dir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-demo").absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    _say(f"run dir {run_dir}")
    model = ensure_model(args.model, log=_say)
    trace = not args.no_trace
    if trace and not traced_connectors_available():
        _say("tracedpush.connector is not installed yet: running vLLM's untraced connectors")
        trace = False
    prompts = PromptMaker(model, seed=0).mix(args.lengths, args.requests)
    _say(
        f"workload: {len(prompts)} prompts of {args.lengths} tokens, {args.max_tokens} output "
        f"tokens, concurrency {args.concurrency}, modes {args.modes}"
    )
    runs: dict[str, dict[str, Any]] = {}
    results_path = run_dir / "results.json"
    # One lock for both modes, so no other engine run slips in between push and pull.
    with EnginesLock(on_wait=_say):
        for i, mode in enumerate(args.modes):
            passes = args.modes[:i].count(mode)
            tag = mode if passes == 0 else f"{mode}-{passes + 1}"
            try:
                one = run_mode(mode, args, model, run_dir, trace, prompts, tag)
            except LaunchError as e:
                print(f"tracedpush demo: {mode} mode failed to start: {e}", file=sys.stderr)
                return 1
            _say(f"{tag} done in {one['seconds']:.0f}s")
            runs[mode] = _pool(runs.get(mode), one)
            # Written after each mode, so an interrupted demo keeps what it measured.
            text = table(runs, args.lengths, args.concurrency)
            out = _results(args, model, trace, runs, time.monotonic() - t0, text)
            results_path.write_text(json.dumps(out, indent=1))

    total = time.monotonic() - t0
    text = table(runs, args.lengths, args.concurrency)
    results_path.write_text(json.dumps(_results(args, model, trace, runs, total, text), indent=1))
    failures = sum(not x.ok for r in runs.values() for x in r["results"])

    print()
    print("Client-measured latency in ms, p50 / p90. TTFT: request sent -> first token;")
    print(f"TPOT: per output token after the first ({args.max_tokens} output tokens each).")
    print(text)
    print()
    for m, r in runs.items():
        print(f"{m}: engines ready in {r['startup_s']:.0f}s; logs {run_dir / m}")
    if trace:
        print(f"traces: {run_dir / 'traces'} (push/ and pull/)")
    print(f"results: {results_path}; demo took {total:.0f}s")
    if failures:
        print(f"{failures} request(s) failed; see results.json and the logs", file=sys.stderr)
    if trace:
        _console_hook(run_dir / "traces", args.no_console)
    return 1 if failures else 0
