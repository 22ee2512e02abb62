"""The report names cross-engine CPU contention when the engines are not pinned.

This reproduces the launcher's old partial pinning (`TRACEDPUSH_PIN_ENGINE_TREE=0`:
vLLM binds only each worker's OpenMP threads, so the API servers and EngineCores of
both engines float over both cores) on a real push 1P1D under load, and checks that the
report's contention findings name an engine's process running on the other engine's
compute core, from the engines' own `engine.threads` samples. The pinned deployments of
the other e2e tests must produce no such finding (see test_under_load.py).

Where the floating threads land is the kernel's choice, and in about one run of twenty
it kept each engine's floaters off the other's compute core for a whole workload: there
was then nothing to find. So the test gives the scheduler up to `ROUNDS` workloads on
the same deployment and stops at the first that leaves a finding; the report must name
it by then. (Narrowing D's API server onto P's compute core would make the contention
certain, but then P released the pushed blocks before D's registrations came, and D's
requests hung until the client's timeout: tried, not kept.)

It runs before the shared deployments start (it has no `pd` marker), on its own ports,
under the session's engines lock.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tracedpush.analysis import TraceStore, analyze
from tracedpush.bench.workload import PromptMaker, run_workload
from tracedpush.launcher import Deployment
from tracedpush.testing.unpinned import check_flushed, push_config

ROUNDS = 3  # workloads at most, each about 20 s here

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def test_unpinned_engines_are_named_as_contending(tmp_path: Path) -> None:
    config = push_config(tmp_path)
    prompts = PromptMaker(config.model, seed=5).mix([512, 1024], 24)
    with Deployment(config) as d:
        for _ in range(ROUNDS):
            results = run_workload(d.proxy_url, prompts, 8, 8, model=d.model_name)
            assert all(r.ok for r in results), [r.to_dict() for r in results if not r.ok][:2]
            time.sleep(3.0)  # the last thread samples (about one a second) and sweeps
            found = analyze(TraceStore.from_path(config.traces_dir), spans=False).contention()
            assert found, "no engine.threads samples in the traces"
            cross = [f for f in found.findings if f.kind == "cross_engine"]
            if cross:
                break
    # the affinity the samples report: the float is visible in the data itself
    floating = [t for t in found.threads if t.process != "worker" and "-" in t.affinity]
    assert floating, "unpinned API servers / EngineCores should be allowed on 0-1"
    assert cross, [f.text for f in found.findings]
    print("\n" + "\n".join(f.text for f in cross))
    # the stop let every engine process (P and D, scheduler and worker) and the proxy flush
    check_flushed(analyze(TraceStore.from_path(config.traces_dir), spans=False).export_health(), d)
