"""D, push mode: free the blocks of registrations whose prefill engine has died.

In push mode D allocates a request's blocks, registers them with P, and waits for P's
WRITE-completion notification. vLLM 0.32 sets no deadline on that wait for a request
whose P is gone: its scheduler only stops re-sending the registration after
``push_registration_timeout``, and a request the client abandoned is finished with its
blocks' release delayed until the receive completes, which it never does (the base
worker's replaced-peer cleanup is pull-only: "TODO: Also handle push mode"). So every
request in flight on a P that died kept its blocks on D for good: measured here, 1.4% of
D's KV cache after killing one P of a 2P1D under 8 streams, still held minutes later.

`ProducerWatch` runs on a thread of its own (nothing on the engine's threads). Once a
second it reads which receives D's worker is waiting for, and for those older than
`after_s` it probes their producer's NIXL side channel (the host and port D registered
with). Only a refused connection counts: the host answered and nothing listens there, so
the engine process is gone. A timeout (a slow or partitioned network, P maybe alive and
still about to WRITE) never does, since freeing blocks a live P then writes into would
corrupt another request. After two refusals `interval_s` apart, that engine's receives
go to the worker's failed-receive queue: at its next ``get_finished`` vLLM reports them
failed, frees the blocks of requests already finished, and handles live ones by its
``kv_load_failure_policy`` ("fail" by default: D answers an error). One log line per producer lost.

Not covered: a P restarted on the same port (the connection succeeds, the new process
knows nothing of the registration).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

REFUSALS_TO_FAIL = 2


def refused(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True only if the host refused the connection (nothing listens on that port)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError as e:
        return e.errno == errno.ECONNREFUSED


class ProducerWatch:
    """Fails D's receives from prefill engines that no longer listen (see module doc)."""

    def __init__(self, worker: Any, *, after_s: float = 5.0, interval_s: float = 1.0) -> None:
        self.worker = worker
        self.after_s, self.interval_s = after_s, interval_s
        self.first_seen: dict[str, float] = {}  # receive -> when we first saw it waiting
        self.refusals: dict[tuple[str, int], int] = {}  # producer -> consecutive refusals
        self.failed: set[str] = set()  # receives handed to the worker as failed
        self.lost: set[tuple[str, int]] = set()  # producers reported gone
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="tracedpush-producer-watch", daemon=True
        )

    def start(self) -> ProducerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check(time.monotonic())
            except Exception:  # never let the watch take anything down with it
                log.debug("tracedpush: producer watch round failed", exc_info=True)

    def waiting(self) -> dict[str, tuple[str, int]]:
        """Receives the worker waits for -> their producer's (host, side-channel port)."""
        try:
            items = list(self.worker._recving_metadata.items())
        except RuntimeError:  # resized by the engine thread mid-copy: next round
            return {}
        out = {}
        for rid, meta in items:
            remote = getattr(meta, "remote", None)
            # A receive without local blocks is the one vLLM's push scheduler registers
            # for a request aborted before D scheduled it, so that P frees its blocks.
            # It holds none on D, and vLLM's failure path indexes local_block_ids[0]:
            # failing one crashed D's worker with an IndexError (seen after killing P)
            if remote is not None and remote.host and remote.port and meta.local_block_ids:
                out[rid] = (str(remote.host), int(remote.port))
        return out

    def check(self, now: float) -> list[str]:
        """One round; returns the receives failed in it."""
        waiting = self.waiting()
        for rid in list(self.first_seen):
            if rid not in waiting:
                del self.first_seen[rid]
                self.failed.discard(rid)
        old: dict[tuple[str, int], list[str]] = {}
        for rid, producer in waiting.items():
            since = self.first_seen.setdefault(rid, now)
            if now - since >= self.after_s and rid not in self.failed:
                old.setdefault(producer, []).append(rid)
        failed_now: list[str] = []
        for producer, rids in old.items():
            if not refused(*producer):
                self.refusals.pop(producer, None)
                self.lost.discard(producer)
                continue
            self.refusals[producer] = self.refusals.get(producer, 0) + 1
            if self.refusals[producer] < REFUSALS_TO_FAIL:
                continue
            if producer not in self.lost:
                self.lost.add(producer)
                log.warning(
                    "tracedpush: prefill engine at %s:%d refuses connections; failing %d "
                    "receive(s) waiting on it so this engine frees their KV blocks",
                    *producer,
                    len(rids),
                )
            for rid in rids:
                self.worker._failed_recv_reqs.put(rid)
                self.failed.add(rid)
            failed_now += rids
        return failed_now
