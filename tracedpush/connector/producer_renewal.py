"""D: serve again after a prefill engine restarted under the same engine id.

vLLM 0.32's NIXL workers on D keep, per remote engine id, the NIXL agent they handshook
with. When that prefill engine dies and comes back on the same side-channel port under
the same engine id (a supervisor restarting it, a pod rescheduled with a fixed
``engine_id``), the cached agent is the dead one, and no handshake runs again because
the engine id is still known. vLLM's replaced-peer cleanup keys on a *new* engine id
at the old address, and its invalid-peer check asks NIXL whether the agent's metadata is
still loaded locally, which it is. Measured here on a real 1P1D (`tracedpush up`, P
SIGKILLed, restarted by the launcher):

* push: every registration (PUSH_REG) failed with NIXL_ERR_REMOTE_DISCONNECT; vLLM logs
  it and keeps the receive waiting ("earlier registrations may still trigger WRITEs"),
  so every later request hung until its client gave up, for minutes;
* pull: every READ failed (``transfer`` raised NIXL_ERR_REMOTE_DISCONNECT), so every later
  request got an error, for good.

Both renewals act on a remote-disconnect error only, and change D's agent table only on
the engine's own thread, in `start_load_kv` (where vLLM itself cleans up pull peers), so
no other thread sees it change under it. While nothing has failed, a step costs one
truthiness test.

`PushRenewal` wraps the agent's ``send_notif`` (any thread: a disconnect names its agent
as gone) and the writer's ``_do_send_reg_notif`` (a registration that reached no agent
at all is kept to send again, up to `MAX_RESENDS` times; one that reached some ranks is
left to vLLM, since those may still WRITE into its blocks). On the engine thread, every
engine whose cached agent is gone is dropped with vLLM's own `_cleanup_remote_engine`,
and the kept registrations go back to the writer, which handshakes with whatever now
listens on P's side channel. So the request that found P restarted still succeeds. If
nothing listens, vLLM's handshake failure fails the receive (the client gets an error,
D frees the blocks); a registration whose resends are spent is failed the same way.

`PullRenewal` wraps ``_log_failure`` (vLLM calls it for every failed READ, with the
error and the engine): an engine whose READ failed with a disconnect is handed to
vLLM's own invalid-peer path (`_mark_remote_engine_invalid`), which fails the reads
queued on it, releases it once in-flight reads drain, and handshakes again on the next
request. The request whose READ found P gone gets an error; the next one is served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from tracedpush.connector.tap import NixlAgentTap

log = logging.getLogger(__name__)

MAX_RESENDS = 3
DISCONNECT = "REMOTE_DISCONNECT"


def is_disconnect(exc: BaseException) -> bool:
    """NIXL's nixlRemoteDisconnectError (by name: the binding module differs per CUDA)."""
    return DISCONNECT.lower() in f"{type(exc).__name__} {exc}".lower().replace(" ", "_")


def _raw_agent(worker: Any) -> Any:
    """The NIXL agent under the tracing tap, which forwards attribute writes to it."""
    agent = worker.nixl_wrapper
    return agent.wrapped if isinstance(agent, NixlAgentTap) else agent


class PushRenewal:
    """Drops a push decode's dead prefill agents and resends what they lost (module doc)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.gone: set[str] = set()  # agent names a send found disconnected
        self.resend: deque[tuple[str, dict[str, Any]]] = deque()  # writer -> engine thread
        self.give_up: deque[str] = deque()  # receives to fail (resends spent)
        self.resends: dict[str, int] = {}  # request -> resends so far
        self.renewed: dict[str, int] = {}  # engine id -> times dropped (for the log)
        self._call = threading.local()  # the writer's current registration: [sent, failed]

    @property
    def pending(self) -> bool:
        return bool(self.gone or self.resend or self.give_up)

    def install(self) -> PushRenewal:
        worker = self.worker
        agent = _raw_agent(worker)  # so the tap still sees every send
        send_notif = agent.send_notif
        send_reg = worker._do_send_reg_notif
        call = self._call

        def guarded_send_notif(agent_name: str, *args: Any, **kwargs: Any) -> Any:
            counts = getattr(call, "counts", None)
            try:
                result = send_notif(agent_name, *args, **kwargs)
            except Exception as exc:
                if is_disconnect(exc):
                    self.gone.add(agent_name)
                if counts is not None:
                    counts[1] += 1
                raise
            if counts is not None:
                counts[0] += 1
            return result

        def guarded_send_reg(req_id: str, reg_data: dict[str, Any]) -> None:
            call.counts = counts = [0, 0]
            try:
                send_reg(req_id, reg_data)
            finally:
                call.counts = None
            if counts[1] and not counts[0]:
                self._lost(req_id, reg_data)

        agent.send_notif = guarded_send_notif
        worker._do_send_reg_notif = guarded_send_reg
        return self

    def _lost(self, req_id: str, reg_data: dict[str, Any]) -> None:
        """Writer thread: a registration reached no agent; resend it after the renewal."""
        n = self.resends.get(req_id, 0)
        if n >= MAX_RESENDS:
            self.resends.pop(req_id, None)
            self.give_up.append(req_id)
        else:
            self.resends[req_id] = n + 1
            self.resend.append((req_id, reg_data))

    def apply(self) -> None:
        """Engine thread, from start_load_kv: drop dead engines, requeue, fail the spent."""
        worker = self.worker
        gone = set(self.gone)
        if gone:
            self.gone -= gone
            with worker._handshake_lock:
                stale = [
                    eid
                    for eid, agents in worker._remote_agents.items()
                    if gone.intersection(agents.values())
                ]
            for eid in stale:
                try:
                    worker._cleanup_remote_engine(eid, log_eviction=False)
                except (AssertionError, KeyError):  # vLLM's TTL eviction got there first
                    pass
                self.renewed[eid] = self.renewed.get(eid, 0) + 1
                log.warning(
                    "tracedpush: prefill engine %s no longer answers at its NIXL agent "
                    "(it died or restarted); dropped it, so the next registration "
                    "handshakes with whatever listens on its side channel now",
                    eid,
                )
        while self.give_up:
            rid = self.give_up.popleft()
            meta = worker._recving_metadata.get(rid)
            # A registration without local blocks (vLLM's notice to P of a request
            # aborted before D scheduled it) holds nothing here, and vLLM's failure
            # path indexes its local_block_ids[0]: never fail one.
            if meta is None or not getattr(meta, "local_block_ids", None):
                continue
            log.warning(
                "tracedpush: registration of %s reached no prefill agent after %d resends; "
                "failing the receive so this engine frees its blocks",
                rid,
                MAX_RESENDS,
            )
            worker._failed_recv_reqs.put(rid)
        if self.resend:
            while self.resend:
                worker._reg_send_inbox.put(self.resend.popleft())
            worker._push_writer_wake.set()
        # forget the resend counts of requests no longer waiting
        if len(self.resends) > 1024:
            waiting = set(worker._recving_metadata)
            for rid in [r for r in self.resends if r not in waiting]:
                del self.resends[rid]


class PullRenewal:
    """Hands a pull decode's disconnected prefill engines to vLLM's invalid-peer path."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.gone: set[str] = set()  # engine ids whose READ failed with a disconnect
        self.renewed: dict[str, int] = {}

    @property
    def pending(self) -> bool:
        return bool(self.gone)

    def install(self) -> PullRenewal:
        worker = self.worker
        log_failure = worker._log_failure

        def observed_log_failure(failure_type: str, req_id: Any, *args: Any, **kw: Any) -> Any:
            try:
                error = kw.get("error", args[1] if len(args) > 1 else None)
                if error is not None and is_disconnect(error):
                    engine = kw.get("dst_engine_id")
                    if engine is None and req_id is not None:
                        meta = worker._recving_metadata.get(req_id)
                        remote = getattr(meta, "remote", None)
                        engine = getattr(remote, "engine_id", None)
                    if engine is not None:
                        self.gone.add(engine)
            except Exception:
                pass
            return log_failure(failure_type, req_id, *args, **kw)

        worker._log_failure = observed_log_failure
        return self

    def apply(self) -> None:
        """Engine thread, from start_load_kv: mark the disconnected engines invalid."""
        worker = self.worker
        gone = set(self.gone)
        self.gone -= gone
        for eid in gone:
            if eid not in worker._remote_agents or eid in worker._invalid_remote_engines:
                continue
            worker._mark_remote_engine_invalid(eid, time.perf_counter())
            self.renewed[eid] = self.renewed.get(eid, 0) + 1
            log.warning(
                "tracedpush: prefill engine %s no longer answers at its NIXL agent (it "
                "died or restarted); vLLM drops it once in-flight reads drain, and the "
                "next request handshakes with whatever listens on its side channel now",
                eid,
            )
