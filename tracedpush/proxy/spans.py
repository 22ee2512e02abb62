"""The proxy's spans: the root of every request's trace, its two legs, pull's relay, a
wait for the model catalog.

All work here runs on the proxy's event loop and uses the OpenTelemetry SDK directly
(a few tens of microseconds per span, negligible next to an HTTP round trip). Names and
keys come from ``tracedpush.semconv``; docs/spans.md documents them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tracedpush import __version__, semconv
from tracedpush.proxy.loop_cpu import CpuSample, spent_ms
from tracedpush.proxy.routing import Instance
from tracedpush.proxy.sampling import SamplerInfo, describe
from tracedpush.proxy.upstream import SendClock

_PROPAGATOR = TraceContextTextMapPropagator()
# the event loop's figures since a request's receipt (`loop_cpu.spent_ms`'s order)
_LOOP_KEYS = (semconv.LOOP_ON_CPU_MS, semconv.LOOP_CPU_WAIT_MS)


class ProxySpans:
    """Starts the proxy's spans on one tracer; knows the W3C propagation format.

    Sampling is the tracer provider's sampler (the SDK's, from `OTEL_TRACES_SAMPLER`): an
    unsampled request gets non-recording spans, which cost nothing to end and are never
    exported, and its legs' ``traceparent`` carries the sampled bit off (flags 00, or 02
    with W3C's random-trace-id bit, which the SDK sets) to the engines.
    """

    def __init__(self, provider: TracerProvider | None, mode: str) -> None:
        provider = provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer(semconv.INSTRUMENTATION_SCOPE, __version__)
        self.mode = mode
        sampler = getattr(provider, "sampler", None)  # an SDK TracerProvider's
        self.sampling: SamplerInfo | None = describe(sampler) if sampler is not None else None

    def start_request(
        self, headers: Mapping[str, str], *, method: str, route: str, start_ns: int
    ) -> Span:
        """Root SERVER span; continues the client's ``traceparent`` when it sent one."""
        parent = _PROPAGATOR.extract(headers)
        attributes: dict[str, Any] = {
            semconv.MODE: self.mode,
            semconv.ROLE: "proxy",
            semconv.HTTP_METHOD: method,
            semconv.HTTP_ROUTE: route,
        }
        info = self.sampling
        if info is not None:
            attributes[semconv.SAMPLER] = info.name
            # Under a parent-based sampler a client's traceparent decides, at the client's
            # rate, which the proxy cannot know: then no ratio.
            client_decided = (
                info.parent_based and trace.get_current_span(parent).get_span_context().is_valid
            )
            if info.ratio is not None and not client_decided:
                attributes[semconv.SAMPLER_RATIO] = info.ratio
        return self.tracer.start_span(
            semconv.SPAN_REQUEST,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes=attributes,
        )

    def start_leg(
        self, root: Span, name: str, instance: Instance, start_ns: int | None = None
    ) -> Span:
        """A CLIENT span for one engine call (``proxy.prefill`` / ``proxy.decode``)."""
        attributes: dict[str, Any] = {
            semconv.MODE: self.mode,
            semconv.ROLE: "proxy",
            semconv.UPSTREAM_URL: instance.url,
            semconv.SERVER_ADDRESS: instance.host,
            semconv.SERVER_PORT: instance.port,
        }
        if instance.engine_id:
            attributes[semconv.ENGINE_ID] = instance.engine_id
        return self.tracer.start_span(
            name,
            context=trace.set_span_in_context(root),
            kind=SpanKind.CLIENT,
            start_time=start_ns,
            attributes=attributes,
        )

    def start_relay(
        self, root: Span, start_ns: int, loop: Mapping[str, float] | None = None
    ) -> Span:
        """Pull only: P's answer in hand -> D's request sent. ``loop``: the event loop's
        figures from the request's receipt to P's answer (`loop_attributes`), so that D's
        ``request_sent`` figures, also since receipt, give the relay's own."""
        attributes = {semconv.MODE: self.mode, semconv.ROLE: "proxy", **(loop or {})}
        return self.tracer.start_span(
            semconv.SPAN_KV_RELAY,
            context=trace.set_span_in_context(root),
            kind=SpanKind.INTERNAL,
            start_time=start_ns,
            attributes=attributes,
        )

    def model_lookup(self, root: Span, start_ns: int, fetched: bool, answered: bool) -> None:
        """``proxy.models``, ended now: the request waited for the model catalog (the
        engines' /v1/models, or the model's vocabulary read from its directory)."""
        span = self.tracer.start_span(
            semconv.SPAN_PROXY_MODELS,
            context=trace.set_span_in_context(root),
            kind=SpanKind.INTERNAL,
            start_time=start_ns,
            attributes={
                semconv.MODE: self.mode,
                semconv.ROLE: "proxy",
                semconv.MODELS_FETCHED: fetched,
                semconv.MODELS_ANSWERED: answered,
            },
        )
        span.end()


def trace_headers(span: Span) -> dict[str, str]:
    """W3C headers (``traceparent``, maybe ``tracestate``) naming ``span`` as parent."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def kv_trace_context(span: Span) -> dict[str, str] | None:
    """The value for ``kv_transfer_params[KV_PARAMS_TRACE_KEY]``; None when not traced.

    An unsampled request's still goes: its sampled bit, off, tells the traced connectors to build
    no spans for it."""
    carrier = trace_headers(span)
    if "traceparent" not in carrier:
        return None
    return {"traceparent": carrier["traceparent"]}


def fail(span: Span, error_type: str, description: str) -> None:
    """Mark a (still open) span failed; the first failure recorded wins."""
    if span.is_recording() and not _failed(span):
        span.set_status(Status(StatusCode.ERROR, description))
        span.set_attribute(semconv.ERROR_TYPE, error_type)


def _failed(span: Span) -> bool:
    attributes = getattr(span, "attributes", None) or {}
    return semconv.ERROR_TYPE in attributes


def loop_attributes(loop: tuple[float, float] | None) -> dict[str, float]:
    """The event loop's figures since a request's receipt (`loop_cpu.spent_ms`) as span or
    event attributes; none without them."""
    return {} if loop is None else dict(zip(_LOOP_KEYS, loop, strict=True))


def sent(span: Span, clock: SendClock, receipt_cpu: CpuSample | None = None) -> None:
    """Record the leg's ``request_sent`` event once: its bytes left for the engine, with
    how the event loop spent the time since the request's receipt (``receipt_cpu``); and
    ``request_resent`` when the engine closed that connection unanswered and they left
    again on a new one."""
    ns, clock.ns = clock.ns, None
    again, clock.resent_ns = clock.resent_ns, None
    if ns is not None and span.is_recording():
        sent_attrs = loop_attributes(spent_ms(receipt_cpu, clock.cpu))
        span.add_event(semconv.EVENT_REQUEST_SENT, sent_attrs, timestamp=ns)
        if again is not None:
            attrs = {semconv.RESENT_REASON: clock.reset}
            span.add_event(semconv.EVENT_REQUEST_RESENT, attrs, timestamp=again)


def end(span: Span, end_ns: int | None = None) -> None:
    """End ``span`` unless it already ended (several exit paths end a leg)."""
    if span.is_recording():
        span.end(end_time=end_ns)
