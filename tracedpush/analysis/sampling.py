"""Sampled runs: the ratio each trace was kept at, and statistics that stay unbiased.

The proxy records its sampler on each root span (`tracedpush.sampler`) and, when its own
sampler decided, the probability it kept the request with (`tracedpush.sampler.ratio`).
OpenTelemetry's trace-id-ratio sampler keeps a request when the low 64 bits of its
random trace id are below ratio x 2^64: a coin that knows nothing of the request, so each
kept request stands for 1/ratio requests alike, and means and percentiles over the kept
ones are unbiased estimates of those over every request.

When the ratios differ (the sampler was changed during the run), the traces are no longer
one uniform sample: an hour at 10% would count ten times an hour at 1%. Instead of
weighting every mean, percentile and phase account by 1/ratio, the statistics keep the
*common sample*: the traces the smallest ratio would have kept. The trace-id rule is
monotone in the ratio, so a trace kept at 10% whose id passes the 1% test is exactly one a
1% sampler would have kept, and the common sample is a uniform 1% sample of every
request: unweighted statistics over it are unbiased again, at the cost of the traces left
out. Traces without a ratio (a client's traceparent decided, at a rate the proxy cannot
know; or written before the proxy recorded one) are left out of such a mixed run's
statistics. With one ratio, or none recorded at all, every trace counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

_LOW64 = (1 << 64) - 1


class RequestAnalysis(Protocol):
    """What this module reads of a request (`results.RequestAnalysis`)."""

    trace_id: str
    proxy_seen: bool
    sampler: str | None
    sampling_ratio: float | None


def kept_at(trace_id: str, ratio: float) -> bool:
    """Would a trace-id-ratio sampler at `ratio` keep this trace (the Python SDK's
    `TraceIdRatioBased` rule: low 64 bits of the id below round(ratio x 2^64))?"""
    try:
        low = int(trace_id, 16) & _LOW64
    except ValueError:
        return False
    return low < round(ratio * (_LOW64 + 1))


def _ratio(r: RequestAnalysis) -> float | None:
    """The request's recorded ratio, if it is one (0 < ratio <= 1)."""
    ratio = r.sampling_ratio
    return ratio if ratio is not None and 0.0 < ratio <= 1.0 else None


def percent(ratio: float) -> str:
    """0.01 -> "1%", 0.005 -> "0.5%"."""
    return f"{100.0 * ratio:.4g}%"


@dataclass(slots=True)
class Sampling:
    """How the traces the proxy saw were sampled, and which ones the statistics use."""

    traces: int = 0  # traces with the proxy's root span
    ratios: dict[float, int] = field(default_factory=dict)  # ratio -> traces
    unknown: int = 0  # traces without a recorded ratio
    samplers: dict[str, int] = field(default_factory=dict)  # sampler name -> traces
    # the smallest ratio when the traces mix ratios (or mix a ratio with none): the
    # statistics then keep the traces this ratio would have kept; None: every trace
    common_ratio: float | None = None
    used: int = 0  # traces the statistics use

    @property
    def mixed(self) -> bool:
        return self.common_ratio is not None

    def keeps(self, r: RequestAnalysis) -> bool:
        """Does the comparison's statistics use this request?"""
        if self.common_ratio is None:
            return True
        return _ratio(r) is not None and kept_at(r.trace_id, self.common_ratio)

    def short(self) -> str:
        """For a table's title: "sampled at 1%", "common sample at 1% of 1%, 10%"; "" when
        every request was kept or nothing was recorded."""
        if self.mixed:
            assert self.common_ratio is not None
            seen = ", ".join(percent(x) for x in sorted(self.ratios))
            return f"common sample at {percent(self.common_ratio)} of {seen}"
        if len(self.ratios) == 1:
            (ratio,) = self.ratios
            return f"sampled at {percent(ratio)}" if ratio < 1.0 else ""
        return ""

    def describe(self) -> str:
        """One line for the report, e.g. "sampled at 1% (5 traces, each standing for
        about 100 requests; means and percentiles are unbiased estimates over every
        request)"."""
        if not self.ratios:
            return "sampling: not recorded" + (f" ({self.unknown} traces)" if self.unknown else "")
        names = ", ".join(sorted(self.samplers)) or "unknown sampler"
        if not self.mixed:
            ((ratio, n),) = self.ratios.items()
            if ratio >= 1.0:
                return f"sampling: every request ({names}, {n} traces)"
            return (
                f"sampled at {percent(ratio)} ({names}; {n} traces, each standing for about "
                f"{1.0 / ratio:.4g} requests; means and percentiles are unbiased estimates "
                "over every request)"
            )
        seen = ", ".join(f"{percent(x)} ({n} traces)" for x, n in sorted(self.ratios.items()))
        if self.unknown:
            seen += f", no ratio ({self.unknown} traces)"
        assert self.common_ratio is not None
        return (
            f"sampled at {seen} ({names}): the comparison uses the {self.used} traces a "
            f"{percent(self.common_ratio)} sampler would have kept (the common sample), so "
            "its statistics stay unbiased"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "samplers": dict(self.samplers),
            "ratios": [
                {"ratio": ratio, "traces": n, "stands_for": round(n / ratio, 3)}
                for ratio, n in sorted(self.ratios.items())
            ],
            "no_ratio": self.unknown,
            "common_ratio": self.common_ratio,
            "traces_in_statistics": self.used,
            "summary": self.describe(),
        }


def summarize(requests: Iterable[RequestAnalysis]) -> Sampling:
    """The sampling of the requests that have the proxy's root span."""
    ratios: Counter[float] = Counter()
    samplers: Counter[str] = Counter()
    seen = []
    unknown = 0
    for r in requests:
        if not r.proxy_seen:
            continue
        seen.append(r)
        if r.sampler:
            samplers[r.sampler] += 1
        ratio = _ratio(r)
        if ratio is None:
            unknown += 1
        else:
            ratios[ratio] += 1
    out = Sampling(len(seen), dict(ratios), unknown, dict(samplers))
    if len(ratios) > 1 or (ratios and unknown):
        out.common_ratio = min(ratios)
    out.used = sum(out.keeps(r) for r in seen)
    return out
