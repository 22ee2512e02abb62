"""Per-event cost of tracing on vLLM's threads, against building an OpenTelemetry span.

What runs on engine, model-runner and push-writer threads is one of:
  * a hook: `time_ns()` + a small named tuple + `deque.append` (the recorder);
  * a NIXL agent call through the tap: the call itself plus the same record;
  * one engine step's worth of connector hooks on the model-runner thread (bind,
    start_load_kv, wait_for_save, get_transfer_results, stats, clear: each timed, one
    `WorkerStep` event per step) and on the EngineCore thread (build_connector_meta:
    one `SchedStep` event), through the real `TracedConnectorMixin` over a stand-in
    for vLLM's connector whose methods do nothing (so only our cost shows).
This script measures them side by side with the same calls made directly and with
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

from tracedpush.bench.argtypes import positive
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


class _Meta:
    tracedpush_step = 1
    reqs_to_recv: dict = {}  # noqa: RUF012
    push_finished_blocks: dict = {}  # noqa: RUF012


class _Results:
    finished_sending: tuple = ()
    finished_recving: tuple = ()
    failed_recving: tuple = ()


class _SchedOutput:
    num_scheduled_tokens = {"cmpl-a-0-12345678": 1, "cmpl-b-0-12345678": 1}  # noqa: RUF012


class FakeUpstream:
    """vLLM's connector facade with every per-step method doing nothing."""

    _connector_metadata = _Meta()

    def bind_connector_metadata(self, metadata):
        pass

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def get_transfer_results(self, finished_req_ids):
        return _Results

    def get_kv_connector_stats(self):
        return None

    def clear_connector_metadata(self):
        pass

    def build_connector_meta(self, scheduler_output):
        return _Meta()


def step_hooks(connector, k: int, rec: Recorder | None) -> None:
    meta, out, finished = _Meta(), _SchedOutput(), set()
    for i in range(k):
        connector.build_connector_meta(out)
        connector.bind_connector_metadata(meta)
        connector.start_load_kv(None)
        connector.wait_for_save()
        connector.get_transfer_results(finished)
        connector.get_kv_connector_stats()
        connector.clear_connector_metadata()
        if rec is not None and i & 0xFFF == 0:
            rec.drain()


def traced_connector(rec: Recorder):
    """`TracedConnectorMixin` over the stand-in, set up as its __init__ would."""
    from tracedpush.connector.traced import TracedConnectorMixin

    class Traced(TracedConnectorMixin, FakeUpstream):
        pass

    c = object.__new__(Traced)
    c._tp_pipeline = None
    c._tp_record = rec.record
    c._tp_outbox = []
    c._tp_await_sched = set()
    c._tp_seq = 0
    c._tp_step_t0 = 0
    c._tp_step_seq = -1
    c._tp_ns = [0, 0, 0, 0, 0]
    c._tp_loads = [0, 0]
    return c


HOOKS_PER_STEP = 7  # build_connector_meta + the six model-runner calls above


def per_call_us(fn, n: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=positive(int), default=200_000, help="calls per measurement (%(default)s)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/benchmarks/events.json"),
        help="JSON to write (%(default)s)",
    )
    args = parser.parse_args()
    n = args.n

    def empty_loop(k):
        for _ in range(k):
            pass

    def record_event(k):
        rec = Recorder()
        record = rec.record
        for i in range(k):
            record((ev.SCHEDULED, time_ns(), "cmpl-abc-0-12345678"))
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

    rec = Recorder()
    plain, traced = FakeUpstream(), traced_connector(rec)
    steps = max(1000, n // 20)
    step_direct = per_call_us(lambda k: step_hooks(plain, k, None), steps)
    step_traced = per_call_us(lambda k: step_hooks(traced, k, rec), steps)
    step_cost = step_traced - step_direct

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
    rows["one engine step of connector calls, direct"] = step_direct
    rows["one engine step of connector calls, traced (2 events)"] = step_traced
    width = max(map(len, rows))
    print(f"{'per call (us)':>{width}}  ")
    for name, us in rows.items():
        print(f"{name:<{width}}  {us:7.3f}")
    print(f"{'=> tap overhead per recorded NIXL call':<{width}}  {tap_cost:7.3f}")
    print(f"{'=> tap overhead per unrecorded poll':<{width}}  {poll_cost:7.3f}")
    print(f"{'=> tracing per engine step (all hooks)':<{width}}  {step_cost:7.3f}")
    print(f"{'=> tracing per hook call':<{width}}  {step_cost / HOOKS_PER_STEP:7.3f}")
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
        "step_overhead_us": step_cost,
        "per_hook_overhead_us": step_cost / HOOKS_PER_STEP,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
