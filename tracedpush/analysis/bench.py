"""Benchmark results joined to their traces: the client's numbers beside the spans'.

A sweep (``tracedpush bench sweep``) or vLLM's own ``vllm bench serve`` measures TTFT and
TPOT at the client; the traces say where each request's time went. `join` matches every
row of every result file to its trace by request id (the client's X-Request-Id, which
the proxy records), groups the rows into cells (input length x QPS) and modes, and per
cell puts push and pull side by side: the client's percentiles and their ratio, how well
the client's TTFT agrees with the proxy's, and the phase account of the TTFT difference
over the joined requests (`compare`'s machinery, so the deltas add up to the mean).

Ids: our result files carry them (``request_ids``). vLLM's own file does not: row ``i``
was sent as ``<prefix><i>``; the prefix is given, or inferred from the trace ids (the
candidate matching the most rows; ties broken by prompt length, then by TTFT
agreement; a near tie is said, an exact one refused). vLLM's ready check and warm-up
re-send row 0's id: an id with several traces takes the one whose TTFT is closest to the
client's, and is counted.

Pure Python (no vLLM, pandas or Streamlit): ``report --bench`` and the console use it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracedpush.analysis.bench_results import BenchResult, BenchRow, rate_text
from tracedpush.analysis.compare import ALL, TtftAccount, group, percentile, summary
from tracedpush.analysis.model import round_ms
from tracedpush.analysis.report import table
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis
from tracedpush.analysis.tpot import TpotAccount, explain_tpot_delta
from tracedpush.analysis.words import delta_sentence

JSON_VERSION = 1
A, B = "push", "pull"  # the account is a - b, ratios a / b
UNKNOWN = "unknown"
EXAMPLES = 5  # ids listed per kind of problem
TOP_PHASES = 5  # phases listed per cell in the text table
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")

# How a file's request ids were obtained.
IDS = "ids"  # the file's own request_ids
FILE_PREFIX = "file"  # the prefix in our block
GIVEN = "given"  # --request-id-prefix
INFERRED = "inferred"  # from the traces
NONE = "none"


# ------------------------------------------------------------------ data


@dataclass(slots=True)
class PrefixGuess:
    """The prefix inferred for one file, and how sure that is."""

    prefix: str | None  # None: no candidate, or an exact tie
    matched: int  # rows whose prefix + index is a trace's request id
    note: str  # "" when clear; else why it is not (near tie, exact tie, no candidate)
    candidates: list[tuple[str, int, float | None]]  # (prefix, rows matched, median |gap| ms)


@dataclass(slots=True)
class FileJoin:
    """One result file's rows and the trace each was matched to (None: not found)."""

    result: BenchResult
    mode: str  # the file's mode, else the majority of its joined traces, else "unknown"
    mode_source: str  # "file" | "traces" | "none"
    prefix: str | None
    prefix_source: str  # IDS | FILE_PREFIX | GIVEN | INFERRED | NONE
    prefix_note: str
    requests: list[RequestAnalysis | None]  # aligned with result.rows
    duplicates: list[str]  # ids that matched several traces (warm-up, ready check)
    duplicate_traces: int  # traces left over by those
    mode_mismatches: int  # joined traces whose mode is not the file's
    guess: PrefixGuess | None = None

    @property
    def joined(self) -> int:
        return sum(r is not None for r in self.requests)

    def pairs(self) -> Iterable[tuple[BenchRow, RequestAnalysis]]:
        for row, req in zip(self.result.rows, self.requests, strict=True):
            if req is not None:
                yield row, req

    def unjoined(self) -> list[str]:
        """Each row not joined, by id or, without one, ``<file>[<row>]``."""
        return [
            row.request_id or f"{self.result.name}[{row.index}]"
            for row, req in zip(self.result.rows, self.requests, strict=True)
            if req is None
        ]


@dataclass(slots=True)
class Agreement:
    """Client TTFT vs the proxy's (receipt -> first token sent), over joined requests:
    gap = (client - span) / client. The client's includes its own HTTP stack, the
    network both ways and any wait for a CPU, so a small positive gap is expected.

    Where the client shared the proxy's clock (`ClientClock`), the gap is measured in its
    two parts, per request: **send** (the client sent -> the proxy received) and
    **receive** (the proxy sent the first token -> the client had it). Both are >= 0 by
    causality; a request where either is not (beyond the clock readings' slack) is
    *outside*: its trace is not the request the client sent (a wrong join), or the
    proxy's window is wrong."""

    n: int
    median_gap_pct: float | None
    median_abs_gap_pct: float | None
    median_abs_gap_ms: float | None
    legs_n: int = 0  # joined rows whose client shared the proxy's clock
    median_send_ms: float | None = None
    median_receive_ms: float | None = None
    max_send_ms: float | None = None
    max_receive_ms: float | None = None
    outside: list[str] = field(default_factory=list)  # request ids (see above)

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "median_gap_pct": _round(self.median_gap_pct, 2),
            "median_abs_gap_pct": _round(self.median_abs_gap_pct, 2),
            "median_abs_gap_ms": round_ms(self.median_abs_gap_ms),
            "legs_n": self.legs_n,
            "median_send_ms": round_ms(self.median_send_ms),
            "median_receive_ms": round_ms(self.median_receive_ms),
            "max_send_ms": round_ms(self.max_send_ms),
            "max_receive_ms": round_ms(self.max_receive_ms),
            "outside": len(self.outside),
            "outside_examples": self.outside[:EXAMPLES],
        }


# Two clock readings taken together differ by well under this (bench.clock.reading).
CLOCK_SLACK_MS = 0.05


def client_legs(
    sent_unix_ms: float, client_ttft_ms: float, receipt_unix_ms: float, span_ttft_ms: float
) -> tuple[float, float]:
    """(client sent -> proxy receipt, proxy's first token -> client's first token) in ms,
    for a client and proxy on one clock. They add up to client TTFT - span TTFT."""
    send = receipt_unix_ms - sent_unix_ms
    return send, client_ttft_ms - span_ttft_ms - send


def _legs(files: Sequence[FileJoin]) -> tuple[list[float], list[float], list[str]]:
    """Each joined successful row's two legs, and the rows outside (see `Agreement`)."""
    sends: list[float] = []
    receives: list[float] = []
    outside: list[str] = []
    for f in files:
        clock = f.result.clock
        if clock is None:
            continue
        slack = CLOCK_SLACK_MS + clock.drift_ms
        for row, r in f.pairs():
            if not row.ok or row.start_s is None or r.ttft_ms is None:
                continue
            send, receive = client_legs(
                clock.unix_ms(row.start_s), _client_ttft(row), r.start_unix_ms, r.ttft_ms
            )
            sends.append(send)
            receives.append(receive)
            if min(send, receive) < -slack:
                outside.append(r.request_id)
    return sends, receives, outside


@dataclass(slots=True)
class ModeCell:
    """One mode in one cell: what the client measured and what the traces say."""

    mode: str
    files: list[str]
    sent: int
    succeeded: int
    joined: int
    client_ttft_ms: dict[str, float | None]  # p50/p90/p99/mean/n over successful rows
    client_tpot_ms: dict[str, float | None]
    span_ttft_ms: dict[str, float | None]  # over joined requests with a TTFT
    span_tpot_ms: dict[str, float | None]
    agreement: Agreement
    typical: tuple[BenchRow, RequestAnalysis, str] | None  # (row, request, file name)
    pairs: list[tuple[BenchRow, RequestAnalysis]] = field(default_factory=list, repr=False)

    @property
    def joined_fraction(self) -> float | None:
        return self.joined / self.sent if self.sent else None

    def to_json(self) -> dict[str, Any]:
        typical = None
        if self.typical is not None:
            row, req, name = self.typical
            typical = {
                "trace_id": req.trace_id,
                "request_id": req.request_id,
                "file": name,
                "row": row.index,
                "client_ttft_ms": round_ms(_ms(row.ttft_s)),
                "span_ttft_ms": round_ms(req.ttft_ms),
            }
        return {
            "files": self.files,
            "sent": self.sent,
            "succeeded": self.succeeded,
            "joined": self.joined,
            "joined_fraction": _round(self.joined_fraction, 4),
            "client_ttft_ms": _summary_json(self.client_ttft_ms),
            "client_tpot_ms": _summary_json(self.client_tpot_ms),
            "span_ttft_ms": _summary_json(self.span_ttft_ms),
            "span_tpot_ms": _summary_json(self.span_tpot_ms),
            "agreement": self.agreement.to_json(),
            "typical": typical,
        }


@dataclass(slots=True)
class BenchCell:
    """One (input length, QPS) cell: push vs pull."""

    input_len: int | None
    qps: float | None  # None: every request at once ("inf")
    modes: dict[str, ModeCell]  # push, pull first
    ratios: dict[str, dict[str, float | None]] | None  # {"ttft"|"tpot": {p50..}}: a / b
    account: TtftAccount | None  # a - b over joined requests, phase by phase
    client_ttft_mean_delta_ms: float | None  # a - b of the client's mean, joined rows
    explanation: str
    tpot_account: TpotAccount | None
    tpot_explanation: str | None

    @property
    def label(self) -> str:
        return f"in{_text(self.input_len)} qps{_rate(self.qps)}"

    @property
    def title(self) -> str:
        """ "2 QPS, 1024-token prompts"."""
        n = "unknown-length" if self.input_len is None else f"{self.input_len}-token"
        return f"{_rate(self.qps)} QPS, {n} prompts"

    @property
    def where(self) -> str:
        """For sentences: "at 2 QPS with 1024-token prompts"."""
        return "at " + self.title.replace(", ", " with ")

    def to_json(self) -> dict[str, Any]:
        return {
            "input_len": self.input_len,
            "qps": self.qps,
            "label": self.label,
            "modes": {m: c.to_json() for m, c in self.modes.items()},
            "ratios": None
            if self.ratios is None
            else {k: {q: _round(v, 4) for q, v in d.items()} for k, d in self.ratios.items()},
            "ttft_account": None if self.account is None else self.account.to_json(),
            "client_ttft_mean_delta_ms": round_ms(self.client_ttft_mean_delta_ms),
            "explanation": self.explanation,
            "tpot_account": None if self.tpot_account is None else self.tpot_account.to_json(),
            "tpot_explanation": self.tpot_explanation,
        }


@dataclass(slots=True)
class BenchJoin:
    """Every result file joined to one run of traces, and the cells they make."""

    files: list[FileJoin]
    cells: list[BenchCell]
    source: str  # where the traces came from
    traces: int  # requests in the traces
    skipped: list[str] = field(default_factory=list)  # files under a directory not read
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(len(f.result.rows) for f in self.files)

    @property
    def joined(self) -> int:
        return sum(f.joined for f in self.files)

    @property
    def joined_fraction(self) -> float | None:
        return self.joined / self.rows if self.rows else None

    def cell(self, input_len: int | None, qps: float | None) -> BenchCell | None:
        return next((c for c in self.cells if (c.input_len, c.qps) == (input_len, qps)), None)

    def unjoined(self) -> list[str]:
        return [x for f in self.files for x in f.unjoined()]

    def duplicates(self) -> list[str]:
        return [x for f in self.files for x in f.duplicates]

    def claimed(self) -> Counter[str]:
        """Trace id -> rows joined to it (above 1: files share ids)."""
        return Counter(r.trace_id for f in self.files for _, r in f.pairs())

    def to_json(self) -> dict[str, Any]:
        """The documented JSON (docs/report.md, "Benchmark results")."""
        claimed = self.claimed()
        dups = self.duplicates()
        unjoined = self.unjoined()
        totals = {
            "files": len(self.files),
            "rows": self.rows,
            "succeeded": sum(sum(r.ok for r in f.result.rows) for f in self.files),
            "joined": self.joined,
            "joined_fraction": _round(self.joined_fraction, 4),
            "unjoined": len(unjoined),
            "unjoined_examples": unjoined[:EXAMPLES],
            "traces": self.traces,
            "traces_unclaimed": self.traces - len(claimed),
            "reused_traces": sum(1 for n in claimed.values() if n > 1),
            "duplicate_ids": len(dups),
            "duplicate_examples": dups[:EXAMPLES],
            "duplicate_traces": sum(f.duplicate_traces for f in self.files),
            "mode_mismatches": sum(f.mode_mismatches for f in self.files),
            "prefixes": [_prefix_json(f) for f in self.files if f.prefix_source != IDS],
        }
        return {
            "version": JSON_VERSION,
            "source": self.source,
            "a": A,
            "b": B,
            "totals": totals,
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "files": [_file_json(f) for f in self.files],
            "cells": [c.to_json() for c in self.cells],
        }


# ------------------------------------------------------------------ joining


def join(
    results: Sequence[BenchResult],
    run: RunAnalysis,
    prefix: str | None = None,
    *,
    skipped: Sequence[str] = (),
) -> BenchJoin:
    """Match every row of `results` to its request in `run` and build the cells.

    `prefix`: the ``--request-id-prefix`` of files without ids (overrides our block's
    and inference). `skipped`: messages from `load_results`, carried to the output.
    """
    by_id: dict[str, list[RequestAnalysis]] = {}
    for r in run.requests:
        by_id.setdefault(r.request_id, []).append(r)
    # files with explicit ids first: their traces are not candidates for inference
    order = sorted(range(len(results)), key=lambda i: not _explicit(results[i], prefix))
    joined: dict[int, FileJoin] = {}
    taken: set[str] = set()
    for i in order:
        fj = _join_file(results[i], run, by_id, prefix, taken)
        taken.update(r.trace_id for _, r in fj.pairs())
        joined[i] = fj
    files = [joined[i] for i in range(len(results))]
    notes = _notes(files)
    return BenchJoin(
        files=files,
        cells=_cells(files),
        source=run.source,
        traces=len(run.requests),
        skipped=list(skipped),
        notes=notes,
    )


def _explicit(res: BenchResult, prefix: str | None) -> bool:
    return res.has_ids or prefix is not None or res.request_id_prefix is not None


def _join_file(
    res: BenchResult,
    run: RunAnalysis,
    by_id: dict[str, list[RequestAnalysis]],
    prefix: str | None,
    taken: set[str],
) -> FileJoin:
    guess = None
    if res.has_ids:
        source, used, note = IDS, None, ""
    elif prefix is not None:
        source, used, note = GIVEN, prefix, ""
    elif res.request_id_prefix is not None:
        source, used, note = FILE_PREFIX, res.request_id_prefix, ""
    else:
        guess = infer_prefix(res, run, exclude=taken)
        source, used, note = (
            (INFERRED if guess.prefix is not None else NONE),
            guess.prefix,
            guess.note,
        )
    if used is not None:
        res = res.with_prefix(used)
    requests: list[RequestAnalysis | None] = []
    dups: list[str] = []
    extra = 0
    for row in res.rows:
        cands = by_id.get(row.request_id, []) if row.request_id is not None else []
        free = [c for c in cands if c.trace_id not in taken]
        cands = free or cands  # another file's trace only when it is the sole one
        if len(cands) > 1:
            dups.append(str(row.request_id))
            extra += len(cands) - 1
        requests.append(_closest(row, cands, res.mode) if cands else None)
    modes = Counter(r.mode for r in requests if r is not None)
    if res.mode:
        mode, mode_source = res.mode, "file"
    elif modes:
        mode, mode_source = modes.most_common(1)[0][0], "traces"
    else:
        mode, mode_source = UNKNOWN, NONE
    mismatches = sum(n for m, n in modes.items() if m != mode)
    return FileJoin(
        res, mode, mode_source, used, source, note, requests, dups, extra, mismatches, guess
    )


def _closest(
    row: BenchRow, cands: Sequence[RequestAnalysis], mode: str | None = None
) -> RequestAnalysis:
    """Of several traces with one id, the one this row is: of the file's mode if any
    is, then the TTFT closest to the client's, else (a failed row) the last sent, since
    vLLM's ready check and warm-ups go before the run."""
    if len(cands) == 1:
        return cands[0]
    if mode and any(c.mode == mode for c in cands):
        cands = [c for c in cands if c.mode == mode]
    client = _client_ttft(row) if row.ok else None
    if client is None:
        return max(cands, key=lambda r: r.start_unix_ms)
    return min(
        cands,
        key=lambda r: (
            math.inf if r.ttft_ms is None else abs(r.ttft_ms - client),
            -r.start_unix_ms,
        ),
    )


def infer_prefix(res: BenchResult, run: RunAnalysis, *, exclude: Iterable[str] = ()) -> PrefixGuess:
    """The ``--request-id-prefix`` a vLLM result file was sent with, from the traces.

    Candidates are the trace request ids without their trailing digits (``str(i)``
    exactly: ``push-00007`` is not row 7). Best = most rows ``prefix + str(i)`` found;
    ties go to the closer prompt lengths (client input_len vs the trace's prompt
    tokens), then to the smaller median |client TTFT - span TTFT|. A tie decided by
    TTFT alone within a factor 2 is kept but noted; an exact tie is refused (prefix
    None), since only the right prefix can then be trusted: pass it.
    `exclude`: trace ids already joined to other files.
    """
    skip = set(exclude)
    n = len(res.rows)
    index: dict[str, dict[int, list[RequestAnalysis]]] = {}
    for r in run.requests:
        if r.trace_id in skip or (res.mode and r.mode != res.mode):
            continue
        m = _TRAILING_DIGITS.match(r.request_id)
        if m is None:
            continue
        digits = m.group(2)
        i = int(digits)
        if str(i) != digits or i >= n:
            continue
        index.setdefault(m.group(1), {}).setdefault(i, []).append(r)
    if not index:
        return PrefixGuess(None, 0, "no trace request id looks like <prefix><row>", [])
    scored = []
    for p, found in index.items():
        lens, gaps = [], []
        for i, rs in found.items():
            row = res.rows[i]
            r = _closest(row, rs, res.mode)
            if row.input_len is not None and r.prompt_tokens is not None:
                lens.append(abs(row.input_len - r.prompt_tokens))
            if row.ok and r.ttft_ms is not None:
                gaps.append(abs(_client_ttft(row) - r.ttft_ms))
        scored.append((p, len(found), _median(lens), _median(gaps)))
    # most rows, then closest prompt lengths, then closest TTFTs; names break exact ties
    scored.sort(key=lambda s: (-s[1], _inf(s[2]), _inf(s[3]), s[0]))
    cands = [(p, k, g) for p, k, _, g in scored]
    best, *rest = scored
    note = ""
    if rest:
        second = rest[0]
        if (best[1], best[2], best[3]) == (second[1], second[2], second[3]):
            return PrefixGuess(
                None,
                0,
                f"ambiguous: {best[0]!r} and {second[0]!r} fit equally "
                f"({best[1]} rows each): pass --request-id-prefix",
                cands,
            )
        if (best[1], best[2]) == (second[1], second[2]):
            g1, g2 = _inf(best[3]), _inf(second[3])
            if g2 < 2 * g1 + 1.0:
                note = (
                    f"near tie: {best[0]!r} over {second[0]!r} ({best[1]} rows each) "
                    f"by TTFT agreement only (median |gap| {g1:.1f} vs {g2:.1f} ms)"
                )
    return PrefixGuess(best[0], best[1], note, cands)


# ------------------------------------------------------------------ cells


def _cells(files: Sequence[FileJoin]) -> list[BenchCell]:
    groups: dict[tuple[int | None, float | None], dict[str, list[FileJoin]]] = {}
    for f in files:
        key = (f.result.input_len, f.result.qps)
        groups.setdefault(key, {}).setdefault(f.mode, []).append(f)
    keys = sorted(groups, key=lambda k: (_inf(k[0]), _inf(k[1])))
    return [_cell(k[0], k[1], groups[k]) for k in keys]


def _cell(
    input_len: int | None, qps: float | None, by_mode: dict[str, list[FileJoin]]
) -> BenchCell:
    order = sorted(by_mode, key=lambda m: (m != A, m != B, m))
    modes = {m: _mode_cell(m, by_mode[m]) for m in order}
    cell = BenchCell(input_len, qps, modes, None, None, None, "", None, None)
    a, b = modes.get(A), modes.get(B)
    if a is None or b is None:
        cell.explanation = f"No comparison: needs both {A} and {B} result files."
        return cell
    cell.ratios = {
        "ttft": _ratios(a.client_ttft_ms, b.client_ttft_ms),
        "tpot": _ratios(a.client_tpot_ms, b.client_tpot_ms),
    }
    with_ttft = {m: [r for _, r in modes[m].pairs if r.ttft_ms is not None] for m in (A, B)}
    g = group(ALL, ALL, with_ttft, A, B)
    cell.account, cell.tpot_account = g.account, g.tpot_account
    ca = [_client_ttft(row) for row, _ in a.pairs if row.ok]
    cb = [_client_ttft(row) for row, _ in b.pairs if row.ok]
    if ca and cb:
        cell.client_ttft_mean_delta_ms = sum(ca) / len(ca) - sum(cb) / len(cb)
    cell.explanation = explain(cell.account, cell.where)
    cell.tpot_explanation = explain_tpot_delta(cell.tpot_account, A, B, where=cell.where)
    return cell


def _mode_cell(mode: str, files: Sequence[FileJoin]) -> ModeCell:
    rows = [(row, f) for f in files for row in f.result.rows]
    ok = [row for row, _ in rows if row.ok]
    pairs = [(row, r) for f in files for row, r in f.pairs()]
    client_ttft = summary(_client_ttft(row) for row in ok)
    client_tpot = summary(row.tpot_s * 1000.0 for row in ok if row.tpot_s is not None)
    gaps = [(_client_ttft(row), r.ttft_ms) for row, r in pairs if row.ok and r.ttft_ms is not None]
    rel = sorted((c - s) / c * 100.0 for c, s in gaps if c)
    sends, receives, outside = _legs(files)
    agreement = Agreement(
        len(gaps),
        percentile(rel, 50),
        percentile(sorted(abs(x) for x in rel), 50),
        percentile(sorted(abs(c - s) for c, s in gaps), 50),
        legs_n=len(sends),
        median_send_ms=percentile(sorted(sends), 50),
        median_receive_ms=percentile(sorted(receives), 50),
        max_send_ms=max(sends, default=None),
        max_receive_ms=max(receives, default=None),
        outside=outside,
    )
    typical = None
    median = client_ttft["p50"]
    if median is not None:
        cands = [(row, r, f.result.name) for f in files for row, r in f.pairs() if row.ok]
        if cands:
            typical = min(cands, key=lambda t: abs(_client_ttft(t[0]) - median))
    return ModeCell(
        mode=mode,
        files=[f.result.name for f in files],
        sent=len(rows),
        succeeded=len(ok),
        joined=len(pairs),
        client_ttft_ms=client_ttft,
        client_tpot_ms=client_tpot,
        span_ttft_ms=summary(r.ttft_ms for _, r in pairs if r.ttft_ms is not None),
        span_tpot_ms=summary(r.tpot_ms for _, r in pairs if r.tpot_ms is not None),
        agreement=agreement,
        typical=typical,
        pairs=pairs,
    )


def _ratios(a: dict[str, float | None], b: dict[str, float | None]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in ("p50", "p90", "p99"):
        x, y = a.get(q), b.get(q)
        out[q] = x / y if x is not None and y else None
    return out


def explain(acc: TtftAccount | None, where: str, *, top: int = 3) -> str:
    """The TTFT difference push - pull of one cell in one sentence, as
    `compare.explain_delta` says it for a load bucket."""
    if acc is None:
        return f"No comparison: needs joined {A} and {B} requests with a TTFT."
    total = acc.ttft_mean_delta_ms
    p50 = "" if acc.ttft_p50_delta_ms is None else f"; p50 {acc.ttft_p50_delta_ms:+.1f} ms"
    if abs(total) < 0.05:
        head = f"{A} and {B} have the same mean TTFT {where} (within 0.05 ms{p50})"
    else:
        verb = "slower" if total > 0 else "faster"
        head = f"{A} is {abs(total):.1f} ms {verb} than {B} {where} (mean span TTFT{p50})"
    deltas = [(r.phase, r.mean_delta_ms) for r in acc.rows]
    return delta_sentence(head, deltas, total, top=top, eps=0.05, digits=1, rest="other phases")


def _notes(files: Sequence[FileJoin]) -> list[str]:
    notes = []
    for f in files:
        if f.prefix_note:
            notes.append(f"{f.result.name}: {f.prefix_note}")
        if f.mode_mismatches:
            notes.append(
                f"{f.result.name}: {f.mode_mismatches} joined traces are not {f.mode} "
                "(wrong traces or prefix?)"
            )
    by_prefix: dict[str, list[str]] = {}
    for f in files:
        if f.prefix_source == INFERRED and f.prefix is not None:
            by_prefix.setdefault(f.prefix, []).append(f.result.name)
    for p, names in by_prefix.items():
        if len(names) > 1:
            notes.append(f"prefix {p!r} inferred for several files: {', '.join(names)}")
    return notes


# ------------------------------------------------------------------ text


def render_bench(bj: BenchJoin, *, top: int = TOP_PHASES) -> str:
    """One block per cell: push vs pull TTFT/TPOT p50/p90/p99 at the client and their
    ratio, the client-vs-span agreement, the typical request, and where the TTFT
    difference goes (largest phases first) with its sentence."""
    doc = bj.to_json()
    t = doc["totals"]
    frac = "-" if t["joined_fraction"] is None else f"{t['joined_fraction'] * 100:.1f}%"
    lines = [
        f"Benchmark results: {t['files']} files, {t['rows']} requests, {t['joined']} "
        f"joined to traces ({frac}); traces: {bj.source} ({t['traces']} requests, "
        f"{t['traces_unclaimed']} in no file)",
    ]
    for p in t["prefixes"]:
        extra = f"; {p['note']}" if p["note"] else ""
        lines.append(
            f"  {p['file']}: ids {p['prefix']!r} ({p['source']}, {p['matched']}/{p['rows']} "
            f"rows found){extra}"
        )
    if t["unjoined"]:
        lines.append(f"  not joined: {t['unjoined']}, e.g. {', '.join(t['unjoined_examples'])}")
    if t["duplicate_ids"]:
        lines.append(
            f"  {t['duplicate_ids']} ids had several traces (warm-up / ready check), "
            f"closest TTFT taken: {', '.join(t['duplicate_examples'])}"
        )
    lines += [f"  note: {n}" for n in bj.notes]
    lines += [f"  skipped: {s}" for s in bj.skipped]
    for c in bj.cells:
        lines += ["", _cell_text(c, top)]
    return "\n".join(lines)


def _cell_text(c: BenchCell, top: int) -> str:
    modes = list(c.modes)
    both = c.ratios is not None
    head = ["", *modes] + ([f"{A}/{B}"] if both else [])
    rows: list[list[Any]] = []

    def add(label: str, get: Any, ratio: float | None = None) -> None:
        rows.append([label, *(get(c.modes[m]) for m in modes)] + ([ratio] if both else []))

    add("files", lambda m: ", ".join(m.files))
    add("sent / ok / joined", lambda m: f"{m.sent} / {m.succeeded} / {m.joined}")
    for what, key in (("TTFT", "ttft"), ("TPOT", "tpot")):
        for q in ("p50", "p90", "p99"):
            ratio = c.ratios[key][q] if c.ratios else None
            add(
                f"client {what} {q} ms",
                lambda m, k=key, q=q: getattr(m, f"client_{k}_ms")[q],
                None if ratio is None else round(ratio, 3),
            )
    add("span TTFT p50 ms", lambda m: m.span_ttft_ms["p50"])
    add("client - span TTFT", _agreement_text)
    add("typical request", _typical_text)
    text = f"{c.label}: {c.title}\n" + table(head, _fmt(rows))
    if c.account is not None:
        ranked = sorted(c.account.rows, key=lambda r: (-abs(r.mean_delta_ms), r.phase))
        shown = [r for r in ranked[:top] if abs(r.mean_delta_ms) >= 0.05]
        rest = c.account.ttft_mean_delta_ms - sum(r.mean_delta_ms for r in shown)
        prow = [[r.phase, r.a_mean_ms, r.b_mean_ms, r.mean_delta_ms] for r in shown]
        prow.append(["other phases", None, None, rest])
        prow.append(["span TTFT (mean)", None, None, c.account.ttft_mean_delta_ms])
        prow.append(["client TTFT (mean)", None, None, c.client_ttft_mean_delta_ms])
        h = ["where the TTFT difference goes", f"{A} ms", f"{B} ms", f"{A} - {B} ms"]
        text += "\n\n" + table(h, _fmt(prow, signed=3))
    text += "\n" + c.explanation
    if c.tpot_account is not None and c.tpot_explanation:
        text += "\n" + c.tpot_explanation
    return "\n".join("  " + ln if ln else ln for ln in text.splitlines())


def _fmt(rows: list[list[Any]], signed: int | None = None) -> list[list[Any]]:
    out = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            if isinstance(v, float):
                v = f"{v:+.2f}" if i == signed else f"{v:.2f}"
            cells.append("-" if v is None else v)
        out.append(cells)
    return out


def _agreement_text(m: ModeCell) -> str:
    ag = m.agreement
    if ag.median_gap_pct is None:
        return "-"
    text = f"{ag.median_gap_pct:+.1f}% ({ag.median_abs_gap_ms:.1f} ms)"
    if ag.median_send_ms is not None and ag.median_receive_ms is not None:
        text += f"; send {ag.median_send_ms:.1f}, receive {ag.median_receive_ms:.1f} ms"
    if ag.outside:
        text += f", {len(ag.outside)} outside the client's window"
    return text


def _typical_text(m: ModeCell) -> str:
    if m.typical is None:
        return "-"
    _, req, _ = m.typical
    return f"{req.trace_id[:16]} {req.request_id}"


# ------------------------------------------------------------------ JSON helpers


def _file_json(f: FileJoin) -> dict[str, Any]:
    res = f.result
    rows = len(res.rows)
    unjoined = f.unjoined()
    return {
        "file": res.name,
        "path": str(res.path),
        "mode": f.mode,
        "mode_source": f.mode_source,
        "qps": res.qps,
        "input_len": res.input_len,
        "output_len": res.output_len,
        "rows": rows,
        "succeeded": sum(r.ok for r in res.rows),
        "joined": f.joined,
        "joined_fraction": _round(f.joined / rows if rows else None, 4),
        "prefix": f.prefix,
        "prefix_source": f.prefix_source,
        "duplicate_ids": len(f.duplicates),
        "mode_mismatches": f.mode_mismatches,
        "unjoined_examples": unjoined[:EXAMPLES],
        "traces": None if res.traces is None else str(res.traces),
    }


def _prefix_json(f: FileJoin) -> dict[str, Any]:
    g = f.guess
    return {
        "file": f.result.name,
        "prefix": f.prefix,
        "source": f.prefix_source,
        "matched": f.joined,
        "rows": len(f.result.rows),
        "note": f.prefix_note,
        "candidates": []
        if g is None
        else [
            {"prefix": p, "matched": k, "median_abs_gap_ms": round_ms(gap)}
            for p, k, gap in g.candidates[:3]
        ],
    }


def _summary_json(s: dict[str, float | None]) -> dict[str, float | int | None]:
    return {k: (v if k == "n" else round_ms(v)) for k, v in s.items()}


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _client_ttft(row: BenchRow) -> float:
    """The client's TTFT in ms (a row that is `ok` has one)."""
    return (row.ttft_s or 0.0) * 1000.0


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000.0


def _median(values: Sequence[float]) -> float | None:
    return percentile(sorted(values), 50)


def _inf(x: float | None) -> float:
    return math.inf if x is None else x


def _rate(qps: float | None) -> str:
    return "inf" if qps is None else rate_text(qps)


def _text(x: int | None) -> str:
    return "?" if x is None else str(x)
