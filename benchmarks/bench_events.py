"""Per-event cost of tracing on vLLM's threads, against building an OpenTelemetry span.

What runs on engine, model-runner and push-writer threads is one of:
  * a hook: `time_ns()` + a small tuple + `deque.append` (the recorder);
  * a NIXL agent call through the tap: the call itself plus the same record.
This script measures both, side by side with the same call made directly and with
an OpenTelemetry SDK span (start + 3 attributes + end, BatchSpanProcessor), in one run.
It prints a table and writes docs/benchmarks/events.json.

    python benchmarks/bench_events.py [--n 200000] [--out docs/benchmarks/events.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from time import time_ns

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tracedpush.connector.tap import NixlAgentTap
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.events import Recorder


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


class FakeAgent:
    """Stands in for nixl_agent: the cheapest possible calls, so the tap's cost shows."""

    def check_xfer_state(self, handle):
        return "PROC"

    def transfer(self, handle, notif_msg=b""):
        return "PROC"

    def get_new_notifs(self):
        return {}

    def send_notif(self, agent, notif_msg):
        return None


def per_call_us(fn, n: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="calls per measurement")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/events.json"))
    args = parser.parse_args()
    n = args.n

    def empty_loop(k):
        for _ in range(k):
            pass

    def record_event(k):
        rec = Recorder()
        record = rec.record
        for i in range(k):
            record((ev.S_SCHEDULED, time_ns(), "cmpl-abc-0-12345678"))
            if i & 0xFFFF == 0:
                rec.drain()

    agent, tap = FakeAgent(), NixlAgentTap(FakeAgent(), Recorder().record)

    def direct_transfer(k):
        for _ in range(k):
            agent.transfer(1)

    def tapped_transfer(k):
        rec = Recorder()
        t = NixlAgentTap(agent, rec.record)
        for i in range(k):
            t.transfer(1)
            if i & 0xFFFF == 0:
                rec.drain()

    def direct_poll(k):
        for _ in range(k):
            agent.check_xfer_state(1)

    def tapped_poll(k):
        for _ in range(k):
            tap.check_xfer_state(1)

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullExporter(), max_queue_size=1 << 20))
    tracer = provider.get_tracer("bench")

    def otel_span(k):
        for _ in range(k):
            span = tracer.start_span("kv.write")
            span.set_attribute("a", 1)
            span.set_attribute("b", "x")
            span.set_attribute("c", 2.0)
            span.end()

    loop = per_call_us(empty_loop, n)
    rows = {
        "hook: record one event (time_ns + tuple + deque.append)": per_call_us(record_event, n)
        - loop,
        "NIXL transfer(), direct": per_call_us(direct_transfer, n) - loop,
        "NIXL transfer(), through the tap (recorded)": per_call_us(tapped_transfer, n) - loop,
        "NIXL check_xfer_state() PROC, direct": per_call_us(direct_poll, n) - loop,
        "NIXL check_xfer_state() PROC, through the tap": per_call_us(tapped_poll, n) - loop,
        "OpenTelemetry SDK span (start, 3 attributes, end)": per_call_us(otel_span, n // 10) - loop,
    }
    provider.shutdown()
    tap_cost = rows["NIXL transfer(), through the tap (recorded)"] - rows["NIXL transfer(), direct"]
    poll_cost = (
        rows["NIXL check_xfer_state() PROC, through the tap"]
        - rows["NIXL check_xfer_state() PROC, direct"]
    )
    width = max(map(len, rows))
    print(f"{'per call (us)':>{width}}  ")
    for name, us in rows.items():
        print(f"{name:<{width}}  {us:7.3f}")
    print(f"{'=> tap overhead per recorded NIXL call':<{width}}  {tap_cost:7.3f}")
    print(f"{'=> tap overhead per unrecorded poll':<{width}}  {poll_cost:7.3f}")
    ratio = (
        rows["OpenTelemetry SDK span (start, 3 attributes, end)"]
        / rows["hook: record one event (time_ns + tuple + deque.append)"]
    )
    print(f"an SDK span costs {ratio:.0f}x a recorded event")
    result = {
        "machine": {"python": platform.python_version(), "processor": platform.processor()},
        "n": n,
        "per_call_us": rows,
        "tap_overhead_recorded_us": tap_cost,
        "tap_overhead_poll_us": poll_cost,
        "sdk_span_over_event": ratio,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
