"""Compact event records: what engine threads append, instead of building spans.

Each event's layout is declared once, below, as a named tuple whose first field `t` is
`time.time_ns()` when it happened. On engine threads the hooks record the *plain* tuple
`(KIND, t, ...)` in that layout, with the small-int `KIND` of its type (`KINDS`): an
exact tuple of atomic values is untracked by CPython's garbage collector after its first
collection, while a named-tuple instance stays tracked and, promoted into vLLM's large
old generation, brings on full collections - on the engine thread. Measured here with
vLLM imported: 0.5 us per plain event against 2-4 us per named one
(benchmarks/bench_events.py). The builder (`telemetry.builder`) turns the plain tuples
back into their named form (`named`) on its background thread.

Payloads hold references the engine already has (ids, ints, the dict NIXL returned, the
scheduler's own dict) - never copies, never formatting. Scheduler-side events that a
worker needs (`SCHEDULER_FACTS`) travel to the workers inside the connector metadata.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final, NamedTuple

# ---- scheduler side (EngineCore process) -----------------------------------------


class New(NamedTuple):
    """`Scheduler.add_request` -> on_new_request: the scheduler has the request."""

    t: int
    req_id: str
    arrival_s: float  # vLLM's arrival_time (API server, as it starts rendering the prompt)
    prompt_len: int
    traceparent: str | None
    received_ns: int  # the engine's HTTP server had it (middleware), 0 if unknown
    # the EngineCore's input thread had it (connector/core_input.py), 0 if unknown
    core_received_ns: int = 0


class Alloc(NamedTuple):
    """D: blocks allocated for a request whose KV comes from P."""

    t: int
    req_id: str
    n_blocks: int
    n_tokens: int
    remote_engine: str
    pp_size: int = 1  # P's pipeline stages (kv_transfer_params): D waits for each's WRITEs


class Scheduled(NamedTuple):
    """First time the request is scheduled for compute: vLLM's SCHEDULED moment (the
    step's start) when the engine keeps stats, else the step's `build_connector_meta`."""

    t: int
    req_id: str
    queued: int = 0  # vLLM's QUEUED moment on the same clock (add_request); 0: unknown


class Finished(NamedTuple):
    t: int
    req_id: str
    status: str
    n_blocks: int


class RecvDone(NamedTuple):
    """The scheduler learned these requests' KV arrived."""

    t: int
    req_ids: tuple[str, ...]


class SendDone(NamedTuple):
    """The scheduler learned P's blocks for these requests were released."""

    t: int
    req_ids: tuple[str, ...]


class SchedStep(NamedTuple):
    """One engine step scheduled (`build_connector_meta`)."""

    t: int
    seq: int
    num_scheduled_tokens: dict[str, int]  # vLLM's own dict, read later by the builder


# ---- worker side (worker process) -------------------------------------------------


class Facts(NamedTuple):
    """Scheduler events shipped inside the connector metadata."""

    t: int
    facts: tuple[Any, ...]


class LoadStart(NamedTuple):
    """Pull, D: start_load_kv took the request."""

    t: int
    req_id: str
    remote_engine: str
    remote_req_id: str
    n_blocks: int


class Handoff(NamedTuple):
    """Push, P: the model-runner thread put finished blocks in the writer's inbox."""

    t: int
    req_ids: tuple[str, ...]


class PushStart(NamedTuple):
    """Push, P writer thread: `_do_start_push_kv` (the rendezvous matched)."""

    t: int
    p_req_id: str
    d_req_id: str
    d_engine: str
    n_blocks: int


class Handshake(NamedTuple):
    t: int  # start
    t_end: int
    engine: str
    error: str | None
    # vLLM's own result, {(pp_rank, tp_rank): NIXL agent name} of the peer's ranks this
    # worker connected to (None on failure): names the rank behind each notification.
    agents: dict[tuple[int, int], str] | None = None


class Results(NamedTuple):
    t: int
    sending: tuple[str, ...]
    recving: tuple[str, ...]
    failed: tuple[str, ...]


class WorkerStep(NamedTuple):
    """One step on the model-runner thread: bind_connector_metadata -> clear."""

    t: int  # bind called
    t_end: int  # clear returned
    seq: int  # the scheduler's step number (-1 if the metadata had none)
    bind_ns: int
    load_ns: int
    save_ns: int
    results_ns: int
    other_ns: int  # the other connector calls of the step
    loads_started: int
    loads_finished: int


# ---- NIXL agent tap (any worker thread) --------------------------------------------


class SendNotif(NamedTuple):
    t: int
    agent: str
    msg: bytes


class Notifs(NamedTuple):
    t: int
    notifs: dict[str, list[bytes]]  # as returned by get_new_notifs


class Prep(NamedTuple):
    t: int  # call start
    t_end: int
    op: str
    notif_msg: Any
    handle: int
    n_desc: int


class Post(NamedTuple):
    t: int
    t_end: int
    handle: int
    state: str


class State(NamedTuple):
    """A terminal transfer state (never "PROC")."""

    t: int
    handle: int
    state: str


class Telemetry(NamedTuple):
    t: int
    handle: int
    telemetry: Any


# The small-int kinds the hooks record as the first element of a plain event tuple.
LAYOUTS: Final[tuple[type, ...]] = (
    New,
    Alloc,
    Scheduled,
    Finished,
    RecvDone,
    SendDone,
    SchedStep,
    Facts,
    LoadStart,
    Handoff,
    PushStart,
    Handshake,
    Results,
    WorkerStep,
    SendNotif,
    Notifs,
    Prep,
    Post,
    State,
    Telemetry,
)
KINDS: Final[dict[type, int]] = {layout: i for i, layout in enumerate(LAYOUTS)}
NEW, ALLOC, SCHEDULED, FINISHED, RECV_DONE, SEND_DONE, SCHED_STEP, FACTS = range(8)
LOAD_START, HANDOFF, PUSH_START, HANDSHAKE, RESULTS, WORKER_STEP = range(8, 14)
SEND_NOTIF, NOTIFS, PREP, POST, STATE, TELEMETRY = range(14, 20)

SCHEDULER_FACTS: Final = frozenset((NEW, ALLOC, SCHEDULED, FINISHED))  # shipped to workers


def named(event: tuple) -> tuple | None:
    """The named form of a recorded `(KIND, t, ...)` tuple (named ones pass through)."""
    if type(event) is not tuple:
        return event
    try:
        return tuple.__new__(LAYOUTS[event[0]], event[1:])
    except (IndexError, TypeError):
        return None


def plain(event: tuple) -> tuple:
    """The recorded form of a named event: `(KIND, *fields)` (for tests and tools)."""
    return (KINDS[type(event)], *event)


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
