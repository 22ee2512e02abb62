"""Compact event records: what engine threads append, instead of building spans.

An event is a plain tuple `(kind, t_ns, *payload)`; `kind` is one of the small ints
below and `t_ns` is `time.time_ns()`. Payloads hold references the engine already has
(ids, ints, the dict NIXL returned) - never copies, never formatting. The builder
(`telemetry.builder`) turns them into spans on a background thread.
"""

from __future__ import annotations

from collections import deque
from typing import Final

# ---- scheduler side (EngineCore process) -----------------------------------------
S_NEW: Final = 1  # (req_id, arrival_s, prompt_len, traceparent|None, remote_prefill, remote_decode)
S_ALLOC: Final = 2  # (req_id, n_blocks, n_external_tokens, remote_engine_id)  D: blocks allocated
S_SCHEDULED: Final = 3  # (req_id,) first time the request is scheduled for compute
S_FINISHED: Final = 4  # (req_id, status_name, n_blocks)
S_RECV_DONE: Final = 5  # (req_ids,) scheduler learned KV arrived
S_SEND_DONE: Final = 6  # (req_ids,) scheduler learned P's blocks were released

# ---- worker side (worker process) -------------------------------------------------
W_FACTS: Final = 20  # (facts,) scheduler events shipped inside connector metadata
W_LOAD_START: Final = 21  # (req_id, remote_engine_id, remote_request_id, n_blocks)
W_PUSH_START: Final = 22  # (p_req_id, d_req_id, d_engine_id, n_blocks)  P writer thread
W_HANDSHAKE: Final = 23  # (t_end_ns, remote_engine_id, error|None)  (t_ns = start)
W_RESULTS: Final = 24  # (finished_sending, finished_recving, failed_recving) tuples
W_TP: Final = 25  # (tp_rank, tp_size)

# ---- NIXL agent tap (any worker thread) --------------------------------------------
N_SEND_NOTIF: Final = 40  # (agent_name, msg_bytes)
N_NOTIFS: Final = 41  # (dict agent -> list[bytes]) as returned by get_new_notifs
N_PREP: Final = 42  # (t_end_ns, op, notif_msg, handle, n_desc)  (t_ns = call start)
N_POST: Final = 43  # (t_end_ns, handle, state)
N_STATE: Final = 44  # (handle, state) only terminal states (not "PROC")
N_TELEMETRY: Final = 45  # (handle, telemetry object)

PUSH_REG_PREFIX: Final = b"PUSH_REG:"
HEARTBEAT_PREFIX: Final = b"HB:"


class Recorder:
    """An append-only event log. `record` is `deque.append`: atomic, lock-free, ~0.1 us."""

    __slots__ = ("_events", "record")

    def __init__(self) -> None:
        self._events: deque[tuple] = deque()
        self.record = self._events.append

    def drain(self, limit: int | None = None) -> list[tuple]:
        """Pop events in order (called by the builder thread only)."""
        events = self._events
        n = len(events) if limit is None else min(limit, len(events))
        popleft = events.popleft
        return [popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._events)
