"""`tracedpush bench sweep`: command line and the loop over modes and cells (`sweep`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tracedpush.bench.argtypes import positive
from tracedpush.bench.sweep import (
    MODES,
    PROFILES,
    CellRunner,
    Progress,
    SweepPlan,
    Target,
    cell_done,
    client_label,
    load_manifest,
    write_manifest,
)
from tracedpush.envs import env_str


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4,8, got {text!r}") from exc
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"rates must be positive numbers, got {text!r}")
    return values


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected integers like 1024,4096, got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"lengths must be positive integers, got {text!r}")
    return values


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"--modes takes push and/or pull once each, got {text!r}")
    return modes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    p = sub.add_parser(
        "sweep",
        help="QPS x input-length sweep, push vs pull, in vllm bench serve's result format",
        description=(
            "For each mode, start a local 1P1D (prefix caching off) or use yours "
            "(--proxy), then run every (input length, QPS) cell: a warm-up, then an "
            "open-loop Poisson run at the cell's rate with random prompts, through vLLM's "
            "own benchmark client where vLLM is installed. Each cell writes "
            "<results>/<mode>-qps<q>-in<n>.json (vllm bench serve --save-result "
            "--save-detailed, plus request_ids); traces go to <results>/traces/<mode>. "
            "Re-running the same command resumes: finished cells are skipped. Then: "
            "tracedpush report --bench <results>; tracedpush console --bench <results>."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="a preset grid: quick (2 rates x 2 lengths, minutes on a CPU box) or seed (the "
        "article's 1-8 QPS x 1k-16k, for GPU machines); flags below override its values",
    )
    p.add_argument("--qps", type=_floats, help="request rates, e.g. 1,2,4,8")
    p.add_argument("--input-len", type=_ints, help="prompt lengths in tokens, e.g. 1024,4096")
    p.add_argument("--output-len", type=int, help="output tokens per request (EOS ignored)")
    count = p.add_mutually_exclusive_group()
    count.add_argument("--num-prompts", type=positive(int), help="requests per cell")
    count.add_argument(
        "--duration",
        type=positive(float),
        help="seconds of arrivals per cell: each cell sends ceil(qps x duration) requests",
    )
    p.add_argument("--modes", type=_modes, default=",".join(MODES), help="push,pull or one of them")
    p.add_argument(
        "--passes",
        type=positive(int),
        default=1,
        help="2 runs every cell twice in ABBA order (push, pull, pull, push), each pass on "
        "fresh engines; report --bench and the console pool a cell's passes",
    )
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests before each cell")
    p.add_argument("--seed", type=int, default=0, help="prompts and arrival times")
    p.add_argument(
        "--results",
        type=Path,
        default=env_str("TRACEDPUSH_RESULTS"),
        help="results directory; default ./runs/<timestamp>-sweep [TRACEDPUSH_RESULTS]",
    )
    p.add_argument(
        "--client",
        choices=("auto", "vllm", "tracedpush"),
        default="auto",
        help="benchmark client: vLLM's (vllm bench serve's library) or ours (same format, "
        "for machines without vLLM); auto picks vLLM's when it imports",
    )
    p.add_argument("--force", action="store_true", help="redo cells that are already done")
    own = p.add_argument_group(
        "your own deployment (instead of a local 1P1D; run one mode at a time)"
    )
    own.add_argument("--proxy", metavar="URL", help="the P/D proxy, e.g. http://host:8000")
    own.add_argument(
        "--prefill", metavar="URL", action="append", help="prefill engine(s): checked healthy"
    )
    own.add_argument(
        "--decode", metavar="URL", action="append", help="decode engine(s): checked healthy"
    )
    own.add_argument(
        "--traces", type=Path, help="where your deployment writes traces (recorded per cell)"
    )
    own.add_argument("--served-model-name", help="the model name requests carry")
    local = p.add_argument_group("local 1P1D")
    local.add_argument(
        "--model",
        type=Path,
        default=env_str("TRACEDPUSH_MODEL"),
        help="model directory; default the tiny model [TRACEDPUSH_MODEL]",
    )
    local.add_argument("--port", type=int, default=8000, help="proxy port")
    local.add_argument("--prefill-port", type=int, default=8100)
    local.add_argument("--decode-port", type=int, default=8200)
    local.add_argument("--prefill-side-channel-port", type=int, default=5600)
    local.add_argument("--decode-side-channel-port", type=int, default=5700)


def plan_from(args: argparse.Namespace) -> SweepPlan:
    """The grid: the profile's values where a flag is not given."""
    prof = PROFILES.get(args.profile) if args.profile else None
    qps = args.qps or (prof.qps if prof else None)
    lens = args.input_len or (prof.input_lens if prof else None)
    missing = [flag for flag, v in (("--qps", qps), ("--input-len", lens)) if not v]
    if missing:
        raise SystemExit(
            f"tracedpush bench sweep: give {' and '.join(missing)}, or --profile quick|seed"
        )
    num, duration = args.num_prompts, args.duration
    if num is None and duration is None:
        num, duration = (prof.num_prompts, prof.duration) if prof else (None, 30.0)
    return SweepPlan(
        modes=args.modes,
        qps=tuple(sorted(qps)),
        input_lens=tuple(sorted(lens)),
        output_len=args.output_len or (prof.output_len if prof else 64),
        num_prompts=num,
        duration=duration,
        warmup=args.warmup,
        seed=args.seed,
        client=args.client,
        passes=args.passes,
    )


def run(args: argparse.Namespace) -> int:
    if args.bench_command != "sweep":  # argparse already refused anything else
        return 2
    from tracedpush.launcher.processes import stop_on_sigterm

    stop_on_sigterm()
    plan = plan_from(args)
    results = (args.results or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-sweep").absolute()
    results.mkdir(parents=True, exist_ok=True)
    plan = load_manifest(results, plan, args.force)
    if args.proxy and len(plan.modes) != 1:
        raise SystemExit(
            "tracedpush bench sweep: with --proxy, name the deployment's mode: --modes push "
            "or --modes pull"
        )
    runner = CellRunner(plan, results)
    todo = {
        (m, k): [c for c in plan.cells(m, k) if args.force or not cell_done(results / c.filename)]
        for m, k in plan.order()
    }
    total = sum(len(plan.cells(m, k)) for m, k in plan.order())
    done = total - sum(len(v) for v in todo.values())
    write_manifest(results, plan, {"client": client_label(runner.client)})
    progress = Progress(total, done)
    progress.say(
        f"{total} cells ({done} already done) in {results}; client "
        f"{client_label(runner.client)}; {plan.output_len} output tokens"
    )
    failed = 0
    try:
        for mode, pass_no in plan.order():
            if not todo[mode, pass_no]:
                continue
            with _target(args, plan, mode, results, progress.say) as target:
                for cell in todo[mode, pass_no]:
                    progress.say(
                        f"{cell.label}: {plan.prompts(cell.qps)} requests at {cell.qps:g}/s"
                    )
                    out, data = runner.run(cell, target)
                    failed += _summarize(out.name, data, progress.say)
                    progress.advance(cell.label)
    finally:
        progress.close()
    print(f"results: {results}")
    print(f"next: tracedpush report --bench {results}")
    print(f"      tracedpush console --bench {results}")
    if failed:
        print(f"{failed} request(s) failed; see the result files' errors", file=sys.stderr)
    return 1 if failed else 0


def _summarize(name: str, d: dict, say) -> int:
    """One line per finished cell; the number of requests that failed in it."""
    say(
        f"{name}: {d.get('completed')}/{len(d['ttfts'])} ok, TTFT p50 "
        f"{d.get('median_ttft_ms', 0):.1f} ms, TPOT p50 {d.get('median_tpot_ms', 0):.2f} ms"
    )
    return int(d.get("failed") or 0)


class _target:
    """Context manager: a Target for `mode`, starting (and stopping) a local 1P1D unless
    the user gave --proxy."""

    def __init__(self, args, plan: SweepPlan, mode: str, results: Path, say) -> None:
        self.args, self.plan, self.mode, self.results, self.say = args, plan, mode, results, say
        self.deployment = None

    def __enter__(self) -> Target:
        a = self.args
        if a.proxy:
            return _own_target(a)
        from tracedpush.launcher.deployment import Deployment, DeploymentConfig
        from tracedpush.launcher.servers import model_max_len
        from tracedpush.model.build import ensure_model

        model = ensure_model(a.model, log=self.say)
        served = model_max_len(model, self.plan.max_model_len)
        if served < self.plan.max_model_len:
            raise SystemExit(
                f"tracedpush bench sweep: {model} serves at most {served} tokens; the grid "
                f"needs {self.plan.max_model_len} (longest input + output + 64)"
            )
        config = DeploymentConfig(
            mode=self.mode,  # type: ignore[arg-type]
            model=model,
            run_dir=self.results / "logs" / self.mode / "engines",
            traces_dir=self.results / "traces" / self.mode,
            proxy_port=a.port,
            prefill_port=a.prefill_port,
            decode_port=a.decode_port,
            prefill_side_channel_port=a.prefill_side_channel_port,
            decode_side_channel_port=a.decode_side_channel_port,
            max_model_len=self.plan.max_model_len,
        )
        self.deployment = Deployment(config, log=lambda m: self.say(f"{self.mode}: {m}"))
        d = self.deployment.start()
        return Target(d.proxy_url, d.model_name, str(d.model), d.traces_dir)

    def __exit__(self, *exc: object) -> None:
        if self.deployment is not None:
            self.deployment.stop()


def _own_target(a) -> Target:
    """Your deployment: the model name and tokenizer come from the proxy's /v1/models
    unless given (vLLM reports the model's path as its ``root``)."""
    import json
    import urllib.request

    from tracedpush.bench.workload import auth_headers

    for url in [*(a.prefill or []), *(a.decode or [])]:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=10) as resp:
                healthy = resp.status == 200
        except OSError:
            healthy = False
        if not healthy:
            raise SystemExit(f"tracedpush bench sweep: {url}/health does not answer 200")
    name, root = a.served_model_name, str(a.model) if a.model else None
    if name is None or root is None:
        url = a.proxy.rstrip("/") + "/v1/models"
        try:
            listing = urllib.request.Request(url, headers=auth_headers())
            with urllib.request.urlopen(listing, timeout=30) as resp:
                first = json.load(resp)["data"][0]
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise SystemExit(f"tracedpush bench sweep: cannot list models at {url}: {exc}") from exc
        name = name or first["id"]
        root = root or first.get("root") or first["id"]
    return Target(a.proxy.rstrip("/"), name, root, a.traces.absolute() if a.traces else None)
