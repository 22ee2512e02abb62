"""Clock offsets between instances, estimated from causal pairs, NTP-style.

Spans from different hosts carry different clocks. Each *causal pair* says an event a
on clock A happened before an event b on clock B (a request is sent before it
arrives; a WRITE is posted before its notification; an engine's work sits inside the
proxy's leg). With offsets θ (corrected = raw − θ), a pair gives the difference
constraint ``θ_B − θ_A <= b − a``. Pairs in both directions bound each instance's
offset relative to the proxy's clock to an interval [lo, hi].

How the offset is chosen (and why):

* The clock domains are instances (``service.instance.id``, split by ``host.name`` if an
  instance spans hosts); the reference is the proxy (the clock TTFT is measured on).
* Instances on one host read one kernel clock (CLOCK_REALTIME is system-wide; time
  namespaces do not virtualise it), so they are tied to one offset: zero-weight edges
  both ways between them. An instance whose pairs contradict the tie (a negative cycle:
  two machines with the same ``host.name``) keeps its own offset.
  Without the tie, a 1P1D on one box got "corrections" of several ms between processes
  reading the same clock, which moved milliseconds between `network` and its
  neighbours.
* The tightest bounds follow from all pairs at once (shortest paths over the
  constraint graph, so P<->D pairs such as WRITE -> notification tighten both).
* The offset is the midpoint of the interval (NTP's symmetric-delay assumption), so it
  never leaves what the evidence allows. The midpoint depends only on the evidence, not
  on where the raw clocks happen to sit: shifting one instance's clock by any constant
  moves its estimate by exactly that constant and changes no attribution. The price:
  two clocks that are really equal (one host) get a correction of up to half the
  asymmetry between the delays the pairs bracket; the interval then contains 0, which
  the report shows (the host tie removes that error for instances on the proxy's host).
  Policy "zero" instead keeps 0 whenever the interval contains it (smallest correction;
  not shift-equivariant).
* Evidence from one direction only (a half-open interval) gets the smallest correction
  it forces (often 0); no evidence at all gets 0 with an infinite bound.
* ``lo_ms``/``hi_ms`` are what the pairs alone allow; ``bound_ms`` is the largest error
  the chosen value can have within them.
* Instances are fixed one at a time, narrowest interval first, each fixing
  re-tightening the others, so the chosen offsets are jointly consistent.
* If the pairs contradict each other (lo > hi, e.g. a clock that jumped), the
  midpoint is used and the offset is flagged ``consistent=False``.

One offset per instance holds for the whole run. `over_time` estimates them again from
each stretch of the run alone (by the raw start of each request's proxy root), so a
clock that stepped or drifted shows where: the run's offset falls outside the evidence
of some windows (`outside`). Such an instance's run offset, judged on evidence that
contradicts itself, can fit few requests (the midpoint of a step fits none; where the
pair graph contradicts itself, a small moved stretch can set it), so `settle` gives it
the offset of the stretches with the most pairs instead: right for their requests, the
rest flagged (`misplaced`, `misfit_at`). The windows' own offsets are reported, not
applied per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tracedpush import semconv as sc
from tracedpush import tuning
from tracedpush.analysis.model import STATUS_ERROR, ClockOffset, OffsetWindow, Resource, Span
from tracedpush.analysis.timeline import DECODE, PREFILL, PROXY, TraceIndex

INF = float("inf")
# `over_time`: the run's time in at most this many windows, each at least this long
# (12, 10 s; `tuning`: TRACEDPUSH_SKEW_WINDOWS, TRACEDPUSH_SKEW_MIN_WINDOW_S)
WINDOWS = tuning.WINDOWS
MIN_WINDOW_NS = tuning.MIN_WINDOW_NS
# The reference clock is the proxy with the most of the run's first this many requests
# (by raw start): a busy proxy, which later requests never change. Counted over the whole
# run, two proxies whose counts are close (replicas behind a balancer, two fleets in one
# directory) swapped it as requests came, and every offset moved with it: a Live index
# analysed the run again, 2,000 requests a refresh.
REFERENCE_REQUESTS = 1_000

Pair = tuple[Span, int, Span, int]  # (a, a's raw time, b, b's raw time): a before b


def domains(resources: Iterable[Resource]) -> dict[Resource, str]:
    """Clock domain label per resource: the instance, or instance@host when an
    instance id appears on several hosts."""
    hosts: dict[str, set[str]] = {}
    res = list(resources)
    for r in res:
        hosts.setdefault(r.instance, set()).add(r.host)
    return {r: r.instance if len(hosts[r.instance]) == 1 else f"{r.instance}@{r.host}" for r in res}


def causal_pairs(ix: TraceIndex) -> Iterator[Pair]:
    """Every (a before b) pair one request offers across processes."""
    ok = _ok
    root = ix.root
    pp = ix.one(sc.SPAN_PROXY_PREFILL, PROXY)
    pd = ix.one(sc.SPAN_PROXY_DECODE, PROXY)
    pre = ix.one(sc.SPAN_PREFILL, PREFILL)
    dec = ix.one(sc.SPAN_DECODE, DECODE)
    # The proxy's legs (else the root) around each engine's work.
    outer_p = pp if ok(pp) else root
    if ok(outer_p) and ok(pre):
        yield outer_p, outer_p.start_ns, pre, pre.start_ns
        yield pre, pre.end_ns, outer_p, outer_p.end_ns
    outer_d = pd if ok(pd) else root
    if ok(outer_d) and ok(dec):
        yield outer_d, outer_d.start_ns, dec, dec.start_ns
        ft = outer_d.event_ns(sc.EVENT_FIRST_TOKEN)
        if ft is None and root is not None:
            ft = root.event_ns(sc.EVENT_FIRST_TOKEN)
        # decode ends when the first token is scheduled: it reaches the proxy later.
        yield dec, dec.end_ns, outer_d, ft if ft is not None else outer_d.end_ns
    if ix.mode == "push":
        reg = ix.one(sc.SPAN_KV_REGISTER, DECODE)
        rdv = ix.one(sc.SPAN_KV_RENDEZVOUS, PREFILL)
        if ok(reg) and ok(rdv):
            first = rdv.attributes.get(sc.RENDEZVOUS_FIRST)
            if first in ("registration", "prefill"):
                arrival = rdv.start_ns if first == "registration" else rdv.end_ns
                yield reg, reg.end_ns, rdv, arrival  # registration sent before it arrives
            else:
                yield reg, reg.end_ns, rdv, rdv.end_ns  # it arrived by the rendezvous end
        # the first notification came from one of P's WRITEs (one per P rank): the
        # earliest posted is certainly before it
        writes = [s for s in ix.on_side(sc.SPAN_KV_WRITE, PREFILL) if ok(s)]
        write = min(writes, key=lambda s: s.start_ns, default=None)
        notify = ix.one(sc.SPAN_KV_NOTIFY, DECODE)
        if write is not None and ok(notify):
            yield write, write.start_ns, notify, notify.start_ns  # posted before notified
    elif ix.mode == "pull":
        read = ix.one(sc.SPAN_KV_READ, DECODE)
        notify = ix.one(sc.SPAN_KV_NOTIFY, PREFILL)
        if ok(read) and ok(notify):
            yield read, read.start_ns, notify, notify.start_ns  # posted before notified
        if ok(pre) and ok(read):
            yield pre, pre.end_ns, read, read.start_ns  # P finished before D reads


def _ok(span: Span | None) -> bool:
    return span is not None and span.status_code != STATUS_ERROR


@dataclass(slots=True)
class Edges:
    """w[(A, B)] = tightest known bound on θ_B − θ_A (ns); n = pairs behind it."""

    w: dict[tuple[str, str], int]
    n: dict[str, int]


def collect(
    indexes: Iterable[TraceIndex],
    dom: Mapping[Resource, str],
    timed: list[tuple[int, str, str, int]] | None = None,
) -> Edges:
    """The edges between clock domains of every trace's causal pairs. `timed`, if
    given, gets each pair of a trace with a proxy root as (the root's raw start ns,
    domain a, domain b, slack ns), for `over_time`."""
    w: dict[tuple[str, str], int] = {}
    n: dict[str, int] = {}
    by_id = {id(r): label for r, label in dom.items()}
    for ix in indexes:
        root = None if timed is None or ix.root is None else ix.root.start_ns
        for a, ta, b, tb in causal_pairs(ix):
            da, db = by_id[id(a.resource)], by_id[id(b.resource)]
            if da == db:
                continue
            key = (da, db)
            slack = tb - ta
            cur = w.get(key)
            if cur is None or slack < cur:
                w[key] = slack
            n[da] = n.get(da, 0) + 1
            n[db] = n.get(db, 0) + 1
            if root is not None:
                timed.append((root, da, db, slack))  # type: ignore[union-attr]
    return Edges(w, n)


def over_time_of(
    timed: Sequence[tuple[int, str, str, int]],
    dom: Mapping[Resource, str],
    reference: str,
    policy: str = "midpoint",
    roots: Sequence[int] = (),
) -> list[OffsetWindow]:
    """`over_time` of the pairs `collect` gave in `timed`; `roots`: the raw start of
    every request's proxy root (counted per window)."""
    names = sorted({x for _t, a, b, _s in timed for x in (a, b)})
    code = {x: i for i, x in enumerate(names)}
    cols = list(zip(*timed, strict=True)) if timed else [(), (), (), ()]
    return over_time(
        np.array(cols[0], dtype=np.int64),
        np.array([code[x] for x in cols[1]], dtype=np.int64),
        np.array([code[x] for x in cols[2]], dtype=np.int64),
        np.array(cols[3], dtype=np.int64),
        names,
        dom,
        reference,
        policy,
        np.array(roots, dtype=np.int64),
    )


def over_time(
    times: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    slack: np.ndarray,
    names: Sequence[str],
    dom: Mapping[Resource, str],
    reference: str,
    policy: str = "midpoint",
    roots: np.ndarray | None = None,
) -> list[OffsetWindow]:
    """The clock offsets of each stretch of the run, estimated from its pairs alone.

    Pair i (domain ``names[a[i]]`` before ``names[b[i]]``, ``slack[i]`` ns) belongs to
    the request whose proxy root started at raw ``times[i]`` ns; the run from the first
    to the last is cut into `WINDOWS` equal windows of whole seconds, at least
    `MIN_WINDOW_NS` each, and `estimate_edges` runs on each window's pairs (as on the
    run's, same reference and policy). Windows without pairs are left out; each lists
    the instances with pairs in it, and the reference, and counts the requests whose
    proxy root started in it (`roots`: every request's raw root start, with pairs or
    not)."""
    keep = a != b
    times, a, b, slack = times[keep], a[keep], b[keep], slack[keep]
    if not len(times) or not reference:
        return []
    t0, t1 = int(times.min()), int(times.max())
    width = max(MIN_WINDOW_NS, -(-(t1 - t0 + 1) // WINDOWS))
    width = -(-width // 10**9) * 10**9
    m = len(names)
    win = (times - t0) // width
    nwin = int(win.max()) + 1
    # the lowest slack per (window, a, b): a few hundred keys at most, so a dense table
    low = np.full(nwin * m * m, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(low, (win * m + a) * m + b, slack)
    keys = np.flatnonzero(low != np.iinfo(np.int64).max)
    low = low[keys]
    count = np.bincount(win * m + a, minlength=nwin * m) + np.bincount(
        win * m + b, minlength=nwin * m
    )
    count = count.reshape(nwin, m).tolist()
    requests = [0] * nwin
    if roots is not None and len(roots):
        at = (roots - t0) // width
        at = at[(at >= 0) & (at < nwin)]
        requests = np.bincount(at, minlength=nwin).tolist()
    kw, ka, kb = (keys // (m * m)).tolist(), (keys // m % m).tolist(), (keys % m).tolist()
    edges: dict[int, dict[tuple[str, str], int]] = {}
    for w, x, y, s in zip(kw, ka, kb, low.tolist(), strict=True):
        edges.setdefault(w, {})[names[x], names[y]] = s
    out = []
    for w, e in sorted(edges.items()):
        n = {names[i]: c for i, c in enumerate(count[w]) if c}
        got = estimate_edges(Edges(e, n), dom, reference, policy)
        shown = {x: o for x, o in got.items() if o.pairs or o.reference}
        start, end = (t0 + w * width) / 1e6, (t0 + (w + 1) * width) / 1e6
        out.append(OffsetWindow(start, end, shown, e, requests[w]))
    return out


def _shortest(nodes: list[str], w: Mapping[tuple[str, str], float]) -> dict[str, dict[str, float]]:
    d = {a: {b: (0.0 if a == b else w.get((a, b), INF)) for b in nodes} for a in nodes}
    for k in nodes:
        dk = d[k]
        for i in nodes:
            dik = d[i][k]
            if dik == INF:
                continue
            di = d[i]
            for j in nodes:
                alt = dik + dk[j]
                if alt < di[j]:
                    di[j] = alt
    return d


POLICIES = ("midpoint", "zero")


def estimate_edges(
    edges: Edges, dom: Mapping[Resource, str], reference: str, policy: str = "midpoint"
) -> dict[str, ClockOffset]:
    """Offsets (ms) of every domain relative to `reference` from the pairs' edges
    (`collect`'s; the analysis index keeps each trace's pairs, so a warm report
    re-estimates offsets without reading a span); see the module docstring.

    `policy`: "midpoint" (default, shift-equivariant) or "zero" (keep 0 whenever the
    evidence allows it; the rest get midpoints).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown skew policy {policy!r}; use one of {POLICIES}")
    host = {}
    for r, label in dom.items():
        host.setdefault(label, r.host)
    nodes = sorted(set(dom.values()) | {reference})
    d0 = _shortest(nodes, edges.w)  # what the pairs alone allow, for the report
    pairs_only = {x: (-d0[x][reference], d0[reference][x]) for x in nodes}
    w, tied, d = _tie_hosts(nodes, dict(edges.w), d0, host, reference)
    out: dict[str, ClockOffset] = {
        reference: ClockOffset(
            reference,
            0.0,
            0.0,
            edges.n.get(reference, 0),
            host.get(reference, ""),
            0.0,
            0.0,
            reference=True,
            host_clock=reference in tied,
        )
    }
    consistent_graph = all(d[x][x] >= 0 for x in nodes)
    todo = [x for x in nodes if x != reference]
    evidence: dict[str, tuple[float, float]] = {}  # what the pairs alone allow
    while todo:
        if not consistent_graph:
            # Contradictory evidence somewhere: judge each domain by its direct pairs
            # with the reference only, so one bad link does not poison the rest.
            d = {
                reference: {x: w.get((reference, x), INF) for x in nodes},
                **{x: {reference: w.get((x, reference), INF)} for x in nodes if x != reference},
            }
        intervals = {x: (-d[x].get(reference, INF), d[reference].get(x, INF)) for x in todo}
        for x, iv in intervals.items():
            evidence.setdefault(x, iv)
        candidates = todo
        if policy == "zero":  # those allowed to stay at 0 first, so guesses do not move them
            candidates = [k for k in todo if intervals[k][0] <= 0.0 <= intervals[k][1]] or todo
        x = min(candidates, key=lambda k: (intervals[k][1] - intervals[k][0], k))
        lo, hi = intervals[x]
        todo.remove(x)
        value = _choose(lo, hi, policy)
        lo0, hi0 = evidence[x]
        consistent = lo0 <= hi0 and lo <= hi
        bound = max(value - lo0, hi0 - value) if consistent else abs(hi0 - lo0) / 2.0
        shown = pairs_only[x] if consistent_graph else (lo0, hi0)
        out[x] = ClockOffset(
            instance=x,
            offset_ms=value / 1e6,
            bound_ms=bound / 1e6,
            pairs=edges.n.get(x, 0),
            host=host.get(x, ""),
            lo_ms=shown[0] / 1e6,
            hi_ms=shown[1] / 1e6,
            consistent=consistent,
            host_clock=x in tied,
        )
        if consistent_graph:
            w[(reference, x)] = min(w.get((reference, x), INF), value)
            w[(x, reference)] = min(w.get((x, reference), INF), -value)
            d = _shortest(nodes, w)
            consistent_graph = all(d[k][k] >= -1e-6 for k in nodes)
    return out


def _tie_hosts(
    nodes: list[str],
    w: dict[tuple[str, str], float],
    d: dict[str, dict[str, float]],
    host: Mapping[str, str],
    reference: str,
) -> tuple[dict[tuple[str, str], float], set[str], dict[str, dict[str, float]]]:
    """`w` with same-host domains tied to one offset where the pairs agree, the tied
    domains, and the shortest paths `d` (those of `w` on entry) updated to match. Each
    host's first domain (its reference, if there) anchors the others; one whose pairs
    contradict the anchor's clock stays untied.

    Tying x to its anchor adds two zero-weight edges; on a consistent graph that makes a
    negative cycle exactly when a shortest path between them is already negative, and
    the paths through the new edges update `d` in O(n^2), not a fresh Floyd-Warshall.
    Where pairs contradict each other somewhere (a clock that jumped), the paths mean
    nothing and `estimate_edges` judges each domain by its direct pairs with the
    reference: so is a tie to the reference's host, by the direct pairs between the two
    (a remote D whose clock jumped does not untie P from the proxy's host); other hosts'
    domains are not tied then (each is judged alone)."""
    tied: set[str] = set()
    consistent = all(d[k][k] >= 0 for k in nodes)
    d = {a: dict(row) for a, row in d.items()} if consistent else d
    groups: dict[str, list[str]] = {}
    for x in sorted(nodes, key=lambda n: (n != reference, n)):
        if host.get(x):
            groups.setdefault(host[x], []).append(x)
    for anchor, *others in groups.values():
        for x in others:
            if not consistent:  # only direct pairs count, the reference's: its host's
                agree = w.get((anchor, x), INF) >= 0 and w.get((x, anchor), INF) >= 0
                if anchor == reference and agree:
                    w[(anchor, x)] = w[(x, anchor)] = 0.0
                    tied.update((anchor, x))
                continue
            if d[anchor][x] < 0 or d[x][anchor] < 0:
                continue
            w[(anchor, x)] = min(w.get((anchor, x), INF), 0.0)
            w[(x, anchor)] = min(w.get((x, anchor), INF), 0.0)
            to_a = {i: d[i][anchor] for i in nodes}
            to_x = {i: d[i][x] for i in nodes}
            from_a, from_x = dict(d[anchor]), dict(d[x])
            for i in nodes:
                row = d[i]
                for j in nodes:
                    row[j] = min(row[j], to_a[i] + from_x[j], to_x[i] + from_a[j])
            tied.update((anchor, x))
    return w, tied, d


def _choose(lo: float, hi: float, policy: str) -> float:
    """The offset picked inside [lo, hi] (ns)."""
    if lo == -INF and hi == INF:
        return 0.0  # no evidence: no correction
    if lo == -INF:  # evidence from one direction only: the smallest correction allowed
        return min(0.0, hi)
    if hi == INF:
        return max(0.0, lo)
    if policy == "zero" and lo <= 0.0 <= hi:
        return 0.0
    return (lo + hi) / 2.0


def outside(offsets: Mapping[str, ClockOffset], windows: Sequence[OffsetWindow]) -> set[str]:
    """The instances whose run-wide offset some window's evidence alone excludes (its
    pairs contradict each other there, or the offset is outside their [lo, hi]): their
    clock stepped or drifted during the run. A run whose pairs contradict nothing has
    none (its interval is within every window's). Where they contradict each other
    somewhere, an instance judged by its direct pairs alone may look consistent and still
    have moved: its offset is then the stretch's with the tightest pairs, and this finds
    it."""
    out = set()
    for w in windows:
        out.update(_misfits(offsets, w))
    return out


def _misfit(o: ClockOffset, run_ms: float) -> bool:
    """A window's evidence `o` (with pairs) contradicts itself or excludes `run_ms`."""
    return bool(o.pairs) and (not o.consistent or not o.lo_ms <= run_ms <= o.hi_ms)


def _misfits(offsets: Mapping[str, ClockOffset], w: OffsetWindow) -> dict[str, ClockOffset]:
    """The instances whose offset in `offsets` misfits window `w`, with its evidence."""
    return {
        x: o
        for x, o in w.offsets.items()
        if x in offsets and not o.reference and _misfit(o, offsets[x].offset_ms)
    }


def misplaced(
    offsets: Mapping[str, ClockOffset], windows: Sequence[OffsetWindow]
) -> tuple[int, int]:
    """(requests in windows where some instance's applied offset misfits, requests in
    all windows): how many requests are off by about a clock's move."""
    off = sum(w.requests for w in windows if _misfits(offsets, w))
    return off, sum(w.requests for w in windows)


def settle(
    offsets: Mapping[str, ClockOffset],
    windows: Sequence[OffsetWindow],
    dom: Mapping[Resource, str],
    reference: str,
    policy: str = "midpoint",
) -> dict[str, ClockOffset]:
    """The run's offsets, those of instances whose clock moved (`outside`) estimated
    again from the stretches of the run with the most pairs: of the windows where the
    instance's evidence is consistent, the set whose intervals share a point and hold
    the most pairs. `estimate_edges` runs on those windows' pairs alone (their edges
    merged: as if the run were only them); where those contradict each other (another
    instance moved, or this one by less than a window shows), the offset is chosen in
    what every picked window allows. `stretch_pairs` says how many of the instance's
    pairs that is; `consistent` stays the whole run's verdict.

    Why: the run's own estimate judges a moved clock on evidence that contradicts
    itself. A step's midpoint fits no request; where the pair graph contradicts itself,
    each instance is judged by its direct pairs with the reference and a few moved
    requests can set the bound (the 205,560-request bench run: -4.91 ms applied to every
    request where 97% of the pairs say -0.34). Estimated from the stretches alone, a
    clock that moved for a few requests keeps the offset the run had before them, so
    nothing else moves. Instances tied to their host's clock keep it (one kernel
    clock), and so does an instance without a consistent window. A run whose pairs
    contradict nothing has nothing outside: its offsets are returned as they are."""
    moved = outside(offsets, windows)
    out = dict(offsets)
    for x in sorted(moved):
        run = offsets[x]
        if run.host_clock:
            continue
        mine = [
            (o.lo_ms, o.hi_ms, o.pairs, w)
            for w in windows
            if (o := w.offsets.get(x)) is not None and o.consistent and o.pairs
        ]
        picked = _most_pairs(mine)
        if not picked:
            continue
        edges = Edges({}, {})
        for w in picked:
            for key, slack in w.edges.items():
                if key not in edges.w or slack < edges.w[key]:
                    edges.w[key] = slack
            for y, o in w.offsets.items():
                edges.n[y] = edges.n.get(y, 0) + o.pairs
        nodes = sorted({y for key in edges.w for y in key})
        d = _shortest(nodes, edges.w)
        if all(d[y][y] >= 0 for y in nodes):  # as if the run were only those requests
            got = estimate_edges(edges, dom, reference, policy)[x]
            value, bound, lo, hi = got.offset_ms, got.bound_ms, got.lo_ms, got.hi_ms
        else:  # their pairs contradict across windows (another instance moved, or this
            # one by less than a window shows): what each window allows, in common
            lo = max(w.offsets[x].lo_ms for w in picked)
            hi = min(w.offsets[x].hi_ms for w in picked)
            value = _choose(lo, hi, policy)
            bound = max(value - lo, hi - value)
        out[x] = replace(
            run,
            offset_ms=value,
            bound_ms=bound,
            lo_ms=lo,
            hi_ms=hi,
            stretch_pairs=edges.n.get(x, 0),
        )
    return out


def _most_pairs(spans: Sequence[tuple[float, float, int, OffsetWindow]]) -> list[OffsetWindow]:
    """Of intervals (lo, hi, pairs, window), the windows of the set that shares a point
    and holds the most pairs (ties: the lowest point); none without a finite bound. A
    point covered by the most is at some interval's bound, so those are the candidates
    (at most 2 per window, 12 windows)."""
    points = sorted({v for lo, hi, _n, _w in spans for v in (lo, hi) if abs(v) != INF})
    best: tuple[int, float] | None = None
    for p in points:
        n = sum(k for lo, hi, k, _w in spans if lo <= p <= hi)
        if best is None or n > best[0]:
            best = (n, p)
    if best is None:
        return []
    return [w for lo, hi, _k, w in spans if lo <= best[1] <= hi]


def misfit_at(
    offsets: Mapping[str, ClockOffset], windows: Sequence[OffsetWindow], unix_ms: float
) -> dict[str, ClockOffset]:
    """The instances whose applied offset misfits the window holding `unix_ms` (a
    request's arrival on the proxy's clock), with that window's evidence: a request's
    spans on them are off by about the difference."""
    for w in windows:
        if w.start_unix_ms <= unix_ms < w.end_unix_ms:
            return _misfits(offsets, w)
    return {}


def window_cell(o: ClockOffset | None, run_ms: float, pm: str = "+/-") -> str:
    """One instance's offset in one window of `over_time` for a table: "" without
    pairs there, a "!" where the run's offset `run_ms` is outside that evidence."""
    if o is None or not o.pairs:
        return ""
    if not o.consistent:
        return f"contradicts itself ({o.pairs} pairs) !"
    mark = " !" if _misfit(o, run_ms) else ""
    return f"{o.offset_ms:+.3f} {pm} {o.bound_ms:.3f} ({o.pairs} pairs){mark}"
