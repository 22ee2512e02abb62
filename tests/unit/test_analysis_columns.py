"""The run-wide statistics over columns (`columns.RunColumns`) equal a plain loop over
the requests; the analysis index's lazy requests, kept steps summary, TPOT breakdowns
over step arrays and sampled runs give `analyze()`'s answers."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest
from test_analysis_index import same, same_columns
from test_analysis_sampling import with_sampler

from tracedpush.analysis import TraceStore, analyze, compare, index_steps
from tracedpush.analysis import steps_columns as cols
from tracedpush.analysis.columns import RunColumns, SlotColumns, row_of
from tracedpush.analysis.compare import ALL, _median, _summary, percentile, summary
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.results import LazyRequests, LazySteps
from tracedpush.analysis.tpot import KEYS
from tracedpush.testing import synthetic


@pytest.fixture(scope="module")
def gen() -> synthetic.SyntheticRun:
    return synthetic.generate(150, seed=11, batch=6, clock_offsets_ms={"decode-0": 7.0})


def _loop_mean(values: list[float]) -> float | None:
    """The requests' values added in their order by a plain loop, over their number."""
    acc = 0.0
    for v in values:
        acc += v
    return acc / len(values) if values else None


def _loop_summary(values: list[float], qs: tuple[int, ...]) -> dict:
    vs = sorted(values)
    out = {f"p{q}": percentile(vs, q) for q in qs}
    out["mean"] = _loop_mean(values)
    out["n"] = len(vs)
    return out


def test_compare_equals_a_loop_over_the_requests(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    """Every group's statistics, recomputed here request by request (the code compare
    had before it used columns), are equal to the last bit."""
    gen.write(tmp_path)
    run = analyze(TraceStore.from_paths([tmp_path]), spans=False)
    cmp = compare(run)
    assert cmp.overall is not None and len(cmp.groups) > 3
    for g in cmp.groups:
        rs = [
            r
            for r in run.requests
            if r.ttft_ms is not None
            and (g.bucket == ALL or r.bucket == g.bucket)
            and (g.load == ALL or r.load_bucket == g.load)
        ]
        for m in g.n:
            mine = [r for r in rs if r.mode == m]
            assert g.n[m] == len(mine)
            assert g.ttft[m] == _loop_summary([r.ttft_ms for r in mine], (50, 90, 99))
            tp = [r.tpot_ms for r in mine if r.tpot_ms is not None]
            assert g.tpot[m] == _loop_summary(tp, (50, 90, 99))
            names = {p for r in mine for p in r.phase_ms()}
            assert set(g.phases[m]) == names
            for p in names:
                col = [r.phase_ms().get(p, 0.0) for r in mine]
                assert g.phases[m][p] == _loop_summary(col, (50, 90))
        acc = g.tpot_account
        if acc is not None:
            for m, mean in ((cmp.a, acc.a_tpot_mean_ms), (cmp.b, acc.b_tpot_mean_ms)):
                sel = [r for r in rs if r.mode == m and r.tpot_breakdown_ms and r.tpot_ms]
                assert acc.n[m] == len(sel)
                assert mean == _loop_mean([r.tpot_ms for r in sel])
                for k in KEYS:
                    row = acc.row(k)
                    assert row is not None
                    vals = [r.tpot_breakdown_ms.get(k, 0.0) for r in sel]
                    got = (
                        (row.a_mean_ms, row.a_p50_ms)
                        if m == cmp.a
                        else (row.b_mean_ms, row.b_p50_ms)
                    )
                    assert got == (_loop_mean(vals), _loop_median(vals))
            tpots = {
                m: [r.tpot_ms for r in rs if r.mode == m and r.tpot_breakdown_ms and r.tpot_ms]
                for m in (cmp.a, cmp.b)
            }
            p50 = _loop_median(tpots[cmp.a]) - _loop_median(tpots[cmp.b])
            assert acc.tpot_p50_delta_ms == p50


def _loop_median(values: list[float]) -> float | None:
    vs, n = sorted(values), len(values)
    return None if not n else vs[n // 2] if n % 2 else (vs[n // 2 - 1] + vs[n // 2]) / 2.0


def test_order_statistics_and_means_of_a_column_are_a_loops() -> None:
    """compare's column helpers (a partition, not a sort; a sequential sum) give what
    sorting and a plain loop give, with ties, negative zeros and every small size; so
    does `summary`, over any iterable."""
    rng = np.random.default_rng(5)
    cases = [[], [3.0], [-0.0], [-0.0, -0.0], [2.0, 1.0], rng.integers(0, 4, 9).astype(float)]
    cases += [rng.lognormal(2.0, 1.5, n) for n in (3, 10, 101, 1_000)]
    for values in cases:
        vs = sorted(float(v) for v in values)
        arr = np.asarray(values, dtype="float64")
        got = _summary(arr, (50, 90, 99))
        want = {f"p{q}": percentile(vs, q) for q in (50, 90, 99)}
        want |= {"mean": _loop_mean([float(v) for v in values]), "n": len(vs)}
        assert got == want and str(got["mean"]) == str(want["mean"])  # -0.0 is not 0.0 here
        # the benchmark client's figures (any iterable): the same definition, one mean
        assert summary(float(v) for v in values) == want
        assert _median(arr) == _loop_median(vs)


def test_the_index_reads_results_and_steps_when_used(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    d = tmp_path / "traces"
    gen.write(d)
    want = analyze(TraceStore.from_paths([d]), spans=False)
    AnalysisIndex([d]).update()  # cold
    idx = AnalysisIndex([d])
    run = idx.update()
    assert isinstance(run.requests, LazyRequests) and run.requests.loaded == 0
    assert isinstance(run.engine_steps, LazySteps)
    # the statistics, the slowest requests and the steps summary read no result
    assert compare(run).to_json() == compare(want).to_json()
    slow = run.slowest(5)
    assert [r.trace_id for r in slow] == [r.trace_id for r in want.slowest(5)]
    assert run.requests.loaded == 5
    assert run.steps_summary() == want.engine_steps.summary()
    assert run.engine_steps._obj is None
    assert run.get(want.requests[3].request_id) == want.requests[3]
    same(run, want)
    idx.close()


def test_a_window_of_the_index_run_is_its_columns_not_its_requests(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    """The console's Live window: a part of a 200,000-request run must cost numpy over
    its rows, not a read of each request; its statistics and table are those of the
    same requests analysed in memory."""
    d = tmp_path / "traces"
    gen.write(d)
    want = analyze(TraceStore.from_paths([d]), spans=False)
    AnalysisIndex([d]).update()
    idx = AnalysisIndex([d])
    run = idx.update()
    starts = sorted(r.start_unix_ms for r in want.requests)
    since = starts[len(starts) // 2]
    at = [i for i, r in enumerate(want.requests) if r.start_unix_ms >= since]
    window = run.subset(at)
    plain = want.subset(at)
    assert isinstance(window.requests, LazyRequests) and window.columns() is not None
    assert plain.columns() is None and len(window) == len(plain) == len(at)
    assert compare(window).to_json() == compare(plain).to_json()
    assert window.table_columns() == _by_column(plain.table(), window.table_columns())
    phase = next(k for k in window.table_columns() if k.startswith("critical_ms."))
    some = ("mode", "ttft_ms", phase, "request_id")  # only those, as they are
    got = window.table_columns(some)
    assert got is not None and sorted(got) == sorted(some)
    assert got == {k: v for k, v in window.table_columns().items() if k in some}
    assert run.requests.loaded == 0  # nothing read so far
    assert window.requests[0] == want.requests[at[0]] and run.requests.loaded == 1
    assert window.get(want.requests[at[-1]].trace_id) == want.requests[at[-1]]
    idx.close()


def _by_column(rows: list[dict], like: dict | None) -> dict:
    """`RunAnalysis.table()` rows as columns, in `like`'s keys (absent phase: None)."""
    assert like is not None
    return {k: [row.get(k) for row in rows] for k in like}


def test_a_sampled_run_through_the_index(tmp_path: Path) -> None:
    """Mixed ratios: the common sample the statistics keep is the same over columns."""
    docs = synthetic.generate(120, seed=5).documents
    rng = random.Random(1)
    half = len(docs) // 2
    with_sampler(docs[:half], "parentbased_traceidratio", 0.5)
    with_sampler(docs[half:], "parentbased_traceidratio", rng.choice([0.25, 0.1]))
    d = tmp_path / "traces"
    d.mkdir()
    (d / "run.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    want = analyze(TraceStore.from_paths([d]), spans=False)
    assert want.sampling().mixed
    AnalysisIndex([d]).update()
    got = AnalysisIndex([d]).update()
    assert got.sampling() == want.sampling()
    assert got.failures().to_json() == want.failures().to_json()
    same(got, want)


def test_breakdown_over_arrays_equals_the_step_walk(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    """`index_steps.breakdowns` against `tpot.breakdown` on random windows of D's steps,
    some starting or ending inside steps, some empty or outside every step: all of an
    engine's windows at once, in blocks of every size down to one window."""
    from tracedpush.analysis.tpot import breakdown

    gen.write(tmp_path)
    store = analyze(TraceStore.from_paths([tmp_path]), spans=False).engine_steps
    assert store is not None
    rng = random.Random(4)
    checked = 0
    for eid, steps in store.steps.items():
        c = store.columns[eid]
        if not cols.has_worker(c).any():
            continue
        lo, hi = steps[0].start_ns - 10**7, steps[-1].end_ns + 10**7
        # a step in ten a scheduler record only (no worker record): not counted; and a
        # step in ten ending after the next ones start (the cursor's case)
        c[cols.DURATION, rng.sample(range(c.shape[1]), c.shape[1] // 10)] = cols.NONE
        c[cols.END, rng.sample(range(c.shape[1]), c.shape[1] // 10)] += 3 * 10**7
        store._lists.clear()
        store._solo.clear()
        store._solo_steps.clear()
        store._max_end.clear()
        arr = index_steps.StepArrays(c)
        solo = store.step_solo_us(eid)
        assert solo.tolist() == arr.solo_us.tolist()
        windows = []
        for _ in range(300):
            t0 = rng.randrange(lo, hi)
            t1 = t0 + rng.choice([0, 1, 10**5, 10**6, 10**7, 10**8, 10**9])
            windows.append((t0, t1, rng.uniform(0.01, 20.0), rng.randrange(1, 200)))
        t0s, t1s, tps, tokens = (list(x) for x in zip(*windows, strict=True))
        assert len({t1 - t0 for t0, t1, *_ in windows}) > 5
        # the steps' solo costs; ones that cut more steps; an engine without any (NaN)
        for s_us in (solo, solo / 2, np.full(len(solo), np.nan)):
            arr.solo_us = store._solo_steps[eid] = s_us
            want = [breakdown(store, eid, *w) for w in windows]
            for block in (index_steps.BLOCK, 4096, 64, 1):
                got = index_steps.breakdowns(arr, t0s, t1s, tps, tokens, block)
                assert got == want, block
            checked += len(windows)
    assert checked >= 300


def test_shares_over_arrays_equal_the_scalar_shares() -> None:
    """`index_steps.shares` against `tpot.shares` where they could part: sums over the
    TPOT (scaled down to it), a TPOT of 0 or below, 0 or 1 tokens, empty windows, and
    values whose float rounding differs with the order of operations."""
    from tracedpush.analysis.tpot import shares

    rng = random.Random(7)
    rows = [
        (3e6, 1e6, 5e5, 2.0, 1),  # over the TPOT: scaled, scheduling 0
        (3e6, 1e6, 5e5, 0.0, 1),  # TPOT 0: not scaled
        (3e6, 1e6, 5e5, -1.0, 3),
        (0.0, 0.0, 0.0, 5.0, 0),  # no step in the window, no token
        (1e6, 0.0, 0.0, 1.0, 1),  # exactly the TPOT
    ]
    for _ in range(2000):
        rows.append(
            (
                rng.uniform(0, 1e8) * rng.choice([0, 1]),
                rng.uniform(0, 1e7),
                rng.uniform(0, 1e6) / 3,
                rng.choice([rng.uniform(0, 50), 0.1 + rng.random() / 7]),
                rng.randrange(0, 300),
            )
        )
    fwd, extra, conn, tp, tokens = (list(x) for x in zip(*rows, strict=True))
    got = index_steps.shares(np.array(fwd), np.array(extra), np.array(conn), tp, tokens)
    want = [shares(*row) for row in rows]
    assert got == want
    assert [list(d) for d in got] == [list(d) for d in want]  # the keys' order too
    assert any(
        d["scheduling and other"] == 0.0 and r[3] > 0 for d, r in zip(got, rows, strict=True)
    )


def test_report_of_some_traces_through_the_index(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    """`report --trace-id` picks the requests by column and reads only those."""
    from tracedpush.cli import main

    d = tmp_path / "traces"
    gen.write(d)
    run = analyze(TraceStore.from_paths([d]), spans=False)
    ids = [run.requests[5].trace_id, run.requests[9].request_id]
    outs = []
    for extra in (["--no-index"], ["--index"]):
        out = tmp_path / f"{extra[0]}.json"
        args = ["report", "--traces", str(d), "--format", "json", "--out", str(out), *extra]
        assert main([*args, "--trace-id", ids[0], "--trace-id", ids[1]]) == 0
        got = json.loads(out.read_text())
        del got["load_stats"]
        outs.append(got)
    assert outs[0] == outs[1] and len(outs[0]["requests"]) == 2


def _columns_by_loop(requests: list, breakdowns: list) -> RunColumns:
    """`RunColumns` of `requests` made request by request (what `RunColumns.build` did
    before it went through `SlotColumns`): the reference `SlotColumns` must equal."""
    n = len(requests)
    phases: dict[str, None] = {}  # in order of first appearance
    for r in requests:
        phases.update(dict.fromkeys(r.phase_ms()))
    phase = np.zeros((n, len(phases)))
    has = np.zeros((n, len(phases)), dtype=bool)
    bd = np.zeros((n, len(KEYS)))
    has_bd = np.zeros(n, dtype=bool)
    for i, r in enumerate(requests):
        for j, p in enumerate(phases):
            if p in r.phase_ms():
                phase[i, j], has[i, j] = r.phase_ms()[p], True
        if breakdowns[i] and r.tpot_ms is not None:
            bd[i] = [breakdowns[i].get(k, 0.0) for k in KEYS]
            has_bd[i] = True

    def floats(name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in requests], dtype=float).reshape(n)

    def flags(values: list) -> np.ndarray:
        return np.array(values, dtype=bool).reshape(n)

    failed = flags([r.failure is not None for r in requests])
    return RunColumns(
        trace_id=[r.trace_id for r in requests],
        request_id=[r.request_id for r in requests],
        mode=[r.mode for r in requests],
        bucket=[r.bucket for r in requests],
        load_bucket=[r.load_bucket for r in requests],
        load=[r.load for r in requests],
        prompt=[r.prompt_tokens for r in requests],
        output=[r.output_tokens for r in requests],
        error=[r.error for r in requests],
        ttft=floats("ttft_ms"),
        tpot=floats("tpot_ms"),
        start=floats("start_unix_ms"),
        complete=flags([r.complete for r in requests]),
        proxy_seen=flags([r.proxy_seen for r in requests]),
        failed=failed,
        recovered=~failed & flags([r.error is not None for r in requests]),
        sampler=[r.sampler for r in requests],
        ratio=[r.sampling_ratio for r in requests],
        problems=[tuple(r.problems) for r in requests],
        phases=list(phases),
        phase=phase,
        has_phase=has,
        bd=bd,
        has_bd=has_bd,
    )


def test_slot_columns_equal_columns_made_request_by_request(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    """`SlotColumns` as the index uses it: every slot written twice, first with another
    request's row (a request re-analysed: its shape of critical path, phases, TPOT and
    breakdown change), in batches and orders of their own; then part of the slots taken
    in another order. Equal to those requests' columns made one by one in that order,
    phase order included (first appearance); `RunColumns.build` too."""
    gen.write(tmp_path)
    rs = analyze(TraceStore.from_paths([tmp_path]), spans=False).requests
    n = len(rs)
    assert {r.mode for r in rs} == {"push", "pull"} and any(r.tpot_breakdown_ms for r in rs)
    rng = random.Random(3)
    # slot i ends with request i (every 5th without a breakdown); first it holds another
    # request's row and breakdown (pull where push)
    bds = [None if i % 5 == 0 else r.tpot_breakdown_ms for i, r in enumerate(rs)]
    slots = SlotColumns()
    for which in (lambda i: n - 1 - i, lambda i: i):
        order = list(range(n))
        rng.shuffle(order)
        for part in (order[: n // 3], order[n // 3 :]):
            mine = [rs[which(i)] for i in part]
            slots.write(part, [r.trace_id for r in mine], [row_of(r) for r in mine],
                        [r.bucket for r in mine])  # fmt: skip
            slots.write_breakdowns(part, [bds[which(i)] for i in part])
    taken = rng.sample(range(n), n // 2)
    loads = [rs[i].load for i in taken]
    load_buckets = [rs[i].load_bucket for i in taken]
    want = _columns_by_loop([rs[i] for i in taken], [bds[i] for i in taken])
    same_columns(slots.take(taken, loads, load_buckets), want)
    built = RunColumns.build(
        [rs[i].trace_id for i in taken],
        [row_of(rs[i]) for i in taken],
        [rs[i].bucket for i in taken],
        load_buckets,
        [bds[i] for i in taken],
        loads,
    )
    same_columns(built, want)
    same_columns(slots.take([], [], []), _columns_by_loop([], []))


def test_frame_columns_make_the_frame_of_the_table(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    """The console's request table: its numeric columns as arrays (NaN for None) make the
    same data frame as `table()`'s lists, absent phases and missing TTFTs included."""
    pd = pytest.importorskip("pandas")
    d = tmp_path / "traces"
    gen.write(d)
    idx = AnalysisIndex([d])
    cols = idx.update().columns()
    assert cols is not None
    table = cols.table()
    phases = [k for k in table if k.startswith("critical_ms.")]
    assert any(None in table[k] for k in phases)  # a phase one mode does not have
    pd.testing.assert_frame_equal(pd.DataFrame(cols.frame_columns()), pd.DataFrame(table))
    no_ttft = cols.take([0, 1])
    no_ttft.ttft[0] = np.nan  # as a request that never got its first token
    pd.testing.assert_frame_equal(
        pd.DataFrame(no_ttft.frame_columns()), pd.DataFrame(no_ttft.table())
    )
    idx.close()


def _steps(starts_s: list[float], forward_us: list[int], decode_reqs: list[int]) -> np.ndarray:
    """Worker-recorded steps (no connector calls) starting at `starts_s`, sorted."""
    c = np.full((len(cols.FIELDS), len(starts_s)), cols.NONE, dtype=np.int64)
    c[cols.START] = [int(s * 1e9) for s in starts_s]
    c[cols.END] = c[cols.START] + 1000 * np.array(forward_us)
    c[cols.DURATION] = forward_us
    c[cols.DECODE_REQS] = decode_reqs
    c[cols.PREFILL] = 0
    return c


def test_the_solo_cost_is_each_epoch_median_and_fills_epochs_without_one() -> None:
    """`steps_columns.step_solo_us`: per step, the median forward of its minute's
    one-decode-request steps when the minute has `SOLO_MIN_STEPS` of them; a minute with
    fewer takes the last earlier minute's, the first minutes the first later one's; when
    no minute has enough, all of them at once; an engine without any, its smallest
    forward."""
    minute = cols.SOLO_EPOCH_NS / 1e9
    enough = cols.SOLO_MIN_STEPS
    assert enough > 2
    one = [100 * (i + 1) for i in range(enough)]  # minute 1: median of these
    three = [200 + 100 * i for i in range(enough + 1)]  # minute 3: median of these
    starts = [0.5 * minute, 0.6 * minute]
    starts += [(1 + (i + 1) / (enough + 2)) * minute for i in range(enough)]
    starts += [2.3 * minute, 2.6 * minute]  # two one-request steps: too few, noise
    starts += [(3 + (i + 1) / (enough + 3)) * minute for i in range(enough + 1)]
    starts += [4.5 * minute]
    forward = [900, 950, *one, 5000, 7000, *three, 800]
    reqs = [1, 3] + [1] * enough + [1, 1] + [1] * (enough + 1) + [4]
    c = _steps(starts, forward, reqs)
    m1, m3 = statistics.median(one), statistics.median(three)
    want = [m1, m1] + [m1] * enough + [m1, m1] + [m3] * (enough + 1) + [m3]
    got, first = cols.solo_by_epoch(c)
    assert got.tolist() == want and first == 2  # minute 1's first step
    assert cols.step_solo_us(c).tolist() == want
    # a tail carrying the cost before it: its first minutes without their own take that
    tail = c[:, 2 + enough :]
    assert cols.step_solo_us(tail, carry=123.0).tolist() == [123.0, 123.0, *want[-enough - 2 :]]
    # no minute with enough: every step the median of all one-request steps
    few = _steps([0.5 * minute, 1.5 * minute, 2.5 * minute, 2.6 * minute],
                 [300, 100, 200, 900], [1, 1, 1, 3])  # fmt: skip
    assert cols.solo_by_epoch(few)[0].tolist() == [200.0] * 4 and cols.solo_by_epoch(few)[1] == -1
    busy = _steps([0.1 * minute, 2.1 * minute], [900, 700], [3, 2])
    busy[cols.NUM_REQS] = [3, 2]
    assert cols.step_solo_us(busy).tolist() == [700.0, 700.0]  # no one-request step at all


def test_extended_step_arrays_compute_only_the_last_epochs_again() -> None:
    """`index_steps.StepArrays` extended from the arrays of the first steps: the same
    solo costs as made from all steps at once, with only the epochs from the last
    unchanged step's on computed again (its `same`)."""
    rng = random.Random(5)
    minute = cols.SOLO_EPOCH_NS / 1e9
    # minutes with many one-request steps, and (the first five of the second run) with
    # too few for a cost of their own
    dense = sorted(rng.uniform(0, 10 * minute) for _ in range(400))
    sparse = sorted([rng.uniform(0, 5 * minute) for _ in range(20)] + dense[200:])
    for starts in (dense, sparse):
        c = _steps(starts, [rng.randrange(100, 900) for _ in starts],
                   [rng.choice([1, 1, 2, 3]) for _ in starts])  # fmt: skip
        _extended_equals_whole(c)


def _extended_equals_whole(c: np.ndarray) -> None:
    whole = index_steps.StepArrays(c)
    n = c.shape[1]
    for kept in (1, 11, 37, n // 2, n - 1):
        head = index_steps.StepArrays(c[:, :kept])
        grown = index_steps.StepArrays(c, head, kept)
        assert grown.solo_us.tolist() == whole.solo_us.tolist(), kept
        epoch = c[cols.START, kept - 1] // cols.SOLO_EPOCH_NS
        k = int(np.argmax(c[cols.START] // cols.SOLO_EPOCH_NS == epoch))
        # from that epoch on, or all again when no earlier epoch has a cost of its own
        assert grown.same == (k if 0 <= whole.first_solo < k else 0), kept
        assert (grown.max_end == whole.max_end).all() and (grown.worker == whole.worker).all()
