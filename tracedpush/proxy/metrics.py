"""The proxy's Prometheus metrics, rendered as text exposition format by hand.

A handful of series are not worth a dependency (and a process-global registry that
would leak between test apps): requests by mode/status/failed leg, requests in flight,
requests in flight per upstream, the proxy-measured TTFT and TPOT histograms, and the
spans the proxy's own exporters dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from tracedpush import semconv
from tracedpush.proxy.routing import Pool

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Time per output token after the first: a tiny model on CPU is ~ms, a loaded GPU ~100 ms.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)

# The proxy's documented failure answers (docs/proxy.md), as (status, failed leg): a leg
# that failed (502) or timed out (504), a request refused (400), a client gone (499).
FAILURES = (
    ("502", "prefill"),
    ("502", "decode"),
    ("504", "prefill"),
    ("504", "decode"),
    ("400", "none"),
    ("499", "none"),
)

# Per exporter, SpanSink.stats() shape: {"jsonl": {"dropped_by_reason": {...}, ...}}
DropStats = Callable[[], Mapping[str, Mapping[str, Any]]]


class Histogram:
    """A cumulative Prometheus histogram with fixed buckets and one `mode` label."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.buckets = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1

    def render(self, name: str, help_text: str, mode: str) -> list[str]:
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, count in zip(self.bounds, self.buckets, strict=True):
            out.append(f'{name}_bucket{{mode="{mode}",le="{bound}"}} {count}')
        out += [
            f'{name}_bucket{{mode="{mode}",le="+Inf"}} {self.count}',
            f'{name}_sum{{mode="{mode}"}} {self.sum}',
            f'{name}_count{{mode="{mode}"}} {self.count}',
        ]
        return out


def sink_drop_stats(provider: Any) -> DropStats | None:
    """The `stats()` of the SpanSink(s) in `provider` (`build_tracer_provider` adds one
    as a span processor with a `.sink`), or None when it has none (tests' providers).

    Reads the SDK's private processor list: the one place the sink is reachable without
    changing telemetry's API; if the SDK renames it, the counter is just left out.
    """
    active = getattr(provider, "_active_span_processor", None)
    processors = getattr(active, "_span_processors", ())
    sinks = [
        p.sink for p in processors if callable(getattr(getattr(p, "sink", None), "stats", None))
    ]
    if not sinks:
        return None

    def stats() -> dict[str, Mapping[str, Any]]:
        merged: dict[str, Mapping[str, Any]] = {}
        for sink in sinks:
            merged.update(sink.stats())
        return merged

    return stats


class ProxyMetrics:
    def __init__(self, mode: str, drop_stats: DropStats | None = None) -> None:
        self.mode = mode
        # (status, leg) -> count; the documented failures exist at 0 from the start, so
        # an error panel shows 0 rather than no data
        self.requests: Counter[tuple[str, str]] = Counter(dict.fromkeys(FAILURES, 0))
        self.in_flight = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.drop_stats = drop_stats

    def finished(self, status: int, leg: str | None) -> None:
        self.requests[(str(status), leg or "none")] += 1

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_tpot(
        self, first_token_ns: int | None, last_token_ns: int | None, output_tokens: int | None
    ) -> None:
        """(last token - first token) / (output tokens - 1), vLLM's TPOT definition;
        nothing when it is undefined (one token, non-streamed: first == last)."""
        if first_token_ns is None or last_token_ns is None or not output_tokens:
            return
        if output_tokens < 2 or last_token_ns <= first_token_ns:
            return
        self.tpot.observe((last_token_ns - first_token_ns) / 1e9 / (output_tokens - 1))

    def _dropped(self) -> dict[str, int]:
        drops = dict.fromkeys(semconv.DROP_REASONS, 0)
        if self.drop_stats is None:
            return drops
        for exporter in self.drop_stats().values():
            for reason, n in (exporter.get("dropped_by_reason") or {}).items():
                drops[reason] = drops.get(reason, 0) + int(n)
        return drops

    def render(self, pools: list[Pool]) -> str:
        mode = self.mode
        out = [
            "# HELP tracedpush_proxy_requests_total Client requests answered, by HTTP "
            "status and the leg that failed (none when no leg failed).",
            "# TYPE tracedpush_proxy_requests_total counter",
        ]
        for (status, leg), count in sorted(self.requests.items()):
            out.append(
                f'tracedpush_proxy_requests_total{{mode="{mode}",status="{status}",'
                f'leg="{leg}"}} {count}'
            )
        out += [
            "# HELP tracedpush_proxy_requests_in_flight Client requests being served.",
            "# TYPE tracedpush_proxy_requests_in_flight gauge",
            f'tracedpush_proxy_requests_in_flight{{mode="{mode}"}} {self.in_flight}',
            "# HELP tracedpush_proxy_upstream_outstanding Requests in flight per engine.",
            "# TYPE tracedpush_proxy_upstream_outstanding gauge",
        ]
        for pool in pools:
            for inst in pool.instances:
                out.append(
                    f'tracedpush_proxy_upstream_outstanding{{role="{inst.role}",'
                    f'url="{inst.url}"}} {inst.outstanding}'
                )
        out += [
            "# HELP tracedpush_proxy_upstream_healthy 1 if the engine's last health check passed.",
            "# TYPE tracedpush_proxy_upstream_healthy gauge",
        ]
        for pool in pools:
            for inst in pool.instances:
                out.append(
                    f'tracedpush_proxy_upstream_healthy{{role="{inst.role}",'
                    f'url="{inst.url}"}} {1 if inst.healthy else 0}'
                )
        out += [
            "# HELP tracedpush_proxy_upstream_resent_total Legs sent again on a new "
            "connection after the engine closed a kept-alive one unanswered (a stalled API "
            "server; docs/proxy.md, Timeouts).",
            "# TYPE tracedpush_proxy_upstream_resent_total counter",
        ]
        for pool in pools:
            for inst in pool.instances:
                out.append(
                    f'tracedpush_proxy_upstream_resent_total{{role="{inst.role}",'
                    f'url="{inst.url}"}} {inst.resent}'
                )
        out += self.ttft.render(
            "tracedpush_proxy_ttft_seconds",
            "Proxy receipt to first token sent to the client (non-streamed: to the response).",
            mode,
        )
        out += self.tpot.render(
            "tracedpush_proxy_tpot_seconds",
            "Streamed requests: (last token - first token sent to the client) / "
            "(output tokens - 1).",
            mode,
        )
        out += [
            "# HELP tracedpush_proxy_spans_dropped_total Spans the proxy's exporters "
            "dropped, by reason (summed over its exporters).",
            "# TYPE tracedpush_proxy_spans_dropped_total counter",
        ]
        for reason, n in self._dropped().items():
            out.append(f'tracedpush_proxy_spans_dropped_total{{reason="{reason}"}} {n}')
        return "\n".join(out) + "\n"
