"""Contention from engine.threads samples: the unpinned case is named, the pinned not."""

from __future__ import annotations

import pytest

from tracedpush.analysis import TraceStore, analyze, run_json
from tracedpush.analysis.report import render
from tracedpush.testing import synthetic

SAME_HOST = {synthetic.PREFILL_INSTANCE: "vm", synthetic.DECODE_INSTANCE: "vm"}


def _run(**kw):
    gen = synthetic.generate(60, seed=5, modes=("push",), hosts=SAME_HOST, **kw)
    return analyze(TraceStore.from_documents(gen.documents))


@pytest.fixture(scope="module")
def unpinned():
    return _run(unpinned_decode=True)


@pytest.fixture(scope="module")
def pinned():
    return _run()


def test_unpinned_decode_engine_core_on_prefill_core_is_named(unpinned) -> None:
    c = unpinned.contention()
    cross = [f for f in c.findings if f.kind == "cross_engine"]
    assert cross, [f.text for f in c.findings]
    f = cross[0]
    assert f.engine_id == synthetic.PREFILL_INSTANCE
    assert f.details["intruder_engine_id"] == synthetic.DECODE_INSTANCE
    assert f.details["intruder_role"] == "engine_core"
    assert f.details["cores"] == [0]
    assert "decode engine_core" in f.text and "core 0" in f.text
    assert "prefill model runner" in f.text and "s of CPU" in f.text
    report = render(unpinned)
    assert "Contention" in report and f.text in report
    js = run_json(unpinned)["contention"]
    assert js["findings"][0]["kind"] == "cross_engine"


def test_pinned_has_no_cross_engine_finding(pinned) -> None:
    c = pinned.contention()
    assert c.samples > 0
    assert not [f for f in c.findings if f.kind == "cross_engine"]


def test_other_hosts_never_contend() -> None:
    gen = synthetic.generate(30, seed=6, modes=("push",), unpinned_decode=True)
    run = analyze(TraceStore.from_documents(gen.documents))
    assert not [f for f in run.contention().findings if f.kind == "cross_engine"]


def test_cpu_per_thread_and_tracing_cost(pinned) -> None:
    c = pinned.contention()
    by_role = {}
    for t in c.threads:
        by_role.setdefault((t.engine_role, t.role), []).append(t)
    runner = by_role[("prefill", "model_runner")][0]
    assert runner.cpu_ms > 0 and runner.core_share() == {0: 1.0}
    assert by_role[("decode", "model_runner")][0].core_share() == {1: 1.0}
    assert runner.affinity == "0"
    cost = c.cost
    assert 0 < cost.tracedpush_cpu_ms < cost.engine_cpu_ms
    assert cost.thread_ratio == pytest.approx(cost.tracedpush_cpu_ms / cost.engine_cpu_ms)
    assert cost.events > 0
    with_hooks = pinned.contention(event_cost_us=1.0).cost
    assert with_hooks.ratio > with_hooks.thread_ratio
    js = c.to_json()
    assert js["tracedpush_cost"]["thread_ratio"] < 0.05
    assert {p["process"] for p in js["processes"]} == {"engine_core", "api_server", "worker"}


def test_contention_folds_only_the_samples_since_the_last(unpinned, monkeypatch) -> None:
    """Steps extended with new samples fold only those into their contention's fold
    (a copy: the old steps' is unchanged), and the result equals contention made of
    every sample, findings, costs and windows included; a late sample (at or before its
    thread's last folded one) makes it again from every sample, equal too."""
    from dataclasses import replace

    from tracedpush.analysis.contention import UsageFold, contention
    from tracedpush.analysis.steps import EngineSteps

    every = sorted(unpinned.engine_steps.samples, key=lambda s: s.time_ns)
    assert len({s.engine_id for s in every}) == 2
    folded: list[int] = []
    fold = UsageFold.add
    monkeypatch.setattr(UsageFold, "add", lambda f, x: folded.append(len(x)) or fold(f, x))
    # the first engine's samples, then the other's: new threads come with the extension
    first = [s for s in every if s.engine_id == every[0].engine_id]
    rest = [s for s in every if s.engine_id != every[0].engine_id]
    for head, tail in ((every[: len(every) // 3], every[len(every) // 3 :]), (first, rest)):
        old = EngineSteps()
        old.samples = head
        before = contention(old).to_json()
        new = EngineSteps()
        new._samples_from(old, tail)
        folded.clear()
        assert contention(new).to_json() == contention(every).to_json()
        assert folded == [len(tail), len(every)]  # the new ones; then `every` alone
        assert contention(old).to_json() == before and old.usage.samples == len(head)
    late = replace(every[-1], time_ns=every[-1].time_ns - 1)  # before its thread's last
    grown = EngineSteps()
    grown._samples_from(new, [late])
    folded.clear()
    assert contention(grown).to_json() == contention([*every, late]).to_json()
    assert folded == [len(every) + 1, len(every) + 1]  # made again from every sample


def test_a_thread_that_waited_for_a_cpu_is_named_with_its_wait(unpinned, pinned) -> None:
    """The synthetic unpinned D's EngineCore spends half its time on P's busy core and
    waits there (a rule: 0.6 ms per ms of CPU); pinned, every thread waits 0.02 ms per
    ms, under `WAIT_SHARE`: nothing is named."""
    from tracedpush.analysis.contention import WAIT_SHARE

    c = unpinned.contention()
    waits = [f for f in c.findings if f.kind == "cpu_wait"]
    assert [f.engine_id for f in waits] == [synthetic.DECODE_INSTANCE], [f.text for f in waits]
    (core,) = [t for t in c.threads if t.engine_role == "decode" and t.role == "engine_core"]
    assert core.wait_known and core.cpu_wait_ms == pytest.approx(0.6 * core.cpu_ms, rel=0.01)
    assert core.wait_share() == pytest.approx(0.6 / 1.6, rel=0.01)
    f = waits[0]
    assert f.cpu_ms == pytest.approx(core.cpu_wait_ms)
    assert f"decode engine_core (pid {core.pid}) {core.cpu_wait_ms / 1000.0:.2f} s" in f.text
    assert "38% of the time it was runnable" in f.text
    assert f.details["waits"][0]["tid"] == core.tid and f.details["waits"][0]["core"] == 1
    # mostly on D's core, where D's worker computes: named as the busiest there
    busiest = f.details["busiest_on_core"]["1"]
    on_1 = sorted(c.threads, key=lambda t: -t.cpu_by_core_ms.get(1, 0.0))  # one host
    assert [b["tid"] for b in busiest] == [t.tid for t in on_1[:2]]
    assert busiest[0]["role"] == "compute" and busiest[1]["role"] == "model_runner"
    assert "on core 1 (busiest there: decode worker VLLM::Worker (pid 1004)" in f.text
    assert c.findings.index(f) > c.findings.index(
        next(x for x in c.findings if x.kind == "cross_engine")
    )
    js = run_json(unpinned)["contention"]
    row = next(t for t in js["threads"] if t["tid"] == core.tid and t["pid"] == core.pid)
    assert row["cpu_wait_s"] == pytest.approx(core.cpu_wait_ms / 1000.0, abs=1e-4)
    assert f.text in render(unpinned) and "wait s" in render(unpinned)
    quiet = pinned.contention()
    assert not [f for f in quiet.findings if f.kind == "cpu_wait"]
    assert all(t.wait_share() < WAIT_SHARE for t in quiet.threads if t.wait_known)


def test_a_wait_is_a_difference_of_known_samples_only() -> None:
    """Cumulative waits are differenced like CPU; a sample without one (-1: not known
    there) or traces from before the attribute (no waits at all) add nothing, and the
    thread's JSON says `null`, not 0."""
    from tracedpush.analysis.contention import thread_usage
    from tracedpush.analysis.steps import ThreadSample

    def smp(t: int, cpu: float, wait: float | None) -> ThreadSample:
        return ThreadSample(
            "d", "decode", "vm", "scheduler", "7", t, (7,), (7,), ("api_server",),
            ("python",), ("api_server",), (cpu,), (1,), ("1",),
            cpu_wait_ms=None if wait is None else (wait,),
        )  # fmt: skip

    (t,) = thread_usage([smp(1, 10, 5), smp(2, 20, 25), smp(3, 30, -1), smp(4, 40, 90)])
    assert t.wait_known and t.cpu_wait_ms == 20.0  # 5 -> 25; unknown at 3 breaks 25 -> 90
    (t,) = thread_usage([smp(4, 40, 90), smp(5, 50, 100)])
    assert t.cpu_wait_ms == 10.0
    (old,) = thread_usage([smp(1, 10, None), smp(2, 20, None)])
    assert not old.wait_known and old.to_json()["cpu_wait_s"] is None
