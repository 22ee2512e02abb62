"""D, push mode, on vLLM's real workers: a prefill engine that died and came back on the
same side-channel port under the same engine id serves again.

vLLM's push decode caches the NIXL agent of each remote engine id and sends every
registration there; after P restarted, each send failed with NIXL_ERR_REMOTE_DISCONNECT
and every later request hung (found by hand on a real 1P1D, `tracedpush up --mode
push`, P SIGKILLed and restarted). `PushRenewal` (tracedpush/connector/
producer_renewal.py) drops the dead agent and sends the registration again.

Engines as in tests/unit/vllm_workers.py: vLLM's own schedulers, workers, writer threads
and ZMQ handshakes; only the NIXL agent is fake, and a dead process's agent raises
NIXL's disconnect error, as UCX does. `make test-vllm033` runs this against 0.33 too.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker
from vllm_workers import (
    Deployment,
    bare,
    decode,
    deployment,
    first_token,
    nixlRemoteDisconnectError,
    prefill,
    report,
    steps_until_received,
    until,
)

from tracedpush.connector.producer_renewal import (
    MAX_RESENDS,
    PullRenewal,
    PushRenewal,
    is_disconnect,
)

SECOND = "cmpl-req-8-0"  # the request sent after P came back


@pytest.fixture
def dep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with deployment(monkeypatch, tmp_path) as d:
        yield d


def _agents(worker) -> list[str]:
    """The agent names D holds for P (NIXL gives them as bytes)."""
    return [a.decode() for a in worker._remote_agents["p1"].values()]


def _restart_prefill(dep: Deployment, p):
    """P's process dies (its agent with it) and a new one starts on the same port and id."""
    p.shutdown()
    dep.fabric.dead.update(p.agents())
    return dep.engine("prefill", p.engine_id, 1, port=p.port)


def test_a_prefill_restarted_under_its_engine_id_serves_the_next_request(
    dep: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    p = dep.engine("prefill", "p1", 1)
    d = dep.engine("decode", "d1", 1)
    prefill(p)
    req = decode(d, p)
    steps_until_received(p, d)
    first_token(d, req)
    worker = d.workers[0].connector_worker
    assert _agents(worker) == p.agents()

    caplog.set_level(logging.WARNING, "tracedpush.connector.producer_renewal")
    p2 = _restart_prefill(dep, p)
    prefill(p2, base=SECOND)
    req = decode(d, p2, base=SECOND)
    steps_until_received(p2, d, d_rid=req.request_id)  # hung for good before the renewal
    first_token(d, req)

    assert _agents(worker) == p2.agents()  # handshook again
    (line,) = [r.getMessage() for r in caplog.records if "no longer answers" in r.getMessage()]
    assert "p1" in line
    renewal = d.workers[0]._tp_renewal
    assert renewal.renewed == {"p1": 1} and not renewal.pending


def test_a_prefill_that_stays_dead_fails_the_receive_instead_of_hanging(dep: Deployment) -> None:
    """Nothing listens on P's side channel: vLLM's handshake fails (after its 5 s ZMQ
    timeout) and so does the receive, which frees D's blocks; the client gets an error."""
    p = dep.engine("prefill", "p1", 1)
    d = dep.engine("decode", "d1", 1)
    prefill(p)
    decode(d, p)
    steps_until_received(p, d)

    p.shutdown()
    dep.fabric.dead.update(p.agents())
    req = decode(d, p, base=SECOND)

    def failed() -> bool:
        results = d.idle_step()
        report(d, results)
        return all(req.request_id in (r.failed_recving or ()) for r in results)

    until(failed, "D to fail the receive", timeout_s=30)
    assert "p1" not in d.workers[0].connector_worker._remote_agents


def test_a_registration_that_reaches_no_agent_is_resent_then_failed() -> None:
    """Without vLLM: the bookkeeping of resends (a stand-in worker, real queues)."""
    failed_recv: queue.Queue[str] = queue.Queue()
    worker = SimpleNamespace(
        _recving_metadata={"r1": SimpleNamespace(local_block_ids=[[1]]), "r0": None},
        _failed_recv_reqs=failed_recv,
        _reg_send_inbox=queue.Queue(),
        _push_writer_wake=SimpleNamespace(set=lambda: None),
        _handshake_lock=threading.Lock(),
        _remote_agents={},
    )
    renewal = PushRenewal(worker)
    for _ in range(MAX_RESENDS):
        renewal._lost("r1", {"request_id": "r1"})
        renewal.apply()
        assert worker._reg_send_inbox.get_nowait() == ("r1", {"request_id": "r1"})
    assert failed_recv.empty()
    renewal._lost("r1", {"request_id": "r1"})
    renewal._lost("r0", {"request_id": "r0"})  # no local blocks: never failed (vLLM crashes)
    for _ in range(MAX_RESENDS):
        renewal._lost("r0", {"request_id": "r0"})
    renewal.apply()
    assert [failed_recv.get_nowait()] == ["r1"] and failed_recv.empty()


def test_disconnects_are_told_apart_from_other_errors() -> None:
    assert is_disconnect(nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT"))
    assert not is_disconnect(RuntimeError("NIXL_ERR_NOT_FOUND"))


def test_pull_a_read_that_finds_p_gone_hands_p_to_vllms_invalid_peer_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Pull: vLLM's READ failure report (its own `_log_failure`, as `_read_blocks` calls
    it) marks P invalid through vLLM's own `_mark_remote_engine_invalid`; vLLM's own
    `_cleanup_remote_engines` then drops P's agent, so the next READ handshakes again.
    Before, vLLM asked NIXL whether P's metadata was still loaded locally (it was) and
    kept the dead agent: every later request failed (real 1P1D, P restarted by `up`)."""
    removed: list[str] = []
    agent = SimpleNamespace(
        remove_remote_agent=removed.append,
        check_remote_metadata=lambda *a, **k: True,  # what NIXL said for the dead agent
        release_dlist_handle=lambda handle: None,
    )
    worker = bare(
        NixlPullConnectorWorker,
        engine_id="d1",
        nixl_wrapper=agent,
        xfer_stats=SimpleNamespace(record_failed_transfer=lambda: None),
        _recving_metadata={},
        _recving_transfers={},
        _remote_agents={"p1": {(0, 0): b"agent-p1"}},
        _engine_by_address={("127.0.0.1", 5600): "p1"},
        _failed_remote_engines=set(),
        _invalid_remote_engines=set(),
        _invalid_engine_backoff={},
        _handshake_lock=threading.RLock(),
        _handshake_futures={},
        _engine_clock_offset={},
        _engine_last_active={},
        dst_xfer_side_handles={},
        kv_caches_base_addr={},
        dst_num_blocks={},
        dst_region_num_blocks={},
        dst_region_group_ids={},
        dst_uses_region_group_mapping={},
        dst_region_mem_types={},
        tp_mappings={},
        draft_tp_mappings={},  # vLLM 0.33
        transfer_topo=None,
    )
    renewal = PullRenewal(worker).install()
    caplog.set_level(logging.WARNING)
    worker._log_failure(  # as vLLM's _read_blocks reports a READ that raised
        failure_type="transfer_setup_failed",
        req_id="r1",
        msg="Deferring failure reporting until outstanding transfers finish",
        error=nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT"),
        dst_engine_id="p1",
        remote_rank=0,
    )
    worker._failed_remote_engines.add("p1")  # as vLLM's _handle_failed_transfer does next
    worker._log_failure("transfer_setup_failed", "r2", error=RuntimeError("NIXL_ERR_BACKEND"))
    assert renewal.pending
    renewal.apply()
    assert worker._invalid_remote_engines == {"p1"} and not renewal.pending
    worker._cleanup_remote_engines()  # vLLM's own, at the end of its step
    assert "p1" not in worker._remote_agents and removed == [b"agent-p1"]
    assert any("no longer answers" in r.getMessage() for r in caplog.records)
