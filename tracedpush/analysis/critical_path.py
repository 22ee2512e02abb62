"""The critical path of one request, walked backwards on the causal graph.

Jaeger's heuristic (descend into the child that finishes last) is wrong when siblings
overlap, which is exactly push mode: D's registration runs during P's prefill. Instead
we start at the first token and repeatedly ask "what was this waiting for?":

push: first token <- decode end <- kv.notify end <- kv.notify start <- WRITE landed
      (kv.write start + NIXL xferDuration) <- kv.write start <- kv.desc_prep <-
      kv.rendezvous end <- whichever input came second: prefill end (<- prefill <-
      proxy.prefill sent) or registration sent (<- kv.register <- decode arrival <-
      proxy.decode sent) <- receipt.
pull: first token <- decode end <- kv.read end (minus its polling lag) <- kv.read start
      <- kv.desc_prep <- decode arrival <- kv.relay <- proxy.prefill end <- prefill end
      <- prefill start <- proxy.prefill sent <- receipt.

Each step cuts a segment [its node, the cursor]; nodes later than the cursor are
clamped to it (and reported when the excess is more than clock noise), so segments are
consecutive, non-negative and sum exactly to the TTFT. A missing span merges its
neighbours into an "unattributed" gap and marks the request incomplete. NIXL handshakes
are carved out of whatever gap they sit in. Spans that overlap the TTFT window without
being on the path are reported as hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tracedpush import semconv as sc
from tracedpush.analysis import phases as ph
from tracedpush.analysis.model import Segment, Span
from tracedpush.analysis.timeline import DECODE, PREFILL, PROXY, TraceIndex

Ms = Callable[[Span, int], float]  # raw span time (ns) -> corrected ms from receipt

CLAMP_NOISE_MS = 0.5  # ordering violations below this are clock noise, not news

_CARVABLE = frozenset(
    {ph.RENDEZVOUS_WAIT, ph.DECODE_ADMISSION, ph.DESC_PREP, ph.REGISTRATION, ph.UNATTRIBUTED}
)
SPAN_PHASE = {
    sc.SPAN_PREFILL: ph.PREFILL,
    sc.SPAN_DECODE: ph.DECODE_ADMISSION,
    sc.SPAN_KV_REGISTER: ph.REGISTRATION,
    sc.SPAN_KV_RENDEZVOUS: ph.RENDEZVOUS_WAIT,
    sc.SPAN_KV_HANDSHAKE: ph.HANDSHAKE,
    sc.SPAN_KV_DESC_PREP: ph.DESC_PREP,
    sc.SPAN_KV_WRITE: ph.WRITE,
    sc.SPAN_KV_READ: ph.READ,
    sc.SPAN_KV_NOTIFY: ph.NOTIFY_COUNTING,
    sc.SPAN_KV_RELAY: ph.RELAY,
}
# decode is always on the path (its end is the first token being scheduled)
_HIDDEN_CANDIDATES = tuple(n for n in SPAN_PHASE if n != sc.SPAN_DECODE)


@dataclass(slots=True)
class Step:
    """Segment `phase` runs from `node` (ms) to the cursor; `owner` is the span it is in."""

    phase: str
    service: str
    node: float | None  # None: the span giving this node is missing
    owner: Span | None = None
    optional: bool = False  # a refinement (e.g. polling lag): silently skipped if None
    need: str = ""  # the span name whose absence makes node None


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


def _push_steps(c: _Ctx, end_from_root: bool) -> tuple[list[Step], str | None, list[str]]:
    ix = c.ix
    root, pd, pp = (
        ix.root,
        ix.one(sc.SPAN_PROXY_DECODE, PROXY),
        ix.one(sc.SPAN_PROXY_PREFILL, PROXY),
    )
    dec, pre = ix.one(sc.SPAN_DECODE, DECODE), ix.one(sc.SPAN_PREFILL, PREFILL)
    notify = ix.one(sc.SPAN_KV_NOTIFY, DECODE)
    write = ix.one(sc.SPAN_KV_WRITE, PREFILL)
    prep = ix.one(sc.SPAN_KV_DESC_PREP, PREFILL)
    rdv = ix.one(sc.SPAN_KV_RENDEZVOUS, PREFILL)
    reg = ix.one(sc.SPAN_KV_REGISTER, DECODE)
    s_p, s_d, s_x = (
        _svc(pre, sc.SERVICE_PREFILL),
        _svc(dec, sc.SERVICE_DECODE),
        _svc(root, sc.SERVICE_PROXY),
    )

    landed = None
    if write is not None:
        w0 = c.start(write)
        xfer = _num(write, sc.NIXL_XFER_US)
        lag = _num(write, sc.POLL_LAG_US)
        if xfer is not None:
            landed = w0 + xfer / 1000.0
        elif lag is not None:
            landed = c.end(write) - lag / 1000.0
        else:
            landed = c.end(write)
    steps: list[Step] = []
    if end_from_root:
        steps.append(
            Step(ph.PROXY, s_x, c.event(pd, sc.EVENT_FIRST_TOKEN), root, need=sc.SPAN_PROXY_DECODE)
        )
    steps += [
        Step(ph.FIRST_DECODE_STEP, s_d, c.end(dec), dec, need=sc.SPAN_DECODE),
        Step(ph.DECODE_SCHEDULING, s_d, c.end(notify), dec, need=sc.SPAN_KV_NOTIFY),
        Step(ph.NOTIFY_COUNTING, s_d, c.start(notify), notify, need=sc.SPAN_KV_NOTIFY),
        Step(ph.NOTIFICATION, s_d, landed, None, need=sc.SPAN_KV_WRITE),
        Step(ph.WRITE, s_p, c.start(write), write, need=sc.SPAN_KV_WRITE),
        Step(ph.DESC_PREP, s_p, c.end(prep), prep, need=sc.SPAN_KV_DESC_PREP),
        Step(ph.DESC_PREP, s_p, c.start(prep), prep, need=sc.SPAN_KV_DESC_PREP),
        Step(ph.RENDEZVOUS_WAIT, s_p, c.end(rdv), rdv, need=sc.SPAN_KV_RENDEZVOUS),
    ]
    problems: list[str] = []
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
    if first == "prefill":  # the registration came second: D's side is on the path
        steps += [
            Step(ph.REGISTRATION_WAIT, s_p, c.end(reg), rdv, need=sc.SPAN_KV_REGISTER),
            Step(ph.REGISTRATION, s_d, c.start(reg), reg, need=sc.SPAN_KV_REGISTER),
            Step(ph.DECODE_ADMISSION, s_d, c.start(dec), dec, need=sc.SPAN_DECODE),
            Step(ph.NETWORK, s_d, c.start(pd), None, need=sc.SPAN_PROXY_DECODE),
            Step(ph.PROXY, s_x, 0.0, root),
        ]
    else:  # prefill finished second (or unknown): P's side is on the path
        steps += [
            Step(ph.RENDEZVOUS_WAIT, s_p, c.end(pre), rdv, need=sc.SPAN_PREFILL),
            Step(ph.PREFILL, s_p, c.start(pre), pre, need=sc.SPAN_PREFILL),
            Step(ph.NETWORK, s_p, c.start(pp), None, need=sc.SPAN_PROXY_PREFILL),
            Step(ph.PROXY, s_x, 0.0, root),
        ]
    return steps, first, problems


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
    lag = _num(read, sc.POLL_LAG_US)
    read_done = None if read is None or lag is None else c.end(read) - lag / 1000.0
    steps: list[Step] = []
    if end_from_root:
        steps.append(
            Step(ph.PROXY, s_x, c.event(pd, sc.EVENT_FIRST_TOKEN), root, need=sc.SPAN_PROXY_DECODE)
        )
    steps += [
        Step(ph.FIRST_DECODE_STEP, s_d, c.end(dec), dec, need=sc.SPAN_DECODE),
        Step(ph.DECODE_SCHEDULING, s_d, c.end(read), dec, need=sc.SPAN_KV_READ),
        Step(ph.POLL_LAG, s_d, read_done, read, optional=True),
        Step(ph.READ, s_d, c.start(read), read, need=sc.SPAN_KV_READ),
        Step(ph.DESC_PREP, s_d, c.end(prep), prep, need=sc.SPAN_KV_DESC_PREP),
        Step(ph.DESC_PREP, s_d, c.start(prep), prep, need=sc.SPAN_KV_DESC_PREP),
        Step(ph.DECODE_ADMISSION, s_d, c.start(dec), dec, need=sc.SPAN_DECODE),
    ]
    if relay is not None:
        steps += [
            Step(ph.NETWORK, s_d, c.end(relay), None),
            Step(ph.RELAY, s_x, c.start(relay), relay),
        ]
    else:
        steps.append(Step(ph.NETWORK, s_d, c.start(pd), None, need=sc.SPAN_KV_RELAY))
    steps += [
        Step(ph.PROXY, s_x, c.end(pp), root, need=sc.SPAN_PROXY_PREFILL),
        Step(ph.NETWORK, s_p, c.end(pre), None, need=sc.SPAN_PREFILL),
        Step(ph.PREFILL, s_p, c.start(pre), pre, need=sc.SPAN_PREFILL),
        Step(ph.NETWORK, s_p, c.start(pp), None, need=sc.SPAN_PROXY_PREFILL),
        Step(ph.PROXY, s_x, 0.0, root),
    ]
    return steps, None, []


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
        steps = [s for s in steps if s.phase != ph.PROXY and s.need not in sc.PROXY_SPANS]
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


def _hidden(c: _Ctx, owners: set[str], end: float, first: str | None) -> list[Segment]:
    """Engine and KV phases inside [0, end] that the first token did not wait for."""
    out: list[Segment] = []
    ix = c.ix
    for name in _HIDDEN_CANDIDATES:
        for s in ix.all(name):
            if s.span_id in owners:
                continue
            a, b = max(c.start(s), 0.0), min(c.end(s), end)
            if b > a or (b == a and 0.0 < a < end):  # instants inside the window count
                out.append(Segment(SPAN_PHASE[name], s.resource.service, a, b - a, name))
    if ix.mode == "push":  # P only notices its WRITE finished at its next step
        write = ix.one(sc.SPAN_KV_WRITE, PREFILL)
        lag = _num(write, sc.POLL_LAG_US)
        if write is not None and lag:
            b = min(c.end(write), end)
            a = max(c.end(write) - lag / 1000.0, 0.0)
            if b > a:
                out.append(Segment(ph.POLL_LAG, write.resource.service, a, b - a, sc.SPAN_KV_WRITE))
    out.sort(key=lambda s: s.start_ms)
    return out
