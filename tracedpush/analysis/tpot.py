"""TPOT attribution: where each decoded token's time went, from D's engine steps.

For a request with a TPOT, its decode window is [first token, last token] on the proxy's
clock; D's worker steps (placed on that clock with the offset estimated for D's
instance) that overlap the window are clipped to it, and the window is split into:

* ``model forward``: the solo cost of each step's forward (what the step would have cost
  with this request alone: the median forward of D's steps with 1 decode request and 0
  prefill tokens that started in the same minute, given at least 8 of them,
  `steps_columns.step_solo_us`), capped
  at the step's own forward;
* ``batch sharing``: forward beyond that solo cost (other requests in the batch);
* ``connector``: connector calls on D's model-runner thread inside the step
  (``tracedpush.step.connector_us``: metadata bind, start_load_kv, wait_for_save,
  get_finished / polling, registration sends);
* ``scheduling and other``: the rest of the window, between and outside the steps
  (scheduling, sampling and output processing after the forward, detokenization,
  streaming to the proxy).

Window totals are divided by output_tokens - 1, so the values sum to ``tpot_ms``. A step
only partly inside the window counts pro rata; overlapping step records (which one
thread cannot produce) count once. Nothing is negative.

`TpotAccount` compares two modes the way `compare.TtftAccount` does for TTFT: means of
each key per mode, a - b, summing to the mean TPOT difference of the requests that have
a breakdown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis.model import Span, round_ms
from tracedpush.analysis.results import RequestAnalysis
from tracedpush.analysis.steps import EngineSteps
from tracedpush.analysis.timeline import DECODE, TraceIndex
from tracedpush.analysis.words import delta_sentence

MODEL_FORWARD = "model forward"
BATCH_SHARING = "batch sharing"
CONNECTOR = "connector"
SCHEDULING = "scheduling and other"
KEYS = (MODEL_FORWARD, BATCH_SHARING, CONNECTOR, SCHEDULING)


def breakdown(
    store: EngineSteps,
    engine_id: str,
    t0_ns: int,
    t1_ns: int,
    tpot_ms: float,
    tokens: int,
) -> dict[str, float]:
    """Split one request's TPOT over D's steps in its decode window [t0, t1] (reference
    clock ns); ``tokens`` = output tokens - 1. Values sum to ``tpot_ms``. Each step's
    forward is capped at its solo cost (`EngineSteps.step_solo_us`)."""
    fwd = extra = conn = 0.0
    cursor = t0_ns
    if t1_ns > t0_ns:
        steps, solos = store.overlapping_solo(engine_id, t0_ns, t1_ns)
        for s, step_solo_us in zip(steps, solos, strict=True):
            a = max(s.start_ns, cursor)
            b = min(s.end_ns, t1_ns)
            if b <= a:
                continue
            cursor = b
            dur = s.end_ns - s.start_ns
            f = (b - a) / dur
            c_ns = min((s.connector_us or 0) * 1000.0, float(dur))
            fw_ns = dur - c_ns
            solo = fw_ns if math.isnan(step_solo_us) else min(fw_ns, step_solo_us * 1000.0)
            fwd += f * solo
            extra += f * (fw_ns - solo)
            conn += f * c_ns
    return shares(fwd, extra, conn, tpot_ms, tokens)


def shares(fwd: float, extra: float, conn: float, tpot_ms: float, tokens: int) -> dict[str, float]:
    """A breakdown from its ns sums over the window (model forward, batch sharing,
    connector): per token in ms, scaled to ``tpot_ms`` when over it, the rest
    scheduling. Shared with the index's array split (`index_steps.breakdowns`)."""
    n = max(tokens, 1)
    out = {
        MODEL_FORWARD: fwd / n / 1e6,
        BATCH_SHARING: extra / n / 1e6,
        CONNECTOR: conn / n / 1e6,
    }
    used = sum(out.values())
    if used > tpot_ms > 0:  # rounding of the window against tpot_ms: scale, keep the sum
        k = tpot_ms / used
        out = {key: v * k for key, v in out.items()}
        used = tpot_ms
    out[SCHEDULING] = max(tpot_ms - used, 0.0)
    return out


def decode_engine(ix: TraceIndex) -> str | None:
    """The decode engine that served a request (decode span's engine id or instance)."""
    dec = ix.one(sc.SPAN_DECODE, DECODE)
    if dec is None:
        return None
    return str(dec.attributes.get(sc.ENGINE_ID) or dec.resource.instance)


def attach(
    requests: Iterable[RequestAnalysis],
    indexes: Mapping[str, TraceIndex],
    store: EngineSteps,
    offset_ns: Callable[[Span], int],
) -> None:
    """Set ``tpot_breakdown_ms`` on every request with a TPOT whose decode engine has
    worker steps. `store` must already be placed on the reference clock;
    `offset_ns(span)` is the offset applied to a span's host clock."""
    if not store.steps:
        return
    facts = {}
    for tid, ix in indexes.items():
        if ix.root is not None:
            facts[tid] = (ix.root.start_ns - offset_ns(ix.root), decode_engine(ix))
    attach_facts(requests, facts, store)


def attach_facts(
    requests: Iterable[RequestAnalysis],
    facts: Mapping[str, tuple[int, str | None]],
    store: EngineSteps,
) -> None:
    """`attach` from what it needs of each trace: {trace id: (the root's corrected start
    in ns, decode engine id)} for traces with a proxy root; the analysis index keeps
    these so a warm report attaches TPOT breakdowns without spans."""
    if not store.steps:
        return
    working: dict[str, bool] = {}
    decode_engines = [e for e, info in store.engines.items() if info.role == "decode"]
    for r, eid, t0, t1 in windows(requests, facts, store.steps, decode_engines):
        if eid not in working:
            working[eid] = store.has_worker_steps(eid)
        if not working[eid]:
            continue
        r.tpot_breakdown_ms = breakdown(store, eid, t0, t1, r.tpot_ms, r.output_tokens - 1)


def windows(
    requests: Iterable[Any],
    facts: Mapping[str, tuple[int, str | None]],
    engines: Container[str],
    decode_engines: Sequence[str],
) -> Iterator[tuple[Any, str, int, int]]:
    """(request, decode engine, t0, t1): each request with a TPOT and its decode window
    in ns on the reference clock, on its decode engine among `engines` (the only decode
    engine when its trace names none of them). The analysis index's split
    (`index_steps.split_tpot`) applies these rules over arrays; the index's equality
    tests (tests/unit/test_analysis_index.py) hold the two together."""
    for r in requests:
        if r.tpot_ms is None or not r.output_tokens or r.output_tokens < 2 or r.ttft_ms is None:
            continue
        fact = facts.get(r.trace_id)
        if fact is None:
            continue
        origin, eid = fact
        if eid not in engines:
            if len(decode_engines) == 1 and decode_engines[0] in engines:
                eid = decode_engines[0]
            else:
                continue
        t0 = origin + round(r.ttft_ms * 1e6)
        yield r, eid, t0, t0 + round(r.tpot_ms * (r.output_tokens - 1) * 1e6)


# ------------------------------------------------------------------ push vs pull


@dataclass(slots=True)
class TpotRow:
    mechanism: str
    a_mean_ms: float
    b_mean_ms: float
    mean_delta_ms: float  # a - b; over rows these sum to tpot_mean_delta_ms
    a_p50_ms: float | None
    b_p50_ms: float | None
    p50_delta_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "a_mean_ms": round(self.a_mean_ms, 4),
            "b_mean_ms": round(self.b_mean_ms, 4),
            "mean_delta_ms": round(self.mean_delta_ms, 4),
            "a_p50_ms": round_ms(self.a_p50_ms),
            "b_p50_ms": round_ms(self.b_p50_ms),
            "p50_delta_ms": round_ms(self.p50_delta_ms),
        }


@dataclass(slots=True)
class TpotAccount:
    """Where the TPOT difference a - b goes in one group (requests with a breakdown)."""

    rows: list[TpotRow]
    n: dict[str, int]  # requests with a breakdown, per mode
    a_tpot_mean_ms: float
    b_tpot_mean_ms: float
    tpot_mean_delta_ms: float  # a - b (= sum of rows' mean_delta_ms)
    tpot_p50_delta_ms: float | None
    p50_remainder_ms: float | None  # p50 delta - sum of row p50 deltas (medians do not add)

    def row(self, mechanism: str) -> TpotRow | None:
        return next((r for r in self.rows if r.mechanism == mechanism), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "direction": "a - b",
            "n": dict(self.n),
            "a_tpot_mean_ms": round(self.a_tpot_mean_ms, 4),
            "b_tpot_mean_ms": round(self.b_tpot_mean_ms, 4),
            "tpot_mean_delta_ms": round(self.tpot_mean_delta_ms, 4),
            "tpot_p50_delta_ms": round_ms(self.tpot_p50_delta_ms),
            "p50_remainder_ms": round_ms(self.p50_remainder_ms),
            "mechanisms": [r.to_json() for r in self.rows],
        }


def _median(values: Sequence[float]) -> float | None:
    vs = sorted(values)
    n = len(vs)
    if not n:
        return None
    return vs[n // 2] if n % 2 else (vs[n // 2 - 1] + vs[n // 2]) / 2.0


def tpot_account(
    by_mode: Mapping[str, Sequence[RequestAnalysis]], a: str = "push", b: str = "pull"
) -> TpotAccount | None:
    """The TPOT difference a - b per mechanism, or None without breakdowns in both."""
    sel = {
        m: [r for r in by_mode.get(m, ()) if r.tpot_breakdown_ms and r.tpot_ms is not None]
        for m in (a, b)
    }
    if not sel[a] or not sel[b]:
        return None
    means: dict[str, dict[str, float]] = {}
    p50s: dict[str, dict[str, float | None]] = {}
    tpot_mean: dict[str, float] = {}
    tpot_p50: dict[str, float | None] = {}
    for m, rs in sel.items():
        means[m] = {
            k: sum((r.tpot_breakdown_ms or {}).get(k, 0.0) for r in rs) / len(rs) for k in KEYS
        }
        p50s[m] = {k: _median([(r.tpot_breakdown_ms or {}).get(k, 0.0) for r in rs]) for k in KEYS}
        tpot_mean[m] = sum(r.tpot_ms or 0.0 for r in rs) / len(rs)
        tpot_p50[m] = _median([r.tpot_ms or 0.0 for r in rs])
    rows = []
    for k in KEYS:
        pa, pb = p50s[a][k], p50s[b][k]
        rows.append(
            TpotRow(
                k,
                means[a][k],
                means[b][k],
                means[a][k] - means[b][k],
                pa,
                pb,
                None if pa is None or pb is None else pa - pb,
            )
        )
    ta, tb = tpot_p50[a], tpot_p50[b]
    p50 = None if ta is None or tb is None else ta - tb
    rest = None if p50 is None else p50 - sum(r.p50_delta_ms or 0.0 for r in rows)
    return TpotAccount(
        rows,
        {a: len(sel[a]), b: len(sel[b])},
        tpot_mean[a],
        tpot_mean[b],
        tpot_mean[a] - tpot_mean[b],
        p50,
        rest,
    )


def explain_tpot_delta(
    acc: TpotAccount | None, a: str = "push", b: str = "pull", *, where: str = "", top: int = 3
) -> str:
    """The TPOT difference in words, largest mechanisms first, e.g. "push's TPOT is
    4.4 ms longer than pull's over all requests (mean; p50 +4.1 ms): batch sharing
    +3.0 ms, connector +1.2 ms, scheduling and other +0.2 ms." (means add up)."""
    if acc is None:
        return f"No TPOT comparison: needs {a} and {b} requests with D's engine steps."
    where = f" {where}" if where else ""
    total = acc.tpot_mean_delta_ms
    p50 = "" if acc.tpot_p50_delta_ms is None else f"; p50 {acc.tpot_p50_delta_ms:+.2f} ms"
    if abs(total) < 0.005:
        head = f"{a} and {b} have the same mean TPOT{where} (within 0.005 ms{p50})"
    else:
        verb = "longer" if total > 0 else "shorter"
        head = f"{a}'s TPOT is {abs(total):.2f} ms {verb} than {b}'s{where} (mean{p50})"
    deltas = [(r.mechanism, r.mean_delta_ms) for r in acc.rows]
    return delta_sentence(head, deltas, total, top=top, eps=0.005, digits=2, rest="the rest")


def top_mechanisms(
    acc: TpotAccount | None, *, top: int = 3, min_ms: float = 0.005
) -> list[tuple[str, float]]:
    """[(mechanism, mean a - b ms)] largest |delta| first (for the console)."""
    if acc is None:
        return []
    ranked = sorted(acc.rows, key=lambda r: (-abs(r.mean_delta_ms), r.mechanism))
    return [(r.mechanism, r.mean_delta_ms) for r in ranked[:top] if abs(r.mean_delta_ms) >= min_ms]
