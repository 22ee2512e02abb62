"""Render a `RunAnalysis` as readable text tables (the `table` format of the report)."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tracedpush.analysis import phases as ph
from tracedpush.analysis import skew
from tracedpush.analysis.columns import columns_of
from tracedpush.analysis.compare import (
    ALL,
    Comparison,
    ComparisonGroup,
    compare,
    describe_group,
    explain_delta,
)
from tracedpush.analysis.failures import FailureSummary
from tracedpush.analysis.report_json import tuning_changed
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain monospace table; numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows) if rows else False
        for i in range(len(headers))
    ]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if numeric[i] else c.ljust(widths[i]) for i, c in enumerate(row)
        ).rstrip()

    lines = [fmt(list(headers)), fmt(["-" * w for w in widths])]
    lines += [fmt(row) for row in cells]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}"
    return str(v)


def _account_header(first: str, a: str, b: str) -> list[str]:
    """Columns of a "where the difference goes" table (means add up; p50s do not)."""
    return [
        first,
        f"{a} mean",
        f"{b} mean",
        f"{a} - {b} mean",
        f"{a} p50",
        f"{b} p50",
        f"{a} - {b} p50",
    ]


def _remainder_row(remainder: float | None) -> list[Any]:
    return ["(p50s do not add: remainder)", None, None, None, None, None, remainder]


def _section(title: str, body: str) -> str:
    return f"{title}\n{'=' * len(title)}\n{body}\n"


def render(run: RunAnalysis, *, slowest: int = 10, cmp: Comparison | None = None) -> str:
    cmp = cmp or compare(run)
    out = [_summary(run)]
    failed = _failures(run.failures())
    if failed:
        out.append(failed)
    out.append(_offsets(run))
    if run.requests:
        out.append(_comparison(cmp, run.sampling().short()))
        overall = cmp.overall
        for g in ([overall] if overall is not None else []) + cmp.by_load():
            if g.account is not None:
                out.append(_delta(cmp, g))
        out.append(_phases(cmp))
        for g in ([overall] if overall is not None else []) + cmp.by_load():
            if g.tpot_account is not None:
                out.append(_tpot_delta(cmp, g))
        out.append(_slowest(run, slowest))
    if run.engine_steps:
        out.append(_engine_steps(run))
        out.append(_contention(run))
        problems = _problems(run)
        if problems:
            out.append(problems)
    health = run.export_health()
    if health:
        out.append(_section("Trace completeness", "\n".join(health.lines())))
    return "\n".join(out)


def _summary(run: RunAnalysis) -> str:
    st = run.stats
    cols = columns_of(run)
    modes = Counter(cols.mode)
    complete = int(cols.complete.sum())
    lines = [
        f"source: {run.source}",
        f"requests: {len(run.requests)} ("
        + ", ".join(f"{m} {n}" for m, n in sorted(modes.items()))
        + f"); complete traces: {complete}",
        *_sampling(run),
        _accounting(run.failures()),
        f"loaded: {st.files} files, {st.lines_read} lines, {st.spans} spans; "
        f"skipped malformed: {st.malformed}; partial lines pending: {st.partial}; "
        f"duplicates dropped: {st.duplicates}"
        + (f"; HTTP requests: {st.fetches} ({st.fetch_errors} failed)" if st.fetches else ""),
        "clock skew: "
        + ("corrected" if run.skew_corrected else "NOT corrected (--no-skew-correction)"),
    ]
    changed = tuning_changed()
    if changed:
        lines.append("tuning: " + ", ".join(changed))
    if st.errors:
        lines.append(f"last loading problem: {st.errors[-1]}")
    return _section("tracedpush report", "\n".join(lines))


def _sampling(run: RunAnalysis) -> list[str]:
    """The sampling line ("sampled at 1% ..."), when the proxy recorded its sampler."""
    sampling = run.sampling()
    return [sampling.describe()] if sampling.ratios or sampling.samplers else []


def _accounting(f: FailureSummary) -> str:
    """One line: how many requests failed, where, and what else is not whole."""
    legs = ", ".join(f"{leg} {n}" for leg, n in f.by_leg().items())
    return (
        f"failed: {f.total}"
        + (f" ({legs})" if legs else "")
        + f"; answered despite a failed span: {f.recovered}"
        + f"; incomplete traces (not failed): {f.incomplete}"
        + f"; without the proxy's span: {f.no_proxy_span}"
    )


def _failures(f: FailureSummary, examples: int = 5) -> str:
    """Failed requests by (leg, type), the first few with their message; plus requests
    whose trace lost spans. Empty when every request was answered with a whole trace."""
    if not f.failed and not f.incomplete:
        return ""
    parts = []
    if f.failed:
        parts.append(table(["leg", "type", "requests"], [list(t) for t in f.by_leg_and_type()]))
        shown = f.examples(examples)
        rows = [
            [
                r.request_id[:32],
                r.trace_id[:16],
                r.mode,
                r.failure.leg,
                r.failure.type,
                r.failure.span,
                r.failure.at_ms,
                " ".join(r.failure.message.split())[:90] or "-",
            ]
            for r in shown
        ]
        h = ["request", "trace", "mode", "leg", "type", "span", "at ms", "message"]
        parts.append(
            f"examples ({len(shown)} of {f.total}; every one is in --format json as "
            "requests[].failure):\n" + table(h, rows)
        )
    if f.incomplete:
        missing = ", ".join(f"{name} {n}" for name, n in list(f.missing_spans.items())[:8])
        parts.append(
            f"{f.incomplete} request(s) the proxy saw did not fail but have an incomplete "
            "trace" + (f"; missing spans: {missing}" if missing else "")
        )
    title = f"Failed requests ({f.total} of {f.requests})"
    return _section(title, "\n\n".join(parts))


def _offsets(run: RunAnalysis) -> str:
    rows = []
    for name, o in sorted(run.clock_offsets.items(), key=lambda kv: (not kv[1].reference, kv[0])):
        if o.reference:
            note = "reference (proxy clock)"
        elif o.pairs == 0:
            note = "no causal pairs: not corrected"
        elif o.stretch_pairs:
            note = f"moved: from the stretches with most pairs ({o.stretch_pairs})"
        elif not o.consistent:
            note = "evidence contradicts itself"
        elif o.host_clock:
            note = "on the same host: one clock" + (
                "" if o.offset_ms == 0.0 else " with its host's offset"
            )
        elif o.lo_ms <= 0.0 <= o.hi_ms:
            note = "0 is consistent with the evidence" + (
                "" if o.offset_ms == 0.0 else " (midpoint applied)"
            )
        else:
            note = "midpoint of the evidence"
        lo = None if o.lo_ms == float("-inf") else o.lo_ms
        hi = None if o.hi_ms == float("inf") else o.hi_ms
        bound = None if o.bound_ms == float("inf") else o.bound_ms
        rows.append([name, o.host, o.offset_ms, bound, lo, hi, o.pairs, note])
    body = table(
        ["instance", "host", "offset ms", "+/- ms", "lo ms", "hi ms", "pairs", "note"], rows
    )
    moved = sorted(skew.outside(run.clock_offsets, run.clock_windows))
    if moved:
        body += "\n\n" + _offsets_over_time(run, moved)
    return _section("Clock offsets (corrected = raw - offset)", body)


def _offsets_over_time(run: RunAnalysis, moved: list[str]) -> str:
    """The windows' offsets of the instances whose clock moved (`skew.outside`)."""
    rows = []
    for w in run.clock_windows:
        row: list[Any] = [_utc(w.start_unix_ms), _utc(w.end_unix_ms), w.requests]
        row += [skew.window_cell(w.offsets.get(x), run.clock_offsets[x].offset_ms) for x in moved]
        rows.append(row)
    off, total = skew.misplaced(run.clock_offsets, run.clock_windows)
    note = (
        f"The clock of {', '.join(moved)} moved during the run: estimated from each "
        "stretch alone (requests by their proxy root's start), the run's one offset is "
        "outside the evidence where marked !. Results use one offset per instance, for a "
        "moved clock that of the stretches with the most pairs (its lo/hi above), so "
        f"the {off:,} of {total:,} requests ({_share(off, total)}) where marked are off by "
        "about the difference; look for a clock step (NTP) at that time."
    )
    head = ["from (UTC)", "to (UTC)", "requests", *[f"{x} ms" for x in moved]]
    return textwrap.fill(note, 100) + "\n" + table(head, rows)


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _utc(unix_ms: float) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _stat(g: ComparisonGroup, what: str, mode: str, q: str) -> float | None:
    d = (g.ttft if what == "ttft" else g.tpot).get(mode) or {}
    return d.get(q)


def _comparison(cmp: Comparison, sampled: str = "") -> str:
    a, b = cmp.a, cmp.b
    rows = []
    for g in cmp.groups:
        if g.bucket != ALL and g.load != ALL:
            continue  # cells are in the JSON; the table keeps to the margins
        rows.append(
            [
                g.bucket,
                g.load,
                g.n.get(a, 0),
                g.n.get(b, 0),
                _stat(g, "ttft", a, "p50"),
                _stat(g, "ttft", b, "p50"),
                _stat(g, "ttft", a, "p90"),
                _stat(g, "ttft", b, "p90"),
                _stat(g, "ttft", a, "p99"),
                _stat(g, "ttft", b, "p99"),
                _stat(g, "tpot", a, "p50"),
                _stat(g, "tpot", b, "p50"),
                _stat(g, "tpot", a, "p90"),
                _stat(g, "tpot", b, "p90"),
                g.ttft_mean_delta_ms,
            ]
        )
    h = [
        "prompt",
        "load",
        f"n {a}",
        f"n {b}",
        f"TTFT p50 {a}",
        f"p50 {b}",
        f"p90 {a}",
        f"p90 {b}",
        f"p99 {a}",
        f"p99 {b}",
        f"TPOT p50 {a}",
        f"p50 {b}",
        f"p90 {a}",
        f"p90 {b}",
        f"mean TTFT {b}-{a}",
    ]
    title = f"{a} vs {b} (ms) by prompt length and load (in flight at receipt)"
    return _section(title + (f"; {sampled}" if sampled else ""), table(h, rows))


def _delta(cmp: Comparison, g: ComparisonGroup) -> str:
    """The TTFT difference a - b of one group, phase by phase (means add up; p50s are
    beside them), with `unattributed` always shown and the sentence explaining it."""
    acc = g.account
    assert acc is not None
    a, b = cmp.a, cmp.b
    rows: list[list[Any]] = [
        [r.phase, r.a_mean_ms, r.b_mean_ms, r.mean_delta_ms, r.a_p50_ms, r.b_p50_ms, r.p50_delta_ms]
        for r in acc.rows
        if r.phase == ph.UNATTRIBUTED
        or abs(r.mean_delta_ms) >= 0.005
        or abs(r.p50_delta_ms or 0.0) >= 0.005
    ]
    ta, tb = g.ttft.get(a) or {}, g.ttft.get(b) or {}
    rows.append(
        [
            "= TTFT",
            ta.get("mean"),
            tb.get("mean"),
            acc.ttft_mean_delta_ms,
            ta.get("p50"),
            tb.get("p50"),
            acc.ttft_p50_delta_ms,
        ]
    )
    rows.append(_remainder_row(acc.p50_remainder_ms))
    h = _account_header("phase (critical path)", a, b)
    n = f"n {a} {g.n.get(a, 0)}, {b} {g.n.get(b, 0)}"
    title = f"Where the TTFT difference goes ({describe_group(g)}; {a} - {b}, ms; {n})"
    return _section(title, explain_delta(g, a, b) + "\n" + table(h, rows))


def _phases(cmp: Comparison) -> str:
    g = cmp.overall
    if g is None:
        return ""
    phases: list[str] = []
    for m in (cmp.a, cmp.b):
        for p in g.phases.get(m, {}):
            if p not in phases:
                phases.append(p)
    rows = []
    for p in phases:
        row: list[Any] = [p]
        for m in (cmp.a, cmp.b):
            s = g.phases.get(m, {}).get(p) or {}
            row += [s.get("p50"), s.get("p90")]
        rows.append(row)
    h = ["phase", f"{cmp.a} p50", f"{cmp.a} p90", f"{cmp.b} p50", f"{cmp.b} p90"]
    return _section(
        "Critical-path phases (ms; 0 where a request did not have the phase)", table(h, rows)
    )


def _top_phases(r: RequestAnalysis, n: int = 3) -> str:
    top = sorted(r.phase_ms().items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{p} {ms:.1f}" for p, ms in top)


def _slowest(run: RunAnalysis, n: int) -> str:
    rows = [
        [
            r.trace_id[:16],
            r.request_id[:24],
            r.mode,
            r.prompt_tokens,
            r.load,
            r.ttft_ms,
            r.tpot_ms,
            _top_phases(r),
            "yes" if r.complete else f"no ({len(r.problems)})",
        ]
        for r in run.slowest(n)
    ]
    h = [
        "trace",
        "request",
        "mode",
        "prompt",
        "load",
        "TTFT ms",
        "TPOT ms",
        "largest phases (ms)",
        "complete",
    ]
    return _section(f"Slowest {len(rows)} requests", table(h, rows))


def _problems(run: RunAnalysis) -> str:
    counts: Counter[str] = Counter()
    for problems in columns_of(run).problems:
        for p in problems:
            counts[p.split(" (largest")[0] if p.startswith("clamped") else p] += 1
    if not counts:
        return ""
    rows = [[p[:100], n] for p, n in counts.most_common(10)]
    return _section("Problems (requests affected)", table(["problem", "requests"], rows))


def _tpot_delta(cmp: Comparison, g: ComparisonGroup) -> str:
    """The TPOT difference a - b of one group per mechanism (tpot_breakdown_ms)."""
    from tracedpush.analysis.tpot import explain_tpot_delta

    acc = g.tpot_account
    assert acc is not None
    a, b = cmp.a, cmp.b
    rows: list[list[Any]] = [
        [
            r.mechanism,
            r.a_mean_ms,
            r.b_mean_ms,
            r.mean_delta_ms,
            r.a_p50_ms,
            r.b_p50_ms,
            r.p50_delta_ms,
        ]
        for r in acc.rows
    ]
    rows.append(
        [
            "= TPOT",
            acc.a_tpot_mean_ms,
            acc.b_tpot_mean_ms,
            acc.tpot_mean_delta_ms,
            None,
            None,
            acc.tpot_p50_delta_ms,
        ]
    )
    rows.append(_remainder_row(acc.p50_remainder_ms))
    h = _account_header("mechanism", a, b)
    n = f"n {a} {acc.n.get(a, 0)}, {b} {acc.n.get(b, 0)}"
    title = f"Where the TPOT difference goes ({describe_group(g)}; {a} - {b}, ms; {n})"
    text = explain_tpot_delta(acc, a, b, where=describe_group(g))
    return _section(title, text + "\n" + table(h, rows))


def _engine_steps(run: RunAnalysis) -> str:
    assert run.engine_steps is not None
    rows = [
        [
            eid,
            d["role"],
            d["host"],
            d["steps"],
            d["busy_steps"],
            d["median_busy_step_ms"],
            d["solo_forward_ms"],
            d["step_ms_total"],
            None if d["connector_share"] is None else 100.0 * d["connector_share"],
            d["loads_started"],
            d["loads_finished"],
        ]
        for eid, d in run.steps_summary().items()
    ]
    h = [
        "engine",
        "role",
        "host",
        "steps",
        "busy",
        "median busy step ms",
        "solo forward ms",
        "step ms total",
        "connector %",
        "loads started",
        "loads finished",
    ]
    return _section("Engine steps (per engine, from engine.steps)", table(h, rows))


def _contention(run: RunAnalysis, top: int = 15) -> str:
    c = run.contention()
    if not c:
        return _section("Contention", "no thread samples (engine.threads) in these traces")
    lines = [f"- {f.text}" for f in c.findings] or ["- no contention found"]
    cost = c.cost
    ratio = cost.thread_ratio
    lines.append(
        f"- tracedpush's own threads used {cost.tracedpush_cpu_ms / 1000.0:.2f} s of CPU, "
        + ("-" if ratio is None else f"{100.0 * ratio:.2f}%")
        + f" of the engine processes' {cost.engine_cpu_ms / 1000.0:.1f} s; hooks recorded "
        f"{cost.events} events on engine threads"
    )
    rows = []
    for t in c.threads[:top]:
        if t.cpu_ms <= 0:
            continue
        share = t.busy_core_share() or t.core_share()
        cores = ", ".join(f"{core}: {100.0 * v:.0f}%" for core, v in share.items())
        rows.append(
            [
                t.engine_id,
                t.process,
                t.pid,
                t.name[:28],
                t.role,
                t.cpu_ms / 1000.0,
                t.cpu_wait_ms / 1000.0 if t.wait_known else None,
                cores,
                t.affinity,
            ]
        )
    h = [
        *("engine", "process", "pid", "thread", "role", "CPU s", "wait s"),
        *("cores (busy samples)", "affinity"),
    ]
    body = "\n".join(lines) + "\n\n" + table(h, rows)
    title = "Contention (CPU per thread over the run, and its wait for one, from engine.threads)"
    return _section(title, body)
