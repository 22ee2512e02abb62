"""Per-process step traces: loading, joining, array attributes, TPOT attribution."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, run_json
from tracedpush.analysis.compare import compare
from tracedpush.analysis.model import LoadStats
from tracedpush.analysis.otlp import Decoder, _jaeger_tags
from tracedpush.analysis.steps import EngineSteps, array, join, steps_from_span
from tracedpush.analysis.tpot import KEYS, breakdown, explain_tpot_delta, top_mechanisms
from tracedpush.testing import synthetic


@pytest.fixture(scope="module")
def gen() -> synthetic.SyntheticRun:
    return synthetic.generate(120, seed=31, clock_offsets_ms={synthetic.DECODE_INSTANCE: 40})


@pytest.fixture(scope="module")
def run(gen: synthetic.SyntheticRun):
    return analyze(TraceStore.from_documents(gen.documents))


def _steps_doc(side: str, arrays: dict[str, list]) -> dict:
    def val(v):
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}

    pid = "7" if side == "worker" else "6"
    attrs = [
        {"key": sc.ENGINE_ID, "value": {"stringValue": "decode-9"}},
        {"key": sc.ROLE, "value": {"stringValue": "decode"}},
        {"key": sc.SIDE, "value": {"stringValue": side}},
    ] + [
        {"key": k, "value": {"arrayValue": {"values": [val(x) for x in v]}}}
        for k, v in arrays.items()
    ]
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.name", "value": {"stringValue": "vllm-decode"}},
                        {"key": "service.instance.id", "value": {"stringValue": "decode-9"}},
                        {"key": "host.name", "value": {"stringValue": "h"}},
                        {"key": "process.pid", "value": {"intValue": pid}},
                    ]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": ("ab" if side == "worker" else "cd") * 16,
                                "spanId": ("01" if side == "worker" else "02") * 8,
                                "name": sc.SPAN_ENGINE_STEPS,
                                "kind": 1,
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "2000",
                                "attributes": attrs,
                            }
                        ]
                    }
                ],
            }
        ]
    }


def test_array_attributes_decode_and_steps_join() -> None:
    t0 = 1_700_000_000_000_000_000
    sched = _steps_doc(
        "scheduler",
        {
            sc.STEP_SEQ: [1, 2],
            sc.STEP_START_NS: [t0, t0 + 10_000_000],
            sc.STEP_PREFILL_TOKENS: [0, 0],
            sc.STEP_DECODE_REQS: [1, 3],
            sc.STEP_NUM_REQS: [1, 3],
        },
    )
    work = _steps_doc(
        "worker",
        {
            sc.STEP_SEQ: [1, 2],
            sc.STEP_START_NS: [t0 + 50_000, t0 + 10_050_000],
            sc.STEP_DURATION_US: [8000, 9000],
            sc.STEP_CONNECTOR_US: [300, 500],
            sc.STEP_BIND_US: [10, 10],
            sc.STEP_LOAD_US: [100, 200],
            sc.STEP_SAVE_US: [5, 5],
            sc.STEP_RESULTS_US: [185, 285],
            sc.STEP_LOADS_STARTED: [1, 0],
            sc.STEP_LOADS_FINISHED: [0, 1],
        },
    )
    spans = []
    Decoder(spans.append, LoadStats()).document([sched, work])
    assert spans[1].attributes[sc.STEP_DURATION_US] == [8000, 9000]  # arrayValue -> list
    store = EngineSteps.from_spans(spans)
    (s1, s2) = store.steps["decode-9"]
    assert (s1.seq, s1.decode_reqs, s1.duration_us, s1.connector_us) == (1, 1, 8000, 300)
    assert s1.scheduled_ns == t0 and s1.start_ns == t0 + 50_000
    assert s1.end_ns == t0 + 50_000 + 8_000_000 and s1.forward_us == 7700
    assert (s2.decode_reqs, s2.loads_finished, s2.load_us) == (3, 1, 200)
    assert store.solo_forward_us("decode-9") == 7700  # the 1-request step
    # nothing here is a request
    assert analyze(TraceStore.from_documents([sched, work])).requests == []


def test_jaeger_legacy_arrays_are_json_strings() -> None:
    tags = _jaeger_tags([{"key": sc.STEP_SEQ, "type": "string", "value": "[1,2,3]"}])
    assert array(tags[sc.STEP_SEQ]) == [1, 2, 3]
    assert array('["a","b"]') == ["a", "b"]
    assert array(None) == [] and array(5) == [5]


def test_join_keeps_restarts_apart_and_drops_other_tp_ranks(gen) -> None:
    spans = [
        s
        for s in TraceStore.from_documents(gen.documents).all_spans()
        if s.name == sc.SPAN_ENGINE_STEPS and s.resource.instance == synthetic.DECODE_INSTANCE
    ]
    sched, work = [], []
    for s in spans:
        side, steps = steps_from_span(s)
        (work if side == "worker" else sched).extend(steps)
    # both modes' runs reuse the engine id: seq numbers repeat, yet every record joins
    assert len({w.seq for w in work}) < len(work)
    joined = join(sched, work)
    assert all(s.has_worker and s.has_scheduler for s in joined)
    assert all(s.scheduled_ns <= s.start_ns for s in joined)


def test_process_spans_never_become_requests(gen, run) -> None:
    assert len(run.requests) == len(gen.requests)
    assert {r.trace_id for r in run.requests} == {r.trace_id for r in gen.requests}
    for r in run.requests:
        assert not any(v.name in sc.PROCESS_SPANS for v in r.spans)
    assert run.engine_steps and set(run.engine_steps.steps) == {
        synthetic.PREFILL_INSTANCE,
        synthetic.DECODE_INSTANCE,
    }
    assert run.engine_steps.samples


def test_tpot_breakdown_sums_to_tpot(run) -> None:
    with_tpot = [r for r in run.requests if r.tpot_ms is not None]
    assert with_tpot
    for r in with_tpot:
        b = r.tpot_breakdown_ms
        assert b is not None and tuple(b) == KEYS
        assert all(v >= 0 for v in b.values())
        assert sum(b.values()) == pytest.approx(r.tpot_ms, rel=0.01)
        # D's steps were placed on the proxy clock despite D's 40 ms skew: most of the
        # window is forward, not "scheduling and other"
        assert b["model forward"] + b["batch sharing"] > 0.6 * r.tpot_ms
    js = json.loads(json.dumps(run_json(run)))
    assert all(
        abs(sum(q["tpot_breakdown_ms"].values()) - q["tpot_ms"]) <= 0.01 * q["tpot_ms"]
        for q in js["requests"]
        if q["tpot_ms"]
    )
    assert js["engine_steps"][synthetic.DECODE_INSTANCE]["steps"] > 0


def test_breakdown_clips_at_window_edges(run) -> None:
    store = run.engine_steps
    eid = synthetic.DECODE_INSTANCE
    s = store.worker_steps(eid)[len(store.worker_steps(eid)) // 2]
    mid = (s.start_ns + s.end_ns) // 2
    tpot = (s.end_ns - mid) / 1e6
    b = breakdown(store, eid, mid, s.end_ns, tpot, 1)
    assert sum(b.values()) == pytest.approx(tpot)
    assert b["scheduling and other"] == pytest.approx(0.0, abs=1e-9)
    assert b["connector"] == pytest.approx(s.connector_us / 1000 / 2, rel=1e-6)


def test_tpot_difference_per_load(run) -> None:
    cmp = compare(run)
    g = cmp.overall
    acc = g.tpot_account
    assert acc is not None
    assert sum(r.mean_delta_ms for r in acc.rows) == pytest.approx(acc.tpot_mean_delta_ms)
    assert any(x.tpot_account is not None for x in cmp.by_load())
    text = explain_tpot_delta(acc, where="over all requests")
    assert "TPOT" in text and "ms" in text
    top = top_mechanisms(acc)
    assert top and all(k in KEYS for k, _ in top)
    js = g.to_json()["tpot_account"]
    assert [m["mechanism"] for m in js["mechanisms"]] == list(KEYS)


# ------------------------------------------------------------------ columns = objects
# The object implementation the columns replaced (`steps_from_span`, `join`, and the
# placement, summary and solo cost as they were), kept here as the reference.


def _reference(spans, offset_ns=None) -> dict:
    from tracedpush.analysis.steps import _engine

    sched: dict = {}
    work: dict = {}
    for s in spans:
        if s.name == sc.SPAN_ENGINE_STEPS:
            side, st = steps_from_span(s)
            (work if side == "worker" else sched).setdefault(_engine(s), []).extend(st)
    out = {e: join(sched.get(e, ()), work.get(e, ())) for e in sorted(set(sched) | set(work))}
    if offset_ns is not None:
        for steps in out.values():
            for st in steps:
                off = offset_ns(st.domain)
                st.start_ns -= off
                st.end_ns -= off
                if st.scheduled_ns is not None:
                    st.scheduled_ns -= off
            steps.sort(key=lambda s: (s.start_ns, s.seq))
    return out


def _reference_solo(steps) -> float | None:
    from statistics import median

    solo = [
        float(s.forward_us)
        for s in steps
        if s.has_worker
        and s.decode_reqs == 1
        and (s.prefill_tokens or 0) == 0
        and s.num_reqs in (None, 1)
    ]
    if solo:
        return float(median(solo))
    busy = [
        float(s.forward_us)
        for s in steps
        if s.forward_us is not None
        and (
            (s.num_reqs is not None and s.num_reqs > 0) or (s.num_reqs is None and s.forward_us > 0)
        )
    ]
    return min(busy) if busy else None


_PARTS = (("bind", "bind_us"), ("start_load_kv", "load_us"), ("wait_for_save", "save_us"),
          ("results", "results_us"))  # fmt: skip


def _reference_summary(steps, role: str, host: str) -> dict:
    from statistics import median

    work = [s for s in steps if s.has_worker]
    durs = [s.duration_us or 0 for s in work]
    busy = [s for s in work if s.num_reqs is None or s.num_reqs > 0]
    conn = sum(s.connector_us or 0 for s in work)
    total = sum(durs)
    solo = _reference_solo(steps)
    return {
        "role": role,
        "host": host,
        "steps": len(steps),
        "worker_steps": len(work),
        "scheduler_steps": sum(1 for s in steps if s.has_scheduler),
        "joined_steps": sum(1 for s in steps if s.has_scheduler and s.has_worker),
        "busy_steps": len(busy),
        "median_step_ms": round(median(durs) / 1000.0, 4) if durs else None,
        "median_busy_step_ms": (
            round(median(s.duration_us or 0 for s in busy) / 1000.0, 4) if busy else None
        ),
        "solo_forward_ms": None if solo is None else round(solo / 1000.0, 4),
        "step_ms_total": round(total / 1000.0, 4),
        "connector_ms_total": round(conn / 1000.0, 4),
        "connector_share": round(conn / total, 4) if total else None,
        "connector_parts_ms": {
            k: round(sum(getattr(s, f) or 0 for s in work) / 1000.0, 4) for k, f in _PARTS
        },
        "prefill_tokens": sum(s.prefill_tokens or 0 for s in steps),
        "loads_started": sum(s.loads_started or 0 for s in work),
        "loads_finished": sum(s.loads_finished or 0 for s in work),
    }


def _same_as_reference(store: EngineSteps, want: dict) -> None:
    assert list(store.steps) == list(want)
    for eid, steps in want.items():
        got = store.steps[eid]
        assert [s.to_json() for s in got] == [s.to_json() for s in steps]
        assert [(s.role, s.host, s.domain) for s in got] == [
            (s.role, s.host, s.domain) for s in steps
        ]
        assert store.solo_forward_us(eid) == _reference_solo(steps)
        info = store.engines[eid]
        assert store.summary()[eid] == _reference_summary(steps, info.role, info.host)


def _spread_docs(gen: synthetic.SyntheticRun, shift_s: int) -> list[dict]:
    """`gen`'s documents with a second copy `shift_s` later (an engine restarted under
    the same id: its seq numbers repeat)."""
    import copy

    later = copy.deepcopy(gen.documents)
    for doc in later:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    for a in s.get("attributes", ()):
                        if a["key"] == sc.STEP_START_NS:
                            for v in a["value"]["arrayValue"]["values"]:
                                v["intValue"] = str(int(v["intValue"]) + shift_s * 10**9)
                    s["spanId"] = s["spanId"][::-1]
    return [*gen.documents, *later]


def _tp_docs(gen: synthetic.SyntheticRun) -> list[dict]:
    """`gen`'s documents with every worker's ``engine.steps`` also recorded by a second
    TP rank: another process (pid + 50), each step starting 5 us later."""
    import copy

    ranks = []
    for doc in gen.documents:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans = [
                    copy.deepcopy(sp)
                    for sp in ss["spans"]
                    if sp["name"] == sc.SPAN_ENGINE_STEPS
                    and any(a["key"] == sc.STEP_DURATION_US for a in sp.get("attributes", ()))
                ]
                if not spans:
                    continue
                res = copy.deepcopy(rs["resource"])
                for a in res["attributes"]:
                    if a["key"] == "process.pid":
                        a["value"] = {"intValue": str(int(a["value"]["intValue"]) + 50)}
                for sp in spans:
                    sp["spanId"] = sp["spanId"][::-1]
                    for a in sp["attributes"]:
                        if a["key"] == sc.STEP_START_NS:
                            for v in a["value"]["arrayValue"]["values"]:
                                v["intValue"] = str(int(v["intValue"]) + 5_000)
                ranks.append(
                    {"resourceSpans": [{"resource": res, "scopeSpans": [{**ss, "spans": spans}]}]}
                )
    return [*gen.documents, *ranks]


def _case_docs(run: synthetic.SyntheticRun, shift_s: int | str | None) -> list[dict]:
    if shift_s == "tp":
        return _tp_docs(run)
    return run.documents if shift_s is None else _spread_docs(run, shift_s)


# (both modes' runs, a restart under the same engine id this many s later or "tp" (a
# second TP rank's worker records), every seq's records spread: joined by arrays alone?)
_JOIN_CASES = [
    (False, None, True), (False, 3600, True), (False, 25, True), (False, 3, False),
    (False, 0, False), (True, None, False), (True, 3600, False), (False, "tp", False),
]  # fmt: skip


@pytest.fixture(scope="module")
def one_mode() -> synthetic.SyntheticRun:
    return synthetic.generate(80, modes=("push",), seed=5)


@pytest.mark.parametrize(("two_modes", "shift_s", "spread"), _JOIN_CASES)
def test_columns_equal_the_object_join(
    gen, one_mode, monkeypatch, two_modes: bool, shift_s: Any, spread: bool
) -> None:
    """Steps as columns equal the object implementation, step by step: seqs joined by
    arrays (a seq repeats only far apart: an engine restarted under its id) and by the
    reference's rule (closer: the two modes' runs here, a quick restart), placed on a
    skewed clock or not, with summary, solo cost and a window's objects."""
    from tracedpush.analysis import steps_columns

    run = gen if two_modes else one_mode
    docs = _case_docs(run, shift_s)
    greedy = []
    real_greedy = steps_columns._greedy_pairs

    def spy(*a):
        greedy.append(len(a[3]))
        return real_greedy(*a)

    monkeypatch.setattr(steps_columns, "_greedy_pairs", spy)
    spans = [s for s in TraceStore.from_documents(docs).all_spans() if s.name in sc.PROCESS_SPANS]
    _same_as_reference(EngineSteps.from_spans(spans), _reference(spans))
    assert (not greedy) == spread  # the path this case is for
    off = {synthetic.DECODE_INSTANCE: 40_000_000, synthetic.PREFILL_INSTANCE: -7}
    store = EngineSteps.from_spans(spans)
    store.place(lambda r: off.get(r.instance, 0))
    _same_as_reference(store, _reference(spans, lambda r: off.get(r.instance, 0)))
    # windows: objects made for the window only equal the reference's
    want = _reference(spans, lambda r: off.get(r.instance, 0))[synthetic.DECODE_INSTANCE]
    fresh = EngineSteps.from_spans(spans)
    fresh.place(lambda r: off.get(r.instance, 0))
    mid = want[len(want) // 2]
    t0, t1 = mid.start_ns - 5 * 10**7, mid.end_ns + 5 * 10**7
    ref = [s for s in want if s.has_worker and s.end_ns > t0 and s.start_ns <= t1]
    assert [s.to_json() for s in fresh.overlapping(synthetic.DECODE_INSTANCE, t0, t1)] == [
        s.to_json() for s in ref
    ]


def test_odd_arrays_convert_as_the_objects_do() -> None:
    """Strings, floats, nulls, short arrays and huge numbers in a step array: the column
    holds what `steps_from_span` makes of each element (None where it makes none)."""
    t0 = 1_700_000_000_000_000_000
    doc = _steps_doc(
        "worker",
        {
            sc.STEP_SEQ: [1, 2, 3, 4],
            sc.STEP_START_NS: [t0, t0 + 10**7, t0 + 2 * 10**7, t0 + 3 * 10**7],
            sc.STEP_DURATION_US: [8000, "9000", "x", 7000],
            sc.STEP_CONNECTOR_US: [300, 2**70],  # short, and beyond int64
            sc.STEP_LOAD_US: ["5", "", "7", "8"],
        },
    )
    spans: list = []
    Decoder(spans.append, LoadStats()).document([doc])
    want = _reference(spans)
    want["decode-9"][1].connector_us = None  # 2**70 is no step's number: None in columns
    _same_as_reference(EngineSteps.from_spans(spans), want)


@pytest.mark.parametrize(("two_modes", "shift_s", "spread"), _JOIN_CASES)
@pytest.mark.parametrize("arrival", ["by end", "shuffled"])
@pytest.mark.parametrize("slack_ms", [None, 20])
def test_extended_steps_equal_steps_joined_at_once(
    gen,
    one_mode,
    monkeypatch,
    two_modes: bool,
    shift_s: Any,
    spread: bool,
    arrival: str,
    slack_ms: int | None,
) -> None:
    """A Live refresh joins the process spans that arrived into the kept steps
    (`EngineSteps.extended`) instead of joining every step again. Over the cases of
    `test_columns_equal_the_object_join`, spans arriving in order of their end (a live
    run) or shuffled, in chunks of every size, placed on a skewed clock or not (or
    first on the other: offsets that moved), and through a pickled copy (as an index
    keeps them): the same columns, samples and engines as one join of every span, with
    seqs close together or not (before, those never extended); None only where two
    records of a seq start at the same ns (the copy of a run at the same times), or
    where new records reach back past the engine's recent ones (the copy an hour later:
    `_spread_docs` moves step times, not span times, so spans arrive an hour apart).
    A 20 ms slack leaves most steps as they were.
    What TPOT breakdowns keep of the steps (`TpotSteps`), made from the last ones at
    each refresh, equals them made afresh, and so do the windows where they changed.
    The extended steps are laid out in memory as the joined ones (`_head_then`)."""
    import dataclasses
    import itertools
    import pickle
    import random

    from tracedpush.analysis import steps as steps_mod
    from tracedpush.analysis.index_steps import TpotSteps, changed_windows
    from tracedpush.analysis.steps import StepParts

    run = gen if two_modes else one_mode
    docs = _case_docs(run, shift_s)
    spans = [s for s in TraceStore.from_documents(docs).all_spans() if s.name in sc.PROCESS_SPANS]
    # D's worker on a clock of its own, 5 ms off its scheduler's, and a third of its
    # records lost: lone scheduler records and worker steps that the placement
    # interleaves (the synthetic engines pair every record, on one clock per engine)
    worker = None
    kept = []
    for i, s in enumerate(spans):
        if s.resource.instance == synthetic.DECODE_INSTANCE and steps_mod._side(s) == "worker":
            if i % 3 == 0:
                continue
            if worker is None:
                worker = dataclasses.replace(s.resource, instance="decode-worker")
            s.resource = worker
        kept.append(s)
    spans = kept
    if arrival == "by end":
        spans.sort(key=lambda s: s.end_ns)
    else:
        random.Random(3).shuffle(spans)
    skewed = {
        synthetic.DECODE_INSTANCE: 40.0,
        "decode-worker": 45.0,
        synthetic.PREFILL_INSTANCE: -0.000007,
    }
    if slack_ms is not None:
        monkeypatch.setattr(steps_mod, "_JOIN_SLACK_NS", slack_ms * 10**6)
        # raw records kept as long as with the real slack (80 s): an engine.steps span
        # holds seconds of steps, and arrives whole
        monkeypatch.setattr(steps_mod.cols, "RECENT_SLACKS", 80_000 // slack_ms)
    kept_steps = 0  # steps a TpotSteps took from the last one unchanged
    refused = 0  # refreshes that `extended` left to a join of every span
    for first, applied in ((skewed, skewed), ({}, {}), ({}, skewed), (skewed, {})):
        want = StepParts().extend(spans).placed([], applied)
        n = len(spans)
        every = [[n // 2], [1, 2, n // 3, n - 1], list(range(n // 4, n, max(n // 12, 1)))]
        for cuts in every if first is applied else every[:2]:
            bounds = [0, *cuts, n]
            got = StepParts().extend(spans[: bounds[1]]).placed([], first)
            tp = TpotSteps(got)
            for i, (a, b) in enumerate(itertools.pairwise(bounds[1:])):
                if i == 1:  # as an index keeps them between processes
                    got, tp = pickle.loads(pickle.dumps((got, tp)))
                was = got
                got = got.extended(StepParts().extend(spans[a:b]), [], applied)
                if got is None:
                    assert shift_s in (0, 3600), cuts
                    refused += 1
                    break
                fresh = TpotSteps(got)  # first: it fills the steps' solo cache
                grown = TpotSteps(got, tp)
                _same_tpot_steps(grown, fresh)
                assert changed_windows(tp, grown) == changed_windows(tp, fresh)
                kept_steps += sum(grown.same.values())
                assert grown.base == was.token
                tp = grown
            if got is None:
                continue
            assert list(got.columns) == list(want.columns)
            for eid, c in want.columns.items():
                assert c.dtype == got.columns[eid].dtype
                assert (c == got.columns[eid]).all() and c.shape == got.columns[eid].shape, eid
                # laid out alike too (a copy that changes the layout transposes every step)
                assert c.flags.f_contiguous == got.columns[eid].flags.f_contiguous, eid
            assert got.samples == want.samples
            assert got.engines == want.engines and got.spans == want.spans
            assert [(r, role) for r, role in got.origins] == list(dict.fromkeys(want.origins))
            _same_tpot_steps(tp, TpotSteps(want))
    if shift_s != 3600:
        assert bool(refused) == (shift_s == 0)
    if slack_ms is not None and shift_s != 0:
        assert kept_steps  # the refreshes took unchanged steps


def _same_tpot_steps(a: Any, b: Any) -> None:
    """Two `TpotSteps` hold the same engines, solo costs and step arrays."""
    assert a.decode == b.decode and a.solo == b.solo and a.arrays.keys() == b.arrays.keys()
    for eid, x in a.arrays.items():
        y = b.arrays[eid]
        assert (x is None) == (y is None), eid
        for name in ("start", "end", "worker", "conn_us", "max_end"):
            if x is not None:
                u, v = getattr(x, name), getattr(y, name)
                assert u.dtype == v.dtype and np.array_equal(u, v), (eid, name)


def _records(side: str, *rows: tuple[int, int]) -> np.ndarray:
    """(seq, start) records of one side as `steps_columns.block` makes them (a worker
    step lasts 7 us; a scheduler record schedules 2 requests)."""
    from tracedpush.analysis import steps_columns as cols

    c = np.full((len(cols.FIELDS), len(rows)), cols.NONE, np.int64)
    for i, (seq, start) in enumerate(rows):
        c[cols.SEQ, i], c[cols.START, i], c[cols.ORIGIN, i] = seq, start, 0
        if side == "worker":
            c[cols.DURATION, i], c[cols.END, i] = 7, start + 7000
        else:
            c[cols.END, i] = c[cols.SCHED, i] = start
            c[cols.NUM_REQS, i] = 2
    return c


def _extended(cols: Any, placed: Any, kept: Any, sched: Any, work: Any, off: Any, slack: int):
    got = cols.extend(placed, kept, sched, work, off, slack)
    return None if got is None else got[0]


def _joined_placed(cols: Any, sched: Any, work: Any, off: Any, slack: int) -> Any:
    return cols.place(cols.join(sched, work, slack), off)


def test_extending_looks_back_far_enough() -> None:
    """`steps_columns.extend` at its edges (slack 100 ns): a new record joins again
    with the records of its seq less than two slacks before it, and through them with
    the ones before those (a chain); a scheduler record merged into a worker step that
    started before comes apart again. Where the chain reaches back past the records
    kept raw (`recent`), the steps are taken apart instead, where that is exact (no
    close seqs there), else None."""
    cols = _cols()
    slack, off = 100, np.zeros(1, np.int64)
    w_old, s_old = _records("worker", (5, 0), (6, 300)), _records("scheduler", (5, 90), (6, 310))
    placed = cols.join(s_old, w_old, slack)
    assert placed.shape[1] == 2  # both pairs merged
    kept = cols.recent(np.concatenate([w_old, s_old], axis=1), slack)
    assert kept[1] == 310 - cols.RECENT_SLACKS * slack  # every record from there on
    # a new scheduler record of seq 5 at 250, within 2 slack of the old one at 90, which
    # is within 2 slack of the worker step at 0: all three join again
    s_new = _records("scheduler", (5, 250))
    want = _joined_placed(cols, np.concatenate([s_old, s_new], axis=1), w_old, off, slack)
    got = _extended(cols, placed, kept, s_new, _records("worker"), off, slack)
    assert got is not None and got.shape == want.shape and (got == want).all()
    # the same with records kept from 50 on only: the chain needs the one at 0
    assert cols.extend(placed, (kept[0], 50), s_new, _records("worker"), off, slack) is None
    # one far enough away extends them, records kept from 50 on or not
    s_far = _records("scheduler", (5, 900))
    want = _joined_placed(cols, np.concatenate([s_old, s_far], axis=1), w_old, off, slack)
    got = _extended(cols, placed, (kept[0], 50), s_far, _records("worker"), off, slack)
    assert got is not None and (got == want).all()
    # records older than those kept raw (a process that flushed late): where their
    # seqs are spread, joined again from the steps themselves (`_extend_spread`)
    got = _extended(cols, placed, (kept[0], 2_000), s_far, _records("worker"), off, slack)
    assert got is not None and (got == want).all()
    late = _records("scheduler", (5, 60))  # close to the one at 90: not without them
    assert cols.extend(placed, (kept[0], 2_000), late, _records("worker"), off, slack) is None


@pytest.mark.parametrize("seed", range(30))
def test_extended_equals_joined_where_records_are_close(monkeypatch, seed: int) -> None:
    """`steps_columns.extend`, over random records as close as they come (a seq
    repeating within the slack on both sides, TP ranks within the rank slack, some
    dropped by the join), placed with per-origin offsets, grown in random chunks that
    arrive out of order: each extension equals one join of every record so far, step
    for step; the records kept raw (`recent`) bring back what the joined steps lost (a
    dropped rank's record, a scheduler record's own origin)."""
    import random

    from tracedpush.analysis import steps as steps_mod

    cols = _cols()
    slack, rank = 100, 30
    monkeypatch.setattr(steps_mod, "_RANK_SLACK_NS", rank)
    monkeypatch.setattr(cols, "RANK_SLACK_NS", rank)
    rng = random.Random(seed)
    starts = rng.sample(range(0, 700), 120)  # distinct: no two records tie (see `extend`)
    rows = [(rng.randrange(10) + t // 200 * 5, t) for t in starts]  # seqs climb slowly
    recs = [_records("worker" if rng.random() < 0.5 else "scheduler", r) for r in rows]
    for r in recs:
        r[cols.ORIGIN] = rng.randrange(3)
    # arrival: roughly in time, chunks shuffled a little
    recs.sort(key=lambda r: int(r[cols.START, 0]) + rng.randrange(150))
    off = np.array([0, 40, -25], np.int64)
    domains = np.array([0, 1, 0])  # origins 0 and 2: one process, two roles

    def split(rs: list) -> tuple[Any, Any]:
        c = np.concatenate(rs, axis=1) if rs else cols.empty()
        w = c[cols.DURATION] != cols.NONE
        return c[:, ~w], c[:, w]

    first = rng.randrange(5, 40)
    s, w = split(recs[:first])
    placed = cols.place(cols.join(s, w, slack, domains), off)
    kept = cols.recent(np.concatenate([w, s], axis=1), slack)
    i, grown = first, 0
    while i < len(recs):
        j = min(len(recs), i + rng.randrange(1, 12))
        s_new, w_new = split(recs[i:j])
        got = cols.extend(placed, kept, s_new, w_new, off, slack, domains)
        assert got is not None, (i, j)  # every record is within `recent` here
        s, w = split(recs[:j])
        want = cols.place(cols.join(s, w, slack, domains), off)
        assert got[0].shape == want.shape and (got[0] == want).all(), (i, j)
        assert (got[0][:, : got[1]] == placed[:, : got[1]]).all()  # the head it kept
        placed, kept, i = got[0], got[2], j
        grown += 1
    assert grown


def _cols() -> Any:
    from tracedpush.analysis import steps_columns

    return steps_columns


@pytest.mark.parametrize("seed", range(40))
def test_join_equals_the_reference_where_records_are_close(monkeypatch, seed: int) -> None:
    """`steps_columns.join` equals `steps.join` record for record, ties in order, on
    records as close as they come: seqs repeating within the slack on both sides (an
    engine restarted under its id, two short runs of one id), TP ranks (origins of
    other processes, and of one process with two roles) within the rank slack, equal
    start times, and spread seqs beside them (the array path, in the same output).
    Both slacks scaled down to this test's times (ns)."""
    import random

    from tracedpush.analysis import steps as steps_mod
    from tracedpush.analysis.model import Resource
    from tracedpush.analysis.steps import _domains

    cols = _cols()
    slack, rank = 100, 30
    monkeypatch.setattr(steps_mod, "_JOIN_SLACK_NS", slack)
    monkeypatch.setattr(steps_mod, "_RANK_SLACK_NS", rank)
    monkeypatch.setattr(cols, "RANK_SLACK_NS", rank)
    rng = random.Random(seed)
    procs = [Resource("decode", f"d-{i}", "h", i) for i in range(3)]
    roles = ("decode", "decode", "prefill", "decode")
    origins = [(procs[p], role) for p, role in zip((0, 1, 0, 2), roles, strict=True)]

    def close(n: int) -> list[tuple[int, int]]:  # 12 seqs over 6 slacks, times on a 7 ns grid
        return [(rng.randrange(12), rng.randrange(600) // 7 * 7) for _ in range(n)]

    far = [(100 + i, 10**6 * i) for i in range(rng.randrange(1, 5))]  # spread: arrays
    work = _records("worker", *close(40), *far)
    sched = _records("scheduler", *close(40), (100, 50), (101, 10**6 + 30))
    for c in (work, sched):
        c[cols.ORIGIN] = [rng.randrange(len(origins)) for _ in range(c.shape[1])]
    store = EngineSteps()
    store.origins = origins
    got = cols.join(sched, work, slack, _domains(origins))
    want = join(store._make("e", sched), store._make("e", work))
    as_fields = [[s.to_json(), s.domain, s.role] for s in store._make("e", got)]
    assert as_fields == [[s.to_json(), s.domain, s.role] for s in want]
    assert got.shape[1] < work.shape[1] + sched.shape[1]  # some merged or dropped


def test_an_engine_restarted_early_keeps_extending() -> None:
    """An engine restarted under its id while its first life's step numbers were
    recent (close seqs, early in the run) does not stop later refreshes from
    extending its steps (before, each then joined every step again), and neither do
    new records whose seq has a close one near them (a restart now): their seqs' records
    near them are joined again from the records kept raw."""
    cols = _cols()
    slack, off = 100, np.zeros(1, np.int64)
    # seqs 0..9 every 50 ns, then a restart at 120: seqs 0..9 again, then on to 40
    life1 = [(i, 50 * i) for i in range(10)]
    life2 = [(i, 120 + 50 * i) for i in range(40)]
    w_old = _records("worker", *life1, *life2)
    s_old = _records("scheduler", *((q, t + 3) for q, t in (*life1, *life2)))
    assert len(cols.close_seqs(w_old, slack))  # the restart: seqs 0.. twice within 2 slack
    placed = cols.join(s_old, w_old, slack)
    kept = cols.recent(np.concatenate([w_old, s_old], axis=1), slack)
    end = 120 + 50 * 40
    w_new = _records("worker", (40, end), (41, end + 50))
    s_new = _records("scheduler", (40, end + 3), (41, end + 53))
    want = cols.join(
        np.concatenate([s_old, s_new], axis=1), np.concatenate([w_old, w_new], axis=1), slack
    )
    got = _extended(cols, placed, kept, s_new, w_new, off, slack)
    assert got is not None and got.shape == want.shape and (got == want).all()
    # a third life from seq 0 again, 60 ns after the second's last step: close to it
    w_3 = _records("worker", (0, end + 110), (38, end + 120))
    want = cols.join(
        np.concatenate([s_old, s_new], axis=1), np.concatenate([w_old, w_new, w_3], axis=1), slack
    )
    grown = cols.extend(placed, kept, s_new, w_new, off, slack)
    assert grown is not None
    got = _extended(cols, grown[0], grown[2], _records("scheduler"), w_3, off, slack)
    assert got is not None and got.shape == want.shape and (got == want).all()


def test_steps_placed_again_keep_the_joined_order_of_ties() -> None:
    """`steps_columns.moved` (offsets that moved) equals placing the joined steps with
    the new offsets, also where two steps tie on the new clock: a worker step and a
    lone scheduler record of one seq, 1,000 ns apart on clocks 1,000 ns apart, which
    the old offsets had put the other way round."""
    from tracedpush.analysis import steps_columns as cols

    w, s = _records("worker", (1, 100)), _records("scheduler", (1, 1100))
    s[cols.ORIGIN] = 1
    joined = cols.join(s, w, 100)
    assert joined is not None and joined.shape[1] == 2  # not a pair: 1,000 ns apart
    was, now = np.array([0, 2000]), np.array([0, 1000])
    want = cols.place(joined, now)
    assert want[cols.DURATION, 0] == 7  # the tie: the worker step first, as joined
    assert (cols.moved(cols.place(joined, was), was, now) == want).all()


@pytest.mark.parametrize("seed", range(12))
def test_steps_placed_again_equal_a_placing_of_the_join(seed: int, monkeypatch) -> None:
    """`steps_columns.moved` equals `place` of the joined steps with the new offsets on
    random records of three origins: when every origin moves by one time (its no-sort
    path), when one origin moves, and when a shift brings steps of two origins onto one
    ns (ties on the new clock). The no-sort path is taken where it may be (one shift,
    no ties in the placed order), and only there."""
    from tracedpush.analysis import steps_columns as cols

    rng = np.random.default_rng(seed)
    n = 300
    seqs = rng.integers(0, 60, 2 * n).tolist()
    starts = (rng.choice(4_000, 2 * n, replace=False) * 1_000).tolist()  # no two alike
    seqs[n : n + n // 2] = seqs[: n // 2]  # half the scheduler records pair with a step
    starts[n : n + n // 2] = starts[: n // 2]
    w = _records("worker", *zip(seqs[:n], starts[:n], strict=True))
    s = _records("scheduler", *((q, t + 3) for q, t in zip(seqs[n:], starts[n:], strict=True)))
    w[cols.ORIGIN] = rng.integers(0, 3, n)
    s[cols.ORIGIN] = rng.integers(0, 3, n)
    s[cols.ORIGIN, : n // 2] = w[cols.ORIGIN, : n // 2]
    # a lone scheduler record that origin 1 moved by -3,000 puts on a step of its seq
    w[cols.ORIGIN, -1] = 0
    lone = _records("scheduler", (seqs[n - 1], starts[n - 1] + 3_000))
    lone[cols.ORIGIN] = 1
    joined = cols.join(np.concatenate([s, lone], axis=1), w, 500)
    assert joined is not None
    was = np.array([0, 5_000, -2_000])
    placed = cols.place(joined, was)
    sorts: list[int] = []
    lexsort = np.lexsort
    monkeypatch.setattr(cols.np, "lexsort", lambda keys: sorts.append(len(keys)) or lexsort(keys))
    for now, no_sort in (
        (was + 700, True),  # one clock moved under every origin
        (np.array([0, 5_000, 1_000]), False),
        (np.array([0, 3_000, -2_000]), False),  # origin 1 onto origin 0's times: ties
    ):
        sorts.clear()
        got = cols.moved(placed, was, now)
        assert (not sorts) == no_sort, sorts
        want = cols.place(joined, now)
        assert got.shape == want.shape and (got == want).all(), now
        ties = (np.diff(want[cols.START]) == 0) & (np.diff(want[cols.SEQ]) == 0)
        if now[1] == 3_000:
            assert ties.any()  # the case is what it says
            for then in (was + 700, now + 500):  # from tied steps: sorted, still exact
                sorts.clear()
                assert (cols.moved(got, now, then) == cols.place(joined, then)).all()
                assert sorts


def test_steps_joined_from_one_table_let_their_blocks_go() -> None:
    """The build joins an engine's records from one table (`stacked`: worker blocks,
    then scheduler blocks), emptying the block lists as it copies them, so the blocks
    and the table are never both whole in memory; the join and the placing in place
    equal the two-sided join and a placing on a copy."""
    from tracedpush.analysis import steps_columns as cols

    w = [_records("worker", (1, 100), (2, 5_000)), _records("worker", (3, 9_000))]
    s = [_records("scheduler", (2, 5_050)), _records("scheduler", (1, 120), (4, 20_000))]
    want = cols.join(np.concatenate(s, axis=1), np.concatenate(w, axis=1), 100)
    blocks = [*w, *s]
    table = cols.stacked(w, s)
    assert w == [] and s == []  # let go
    assert (table == np.concatenate(blocks, axis=1)).all()
    got = cols.join_table(table, 3, 100)
    assert want is not None and got is not None and (got == want).all()
    assert got.shape[1] == 4  # seq 1 and 2 merged, 3 and 4 alone
    off = np.array([250], np.int64)
    on_copy = cols.place(got, off)
    assert (cols.place(got, off, own=True) == on_copy).all()
    assert (got[cols.START] == want[cols.START] - 250).all()  # moved where it was


def test_thread_samples_survive_pickling(run) -> None:
    """Steps and their parts are pickled with their thread samples as `marshal`ed
    tuples (an index writes them on every pause of a Live run; the build's workers send
    theirs): the same samples come back."""
    import pickle

    from tracedpush.analysis.steps import StepParts

    store = run.engine_steps
    assert store.samples
    assert pickle.loads(pickle.dumps(store)).samples == store.samples
    parts = StepParts()
    parts.samples = list(store.samples)
    assert pickle.loads(pickle.dumps(parts)).samples == store.samples


def test_thread_samples_read_back_stay_packed_until_asked(run) -> None:
    """Steps read back from an index keep their thread samples packed through what a
    Live refresh does with them (truth, extensions, pickling again: the new ones in a
    chunk of their own), and unpack them,
    with the new ones in time order, only when asked: the same samples as steps made
    and extended with every sample unpacked."""
    import pickle

    from tracedpush.analysis.steps import StepParts

    store = run.engine_steps
    later = [replace(x, time_ns=x.time_ns + 1) for x in store.samples[::3]]  # ties too
    same_time = [replace(x, time_ns=store.samples[0].time_ns) for x in store.samples[:2]]
    parts = [StepParts(), StepParts()]
    parts[0].samples, parts[1].samples = later, same_time

    back = pickle.loads(pickle.dumps(store))
    assert back._packed is not None and back  # truthy without unpacking
    assert store._packed is not None  # pickled: kept packed (an index writes at every pause)
    assert store.samples and store._packed is None  # asked: unpacked again
    grown = back.extended(parts[0], [], {})
    assert grown is not None and grown._packed is back._packed and back._packed is not None
    blob = pickle.dumps(back)  # as read: pickled again as it was
    assert pickle.loads(blob)._packed == back._packed
    grown = grown.extended(parts[1], [], {})
    assert grown is not None and grown._packed is not None

    eager = store.extended(parts[0], [], {})
    assert eager is not None and eager._packed is None
    eager = eager.extended(parts[1], [], {})
    assert eager is not None
    again = pickle.loads(pickle.dumps(grown))  # the new ones packed beside: not unpacked
    assert len(grown._packed) == 2 and not grown._more and again._packed == grown._packed
    assert again.samples == eager.samples
    assert grown.samples == eager.samples  # unpacked now, the new ones in their places
    assert grown._packed is None and len(back._packed) == 1  # `back` is not changed
    assert pickle.loads(pickle.dumps(grown)).samples == eager.samples
    empty = pickle.loads(pickle.dumps(EngineSteps()))
    assert not empty and empty.samples == []


def test_step_arrays_made_from_the_last_ones_keep_the_running_end() -> None:
    """A long step ends after the later ones: the running maximum of ends (by which a
    decode window finds its first step) goes on from the unchanged steps', not from
    the new ones alone."""
    from tracedpush.analysis import steps_columns as cols
    from tracedpush.analysis.index_steps import StepArrays

    c = _records("worker", (1, 0), (2, 10), (3, 20), (4, 30), (5, 40))
    c[cols.END, 0] = 10**9  # the first step outlasts the others
    grown, fresh = StepArrays(c, StepArrays(c[:, :3]), 3), StepArrays(c)
    for name in ("worker", "conn_us", "max_end"):
        assert np.array_equal(getattr(grown, name), getattr(fresh, name)), name
    assert grown.max_end.tolist() == [10**9] * 5
