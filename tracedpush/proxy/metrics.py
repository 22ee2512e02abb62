"""The proxy's Prometheus metrics, rendered as text exposition format by hand.

Four series are not worth a dependency (and a process-global registry that would
leak between test apps): requests by mode/status/failed leg, requests in flight,
requests in flight per upstream, and the proxy-measured TTFT histogram.
"""

from __future__ import annotations

from collections import Counter

from tracedpush.proxy.routing import Pool

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ProxyMetrics:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: Counter[tuple[str, str]] = Counter()  # (status, leg) -> count
        self.in_flight = 0
        self._ttft_buckets = [0] * len(TTFT_BUCKETS)
        self._ttft_count = 0
        self._ttft_sum = 0.0

    def finished(self, status: int, leg: str | None) -> None:
        self.requests[(str(status), leg or "none")] += 1

    def observe_ttft(self, seconds: float) -> None:
        self._ttft_count += 1
        self._ttft_sum += seconds
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self._ttft_buckets[i] += 1

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
            "# HELP tracedpush_proxy_ttft_seconds Proxy receipt to first token sent to "
            "the client (non-streamed: to the response).",
            "# TYPE tracedpush_proxy_ttft_seconds histogram",
        ]
        for bound, count in zip(TTFT_BUCKETS, self._ttft_buckets, strict=True):
            out.append(
                f'tracedpush_proxy_ttft_seconds_bucket{{mode="{mode}",le="{bound}"}} {count}'
            )
        out += [
            f'tracedpush_proxy_ttft_seconds_bucket{{mode="{mode}",le="+Inf"}} {self._ttft_count}',
            f'tracedpush_proxy_ttft_seconds_sum{{mode="{mode}"}} {self._ttft_sum}',
            f'tracedpush_proxy_ttft_seconds_count{{mode="{mode}"}} {self._ttft_count}',
        ]
        return "\n".join(out) + "\n"
