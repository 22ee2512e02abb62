"""What one process learned about each request, updated event by event.

`RequestTracker` owns the per-request state (`RequestState`) and one handler per event
type; each handler returns the requests it touched so the builder knows which ones may
now have a span ready. Requests are keyed by their base request id, which P and D share.
Runs on the builder thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracedpush import semconv
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.context import parse_traceparent, request_key, sampled, trace_id_for

try:  # present wherever vLLM runs; only needed to read PUSH_REG payloads
    import msgspec
except ImportError:  # pragma: no cover
    msgspec = None  # type: ignore[assignment]

Handshake = tuple[int, int, str, str | None]  # (start, end, engine, error)


def as_text(value: Any) -> str:
    """NIXL's names and messages as text, bytes or not: an agent's name as
    `get_new_notifs` keys it (str; `add_remote_agent` returns it as bytes, and vLLM keeps
    and sends to those bytes), a transfer's notif_msg."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class Peers:
    """The peer NIXL agents this worker connected to, learnt from its handshakes.

    NIXL keys every notification by the sending agent's name, and vLLM's handshake
    returns the peer's agents by rank (`{(pp_rank, tp_rank): name}`, what it stores in
    `_remote_agents[engine]`): so a notification names the rank that sent it, though its
    text (`"<request>:<tp>"`) does not. Bounded by engines x ranks: an engine's agents
    are replaced when it is handshaken again."""

    def __init__(self) -> None:
        self.by_agent: dict[str, tuple[str, int, int]] = {}  # name -> (engine, pp, tp)
        self.by_engine: dict[str, list[str]] = {}

    def learn(self, engine: str, agents: Any) -> None:
        try:
            ranks = [(int(k[0]), int(k[1]), as_text(v)) for k, v in dict(agents).items()]
        except (TypeError, ValueError, IndexError):
            return
        for name in self.by_engine.pop(engine, ()):
            self.by_agent.pop(name, None)
        for pp, tp, name in ranks:
            self.by_agent[name] = (engine, pp, tp)
        self.by_engine[engine] = [name for _, _, name in ranks]

    def rank(self, agent: str) -> tuple[str, int, int] | None:
        return self.by_agent.get(agent)

    def describe(self, agents: list[str]) -> str:
        """'rank 1 of prefill-engine-001' ('stage 1 rank 0' with pipeline stages; the
        agent's name when no handshake named it)."""
        parts = []
        for agent in agents:
            known = self.by_agent.get(agent)
            if known is None:
                parts.append(f"agent {agent}")
            else:
                engine, pp, tp = known
                where = f"stage {pp} rank {tp}" if pp else f"rank {tp}"
                parts.append(f"{where} of {engine}")
        return ", ".join(parts)


class RequestState:
    """Everything one process learned about one request (times in ns, 0 = unknown)."""

    __slots__ = (
        "alloc",
        "arrival",
        "base",
        "core_recv",
        "done",
        "emitted",
        "failed",
        "finish_status",
        "finished",
        "handles",
        "handoff",
        "handshakes",
        "last_seen",
        "load_start",
        "local_id",
        "n_blocks",
        "n_desc",
        "n_done",
        "notif_agents",
        "notif_expected",
        "notif_times",
        "parent_id",
        "post_start",
        "pp_size",
        "prep_end",
        "prompt_len",
        "push_starts",
        "received",
        "recv_done",
        "reg_agents",
        "reg_arrival",
        "reg_sent",
        "remote_engine",
        "results_done",
        "sampled",
        "sched",
        "sched_recv",
        "steps",
        "telemetry",
        "trace_id",
        "xfer_done",
        "xfer_error",
    )

    def __init__(self, base: str) -> None:
        self.base = base
        self.local_id = ""
        self.trace_id = 0
        self.parent_id = 0
        self.arrival = self.received = self.sched_recv = self.alloc = self.sched = 0
        self.core_recv = 0  # the EngineCore's input thread had it
        self.finished = self.recv_done = self.handoff = 0
        self.reg_arrival = self.reg_sent = self.load_start = self.prep_end = 0
        self.post_start = self.xfer_done = self.results_done = self.last_seen = 0
        self.prompt_len = self.n_blocks = self.n_desc = self.notif_expected = self.n_done = 0
        self.steps = 0  # engine steps that computed this request (prefill)
        self.pp_size = 1  # D, push: P's pipeline stages (each stage's ranks notify)
        self.finish_status = ""
        self.remote_engine = ""
        self.xfer_error = ""
        self.failed = ""
        self.push_starts: list[int] = []
        self.handshakes: list[Handshake] = []
        self.notif_times: list[int] = []
        self.notif_agents: list[str] = []  # the sending agent of each notification
        self.reg_agents: list[str] = []  # D push: the P agents the registration went to
        self.handles: set[int] = set()
        self.telemetry: list[Any] = []
        self.emitted: set[str] = set()
        self.done = False
        self.sampled = True  # the traceparent's flags: False -> build no spans (builder)

    def set_context(self, traceparent: str | None) -> None:
        self.sampled = sampled(traceparent)
        parent = parse_traceparent(traceparent)
        if parent is not None:
            self.trace_id, self.parent_id = parent.trace_id, parent.span_id
        else:
            self.trace_id, self.parent_id = trace_id_for(self.base), 0


Touched = tuple[RequestState, ...] | list[RequestState]


class RequestTracker:
    """Per-request state of one process and the handlers that update it."""

    def __init__(self, tp_size: int = 1, mode: str = "push") -> None:
        self.tp_size = tp_size
        self.mode = mode
        self.reqs: dict[str, RequestState] = {}
        self.handle_req: dict[int, str] = {}
        self.handshakes: list[Handshake] = []
        self.peers = Peers()
        self.requests_seen = 0
        self._prefilling: set[str] = set()  # scheduled, not finished: count their steps
        self.handlers: dict[type, Callable[[Any], Touched]] = {
            ev.New: self.on_new,
            ev.Alloc: self.on_alloc,
            ev.Scheduled: self.on_scheduled,
            ev.Finished: self.on_finished,
            ev.RecvDone: self.on_recv_done,
            ev.SendDone: self.on_send_done,
            ev.SchedStep: self.on_sched_step,
            ev.Facts: self.on_facts,
            ev.LoadStart: self.on_load_start,
            ev.Handoff: self.on_handoff,
            ev.PushStart: self.on_push_start,
            ev.Handshake: self.on_handshake,
            ev.Results: self.on_results,
            ev.SendNotif: self.on_send_notif,
            ev.Notifs: self.on_notifs,
            ev.Prep: self.on_prep,
            ev.Post: self.on_post,
            ev.State: self.on_state,
            ev.Telemetry: self.on_telemetry,
        }

    def req(self, req_id: str) -> RequestState:
        base = request_key(req_id)
        req = self.reqs.get(base)
        if req is None:
            req = self.reqs[base] = RequestState(base)
            self.requests_seen += 1
        if not req.local_id:
            req.local_id = req_id
        return req

    def for_handle(self, handle: int) -> RequestState | None:
        base = self.handle_req.get(handle)
        return self.reqs.get(base) if base is not None else None

    def forget(self, base: str) -> None:
        self.reqs.pop(base, None)
        self._prefilling.discard(base)

    def prune(self, now_ns: int, limit_ns: int) -> None:
        if len(self.handle_req) > 4 * len(self.reqs) + 64:
            self.handle_req = {h: b for h, b in self.handle_req.items() if b in self.reqs}
        self.handshakes[:] = [h for h in self.handshakes if now_ns - h[1] < limit_ns]

    # ------------------------------------------------------------ scheduler events
    def on_new(self, e: ev.New) -> Touched:
        req = self.req(e.req_id)
        req.local_id = e.req_id
        req.sched_recv = e.t
        req.arrival = int(e.arrival_s * 1e9) if e.arrival_s else e.t
        req.received = e.received_ns if 0 < e.received_ns <= req.arrival else 0
        req.core_recv = e.core_received_ns if e.core_received_ns >= req.arrival else 0
        req.prompt_len = e.prompt_len
        req.set_context(e.traceparent)
        return (req,)

    def on_alloc(self, e: ev.Alloc) -> Touched:
        req = self.req(e.req_id)
        req.alloc = req.alloc or e.t
        req.n_blocks = e.n_blocks
        req.remote_engine = e.remote_engine or req.remote_engine
        req.pp_size = e.pp_size
        return (req,)

    def on_scheduled(self, e: ev.Scheduled) -> Touched:
        req = self.req(e.req_id)
        if not req.sched and e.queued:
            req.sched_recv = e.queued  # vLLM's own, read on the clock of `sched`
        req.sched = req.sched or e.t
        if not req.finished:
            self._prefilling.add(req.base)
        return (req,)

    def on_finished(self, e: ev.Finished) -> Touched:
        req = self.req(e.req_id)
        req.finished = req.finished or e.t
        req.finish_status = e.status
        if e.n_blocks:
            req.n_blocks = e.n_blocks
        self._prefilling.discard(req.base)
        return (req,)

    def on_recv_done(self, e: ev.RecvDone) -> Touched:
        reqs = [self.req(r) for r in e.req_ids]
        for req in reqs:
            req.recv_done = req.recv_done or e.t
        return reqs

    def on_send_done(self, e: ev.SendDone) -> Touched:
        return [self.req(r) for r in e.req_ids]

    def on_sched_step(self, e: ev.SchedStep) -> Touched:
        """Count the step for every request still in prefill that it computed."""
        if self._prefilling:
            for rid in e.num_scheduled_tokens:
                base = request_key(rid)
                if base in self._prefilling:
                    self.reqs[base].steps += 1
        return ()

    # --------------------------------------------------------------- worker events
    def on_facts(self, e: ev.Facts) -> Touched:
        touched: list[RequestState] = []
        for raw in e.facts:
            fact = ev.named(raw)
            if fact is not None and ev.KINDS.get(type(fact)) in ev.SCHEDULER_FACTS:
                touched.extend(self.handlers[type(fact)](fact) or ())
        return touched

    def on_load_start(self, e: ev.LoadStart) -> Touched:
        req = self.req(e.req_id)
        req.load_start = req.load_start or e.t
        req.remote_engine = e.remote_engine or req.remote_engine
        req.n_blocks = e.n_blocks or req.n_blocks
        return (req,)

    def on_handoff(self, e: ev.Handoff) -> Touched:
        reqs = [self.req(r) for r in e.req_ids]
        for req in reqs:
            req.handoff = req.handoff or e.t
        return reqs

    def on_push_start(self, e: ev.PushStart) -> Touched:
        req = self.req(e.p_req_id)
        req.push_starts.append(e.t)
        req.remote_engine = e.d_engine
        req.n_blocks = e.n_blocks or req.n_blocks
        return (req,)

    def on_handshake(self, e: ev.Handshake) -> Touched:
        record = (e.t, e.t_end, e.engine, e.error)
        self.handshakes.append(record)
        if e.agents:
            self.peers.learn(e.engine, e.agents)
        touched = []
        for req in self.reqs.values():  # requests waiting on this engine
            if req.remote_engine == e.engine and not req.done:
                req.handshakes.append(record)
                touched.append(req)
        return touched

    def on_results(self, e: ev.Results) -> Touched:
        touched = []
        for req_id in e.failed:
            req = self.req(req_id)
            req.failed = req.failed or semconv.ERR_TRANSFER
            req.results_done = req.results_done or e.t
            touched.append(req)
        for req_id in (*e.sending, *e.recving):
            req = self.req(req_id)
            req.results_done = req.results_done or e.t
            touched.append(req)
        return touched

    # ------------------------------------------------------------------- NIXL tap
    def on_send_notif(self, e: ev.SendNotif) -> Touched:
        msg = e.msg
        if not isinstance(msg, bytes | bytearray) or not msg.startswith(ev.PUSH_REG_PREFIX):
            return ()
        reg = decode_registration(msg)
        if reg is None:
            return ()
        req = self.req(reg["request_id"])
        req.reg_sent = req.reg_sent or e.t
        agent = as_text(e.agent)
        if agent not in req.reg_agents:  # vLLM sends it to each of P's ranks
            req.reg_agents.append(agent)
        req.remote_engine = str(reg.get("remote_engine_id", req.remote_engine))
        return (req,)

    def on_notifs(self, e: ev.Notifs) -> Touched:
        touched = []
        for agent, msgs in e.notifs.items():
            for msg in msgs:
                if msg.startswith(ev.HEARTBEAT_PREFIX):
                    continue
                if msg.startswith(ev.PUSH_REG_PREFIX):
                    reg = decode_registration(msg)
                    if reg is None:
                        continue
                    req = self.req(reg["request_id"])
                    req.reg_arrival = req.reg_arrival or e.t
                    req.remote_engine = str(reg.get("decode_engine_id", req.remote_engine))
                else:
                    text = msg.decode("utf-8", "replace")
                    req_id, _, peer_tp = text.rpartition(":")
                    if not req_id:
                        continue
                    req = self.req(req_id)
                    req.notif_times.append(e.t)
                    req.notif_agents.append(as_text(agent))
                    req.notif_expected = self._expected_notifs(req, peer_tp)
                touched.append(req)
        return touched

    def _expected_notifs(self, req: RequestState, suffix: str) -> int:
        """How many completion notifications the engine waits for, as vLLM counts them.

        Pull (P): the suffix is that number (D's `expected_consumers`). Push (D): the
        suffix is P's TP; each of D's ranks hears from P's ranks that map onto it, on
        each of P's pipeline stages."""
        try:
            n = int(suffix)
        except ValueError:
            return 1
        if self.mode == "pull":
            return max(1, n)
        return max(1, req.pp_size) * max(1, n // max(1, self.tp_size))

    def on_prep(self, e: ev.Prep) -> Touched:
        text = as_text(e.notif_msg)
        if not text:  # pull's split DRAM/VRAM READ names no request (docs/connector.md)
            return ()
        req = self.req(text.rpartition(":")[0] or text)
        self.handle_req[e.handle] = req.base
        req.handles.add(e.handle)
        req.prep_end = max(req.prep_end, e.t_end)
        req.n_desc += e.n_desc
        return (req,)

    def on_post(self, e: ev.Post) -> Touched:
        req = self.for_handle(e.handle)
        if req is None:
            return ()
        req.post_start = min(req.post_start, e.t) if req.post_start else e.t
        if e.state == "ERR":
            req.xfer_error = "NIXL transfer post returned ERR"
        return (req,)

    def on_state(self, e: ev.State) -> Touched:
        req = self.for_handle(e.handle)
        if req is None:
            return ()
        req.handles.discard(e.handle)  # the handle -> request map stays for its telemetry
        req.n_done += 1
        if e.state != "DONE":
            req.xfer_error = f"NIXL transfer state {e.state}"
        req.xfer_done = max(req.xfer_done, e.t)
        return (req,)

    def on_telemetry(self, e: ev.Telemetry) -> Touched:
        req = self.for_handle(e.handle)
        if req is None or e.telemetry is None:
            return ()
        req.telemetry.append(e.telemetry)
        return (req,)


def decode_registration(msg: bytes) -> dict[str, Any] | None:
    if msgspec is None:
        return None
    try:
        reg = msgspec.msgpack.decode(msg[len(ev.PUSH_REG_PREFIX) :])
    except Exception:
        return None
    if not isinstance(reg, dict) or not isinstance(reg.get("request_id"), str):
        return None
    return reg
