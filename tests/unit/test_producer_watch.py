"""D's producer watch: receives from a prefill engine that no longer listens are failed.

vLLM's push worker needs NIXL, a model and a peer, so here a stand-in worker holds the
two things the watch touches (`_recving_metadata`, `_failed_recv_reqs`); the sockets are
real. tests/e2e/test_faults.py covers the real worker with a prefill engine killed.
"""

from __future__ import annotations

import logging
import queue
import socket
from dataclasses import dataclass, field

import pytest

from tracedpush.connector.producer_watch import ProducerWatch, refused


@dataclass
class _Remote:
    host: str
    port: int


@dataclass
class _Meta:
    remote: _Remote
    local_block_ids: list[list[int]] = field(default_factory=lambda: [[1, 2]])


@dataclass
class _Worker:
    _recving_metadata: dict[str, _Meta] = field(default_factory=dict)
    _failed_recv_reqs: queue.Queue[str] = field(default_factory=queue.Queue)

    def failed(self) -> list[str]:
        out = []
        while not self._failed_recv_reqs.empty():
            out.append(self._failed_recv_reqs.get_nowait())
        return out


@pytest.fixture()
def live_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture()
def dead_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_means_nothing_listens(live_port: int, dead_port: int):
    assert refused("127.0.0.1", dead_port)
    assert not refused("127.0.0.1", live_port)


def test_fails_only_old_receives_from_a_producer_that_refuses_twice(
    live_port: int, dead_port: int, caplog: pytest.LogCaptureFixture
):
    w = _Worker()
    w._recving_metadata |= {
        "on-dead-1": _Meta(_Remote("127.0.0.1", dead_port)),
        "on-dead-2": _Meta(_Remote("127.0.0.1", dead_port)),
        "on-live": _Meta(_Remote("127.0.0.1", live_port)),
    }
    watch = ProducerWatch(w, after_s=5.0)
    caplog.set_level(logging.WARNING, "tracedpush.connector.producer_watch")
    assert watch.check(0.0) == []  # first seen: too young to probe
    assert watch.check(5.0) == []  # one refusal is not enough
    w._recving_metadata["young"] = _Meta(_Remote("127.0.0.1", dead_port))
    assert sorted(watch.check(6.0)) == ["on-dead-1", "on-dead-2"]
    assert sorted(w.failed()) == ["on-dead-1", "on-dead-2"]
    assert watch.check(7.0) == []  # handed over once, even while still listed
    # the worker drops them at its next get_finished; the young one ages, then goes
    del w._recving_metadata["on-dead-1"], w._recving_metadata["on-dead-2"]
    assert watch.check(11.0) == ["young"]  # the producer is already known to be gone
    assert w.failed() == ["young"]
    lines = [r.getMessage() for r in caplog.records if "refuses connections" in r.getMessage()]
    assert len(lines) == 1 and str(dead_port) in lines[0], lines
    assert "on-live" in w._recving_metadata and watch.check(60.0) == []


def test_receives_without_local_blocks_are_left_alone(dead_port: int):
    """vLLM registers an empty receive for a request aborted before D scheduled it, and
    fails a receive by indexing its local_block_ids[0]: failing an empty one raised
    IndexError in D's worker and took the engine down (seen in the e2e)."""
    w = _Worker(_recving_metadata={"cached": _Meta(_Remote("127.0.0.1", dead_port), [])})
    watch = ProducerWatch(w, after_s=0.0)
    for t in range(3):
        assert watch.check(float(t)) == []
    assert w.failed() == []


def test_a_producer_that_listens_again_is_forgiven(dead_port: int):
    w = _Worker(_recving_metadata={"r": _Meta(_Remote("127.0.0.1", dead_port))})
    watch = ProducerWatch(w, after_s=0.0)
    assert watch.check(0.0) == []  # one refusal
    with socket.socket() as s:  # the engine is back on its port
        s.bind(("127.0.0.1", dead_port))
        s.listen()
        assert watch.check(1.0) == []
    assert watch.check(2.0) == []  # the count started again: one refusal
    assert watch.check(3.0) == ["r"]


def test_a_timeout_is_not_a_refusal():
    """A listener whose accept queue is full drops new SYNs: the connection times out, as
    to a P behind a slow or partitioned network, which may be alive and about to WRITE."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(0)
        port = s.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for f in fillers:
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
        try:
            w = _Worker(_recving_metadata={"r": _Meta(_Remote("127.0.0.1", port))})
            watch = ProducerWatch(w, after_s=0.0)
            for t in range(3):
                assert watch.check(float(t)) == []
            assert w.failed() == []
        finally:
            for f in fillers:
                f.close()
