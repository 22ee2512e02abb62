"""Per-trace indexing and the pieces of a timeline: roles, lanes, buckets and load.

A trace is indexed once (`TraceIndex`) so the skew estimator and the critical path can
ask "the decode-side kv.notify of this request" without scanning. Lanes follow where a
span ran: service / instance / thread (the `tracedpush.thread` attribute, with the TP rank
when above 0), falling back to the process id.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from functools import lru_cache

from tracedpush import semconv as sc
from tracedpush.analysis.model import Span

PROXY, PREFILL, DECODE = "proxy", "prefill", "decode"

# Which side emits each span when a name exists on both (docs/spans.md).
_SIDE = {
    "push": {
        sc.SPAN_KV_DESC_PREP: PREFILL,
        sc.SPAN_KV_HANDSHAKE: PREFILL,
        sc.SPAN_KV_NOTIFY: DECODE,
    },
    "pull": {
        sc.SPAN_KV_DESC_PREP: DECODE,
        sc.SPAN_KV_HANDSHAKE: DECODE,
        sc.SPAN_KV_NOTIFY: PREFILL,
    },
}
_THREAD_ORDER = {"scheduler": 0, "model_runner": 1, "push_writer": 2, "handshake": 3}
_SERVICE_ORDER = {PROXY: 0, PREFILL: 1, DECODE: 2}


def role_of(span: Span) -> str:
    """ "proxy", "prefill", "decode" (attribute first, then the service name)."""
    role = span.attributes.get(sc.ROLE)
    if role:
        return str(role)
    service = span.resource.service
    if service == sc.SERVICE_PROXY or "proxy" in service:
        return PROXY
    if "prefill" in service:
        return PREFILL
    if "decode" in service:
        return DECODE
    if span.name in sc.PROXY_SPANS:
        return PROXY
    return ""


def lane_of(span: Span, ranked: bool = False) -> str:
    """ "service/instance/thread", e.g. "vllm-prefill/prefill-0/push_writer"; a worker's
    TP rank is appended ("push_writer/tp1") when above 0, or always when `ranked` (the
    instance has several ranks in this trace: each rank gets its own lane, tp0 too)."""
    res = span.resource
    attrs = span.attributes
    thread = attrs.get(sc.THREAD)
    if not thread:
        thread = f"pid {res.pid}" if res.pid else "main"
    rank = attrs.get(sc.TP_RANK)
    if rank is not None and (ranked or rank not in (0, "0")):
        thread = f"{thread}/tp{rank}"
    return f"{res.service}/{res.instance}/{thread}"


def ranked_instances(spans: Iterable[Span]) -> set[str]:
    """Instances whose worker spans in `spans` come from more than one TP rank."""
    ranks: dict[str, set[str]] = {}
    for s in spans:
        rank = s.attributes.get(sc.TP_RANK)
        if rank is not None:
            ranks.setdefault(s.resource.instance, set()).add(str(rank))
    return {instance for instance, seen in ranks.items() if len(seen) > 1}


@lru_cache(maxsize=4096)
def lane_sort_key(lane: str, role: str) -> tuple[int, str, int, str]:
    _service, _, rest = lane.partition("/")
    instance, _, thread = rest.partition("/")
    base = thread.split("/")[0]
    return (_SERVICE_ORDER.get(role, 3), instance, _THREAD_ORDER.get(base, 9), thread)


class TraceIndex:
    """One trace's spans, indexed by name, with the request-level facts read once."""

    __slots__ = ("_one", "by_name", "mode", "problems", "request_id", "root", "spans", "trace_id")

    def __init__(self, trace_id: str, spans: Sequence[Span]) -> None:
        self.trace_id = trace_id
        self.spans = spans
        self.problems: list[str] = []
        by_name: dict[str, list[Span]] = {}
        for s in spans:
            lst = by_name.get(s.name)
            if lst is None:
                by_name[s.name] = [s]
            else:
                lst.append(s)
        self.by_name = by_name
        self._one: dict[tuple[str, str | None], Span | None] = {}
        roots = by_name.get(sc.SPAN_REQUEST)
        root = None
        if roots:
            # A client retry can yield two roots in one trace: the one with a first token
            # (else the latest) is the request we report.
            root = max(
                roots, key=lambda s: (s.event_ns(sc.EVENT_FIRST_TOKEN) is not None, s.end_ns)
            )
            if len(roots) > 1:
                self.problems.append(f"{len(roots)} {sc.SPAN_REQUEST} spans in one trace")
        self.root = root
        self.mode = self._mode()
        self.request_id = self._request_id()

    def _mode(self) -> str:
        if self.root is not None:
            m = self.root.attributes.get(sc.MODE)
            if m:
                return str(m)
        for s in self.spans:
            m = s.attributes.get(sc.MODE)
            if m:
                return str(m)
        names = self.by_name
        if (
            sc.SPAN_KV_WRITE in names
            or sc.SPAN_KV_REGISTER in names
            or sc.SPAN_KV_RENDEZVOUS in names
        ):
            return "push"
        if sc.SPAN_KV_READ in names or sc.SPAN_KV_RELAY in names:
            return "pull"
        return "unknown"

    def _request_id(self) -> str:
        if self.root is not None:
            rid = self.root.attributes.get(sc.REQUEST_ID)
            if rid:
                return str(rid)
        # the proxy's legs carry the id the client sent; engines may decorate theirs
        ordered = sorted(self.spans, key=lambda s: role_of(s) != PROXY)
        for s in ordered:
            rid = s.attributes.get(sc.REQUEST_ID)
            if rid:
                return str(rid)
        return self.trace_id

    def one(self, name: str, role: str | None = None) -> Span | None:
        """The span called `name` (on `role`'s side) that ended last: with several (TP
        ranks, retries), the last to finish is the one anything after it waited for."""
        key = (name, role)
        try:
            return self._one[key]
        except KeyError:
            pass
        found = self._one[key] = self._find(name, role)
        return found

    def _find(self, name: str, role: str | None) -> Span | None:
        spans = self.by_name.get(name)
        if not spans:
            return None
        if role is None:
            role = _SIDE.get(self.mode, {}).get(name)
        if len(spans) == 1:
            s = spans[0]
            return s if role is None or role_of(s) in (role, "") else None
        best = None
        for s in spans:
            if role is not None and role_of(s) not in (role, ""):
                continue
            if best is None or s.end_ns > best.end_ns:
                best = s
        return best

    def all(self, name: str) -> list[Span]:
        return self.by_name.get(name, [])

    def on_side(self, name: str, role: str) -> list[Span]:
        """Every span called `name` on `role`'s side (one per TP rank, say)."""
        return [s for s in self.by_name.get(name, ()) if role_of(s) in (role, "")]

    def int_attr(self, key: str, *names: str) -> int | None:
        for name in names:
            for s in self.by_name.get(name, ()):
                v = s.attributes.get(key)
                if v is not None:
                    try:
                        return int(v)
                    except (TypeError, ValueError):
                        continue
        return None


# ------------------------------------------------------------------ groupings

DEFAULT_BUCKETS: tuple[int, ...] = (256, 1024, 4096)
DEFAULT_LOAD_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


def bucket_label(tokens: int | None, edges: Sequence[int] = DEFAULT_BUCKETS) -> str:
    """Prompt-length bucket: "<=256", "<=1024", "<=4096", ">4096" by default."""
    if tokens is None:
        return "unknown"
    for e in edges:
        if tokens <= e:
            return f"<={e}"
    return f">{edges[-1]}" if edges else "all"


def bucket_labels(edges: Sequence[int] = DEFAULT_BUCKETS) -> list[str]:
    return [f"<={e}" for e in edges] + ([f">{edges[-1]}"] if edges else ["all"])


def load_label(load: int, edges: Sequence[int] = DEFAULT_LOAD_BUCKETS) -> str:
    """Load bucket: "1", "2", "3-4", "5-8", ... ">32" by default."""
    lo = 1
    for e in edges:
        if load <= e:
            return str(e) if lo >= e else f"{lo}-{e}"
        lo = e + 1
    return f">{edges[-1]}" if edges else "all"


def load_labels(edges: Sequence[int] = DEFAULT_LOAD_BUCKETS) -> list[str]:
    out, lo = [], 1
    for e in edges:
        out.append(str(e) if lo >= e else f"{lo}-{e}")
        lo = e + 1
    out.append(f">{edges[-1]}" if edges else "all")
    return out


class LoadCounter:
    """Requests in flight at the proxy at a given time (root spans' [start, end))."""

    def __init__(self, intervals: Iterable[tuple[int, int]]) -> None:
        iv = list(intervals)
        self.starts = sorted(s for s, _ in iv)
        self.ends = sorted(e for _, e in iv)

    def at(self, t_ns: int) -> int:
        return bisect_right(self.starts, t_ns) - bisect_right(self.ends, t_ns)
