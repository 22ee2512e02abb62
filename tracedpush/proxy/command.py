"""`tracedpush proxy`: serve the P/D proxy until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from tracedpush import semconv
from tracedpush.envs import env_bool, env_float, env_int, env_list, env_str
from tracedpush.proxy.app import (
    DEFAULT_MAX_BODY_BYTES,
    KV_DISCOVERY,
    MODES,
    ProxyConfig,
    create_app,
)
from tracedpush.proxy.coords import InstanceSpec, parse_instance
from tracedpush.proxy.models import vocab_size_of
from tracedpush.proxy.sampling import check_env as check_sampler_env
from tracedpush.proxy.sampling import describe as describe_sampler
from tracedpush.proxy.upstream import Timeouts

log = logging.getLogger("tracedpush.proxy")

SHUTDOWN_GRACE = 2.0  # seconds
LISTEN_BACKLOG = 2048  # pending connections the kernel queues for us (see serve)

DESCRIPTION = """\
OpenAI-compatible router for vLLM prefill/decode disaggregation over NIXL.

Routes: POST /v1/completions, POST /v1/chat/completions (streamed or not),
GET /v1/models (from a decode instance), GET /health (200 when at least one
prefill and one decode instance are healthy), GET /metrics (Prometheus).

  pull: P computes the prompt (max_tokens 1), the proxy relays P's
        kv_transfer_params to D, D reads the KV and generates.
  push: P and D get the request at the same time (same X-Request-Id); D
        carries P's NIXL coordinates and P writes the KV into D's blocks.

Every request is traced (root span tracedpush.request, legs proxy.prefill /
proxy.decode, kv.relay in pull mode); see docs/proxy.md and docs/spans.md.
Sampling follows OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, e.g.
OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01: the
engines build no spans for an unsampled request (its traceparent says so).
"""

EPILOG = """\
prefill coordinates (push mode):
  D must name its P before P answers. Give them in the URL fragment:
    --prefill 'http://10.0.0.5:8100#engine_id=prefill-engine-001,port=5600'
  keys: engine_id, host (side channel; default: what P reports, else the
  URL's host), port (VLLM_NIXL_SIDE_CHANNEL_PORT), tp, pp, dcp. Without them
  the proxy learns them from P's first answer (that request runs P then D,
  not in parallel), or with --kv-discovery probe from a 1-token probe when P
  turns healthy. Decode URLs accept '#engine_id=...' (for span attributes).

examples:
  tracedpush proxy --mode pull --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
  tracedpush proxy --mode push --port 8000 --traces /var/log/tracedpush \\
      --prefill 'http://127.0.0.1:8100#engine_id=prefill-engine-001,host=127.0.0.1,port=5600' \\
      --decode 'http://127.0.0.1:8200#engine_id=decode-engine-001'
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=env_str("TRACEDPUSH_PROXY_MODE"),
        help="KV handoff: push (P writes into D) or pull (D reads from P). "
        "Must match the engines' connector. Env: TRACEDPUSH_PROXY_MODE.",
    )
    parser.add_argument(
        "--prefill",
        action="append",
        metavar="URL",
        help="a prefill instance, repeatable (xPyD), e.g. http://127.0.0.1:8100, "
        "optionally with '#engine_id=...,port=...' (see below). "
        "Env: TRACEDPUSH_PREFILL_URLS (whitespace-separated).",
    )
    parser.add_argument(
        "--decode",
        action="append",
        metavar="URL",
        help="a decode instance, repeatable. Env: TRACEDPUSH_DECODE_URLS.",
    )
    parser.add_argument(
        "--host",
        default=env_str("TRACEDPUSH_PROXY_HOST", "0.0.0.0"),
        help="address to listen on (default 0.0.0.0). Env: TRACEDPUSH_PROXY_HOST.",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=env_int("TRACEDPUSH_PROXY_PORT", 8000),
        help="port to listen on (default 8000; 0 picks a free one). Env: TRACEDPUSH_PROXY_PORT.",
    )
    parser.add_argument(
        "--traces",
        "--traces-dir",
        dest="traces",
        metavar="DIR",
        default=env_str("TRACEDPUSH_TRACES_DIR", "traces"),
        help="directory for the proxy's OTLP JSON-lines trace files (default ./traces). "
        "Give it the engines' traces_dir (kv_connector_extra_config.tracedpush.traces_dir, "
        "which also defaults to $TRACEDPUSH_TRACES_DIR) so that one directory holds whole "
        "traces; `tracedpush report --traces A --traces B` merges two places otherwise. "
        "OTLP export to a collector/Jaeger follows the standard OTEL_EXPORTER_OTLP_* "
        "variables. Env: TRACEDPUSH_TRACES_DIR.",
    )
    parser.add_argument(
        "--no-trace-files",
        action="store_true",
        help="write no trace files (OTLP export, if configured, still happens)",
    )
    parser.add_argument(
        "--trace-context",
        action=argparse.BooleanOptionalAction,
        default=env_bool("TRACEDPUSH_TRACE_CONTEXT", True),
        help=f"put each leg's W3C traceparent into kv_transfer_params"
        f"['{semconv.KV_PARAMS_TRACE_KEY}'] so traced connectors join the proxy's "
        "trace (default on; vLLM's own connectors ignore the extra key). "
        "Env: TRACEDPUSH_TRACE_CONTEXT=0/1.",
    )
    parser.add_argument(
        "--kv-discovery",
        choices=KV_DISCOVERY,
        default=env_str("TRACEDPUSH_KV_DISCOVERY", "learn"),
        help="push mode, for a prefill given without coordinates: 'learn' them from "
        "P's first answer (that request runs sequentially), or also 'probe' P with a "
        "1-token request when it turns healthy (pins one KV block on P for its lease, "
        "30 s by default). Default learn. Env: TRACEDPUSH_KV_DISCOVERY.",
    )
    requests = parser.add_argument_group(
        "request checks (refused before any engine sees them; docs/proxy.md)"
    )
    requests.add_argument(
        "--max-body-bytes",
        type=int,
        default=env_int("TRACEDPUSH_PROXY_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
        metavar="N",
        help=f"larger request bodies get a 413 (default {DEFAULT_MAX_BODY_BYTES}, 64 MiB). "
        "Env: TRACEDPUSH_PROXY_MAX_BODY_BYTES.",
    )
    requests.add_argument(
        "--vocab-size",
        type=int,
        default=env_int("TRACEDPUSH_PROXY_VOCAB_SIZE", 0),
        metavar="N",
        help="token ids >= N in a prompt get a 400. Default 0: from --model-dir, else "
        "from the model directory the engines report in /v1/models when it is readable "
        "here, else no check. Env: TRACEDPUSH_PROXY_VOCAB_SIZE.",
    )
    requests.add_argument(
        "--model-dir",
        metavar="DIR",
        default=env_str("TRACEDPUSH_PROXY_MODEL_DIR"),
        help="the served model's directory, read for the vocabulary size (config.json, "
        "tokenizer files). Env: TRACEDPUSH_PROXY_MODEL_DIR.",
    )
    requests.add_argument(
        "--model-check",
        action=argparse.BooleanOptionalAction,
        default=env_bool("TRACEDPUSH_PROXY_MODEL_CHECK", True),
        help="answer 404 model_not_found for a model the engines do not list in "
        "/v1/models (default on; turn off for engines that load LoRAs on demand or skip "
        "model name validation). The proxy learns the list as it starts, with the key in "
        "VLLM_API_KEY when set (the engines' own variable for --api-key), else with the "
        "first request's Authorization. Env: TRACEDPUSH_PROXY_MODEL_CHECK=0/1.",
    )
    timeouts = parser.add_argument_group("timeouts (seconds)")
    timeouts.add_argument(
        "--connect-timeout",
        type=float,
        default=env_float("TRACEDPUSH_PROXY_CONNECT_TIMEOUT", 5.0),
        help="TCP connect to an engine (default 5). Env: TRACEDPUSH_PROXY_CONNECT_TIMEOUT.",
    )
    timeouts.add_argument(
        "--first-byte-timeout",
        type=float,
        default=env_float("TRACEDPUSH_PROXY_FIRST_BYTE_TIMEOUT", 300.0),
        help="request sent -> first response byte of a leg: the response head of a "
        "non-streamed leg, the first SSE event of a streamed one; covers queueing, "
        "prefill and the KV transfer (default 300). "
        "Env: TRACEDPUSH_PROXY_FIRST_BYTE_TIMEOUT.",
    )
    timeouts.add_argument(
        "--total-timeout",
        type=float,
        default=env_float("TRACEDPUSH_PROXY_TOTAL_TIMEOUT", 900.0),
        help="whole client request, both legs (default 900). Env: TRACEDPUSH_PROXY_TOTAL_TIMEOUT.",
    )
    health = parser.add_argument_group("health checks")
    health.add_argument(
        "--health-interval",
        type=float,
        default=env_float("TRACEDPUSH_PROXY_HEALTH_INTERVAL", 5.0),
        help="seconds between GET /health of every engine; unhealthy ones get no "
        "requests (default 5; 0 disables, and /health then checks on demand). "
        "Env: TRACEDPUSH_PROXY_HEALTH_INTERVAL.",
    )
    health.add_argument(
        "--health-timeout",
        type=float,
        default=env_float("TRACEDPUSH_PROXY_HEALTH_TIMEOUT", 2.0),
        help="timeout of one engine health check (default 2).",
    )
    parser.add_argument(
        "--log-level",
        default=env_str("TRACEDPUSH_LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="log level (default info). Env: TRACEDPUSH_LOG_LEVEL.",
    )


def build_config(args: argparse.Namespace) -> ProxyConfig:
    """ProxyConfig from parsed flags; ValueError explains a bad value."""
    if not args.mode:
        raise ValueError("--mode push|pull is required (or TRACEDPUSH_PROXY_MODE)")
    prefill_urls = args.prefill or env_list("TRACEDPUSH_PREFILL_URLS")
    decode_urls = args.decode or env_list("TRACEDPUSH_DECODE_URLS")
    if not prefill_urls:
        raise ValueError("at least one --prefill URL is required")
    if not decode_urls:
        raise ValueError("at least one --decode URL is required")
    prefill: list[InstanceSpec] = [parse_instance(u, "prefill") for u in prefill_urls]
    decode: list[InstanceSpec] = [parse_instance(u, "decode") for u in decode_urls]
    for name in ("connect_timeout", "first_byte_timeout", "total_timeout"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    if args.max_body_bytes < 1:
        raise ValueError("--max-body-bytes must be >= 1")
    check_sampler_env()  # the SDK reads them when the tracer provider is built
    return ProxyConfig(
        mode=args.mode,
        prefill=prefill,
        decode=decode,
        timeouts=Timeouts(
            connect=args.connect_timeout,
            first_byte=args.first_byte_timeout,
            total=args.total_timeout,
        ),
        trace_context=args.trace_context,
        kv_discovery=args.kv_discovery,
        health_interval=args.health_interval,
        health_timeout=args.health_timeout,
        max_body_bytes=args.max_body_bytes,
        vocab_size=_vocab_size(args),
        model_check=args.model_check,
        engine_api_key=env_str("VLLM_API_KEY"),
    )


def _vocab_size(args: argparse.Namespace) -> int | None:
    """--vocab-size, else --model-dir's; None (check skipped or learned) when neither."""
    if args.vocab_size < 0:
        raise ValueError("--vocab-size must be >= 0 (0: unknown)")
    if args.vocab_size:
        return args.vocab_size
    if not args.model_dir:
        return None
    size = vocab_size_of(args.model_dir)
    if size is None:
        raise ValueError(
            f"--model-dir {args.model_dir}: no vocab_size in its config.json "
            "(give --vocab-size instead)"
        )
    return size


def _traces_note(args: argparse.Namespace, provider: TracerProvider | None = None) -> str:
    """Where this proxy's spans go, for the ready line (the engines' must go there too),
    and how requests are sampled when that is not all of them."""
    note = (
        "no trace files"
        if args.no_trace_files or not args.traces
        else f"trace files in {os.path.abspath(args.traces)}"
    )
    if provider is not None:
        info = describe_sampler(provider.sampler)
        if info.name != "parentbased_always_on":  # the SDK's default: every request
            note += f"; sampler {info.describe()}"
    return note


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _tracer_provider(args: argparse.Namespace, instance_id: str) -> TracerProvider:
    from tracedpush.telemetry.export import ENV_TRACES_DIR, build_tracer_provider

    traces_dir = None
    if args.no_trace_files:
        os.environ.pop(ENV_TRACES_DIR, None)  # export.py would fall back to it
    else:
        traces_dir = args.traces
    return build_tracer_provider(semconv.SERVICE_PROXY, instance_id, traces_dir, mode=args.mode)


async def serve(
    config: ProxyConfig,
    host: str,
    port: int,
    provider: TracerProvider | None,
    traces_note: str = "",
) -> None:
    """Serve until SIGINT/SIGTERM; print the ready line (and ``traces_note``) once
    listening."""
    app = create_app(config, provider)
    # On shutdown, requests in flight get SHUTDOWN_GRACE seconds, then are cancelled
    # (closing both legs, which aborts them on the engines).
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE
    )
    await runner.setup()
    # aiohttp's default listen backlog (128) drops connections of a burst of clients
    # (measured: 131 of 200 concurrent streams waited seconds for their first byte);
    # uvicorn, which vLLM's own server runs on, uses 2048.
    site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
    await site.start()
    bound_port = port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound_port = address[1]
            break
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"tracedpush proxy ready on http://{_display_host(host)}:{bound_port} "
        f"(mode={config.mode}, prefill={len(config.prefill)}, decode={len(config.decode)})"
        + (f"; {traces_note}" if traces_note else ""),
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"tracedpush proxy: {exc}", file=sys.stderr)
        return 2
    provider = _tracer_provider(args, f"{_display_host(args.host)}:{args.port}")
    try:
        asyncio.run(serve(config, args.host, args.port, provider, _traces_note(args, provider)))
    except OSError as exc:  # e.g. port already in use
        print(f"tracedpush proxy: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    finally:
        provider.shutdown()
    return 0
