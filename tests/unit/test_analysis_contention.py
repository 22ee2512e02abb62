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
