"""The critical path of one request, walked backwards on the causal graph.

Jaeger's heuristic (descend into the child that finishes last) is wrong when siblings
overlap, which is exactly push mode: D's registration runs during P's prefill. Instead
we start at the first token and repeatedly ask "what was this waiting for?". Every node
is a span boundary or a span event, and every segment names one mechanism
(`tracedpush.analysis.phases`):

push: first token <- decode end <- kv.notify end <- kv.notify start <- WRITE landed
      (kv.write start + NIXL xferDuration) <- kv.write start <- kv.desc_prep <-
      kv.rendezvous end (writer starts it) <- handed_to_writer (writer queue) <-
      max(prefill_finished, registration_arrived) (step handoff) <- whichever input came
      second: P's leg (prefill compute <- compute_started, queue wait <-
      scheduler_received, engine busy <- core_received, engine input <- vllm_arrival,
      api server <- http_received, network <- proxy.prefill request_sent),
      or D's (registration delivery <- kv.register end, registration <- blocks_allocated,
      queue wait <- scheduler_received, engine busy <- core_received, engine input <-
      vllm_arrival, api server <- http_received, network <- proxy.decode request_sent)
      <- receipt (proxy, and proxy CPU wait: the proxy's event loop runnable without a
      CPU, from the first leg's request_sent event, drawn just before the send). A
      rendezvous that ended without D's registration and no WRITE (P gave up on it):
      kv.notify start <- D's chain from its registration on; P's writer never had the
      request.
pull: first token <- decode end <- kv.read end (minus its polling lag) <- kv.read start
      <- kv.desc_prep <- blocks_allocated (step handoff) <- D's queue wait, engine
      busy, engine input, api server, network <- proxy.decode request_sent <- relay
      (kv.relay start; proxy CPU wait just before the send: D's request_sent wait less
      kv.relay's) <- proxy.prefill end (response) <- prefill end <- P's prefill compute,
      queue wait, engine busy, engine input, api server, network <- proxy.prefill
      request_sent <- receipt (proxy, and proxy CPU wait as in push).
Both: "first token" is the root's first_token (out to the client) <- proxy.decode's
      (D's token in): proxy, and proxy CPU wait (the root event's wait less D's).

Each step cuts a segment [its node, the cursor]; nodes later than the cursor are
clamped to it (and reported when the excess is more than clock noise), so segments are
consecutive, non-negative and sum exactly to the TTFT. A missing span merges its
neighbours into an "unattributed" gap and marks the request incomplete; a missing event
does the same (or falls back, e.g. to the span start without ``http_received``) and is
reported, without making the trace incomplete. NIXL handshakes are carved out of
whatever gap they sit in. Spans that overlap the TTFT window without being on the path
are reported as hidden, and so is P's registration wait (engine-local, it overlaps D's
chain). `engine_phases` measures every phase on each engine's own clock, on the path or
not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tracedpush import semconv as sc
from tracedpush.analysis import phases as ph
from tracedpush.analysis.model import Segment, Span
from tracedpush.analysis.timeline import DECODE, PREFILL, PROXY, TraceIndex, role_of

Num = TypeVar("Num", int, float)

Ms = Callable[[Span, int], float]  # raw span time (ns) -> corrected ms from receipt

CLAMP_NOISE_MS = 0.5  # ordering violations below this are clock noise, not news

_CARVABLE = frozenset(
    {
        ph.STEP_HANDOFF,
        ph.WRITER_QUEUE,
        ph.DESC_PREP,
        ph.QUEUE_WAIT,
        ph.REGISTRATION,
        ph.REGISTRATION_DELIVERY,
        ph.UNATTRIBUTED,
    }
)
# Spans that can stand for a hidden phase (`phases.SPAN_PHASE`): not decode, which is
# always on the path (its end is the first token being scheduled), nor the proxy's
# request and leg spans, which enclose the whole TTFT window.
_NEVER_HIDDEN = frozenset(
    {sc.SPAN_DECODE, sc.SPAN_REQUEST, sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE}
)
_HIDDEN_CANDIDATES = tuple(n for n in ph.SPAN_PHASE if n not in _NEVER_HIDDEN)


@dataclass(slots=True)
class Step:
    """Segment `phase` runs from `node` (ms) to the cursor; `owner` is the span it is in."""

    phase: str
    service: str
    node: float | None  # None: the span (or event) giving this node is missing
    owner: Span | None = None
    optional: bool = False  # a refinement (e.g. polling lag): silently skipped if None
    need: str = ""  # the span name whose absence makes node None ("" for an event)


@dataclass(slots=True)
class PathResult:
    segments: list[Segment]
    hidden: list[Segment]
    on_path: set[str]  # span ids owning a critical segment
    problems: list[str]
    end_ms: float
    rendezvous_first: str | None = None
    missing: tuple[str, ...] = ()
    first_token: bool = False  # the path ends at a first token (else at decode's end)


class _Ctx:
    """Corrected times of one trace's spans (ms from receipt)."""

    def __init__(self, ix: TraceIndex, ms: Ms) -> None:
        self.ix = ix
        self.ms = ms

    def start(self, s: Span | None) -> float | None:
        return None if s is None else self.ms(s, s.start_ns)

    def end(self, s: Span | None) -> float | None:
        return None if s is None else self.ms(s, s.end_ns)

    def event(self, s: Span | None, name: str) -> float | None:
        if s is None:
            return None
        t = s.event_ns(name)
        return None if t is None else self.ms(s, t)


def _svc(span: Span | None, default: str) -> str:
    return span.resource.service if span is not None else default


def _num(span: Span | None, key: str) -> float | None:
    if span is None:
        return None
    v = span.attributes.get(key)
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def landed_ns(write: Span) -> int:
    """When a WRITE's data landed, on P's clock: its post plus NIXL's xferDuration (else
    its observed end minus the polling lag, else its end)."""
    xfer = _num(write, sc.NIXL_XFER_US)
    if xfer is not None:
        return write.start_ns + round(xfer * 1000)
    lag = _num(write, sc.POLL_LAG_US)
    return write.end_ns - round(lag * 1000) if lag is not None else write.end_ns


def last_write(ix: TraceIndex) -> Span | None:
    """P's kv.write whose data landed last. With several P ranks, each WRITEs its share
    and D counts one notification from each: D waited for the last to land, whichever
    rank P's polling happened to see finish last (`TraceIndex.one` would take that)."""
    return max(ix.on_side(sc.SPAN_KV_WRITE, PREFILL), key=landed_ns, default=None)


def _worker(s: Span) -> tuple[str, str]:
    return s.resource.instance, str(s.attributes.get(sc.TP_RANK, 0))


def same_worker(ix: TraceIndex, name: str, role: str, like: Span | None) -> Span | None:
    """The `name` span (on `role`'s side) of the worker (instance, TP rank) that emitted
    `like`: the phases before a rank's WRITE are that rank's; `ix.one` when none."""
    if like is not None:
        mine = [s for s in ix.on_side(name, role) if _worker(s) == _worker(like)]
        if mine:
            return max(mine, key=lambda s: s.end_ns)
    return ix.one(name, role)


def _latest(*ts: float | None) -> float | None:
    known = [t for t in ts if t is not None]
    return max(known) if known else None


def _no_event(span: Span, event: str, consequence: str) -> str:
    return f"no {event} event on {span.name}: {consequence}"


def _need(span: Span | None, name: str) -> str:
    """The span a node needs, for `Step.need`: "" when the span is there (a missing event
    is reported by the caller and does not make the trace incomplete)."""
    return name if span is None else ""


def _leg(
    c: _Ctx,
    span: Span | None,
    name: str,
    svc: str,
    proxy_leg: Span | None,
    fallback: float | None,
    sent_need: str,
) -> tuple[list[Step], list[str]]:
    """An engine leg from scheduler_received back to the proxy sending it: queue wait
    (node scheduler_received), engine busy (core_received, when it lies between), engine
    input (vllm_arrival, when it lies between), api server (http_received), network (the
    proxy leg's request_sent; without it, `fallback`: the leg's start). The caller's
    previous step ends the queue wait (compute_started, blocks_allocated). A leg sent
    again after the engine closed its kept-alive connection unanswered
    (``request_resent``): network from the second send, and the time before it, back to
    the first, is the engine's api server, which did not read the request before it
    closed the connection."""
    problems: list[str] = []
    sent = c.event(proxy_leg, sc.EVENT_REQUEST_SENT)
    if sent is None:
        sent = fallback
        if proxy_leg is not None:
            problems.append(
                _no_event(proxy_leg, sc.EVENT_REQUEST_SENT, "network includes the proxy's work")
            )
    sched = c.event(span, sc.EVENT_SCHEDULER_RECEIVED)
    http = c.event(span, sc.EVENT_HTTP_RECEIVED)
    steps: list[Step] = []
    if span is not None and http is None:
        http = c.start(span)
        problems.append(_no_event(span, sc.EVENT_HTTP_RECEIVED, "network includes API-server work"))
    if span is not None and sched is None:
        problems.append(
            _no_event(span, sc.EVENT_SCHEDULER_RECEIVED, "API-server time counted in queue wait")
        )
        steps.append(Step(ph.QUEUE_WAIT, svc, http, span, need=name))
    else:
        steps.append(Step(ph.QUEUE_WAIT, svc, sched, span, need=name))
        arrival = _arrival(c, span, http, sched)
        core = _core(c, span, http if arrival is None else arrival, sched)
        steps.append(Step(ph.ENGINE_BUSY, svc, core, span, optional=True))
        steps.append(Step(ph.ENGINE_INPUT, svc, arrival, span, optional=True))
        steps.append(Step(ph.API_SERVER, svc, http, span, need=name))
    again = c.event(proxy_leg, sc.EVENT_REQUEST_RESENT)
    if again is not None:  # the engine closed the kept-alive connection unanswered: its API
        steps.append(Step(ph.NETWORK, svc, again, None))  # server had not read it (starved)
        steps.append(Step(ph.API_SERVER, svc, sent, None, need=sent_need))
    else:
        steps.append(Step(ph.NETWORK, svc, sent, None, need=sent_need))
    return steps, problems


def _arrival(c: _Ctx, span: Span | None, http: float | None, sched: float | None) -> float | None:
    """vLLM's arrival_time (the span's vllm_arrival event) when it splits api server from
    engine input: between http_received and scheduler_received (one engine's clock)."""
    return _between(http, c.event(span, sc.EVENT_VLLM_ARRIVAL), sched)


def _core(c: _Ctx, span: Span | None, after: float | None, sched: float | None) -> float | None:
    """When the EngineCore's input thread had the request (core_received), when it splits
    engine input (or api server) from engine busy: between `after` and scheduler_received."""
    return _between(after, c.event(span, sc.EVENT_CORE_RECEIVED), sched)


def _between(a: Num | None, x: Num | None, b: Num | None) -> Num | None:
    """``x`` when it lies within [a, b], all three known; else None."""
    return x if a is not None and x is not None and b is not None and a <= x <= b else None


def _push_steps(c: _Ctx, end_from_root: bool) -> tuple[list[Step], str | None, list[str]]:
    ix = c.ix
    root, pd, pp = (
        ix.root,
        ix.one(sc.SPAN_PROXY_DECODE, PROXY),
        ix.one(sc.SPAN_PROXY_PREFILL, PROXY),
    )
    dec, pre = ix.one(sc.SPAN_DECODE, DECODE), ix.one(sc.SPAN_PREFILL, PREFILL)
    notify = ix.one(sc.SPAN_KV_NOTIFY, DECODE)
    write = last_write(ix)
    prep = same_worker(ix, sc.SPAN_KV_DESC_PREP, PREFILL, write)
    rdv = same_worker(ix, sc.SPAN_KV_RENDEZVOUS, PREFILL, write)
    reg = ix.one(sc.SPAN_KV_REGISTER, DECODE)
    s_p, s_d, s_x = (
        _svc(pre, sc.SERVICE_PREFILL),
        _svc(dec, sc.SERVICE_DECODE),
        _svc(root, sc.SERVICE_PROXY),
    )
    problems: list[str] = []

    landed = None if write is None else c.ms(write, landed_ns(write))
    # D counted from the last notification it needed (from the rank that landed last;
    # with one P rank the only one, the span's start)
    heard = c.start(notify)
    if notify is not None:
        last = max((e.time_ns for e in notify.events if e.name == sc.EVENT_NOTIFICATION), default=0)
        if last > notify.start_ns:
            heard = c.ms(notify, last)

    first = rdv.attributes.get(sc.RENDEZVOUS_FIRST) if rdv is not None else None
    if first not in ("registration", "prefill"):
        # No attribute: the input that came second is the one that finished last.
        pe, re_ = c.end(pre), c.end(reg)
        if pe is not None and re_ is not None:
            first = "registration" if re_ <= pe else "prefill"
        elif pe is not None:
            first = "registration"
        elif re_ is not None:
            first = "prefill"
        if first is not None and rdv is not None:
            problems.append(f"{sc.SPAN_KV_RENDEZVOUS} has no {sc.RENDEZVOUS_FIRST}; inferred")

    # F: P's scheduler finished the request; R: P's writer drained D's registration;
    # H: P's worker handed the blocks to the writer; W: the writer started the request.
    f_ = c.event(rdv, sc.EVENT_PREFILL_FINISHED)
    if f_ is None:
        f_ = c.end(pre)
    r_ = c.event(rdv, sc.EVENT_REGISTRATION_ARRIVED)
    if r_ is None and rdv is not None and first == "registration":
        r_ = c.start(rdv)  # it came first: it opened the rendezvous
    h_ = c.event(rdv, sc.EVENT_HANDED_TO_WRITER)
    if rdv is not None and h_ is None:
        problems.append(
            _no_event(
                rdv, sc.EVENT_HANDED_TO_WRITER, "step handoff and writer queue are unattributed"
            )
        )
    ready = _latest(f_, r_)
    steps: list[Step] = []
    if end_from_root:
        steps += _token_out(c, s_x, pd)
    steps += [
        Step(ph.FIRST_DECODE_STEP, s_d, c.end(dec), dec, need=sc.SPAN_DECODE),
        Step(ph.DECODE_SCHEDULING, s_d, c.end(notify), dec, need=sc.SPAN_KV_NOTIFY),
        Step(ph.NOTIFY_COUNTING, s_d, heard, notify, need=sc.SPAN_KV_NOTIFY),
    ]
    unmatched = _unmatched(rdv, r_, write)
    if unmatched:
        # P gave up waiting before D's registration reached it (lease expired, or it
        # timed out): P's writer never had the request, so nothing of P's side is what
        # the request waited on. D waited for KV from its registration on, and the
        # registration went when D's own chain let it: that chain is the path.
        problems.append(
            f"{sc.SPAN_KV_RENDEZVOUS} ended without D's registration: the path goes "
            "through D's side"
        )
    else:
        steps += [
            Step(ph.NOTIFICATION, s_d, landed, None, need=sc.SPAN_KV_WRITE),
            Step(ph.WRITE, s_p, c.start(write), write, need=sc.SPAN_KV_WRITE),
            Step(ph.DESC_PREP, s_p, c.end(prep), prep, need=sc.SPAN_KV_DESC_PREP),
            Step(ph.DESC_PREP, s_p, c.start(prep), prep, need=sc.SPAN_KV_DESC_PREP),
            # the writer started it -> descriptor prep (a first-contact handshake sits here)
            Step(ph.DESC_PREP, s_p, c.end(rdv), rdv, need=sc.SPAN_KV_RENDEZVOUS),
            Step(ph.WRITER_QUEUE, s_p, None if h_ is None else _latest(h_, ready), rdv),
            Step(ph.STEP_HANDOFF, s_p, ready, rdv, need=sc.SPAN_KV_RENDEZVOUS),
        ]
        if first == "prefill":  # D's registration reached P's writer after it was sent
            steps.append(
                Step(ph.REGISTRATION_DELIVERY, s_d, c.end(reg), None, need=sc.SPAN_KV_REGISTER)
            )
    if first == "prefill" or unmatched:  # the registration came second: D's side
        steps += [
            Step(ph.REGISTRATION, s_d, c.start(reg), reg, need=sc.SPAN_KV_REGISTER),
            Step(ph.REGISTRATION, s_d, c.event(dec, sc.EVENT_BLOCKS_ALLOCATED), reg, optional=True),
        ]
        first_leg = pd
        leg, more = _leg(c, dec, sc.SPAN_DECODE, s_d, pd, c.start(pd), sc.SPAN_PROXY_DECODE)
    else:  # prefill finished second (or unknown): P's side is on the path
        compute = c.event(pre, sc.EVENT_COMPUTE_STARTED)
        if pre is not None and compute is None:
            problems.append(
                _no_event(pre, sc.EVENT_COMPUTE_STARTED, "queue wait and compute are unattributed")
            )
        steps.append(Step(ph.PREFILL_COMPUTE, s_p, compute, pre, need=_need(pre, sc.SPAN_PREFILL)))
        first_leg = pp
        leg, more = _leg(c, pre, sc.SPAN_PREFILL, s_p, pp, c.start(pp), sc.SPAN_PROXY_PREFILL)
    steps += [*leg, *_receipt(c, s_x, first_leg)]
    return steps, first, problems + more


def _receipt(c: _Ctx, s_x: str, leg: Span | None) -> list[Step]:
    """Receipt -> the first leg's bytes out (``leg``'s request_sent): the proxy's own work,
    the time its event loop waited for a CPU meanwhile, and a wait for its model catalog
    when the request had one (``proxy.models``).

    The CPU wait is interleaved with the work; it is drawn as one block just before the
    send, at most the whole interval after the catalog wait."""
    root, models = c.ix.root, c.ix.one(sc.SPAN_PROXY_MODELS, PROXY)
    floor = max(c.end(models) or 0.0, 0.0)
    return [
        *_cpu_wait(c, s_x, leg, sc.EVENT_REQUEST_SENT, 0.0, floor, root),
        Step(ph.PROXY, s_x, c.end(models), root, optional=True),
        Step(ph.MODEL_LOOKUP, s_x, c.start(models), models, optional=True),
        Step(ph.PROXY, s_x, 0.0, root),
    ]


def _cpu_wait(
    c: _Ctx,
    s_x: str,
    span: Span | None,
    event: str,
    before: float | None,
    floor: float | None,
    owner: Span | None,
) -> list[Step]:
    """`proxy CPU wait` before ``span``'s ``event`` (a leg's bytes out, the first token
    out): the event's wait since receipt less ``before`` (the wait since receipt at the
    interval's start), drawn as one block just before the event, never earlier than
    ``floor``. Nothing without both figures, or when the wait did not grow."""
    ev = None if span is None else span.event(event)
    since = None if ev is None else _loop_cpu_wait(ev.attributes)
    if span is None or ev is None or since is None or before is None or floor is None:
        return []
    if since - before <= 0:
        return []
    node = max(c.ms(span, ev.time_ns) - (since - before), floor)
    return [Step(ph.PROXY_CPU_WAIT, s_x, node, owner)]


def _token_out(c: _Ctx, s_x: str, pd: Span | None) -> list[Step]:
    """D's first token at the proxy (proxy.decode first_token) -> out to the client (the
    root's): `proxy`, less the loop's wait for a CPU between the two events' figures."""
    root = c.ix.root
    got = None if pd is None else pd.event(sc.EVENT_FIRST_TOKEN)
    before = None if got is None else _loop_cpu_wait(got.attributes)
    into = None if pd is None or got is None else c.ms(pd, got.time_ns)
    return [
        *_cpu_wait(c, s_x, root, sc.EVENT_FIRST_TOKEN, before, into, root),
        Step(ph.PROXY, s_x, into, root, need=sc.SPAN_PROXY_DECODE),
    ]


def _loop_cpu_wait(attributes: Mapping[str, Any]) -> float | None:
    """ms the proxy's event loop waited for a CPU since the request's receipt (the
    attribute of a request_sent or first_token event, or of kv.relay; None without a
    usable one)."""
    value = attributes.get(sc.LOOP_CPU_WAIT_MS)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


_GAVE_UP = frozenset({sc.ERR_LEASE_EXPIRED, sc.ERR_REGISTRATION_TIMEOUT})


def _unmatched(rdv: Span | None, registration_in: float | None, write: Span | None) -> bool:
    """P's rendezvous failed for want of D's registration (lease expired, or the wait
    timed out: no `registration_arrived`) and no WRITE followed. Only that failure says
    P gave up; a trace that merely lost spans or events is left to the usual rules."""
    return (
        rdv is not None
        and registration_in is None
        and write is None
        and rdv.attributes.get(sc.ERROR_TYPE) in _GAVE_UP
    )


def _pull_steps(c: _Ctx, end_from_root: bool) -> tuple[list[Step], str | None, list[str]]:
    ix = c.ix
    root, pd, pp = (
        ix.root,
        ix.one(sc.SPAN_PROXY_DECODE, PROXY),
        ix.one(sc.SPAN_PROXY_PREFILL, PROXY),
    )
    relay = ix.one(sc.SPAN_KV_RELAY, PROXY)
    dec, pre = ix.one(sc.SPAN_DECODE, DECODE), ix.one(sc.SPAN_PREFILL, PREFILL)
    read = ix.one(sc.SPAN_KV_READ, DECODE)
    prep = ix.one(sc.SPAN_KV_DESC_PREP, DECODE)
    s_p, s_d, s_x = (
        _svc(pre, sc.SERVICE_PREFILL),
        _svc(dec, sc.SERVICE_DECODE),
        _svc(root, sc.SERVICE_PROXY),
    )
    problems: list[str] = []
    lag = _num(read, sc.POLL_LAG_US)
    read_done = None if read is None or lag is None else c.end(read) - lag / 1000.0
    alloc = c.event(dec, sc.EVENT_BLOCKS_ALLOCATED)
    if dec is not None and alloc is None:
        problems.append(
            _no_event(dec, sc.EVENT_BLOCKS_ALLOCATED, "queue wait, step handoff unattributed")
        )
    compute = c.event(pre, sc.EVENT_COMPUTE_STARTED)
    if pre is not None and compute is None:
        problems.append(
            _no_event(pre, sc.EVENT_COMPUTE_STARTED, "queue wait and compute are unattributed")
        )
    steps: list[Step] = []
    if end_from_root:
        steps += _token_out(c, s_x, pd)
    steps += [
        Step(ph.FIRST_DECODE_STEP, s_d, c.end(dec), dec, need=sc.SPAN_DECODE),
        Step(ph.DECODE_SCHEDULING, s_d, c.end(read), dec, need=sc.SPAN_KV_READ),
        Step(ph.POLL_LAG, s_d, read_done, read, optional=True),
        Step(ph.READ, s_d, c.start(read), read, need=sc.SPAN_KV_READ),
        Step(ph.DESC_PREP, s_d, c.end(prep), prep, need=sc.SPAN_KV_DESC_PREP),
        Step(ph.DESC_PREP, s_d, c.start(prep), prep, need=sc.SPAN_KV_DESC_PREP),
        Step(ph.STEP_HANDOFF, s_d, alloc, dec, need=_need(dec, sc.SPAN_DECODE)),
    ]
    if relay is not None:
        d_leg, more = _leg(c, dec, sc.SPAN_DECODE, s_d, pd, c.end(relay), "")
        start = c.start(relay)  # P's answer: the wait since then is the relay's
        before = _loop_cpu_wait(relay.attributes)
        waited = _cpu_wait(c, s_x, pd, sc.EVENT_REQUEST_SENT, before, start, relay)
        steps += [*d_leg, *waited, Step(ph.RELAY, s_x, start, relay)]
    else:
        d_leg, more = _leg(c, dec, sc.SPAN_DECODE, s_d, pd, c.start(pd), sc.SPAN_KV_RELAY)
        steps += d_leg
    p_leg, more2 = _leg(c, pre, sc.SPAN_PREFILL, s_p, pp, c.start(pp), sc.SPAN_PROXY_PREFILL)
    steps += [
        Step(ph.PROXY, s_x, c.end(pp), root, need=sc.SPAN_PROXY_PREFILL),
        Step(ph.RESPONSE, s_p, c.end(pre), None, need=sc.SPAN_PREFILL),
        Step(ph.PREFILL_COMPUTE, s_p, compute, pre, need=_need(pre, sc.SPAN_PREFILL)),
        *p_leg,
        *_receipt(c, s_x, pp),
    ]
    return steps, None, problems + more + more2


def walk(steps: list[Step], end_ms: float) -> tuple[list[Segment], set[str], list[str], list[str]]:
    """Cut [0, end_ms] along `steps` (latest first). Returns chronological segments,
    the ids of spans owning them, missing span names, and ordering problems."""
    cursor = end_ms
    out: list[Segment] = []
    owners: set[str] = set()
    missing: list[str] = []
    problems: list[str] = []
    merged: list[Step] = []  # steps whose node was missing, waiting for the next node
    clamped: list[tuple[float, str]] = []  # (ms, phase) of nodes later than their successor
    for st in steps:
        if st.node is None:
            if st.optional:
                continue
            if st.need and st.need not in missing:
                missing.append(st.need)
            merged.append(st)
            continue
        t = st.node
        if t > cursor:
            if t - cursor > CLAMP_NOISE_MS:
                clamped.append((t - cursor, st.phase))
            t = cursor
        t = max(t, 0.0)
        phase, service, owner = st.phase, st.service, st.owner
        if merged:
            kinds = {m.phase for m in merged} | {st.phase}
            if len(kinds) > 1:
                phase, owner = ph.UNATTRIBUTED, None
            merged = []
        dur = cursor - t
        if dur > 0.0:
            span_name = owner.name if owner is not None else ""
            if out and out[-1].phase == phase and out[-1].service == service:
                prev = out[-1]
                prev.start_ms = t
                prev.duration_ms += dur
                prev.span = prev.span or span_name
            else:
                out.append(Segment(phase, service, t, dur, span_name))
        if owner is not None:
            owners.add(owner.span_id)
        cursor = t
    if clamped:
        worst, where = max(clamped)
        problems.append(
            f"clamped {len(clamped)} step(s) that start after what follows them (largest "
            f"{worst:.2f} ms, at {where}): clock skew not fully corrected, or spans out of order"
        )
    if cursor > 0.0:  # the chain ended before receipt (its first nodes were missing)
        out.append(Segment(ph.UNATTRIBUTED, "", 0.0, cursor, ""))
    out.reverse()
    return out, owners, missing, problems


def carve(segments: list[Segment], intervals: list[tuple[float, float, str, str]]) -> list[Segment]:
    """Split out (start, end, phase, service) intervals from carvable gap segments."""
    for s0, e0, phase, service in intervals:
        out: list[Segment] = []
        for seg in segments:
            a, b = seg.start_ms, seg.end_ms
            lo, hi = max(a, s0), min(b, e0)
            if seg.phase not in _CARVABLE or hi <= lo:
                out.append(seg)
                continue
            if lo > a:
                out.append(Segment(seg.phase, seg.service, a, lo - a, seg.span))
            out.append(Segment(phase, service, lo, hi - lo, sc.SPAN_KV_HANDSHAKE))
            if b > hi:
                out.append(Segment(seg.phase, seg.service, hi, b - hi, seg.span))
        segments = out
    return segments


def critical_path(ix: TraceIndex, ms: Ms) -> PathResult:
    """Cut one request's TTFT into phases; see the module docstring."""
    c = _Ctx(ix, ms)
    root = ix.root
    problems: list[str] = []
    ft = c.event(root, sc.EVENT_FIRST_TOKEN)
    end_from_root = ft is not None
    if ft is None and root is not None:
        attr = _num(root, sc.TTFT_MS)
        if attr is not None:
            ft, end_from_root = attr, True
    if ft is None:
        pd = ix.one(sc.SPAN_PROXY_DECODE, PROXY)
        ft = c.event(pd, sc.EVENT_FIRST_TOKEN)
        if ft is not None:
            problems.append(
                f"no {sc.EVENT_FIRST_TOKEN} on {sc.SPAN_REQUEST}; used {sc.SPAN_PROXY_DECODE}'s"
            )
    first_token = ft is not None
    if ft is None:
        dec = ix.one(sc.SPAN_DECODE, DECODE)
        ft = c.end(dec)
        if ft is not None:
            problems.append("no first token from the proxy; the path ends when decode scheduled it")
    if ft is None:
        return PathResult([], [], set(), [*problems, "no first token and no decode span"], 0.0)
    if ix.mode == "push":
        steps, first, more = _push_steps(c, end_from_root)
    elif ix.mode == "pull":
        steps, first, more = _pull_steps(c, end_from_root)
    else:
        steps, first, more = (
            [Step(ph.UNATTRIBUTED, "", 0.0, root)],
            None,
            [f"unknown mode {ix.mode!r}"],
        )
    problems += more
    if root is None:  # no proxy: the path starts at the first engine span, not receipt
        proxy = (ph.PROXY, ph.PROXY_CPU_WAIT, ph.MODEL_LOOKUP)
        steps = [s for s in steps if s.phase not in proxy and s.need not in sc.PROXY_SPANS]
    segments, owners, missing, order = walk(steps, ft)
    problems += order
    handshakes = [
        (c.start(h), c.end(h), ph.HANDSHAKE, h.resource.service)
        for h in ix.all(sc.SPAN_KV_HANDSHAKE)
    ]
    if handshakes:
        before = sum(s.duration_ms for s in segments if s.phase == ph.HANDSHAKE)
        segments = carve(segments, handshakes)
        if sum(s.duration_ms for s in segments if s.phase == ph.HANDSHAKE) > before:
            owners.update(h.span_id for h in ix.all(sc.SPAN_KV_HANDSHAKE))
    hidden = _hidden(c, owners, ft, first)
    return PathResult(segments, hidden, owners, problems, ft, first, tuple(missing), first_token)


def _clip(
    phase: str, service: str, a: float | None, b: float | None, end: float, span: str
) -> Segment | None:
    """A hidden segment [a, b] clipped to the TTFT window, or None when outside it."""
    if a is None or b is None:
        return None
    a, b = max(a, 0.0), min(b, end)
    if b > a or (b == a and 0.0 < a < end):  # instants inside the window count
        return Segment(phase, service, a, b - a, span)
    return None


def _engine_parts(c: _Ctx, s: Span) -> list[tuple[str, float | None, float | None]]:
    """A hidden `prefill` span as its phases: api server, engine input, engine busy,
    queue wait, prefill compute."""
    http = c.event(s, sc.EVENT_HTTP_RECEIVED) or c.start(s)
    sched = c.event(s, sc.EVENT_SCHEDULER_RECEIVED)
    compute = c.event(s, sc.EVENT_COMPUTE_STARTED)
    if compute is None:
        return [(ph.PREFILL_COMPUTE, c.start(s), c.end(s))]
    if sched is None:
        return [(ph.QUEUE_WAIT, http, compute), (ph.PREFILL_COMPUTE, compute, c.end(s))]
    arrival = _arrival(c, s, http, sched)
    core = _core(c, s, http if arrival is None else arrival, sched)
    taken = sched if core is None else core  # the EngineCore had it
    inputs = [] if arrival is None else [(ph.ENGINE_INPUT, arrival, taken)]
    busy = [] if core is None else [(ph.ENGINE_BUSY, core, sched)]
    return [
        (ph.API_SERVER, http, taken if arrival is None else arrival),
        *inputs,
        *busy,
        (ph.QUEUE_WAIT, sched, compute),
        (ph.PREFILL_COMPUTE, compute, c.end(s)),
    ]


def _hidden(c: _Ctx, owners: set[str], end: float, first: str | None) -> list[Segment]:
    """Engine and KV phases inside [0, end] that the first token did not wait for."""
    out: list[Segment] = []
    ix = c.ix
    for name in _HIDDEN_CANDIDATES:
        for s in ix.all(name):
            if s.span_id in owners:
                continue
            svc = s.resource.service
            parts = (
                _engine_parts(c, s)
                if name == sc.SPAN_PREFILL
                else [(ph.SPAN_PHASE[name], c.start(s), c.end(s))]
            )
            for phase, a, b in parts:
                seg = _clip(phase, svc, a, b, end, name)
                if seg is not None:
                    out.append(seg)
    if ix.mode == "push":
        write = last_write(ix)
        rdv = same_worker(ix, sc.SPAN_KV_RENDEZVOUS, PREFILL, write)
        f_ = c.event(rdv, sc.EVENT_PREFILL_FINISHED)
        r_ = c.event(rdv, sc.EVENT_REGISTRATION_ARRIVED)
        if rdv is not None and f_ is not None and r_ is not None and r_ > f_:
            # P was ready and waited for D's registration: it overlaps D's chain
            seg = _clip(
                ph.REGISTRATION_WAIT, rdv.resource.service, f_, r_, end, sc.SPAN_KV_RENDEZVOUS
            )
            if seg is not None:
                out.append(seg)
        # P only notices its WRITE finished at its next step
        lag = _num(write, sc.POLL_LAG_US)
        if write is not None and lag:
            b = min(c.end(write), end)
            a = max(c.end(write) - lag / 1000.0, 0.0)
            if b > a:
                out.append(Segment(ph.POLL_LAG, write.resource.service, a, b - a, sc.SPAN_KV_WRITE))
    out.sort(key=lambda s: s.start_ms)
    return out


# ------------------------------------------------------------------ engine-local phases

ENGINE_ROLES = (PREFILL, DECODE)


def _ev(span: Span | None, name: str) -> int | None:
    return None if span is None else span.event_ns(name)


def _gap_ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else max(b - a, 0) / 1e6


def _overlap_ms(spans: list[Span], a: int | None, b: int | None) -> float:
    if a is None or b is None:
        return 0.0
    return sum(max(min(s.end_ns, b) - max(s.start_ns, a), 0) for s in spans) / 1e6


def engine_phases(ix: TraceIndex) -> dict[str, dict[str, float]]:
    """Every phase each engine measured for this request, on or off the critical path:
    ``{"prefill": {phase: ms}, "decode": {phase: ms}}``. Each phase is bounded by two
    times from one engine (its scheduler and worker share a host clock), so no clock
    correction is involved. A phase whose bounding span or event is missing is left out.
    WRITE / READ are NIXL's xferDuration exactly (what vLLM's nixl_xfer_time observes),
    queue wait on P is vLLM's request_queue_time, prefill compute its request_prefill_time.
    """
    out: dict[str, dict[str, float]] = {PREFILL: {}, DECODE: {}}

    def put(role: str, phase: str, v: float | None) -> None:
        if v is not None:
            out[role][phase] = out[role].get(phase, 0.0) + v

    pre, dec = ix.one(sc.SPAN_PREFILL, PREFILL), ix.one(sc.SPAN_DECODE, DECODE)
    hs = {
        role: [s for s in ix.all(sc.SPAN_KV_HANDSHAKE) if role_of(s) == role]
        for role in ENGINE_ROLES
    }
    for role, span in ((PREFILL, pre), (DECODE, dec)):
        sched = _ev(span, sc.EVENT_SCHEDULER_RECEIVED)
        http = _ev(span, sc.EVENT_HTTP_RECEIVED)
        arrival = _between(http, _ev(span, sc.EVENT_VLLM_ARRIVAL), sched)
        after = http if arrival is None else arrival
        core = _between(after, _ev(span, sc.EVENT_CORE_RECEIVED), sched)
        taken = sched if core is None else core  # the EngineCore had it
        if arrival is not None:  # vLLM took it in: api server, then engine input
            put(role, ph.API_SERVER, _gap_ms(http, arrival))
            put(role, ph.ENGINE_INPUT, _gap_ms(arrival, taken))
        else:
            put(role, ph.API_SERVER, _gap_ms(http, taken))
        if core is not None:  # then the EngineCore's loop finished its step
            put(role, ph.ENGINE_BUSY, _gap_ms(core, sched))
        queue_end = sc.EVENT_COMPUTE_STARTED if role == PREFILL else sc.EVENT_BLOCKS_ALLOCATED
        put(role, ph.QUEUE_WAIT, _gap_ms(sched, _ev(span, queue_end)))
        for h in hs[role]:
            put(role, ph.HANDSHAKE, (h.end_ns - h.start_ns) / 1e6)
    if pre is not None:
        put(PREFILL, ph.PREFILL_COMPUTE, _gap_ms(_ev(pre, sc.EVENT_COMPUTE_STARTED), pre.end_ns))

    if ix.mode == "push":
        write = last_write(ix)  # the rank whose WRITE landed last, and its phases
        rdv = same_worker(ix, sc.SPAN_KV_RENDEZVOUS, PREFILL, write)
        prep = same_worker(ix, sc.SPAN_KV_DESC_PREP, PREFILL, write)
        reg = ix.one(sc.SPAN_KV_REGISTER, DECODE)
        notify = ix.one(sc.SPAN_KV_NOTIFY, DECODE)
        f_ = _ev(rdv, sc.EVENT_PREFILL_FINISHED)
        if f_ is None and pre is not None and rdv is not None:
            f_ = pre.end_ns
        r_ = _ev(rdv, sc.EVENT_REGISTRATION_ARRIVED)
        h_ = _ev(rdv, sc.EVENT_HANDED_TO_WRITER)
        if f_ is not None and r_ is not None:
            put(PREFILL, ph.REGISTRATION_WAIT, _gap_ms(f_, max(f_, r_)))
        ready = max((t for t in (f_, r_) if t is not None), default=None)
        if _unmatched(rdv, r_, write):  # P waited for a registration that never came
            put(PREFILL, ph.REGISTRATION_WAIT, _gap_ms(f_, rdv.end_ns if rdv else None))
        elif h_ is not None and ready is not None:
            put(PREFILL, ph.STEP_HANDOFF, _gap_ms(ready, max(ready, h_)))
            if rdv is not None:
                put(PREFILL, ph.WRITER_QUEUE, _gap_ms(max(ready, h_), rdv.end_ns))
        if write is not None:
            start = rdv.end_ns if rdv is not None else (prep.start_ns if prep else None)
            prep_ms = _gap_ms(start, write.start_ns)
            if prep_ms is not None:
                prep_ms -= _overlap_ms(hs[PREFILL], start, write.start_ns)
                put(PREFILL, ph.DESC_PREP, max(prep_ms, 0.0))
            xfer = _num(write, sc.NIXL_XFER_US)
            put(PREFILL, ph.WRITE, None if xfer is None else xfer / 1000.0)
            lag = _num(write, sc.POLL_LAG_US)
            put(PREFILL, ph.POLL_LAG, None if lag is None else lag / 1000.0)
        elif prep is not None:
            put(PREFILL, ph.DESC_PREP, (prep.end_ns - prep.start_ns) / 1e6)
        if reg is not None:
            put(DECODE, ph.REGISTRATION, (reg.end_ns - reg.start_ns) / 1e6)
        if notify is not None:
            put(DECODE, ph.NOTIFY_COUNTING, (notify.end_ns - notify.start_ns) / 1e6)
            if dec is not None:
                put(DECODE, ph.DECODE_SCHEDULING, _gap_ms(notify.end_ns, dec.end_ns))
    elif ix.mode == "pull":
        prep = ix.one(sc.SPAN_KV_DESC_PREP, DECODE)
        read = ix.one(sc.SPAN_KV_READ, DECODE)
        notify = ix.one(sc.SPAN_KV_NOTIFY, PREFILL)
        alloc = _ev(dec, sc.EVENT_BLOCKS_ALLOCATED)
        if prep is not None and alloc is not None:
            handoff = _gap_ms(alloc, prep.start_ns) or 0.0
            handoff -= _overlap_ms(hs[DECODE], alloc, prep.start_ns)
            put(DECODE, ph.STEP_HANDOFF, max(handoff, 0.0))
        if prep is not None:
            end = read.start_ns if read is not None else prep.end_ns
            put(DECODE, ph.DESC_PREP, _gap_ms(prep.start_ns, end))
        if read is not None:
            xfer = _num(read, sc.NIXL_XFER_US)
            put(DECODE, ph.READ, None if xfer is None else xfer / 1000.0)
            lag = _num(read, sc.POLL_LAG_US)
            put(DECODE, ph.POLL_LAG, None if lag is None else lag / 1000.0)
            if dec is not None:
                put(DECODE, ph.DECODE_SCHEDULING, _gap_ms(read.end_ns, dec.end_ns))
        if notify is not None:
            put(PREFILL, ph.NOTIFY_COUNTING, (notify.end_ns - notify.start_ns) / 1e6)
    return out
