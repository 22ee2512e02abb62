"""`tracedpush collect`: receive OTLP spans, store them, forward them, measure TTFT phases."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from tracedpush.collect.assemble import DEFAULT_MAX_PENDING, DEFAULT_TIMEOUT_S
from tracedpush.collect.forward import DEFAULT_QUEUE
from tracedpush.collect.forward import DEFAULT_TIMEOUT_S as FORWARD_TIMEOUT_S
from tracedpush.collect.service import (
    METRICS_PORT,
    OTLP_GRPC_PORT,
    OTLP_HTTP_PORT,
    CollectConfig,
    CollectService,
)
from tracedpush.envs import env_float, env_int, env_str

log = logging.getLogger("tracedpush.collect")

PROGRESS_EVERY_S = 30.0

DESCRIPTION = """\
A small OpenTelemetry collector for tracedpush's traces.

Receives spans over OTLP (HTTP POST /v1/traces, protobuf or JSON, gzip; gRPC
TraceService/Export) from the proxy and the engines, and
  * appends them to the trace store (one line-atomic OTLP JSON-lines file per
    collector process in --traces), which `tracedpush report DIR` and
    `tracedpush console DIR` read like the connectors' own files;
  * forwards them (--forward) to another OTLP/HTTP endpoint (Jaeger, an
    OpenTelemetry Collector) from a bounded queue: a target that is down or hangs
    never slows receiving, lost spans are counted;
  * assembles each request's trace, runs the critical path on it once it is
    complete, and serves on /metrics the histograms
    tracedpush_ttft_phase_seconds{mode,phase} and tracedpush_ttft_seconds{mode}
    (each observation with an OpenMetrics exemplar trace_id) and the counters
    tracedpush_collect_traces_total{outcome} and tracedpush_collect_spans_total.

A trace is complete when the proxy's root span tracedpush.request and every span
the critical path needs for its mode have arrived. One still incomplete after
--trace-timeout seconds without a new span expires (counted, dropped); at most
--max-pending traces wait. See docs/collect.md.
"""

EPILOG = """\
point exporters at it (standard OpenTelemetry variables):
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318   (http/protobuf, the default)
  OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317

examples:
  tracedpush collect --traces runs/traces
  tracedpush collect --traces runs/traces --forward http://jaeger:4318 --otlp-grpc-port 0
  tracedpush up --collect        (the launcher starts it and wires every process to it)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--traces",
        metavar="DIR",
        default=env_str("TRACEDPUSH_TRACES_DIR", "traces"),
        help="trace store directory: the collector appends to "
        "tracedpush-collect-<host>-<pid>.jsonl in it (default ./traces). "
        "Env: TRACEDPUSH_TRACES_DIR.",
    )
    parser.add_argument(
        "--no-trace-files",
        action="store_true",
        help="store nothing (metrics and forwarding only)",
    )
    parser.add_argument(
        "--host",
        default=env_str("TRACEDPUSH_COLLECT_HOST", "0.0.0.0"),
        help="address every listener binds (default 0.0.0.0). Env: TRACEDPUSH_COLLECT_HOST.",
    )
    parser.add_argument(
        "--otlp-http-port",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_OTLP_HTTP_PORT", OTLP_HTTP_PORT),
        metavar="PORT",
        help=f"OTLP/HTTP port (default {OTLP_HTTP_PORT}; 0 disables). "
        "Env: TRACEDPUSH_COLLECT_OTLP_HTTP_PORT.",
    )
    parser.add_argument(
        "--otlp-grpc-port",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_OTLP_GRPC_PORT", OTLP_GRPC_PORT),
        metavar="PORT",
        help=f"OTLP/gRPC port (default {OTLP_GRPC_PORT}; 0 disables). "
        "Env: TRACEDPUSH_COLLECT_OTLP_GRPC_PORT.",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_METRICS_PORT", METRICS_PORT),
        metavar="PORT",
        help=f"Prometheus /metrics and /health port (default {METRICS_PORT}, the "
        "OpenTelemetry Prometheus exporter's; 0 disables). Env: TRACEDPUSH_COLLECT_METRICS_PORT.",
    )
    fwd = parser.add_argument_group("forwarding")
    fwd.add_argument(
        "--forward",
        metavar="URL",
        default=env_str("TRACEDPUSH_COLLECT_FORWARD"),
        help="also send everything received to this OTLP/HTTP endpoint, e.g. "
        "http://jaeger:4318 (/v1/traces is added). Env: TRACEDPUSH_COLLECT_FORWARD.",
    )
    fwd.add_argument(
        "--forward-queue",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_FORWARD_QUEUE", DEFAULT_QUEUE),
        metavar="N",
        help=f"export requests waiting to be forwarded; more are dropped and counted "
        f"(default {DEFAULT_QUEUE}). Env: TRACEDPUSH_COLLECT_FORWARD_QUEUE.",
    )
    fwd.add_argument(
        "--forward-timeout",
        type=float,
        default=env_float("TRACEDPUSH_COLLECT_FORWARD_TIMEOUT", FORWARD_TIMEOUT_S),
        metavar="S",
        help=f"seconds one forward attempt may take (default {FORWARD_TIMEOUT_S:g}). "
        "Env: TRACEDPUSH_COLLECT_FORWARD_TIMEOUT.",
    )
    asm = parser.add_argument_group("trace assembly (bounded memory)")
    asm.add_argument(
        "--trace-timeout",
        type=float,
        default=env_float("TRACEDPUSH_COLLECT_TRACE_TIMEOUT", DEFAULT_TIMEOUT_S),
        metavar="S",
        help=f"an incomplete trace that got no span for this long expires (default "
        f"{DEFAULT_TIMEOUT_S:g}). Env: TRACEDPUSH_COLLECT_TRACE_TIMEOUT.",
    )
    asm.add_argument(
        "--max-pending",
        type=int,
        default=env_int("TRACEDPUSH_COLLECT_MAX_PENDING", DEFAULT_MAX_PENDING),
        metavar="N",
        help=f"incomplete traces kept; a new one beyond this expires the one idle longest "
        f"(default {DEFAULT_MAX_PENDING}). Env: TRACEDPUSH_COLLECT_MAX_PENDING.",
    )
    parser.add_argument(
        "--log-level",
        default=env_str("TRACEDPUSH_LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="log level (default info). Env: TRACEDPUSH_LOG_LEVEL.",
    )


def build_config(args: argparse.Namespace) -> CollectConfig:
    """CollectConfig from parsed flags; ValueError explains a bad value."""
    for name in ("otlp_http_port", "otlp_grpc_port", "metrics_port"):
        if not 0 <= getattr(args, name) <= 65535:
            raise ValueError(f"--{name.replace('_', '-')} must be a port (0 disables)")
    if not args.otlp_http_port and not args.otlp_grpc_port:
        raise ValueError("both OTLP receivers are disabled: nothing to collect")
    if args.trace_timeout <= 0 or args.forward_timeout <= 0:
        raise ValueError("--trace-timeout and --forward-timeout must be > 0")
    if args.max_pending < 1 or args.forward_queue < 1:
        raise ValueError("--max-pending and --forward-queue must be >= 1")
    if args.forward and not args.forward.startswith(("http://", "https://")):
        raise ValueError(f"--forward {args.forward!r}: give an http(s):// OTLP/HTTP URL")
    return CollectConfig(
        traces_dir=None if args.no_trace_files else Path(args.traces),
        host=args.host,
        http_port=args.otlp_http_port,
        grpc_port=args.otlp_grpc_port,
        metrics_port=args.metrics_port,
        forward=args.forward,
        forward_queue=args.forward_queue,
        forward_timeout_s=args.forward_timeout,
        trace_timeout_s=args.trace_timeout,
        max_pending=args.max_pending,
    )


async def serve(config: CollectConfig) -> None:
    """Listen until SIGINT/SIGTERM; print the ready line once every listener is bound."""
    service = CollectService(config)
    endpoints = await service.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    urls = ", ".join(f"{k} {v}" for k, v in endpoints.urls().items())
    print(f"tracedpush collect ready: {urls}", flush=True)
    collector = service.collector
    last = ""
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S)
            except TimeoutError:
                now = collector.summary()
                if now != last:
                    log.info("%s", now)
                    last = now
    finally:
        log.info("shutting down")
        await service.stop()
        print(f"tracedpush collect stopped: {collector.summary()}", flush=True)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"tracedpush collect: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(config))
    except OSError as exc:  # a port already in use
        print(f"tracedpush collect: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
