"""`analyze()`: from spans to one `RequestAnalysis` per request.

Order matters: clock offsets are estimated across all requests first, then every
request's spans are placed on the proxy's clock, and only then is the TTFT attributed,
so a skewed host cannot make a WRITE look like it finished before it started.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from tracedpush import semconv as sc
from tracedpush.analysis import failures, skew, tpot
from tracedpush.analysis import steps as steps_mod
from tracedpush.analysis._gc import paused_gc
from tracedpush.analysis.critical_path import critical_path, engine_phases
from tracedpush.analysis.load import TraceStore
from tracedpush.analysis.model import (
    STATUS_ERROR,
    STATUS_OK,
    ClockOffset,
    LoadStats,
    OffsetWindow,
    Resource,
    Span,
    SpanView,
)
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis
from tracedpush.analysis.timeline import (
    DEFAULT_BUCKETS,
    DEFAULT_LOAD_BUCKETS,
    LoadCounter,
    TraceIndex,
    bucket_label,
    lane_of,
    lane_sort_key,
    load_label,
    ranked_instances,
    role_of,
)

__all__ = ["DEFAULT_BUCKETS", "DEFAULT_LOAD_BUCKETS", "analyze"]

_STATUS_NAMES = {STATUS_OK: "ok", STATUS_ERROR: "error"}
PROCESS_SPANS = frozenset(sc.PROCESS_SPANS)  # per process, not per request (index.py too)

Source = TraceStore | Mapping[str, Iterable[Span]] | Iterable[Span]


def _traces(source: Source) -> tuple[list[tuple[str, list[Span]]], LoadStats, str]:
    if isinstance(source, TraceStore):
        items = [(tid, list(spans.values())) for tid, spans in source.traces.items()]
        return items, source.stats, source.describe()
    if isinstance(source, Mapping):
        return [(tid, list(spans)) for tid, spans in source.items()], LoadStats(), "memory"
    grouped: dict[str, list[Span]] = {}
    for s in source:
        grouped.setdefault(s.trace_id, []).append(s)
    return list(grouped.items()), LoadStats(), "memory"


def _reference(indexes: Sequence[TraceIndex], dom: Mapping[Resource, str]) -> str:
    """The clock times are placed on: the proxy that received the most of the run's first
    `skew.REFERENCE_REQUESTS` requests (by raw start, then first seen; ties: the one met
    first among them), which later requests never change; without a proxy, the clock
    with the most spans."""
    rooted = sorted((ix.root for ix in indexes if ix.root is not None), key=_start)
    roots = Counter(dom[root.resource] for root in rooted[: skew.REFERENCE_REQUESTS])
    if roots:
        return roots.most_common(1)[0][0]
    labels = Counter(dom[s.resource] for ix in indexes for s in ix.spans)
    return labels.most_common(1)[0][0] if labels else ""


def _start(span: Span) -> int:
    return span.start_ns


def analyze(
    source: Source,
    *,
    correct_skew: bool = True,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    load_buckets: Sequence[int] = DEFAULT_LOAD_BUCKETS,
    spans: bool = True,
    skew_policy: str = "midpoint",
) -> RunAnalysis:
    """Analyse every trace in `source` (a `TraceStore`, {trace id: spans}, or spans).

    `correct_skew=False` still estimates offsets (reported) but does not apply them.
    `buckets` / `load_buckets` are the upper edges of the prompt-length / load groups.
    `spans=False` skips building `SpanView`s (faster when only numbers are wanted).
    `skew_policy`: "midpoint" (default) or "zero" (see `skew`).
    """
    with paused_gc():
        return _analyze(
            source, correct_skew, tuple(buckets), tuple(load_buckets), spans, skew_policy
        )


def _analyze(
    source: Source,
    correct_skew: bool,
    buckets: tuple[int, ...],
    load_buckets: tuple[int, ...],
    spans: bool,
    skew_policy: str,
) -> RunAnalysis:
    items, stats, where = _traces(source)
    # per-process step traces (engine.steps, engine.threads) are not requests
    process_spans: list[Span] = []
    indexes = []
    for tid, ss in items:
        req = [s for s in ss if s.name not in PROCESS_SPANS]
        if len(req) != len(ss):
            process_spans += [s for s in ss if s.name in PROCESS_SPANS]
        if req:
            indexes.append(TraceIndex(tid, req))
    resources = {id(s.resource): s.resource for ix in indexes for s in ix.spans}
    dom = skew.domains(resources.values())
    ref = _reference(indexes, dom)
    offsets: dict[str, ClockOffset] = {}
    windows: list[OffsetWindow] = []
    if ref:
        timed: list[tuple[int, str, str, int]] = []
        edges = skew.collect(indexes, dom, timed)
        roots = [ix.root.start_ns for ix in indexes if ix.root is not None]
        windows = skew.over_time_of(timed, dom, ref, skew_policy, roots)
        offsets = skew.estimate_edges(edges, dom, ref, skew_policy)
        offsets = skew.settle(offsets, windows, dom, ref, skew_policy)
    applied = {label: (o.offset_ms if correct_skew else 0.0) for label, o in offsets.items()}
    off_ns = {rid: round(applied.get(dom[r], 0.0) * 1e6) for rid, r in resources.items()}

    load = LoadCounter((ix.root.start_ns, ix.root.end_ns) for ix in indexes if ix.root is not None)
    requests = [request_analysis(ix, off_ns, load, buckets, load_buckets, spans) for ix in indexes]
    requests.sort(key=lambda r: r.start_unix_ms)
    engine_steps = steps_mod.placed(process_spans, resources.values(), applied)
    tpot.attach(
        requests,
        {ix.trace_id: ix for ix in indexes},
        engine_steps,
        lambda s: off_ns.get(id(s.resource), 0),
    )
    return RunAnalysis(
        requests=requests,
        clock_offsets=offsets,
        clock_windows=windows,
        stats=stats,
        skew_corrected=correct_skew,
        skew_policy=skew_policy,
        buckets=tuple(buckets),
        load_buckets=tuple(load_buckets),
        source=where,
        engine_steps=engine_steps,
    )


def request_analysis(
    ix: TraceIndex,
    off_ns: Mapping[int, int],
    load: LoadCounter,
    buckets: tuple[int, ...],
    load_buckets: tuple[int, ...],
    with_spans: bool,
) -> RequestAnalysis:
    """One trace's analysis under clock offsets `off_ns`; the analysis index calls it for
    just the traces that changed, so its result must depend on nothing but these."""
    root = ix.root
    if root is not None:
        origin = root.start_ns - off_ns.get(id(root.resource), 0)
    else:
        origin = min(s.start_ns - off_ns.get(id(s.resource), 0) for s in ix.spans)

    def ms(span: Span, t: int) -> float:
        return (t - off_ns.get(id(span.resource), 0) - origin) / 1e6

    path = critical_path(ix, ms)
    problems = list(ix.problems)
    required = sc.REQUIRED_SPANS.get(ix.mode, ())
    absent = [n for n in required if n not in ix.by_name]
    problems += [f"missing span {n}" for n in absent]
    problems += [f"missing span {n}" for n in path.missing if n not in absent]
    problems += path.problems
    found = failures.first_failure(ix, lambda s: ms(s, s.end_ns))
    failure = found if found is not None and failures.request_failed(ix) else None
    error = found.describe() if found is not None else None
    if error:
        problems.append(f"failed: {error}")

    # TTFT only when the proxy saw a first token (a failed request has none)
    ttft = path.end_ms if root is not None and path.first_token and path.segments else None
    attr_ttft = None
    if root is not None:
        v = root.attributes.get(sc.TTFT_MS)
        if v is not None:
            try:
                attr_ttft = float(v)
            except (TypeError, ValueError):
                attr_ttft = None
        if ttft is not None and attr_ttft is not None and abs(attr_ttft - ttft) > 1.0:
            problems.append(f"{sc.TTFT_MS}={attr_ttft:.3f} differs from the first_token event")
    out_tokens = ix.int_attr(sc.OUTPUT_TOKENS, sc.SPAN_REQUEST)
    tpot = None
    if ttft is not None and out_tokens and out_tokens > 1 and root is not None:
        tpot = max(ms(root, root.end_ns) - ttft, 0.0) / (out_tokens - 1)
    prompt = ix.int_attr(sc.PROMPT_TOKENS, sc.SPAN_REQUEST, sc.SPAN_PREFILL, sc.SPAN_DECODE)
    n_load = load.at(root.start_ns) if root is not None else 0

    views: list[SpanView] = []
    lanes: list[str] = []
    if with_spans:
        owners = path.on_path
        lane_role: dict[str, str] = {}
        ranked = ranked_instances(ix.spans)  # several TP ranks: a lane per rank
        for s in sorted(ix.spans, key=lambda s: s.start_ns):
            res = s.resource
            lane = lane_of(s, res.instance in ranked)
            if lane not in lane_role:
                lane_role[lane] = role_of(s)
            err = ""
            if s.status_code == STATUS_ERROR:
                err = str(s.attributes.get(sc.ERROR_TYPE) or s.status_message or "error")
            start = ms(s, s.start_ns)
            views.append(
                SpanView(
                    name=s.name,
                    service=res.service,
                    instance=res.instance,
                    lane=lane,
                    start_ms=start,
                    duration_ms=(s.end_ns - s.start_ns) / 1e6,
                    on_critical_path=s.span_id in owners or s is root,
                    status=_STATUS_NAMES.get(s.status_code, "unset"),
                    attributes=s.attributes,
                    span_id=s.span_id,
                    parent_id=s.parent_id,
                    host=res.host,
                    pid=res.pid,
                    error=err,
                )
            )
        lanes = sorted(lane_role, key=lambda ln: lane_sort_key(ln, lane_role[ln]))
    # complete = the trace is whole (a failure is reported in `error`, not here)
    complete = ix.mode in sc.REQUIRED_SPANS and not absent and not path.missing and ttft is not None
    return RequestAnalysis(
        trace_id=ix.trace_id,
        request_id=ix.request_id,
        mode=ix.mode,
        prompt_tokens=prompt,
        output_tokens=out_tokens,
        ttft_ms=ttft,
        tpot_ms=tpot,
        start_unix_ms=origin / 1e6,
        load=n_load,
        bucket=bucket_label(prompt, buckets),
        critical_path=path.segments,
        hidden=path.hidden,
        spans=views,
        complete=complete,
        problems=problems,
        load_bucket=load_label(n_load, load_buckets) if root is not None else "unknown",
        rendezvous_first=path.rendezvous_first,
        error=error,
        failure=failure,
        proxy_seen=root is not None,
        lanes=lanes,
        ttft_attr_ms=attr_ttft,
        engine_phases_ms=engine_phases(ix),
        prefill_steps=ix.int_attr(sc.PREFILL_STEPS, sc.SPAN_PREFILL),
        sampler=_sampler(root),
        sampling_ratio=_sampling_ratio(root),
    )


def _sampler(root: Span | None) -> str | None:
    value = root.attributes.get(sc.SAMPLER) if root is not None else None
    return value if isinstance(value, str) and value else None


def _sampling_ratio(root: Span | None) -> float | None:
    """The root's tracedpush.sampler.ratio, if it is a probability above 0."""
    value = root.attributes.get(sc.SAMPLER_RATIO) if root is not None else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0.0 < value <= 1.0 else None
