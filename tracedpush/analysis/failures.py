"""Where a failed request failed: the leg, the error type and the message, per request,
and the run's account of failed, recovered and incomplete requests.

A failure leaves several ERROR spans (the proxy fails the root and the leg; the engines
fail their own spans when the proxy aborts them; a span closed by a timeout says only
that something else did not happen), so "the first failed span by start time" often
names a symptom. The rule here (docs/report.md, "Failed requests"):

* Consequences are set aside: the proxy's root (it repeats a leg's failure) and spans
  the proxy cancelled because another leg failed (message ``cancelled: ...``).
* When a proxy span failed, only failures that ended no later than the proxy's first
  one are candidates: what the engines did after the proxy gave up (aborts) followed it.
* Active failures (an error answer, a broken connection, a failed WRITE) come before
  waits that timed out (``notifications_missing``, ``registration_timeout``,
  ``lease_expired``, ``upstream_timeout``, ``client_disconnected``): a wait's end is when
  it gave up, not when the cause happened.
* Then the earliest end (skew-corrected) wins.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracedpush import semconv as sc
from tracedpush.analysis.model import STATUS_ERROR, Span
from tracedpush.analysis.timeline import DECODE, PREFILL, PROXY, TraceIndex, role_of

RELAY, CLIENT, UNKNOWN = "relay", "client", "unknown"
LEGS: tuple[str, ...] = (PREFILL, DECODE, RELAY, PROXY, CLIENT)  # display order
CANCELLED_PREFIX = "cancelled:"  # the proxy cancelled this leg because another failed
MISSING_SPAN = "missing span "  # how `analyze` words a missing span in `problems`
_PROXY_LEGS = {
    sc.SPAN_PROXY_PREFILL: PREFILL,
    sc.SPAN_PROXY_DECODE: DECODE,
    sc.SPAN_KV_RELAY: RELAY,
}
# error.type values that say a wait timed out: a symptom of a failure elsewhere
WAITS = frozenset(
    {
        sc.ERR_NOTIFY_TIMEOUT,
        sc.ERR_REGISTRATION_TIMEOUT,
        sc.ERR_LEASE_EXPIRED,
        sc.ERR_UPSTREAM_TIMEOUT,
        sc.ERR_CLIENT_DISCONNECT,
    }
)
# the proxy's UpstreamFailure messages start with the leg that failed
_LEG_IN_MESSAGE = re.compile(rf"^({PREFILL}|{DECODE}) leg: ")


@dataclass(slots=True, frozen=True)
class Failure:
    """Where one request failed (see the module docstring for which span is chosen)."""

    leg: str  # "prefill" | "decode" | "relay" | "proxy" | "client" (| "unknown")
    type: str  # error.type, else the root's HTTP status code ("400")
    message: str  # the span's status message ("" when it had none)
    span: str  # the span that failed, e.g. "kv.write"
    service: str  # its service, e.g. "vllm-prefill"
    at_ms: float  # when that span ended: ms since the proxy's receipt, skew-corrected

    def describe(self) -> str:
        """``<span>: <type>``, the form of ``RequestAnalysis.error``."""
        return f"{self.span}: {self.type}"

    def to_json(self) -> dict[str, Any]:
        return {
            "leg": self.leg,
            "type": self.type,
            "message": self.message,
            "span": self.span,
            "service": self.service,
            "at_ms": round(self.at_ms, 4),
        }


def error_type(span: Span) -> str:
    return str(span.attributes.get(sc.ERROR_TYPE) or span.status_message or "error")


def _http_status(span: Span | None) -> int | None:
    value = None if span is None else span.attributes.get(sc.HTTP_STATUS)
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def leg_of(span: Span, kind: str, message: str) -> str:
    """The leg a failed span stands for: the client's, one of the proxy's legs, the
    engine side it ran on (KV spans included), or the proxy itself."""
    if kind == sc.ERR_CLIENT_DISCONNECT:
        return CLIENT
    if span.name in _PROXY_LEGS:
        return _PROXY_LEGS[span.name]
    if span.name == sc.SPAN_REQUEST:
        found = _LEG_IN_MESSAGE.match(message)
        return found.group(1) if found else PROXY
    role = role_of(span)
    return role if role in (PREFILL, DECODE, PROXY) else UNKNOWN


def _candidates(
    ix: TraceIndex, failed: Sequence[Span], end_ms: Callable[[Span], float]
) -> list[Span]:
    """The failed spans that may be the failure itself (the module docstring's rules)."""
    root = ix.root
    causes = [
        s for s in failed if s is not root and not s.status_message.startswith(CANCELLED_PREFIX)
    ]
    if not causes:  # the root alone, or only cancellations
        return [s for s in failed if s is root] or list(failed)
    proxy_ends = [end_ms(s) for s in causes if role_of(s) == PROXY]
    if proxy_ends:
        cut = min(proxy_ends)
        causes = [s for s in causes if end_ms(s) <= cut]
    return causes


def first_failure(ix: TraceIndex, end_ms: Callable[[Span], float]) -> Failure | None:
    """The failure the request's other errors followed from; None without an ERROR span
    (or, at the proxy, an HTTP status >= 400). `end_ms`: a span's skew-corrected end."""
    failed = [s for s in ix.spans if s.status_code == STATUS_ERROR]
    if not failed:
        return _refused(ix, end_ms)
    causes = _candidates(ix, failed, end_ms)
    span = min(causes, key=lambda s: (error_type(s) in WAITS, end_ms(s), s.start_ns))
    kind, message = error_type(span), span.status_message
    return Failure(
        leg=leg_of(span, kind, message),
        type=kind,
        message=message,
        span=span.name,
        service=span.resource.service,
        at_ms=end_ms(span),
    )


def _refused(ix: TraceIndex, end_ms: Callable[[Span], float]) -> Failure | None:
    """A request the proxy answered with an error status without failing a span (it
    refused the request itself, e.g. 400 for a bad body)."""
    root, status = ix.root, _http_status(ix.root)
    if root is None or status is None or status < 400:
        return None
    return Failure(
        leg=PROXY,
        type=str(status),
        message=f"the proxy answered HTTP {status}",
        span=root.name,
        service=root.resource.service,
        at_ms=end_ms(root),
    )


def request_failed(ix: TraceIndex) -> bool:
    """Whether the client did not get a whole answer: the proxy failed its root, answered
    an error status, or relayed an error in D's stream. Without the proxy's root, any
    failed span counts. (A request answered despite a failed span is "recovered".)"""
    root = ix.root
    if root is None:
        return any(s.status_code == STATUS_ERROR for s in ix.spans)
    if root.status_code == STATUS_ERROR or (_http_status(root) or 0) >= 400:
        return True
    return any(
        s.status_code == STATUS_ERROR and not s.status_message.startswith(CANCELLED_PREFIX)
        for s in ix.all(sc.SPAN_PROXY_DECODE)
    )


# ----------------------------------------------------------------------- the run


class Outcome(Protocol):
    """What `summarize` reads of a request (`results.RequestAnalysis`)."""

    request_id: str
    failure: Failure | None
    error: str | None
    complete: bool
    proxy_seen: bool
    problems: list[str]


@dataclass(slots=True)
class FailureSummary:
    """The run's account: every request is answered, failed, recovered or lost data."""

    requests: int = 0
    failed: list[Any] = field(default_factory=list)  # failed requests, in receipt order
    recovered: int = 0  # answered despite a failed span (e.g. P's answer after D's)
    incomplete: int = 0  # seen by the proxy, not failed, but the trace is incomplete
    missing_spans: dict[str, int] = field(default_factory=dict)  # among those
    no_proxy_span: int = 0  # traces without the proxy's root (not proxied, or lost)

    @property
    def total(self) -> int:
        return len(self.failed)

    def by_leg(self) -> dict[str, int]:
        counts = Counter(r.failure.leg for r in self.failed)
        order = [*LEGS, *sorted(set(counts) - set(LEGS))]
        return {leg: counts[leg] for leg in order if counts[leg]}

    def by_type(self) -> dict[str, int]:
        return dict(Counter(r.failure.type for r in self.failed).most_common())

    def by_leg_and_type(self) -> list[tuple[str, str, int]]:
        """(leg, type, requests), legs in `LEGS` order, most frequent type first."""
        counts = Counter((r.failure.leg, r.failure.type) for r in self.failed)
        rank = {leg: i for i, leg in enumerate(LEGS)}
        return sorted(
            ((leg, kind, n) for (leg, kind), n in counts.items()),
            key=lambda t: (rank.get(t[0], len(rank)), -t[2], t[1]),
        )

    def examples(self, n: int = 5) -> list[Any]:
        """Up to `n` failed requests: the first of each (leg, type), most frequent first,
        then the next ones in receipt order."""
        firsts: dict[tuple[str, str], Any] = {}
        for r in self.failed:
            firsts.setdefault((r.failure.leg, r.failure.type), r)
        picked = [firsts[(leg, kind)] for leg, kind, _ in self.by_leg_and_type()][:n]
        chosen = {id(r) for r in picked}
        picked += [r for r in self.failed if id(r) not in chosen][: n - len(picked)]
        return picked

    def __bool__(self) -> bool:
        return bool(self.failed or self.recovered or self.incomplete or self.no_proxy_span)

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_leg": self.by_leg(),
            "by_type": self.by_type(),
            "recovered": self.recovered,
            "incomplete": self.incomplete,
            "missing_spans": dict(self.missing_spans),
            "no_proxy_span": self.no_proxy_span,
        }


def _missing_spans(problems: Iterable[str]) -> list[str]:
    """The span names of `analyze`'s "missing span <name>" problems."""
    return [p.removeprefix(MISSING_SPAN) for p in problems if p.startswith(MISSING_SPAN)]


def summarize(requests: Iterable[Outcome]) -> FailureSummary:
    """Count failed, recovered and incomplete requests (`RunAnalysis.failures`)."""
    out = FailureSummary()
    missing: Counter[str] = Counter()
    for r in requests:
        out.requests += 1
        if r.failure is not None:
            out.failed.append(r)
            continue
        if r.error is not None:
            out.recovered += 1
        if not r.proxy_seen:
            out.no_proxy_span += 1
        elif not r.complete:
            out.incomplete += 1
            missing.update(_missing_spans(r.problems))
    out.missing_spans = dict(missing.most_common())
    return out
