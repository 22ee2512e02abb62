"""Turn a process's compact events (`telemetry.events`) into OpenTelemetry spans.

Runs on a background thread, never on an engine thread. One builder per connector
instance: the scheduler-side builder (EngineCore process) emits the engine spans
`prefill` / `decode`; the worker-side builder (one per worker rank) emits the `kv.*`
phase spans. Requests are keyed by their base request id, which P and D share.

Span identity: the engine span's id is derived from (trace id, role, base id), so a
worker can parent its spans to the scheduler's span without any extra message. The
trace id comes from the proxy's traceparent (shipped from the scheduler to workers in
the connector metadata), or is derived from the base request id.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracedpush import __version__, semconv
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.context import (
    parse_traceparent,
    request_key,
    span_id_for,
    trace_id_for,
)

try:  # present wherever vLLM runs; only needed to read PUSH_REG payloads
    import msgspec
except ImportError:  # pragma: no cover
    msgspec = None  # type: ignore[assignment]

_SCOPE = InstrumentationScope(semconv.INSTRUMENTATION_SCOPE, __version__)
_FLAGS = TraceFlags(TraceFlags.SAMPLED)


@dataclass(frozen=True)
class BuilderConfig:
    mode: str  # "push" | "pull"
    role: str  # "prefill" | "decode"
    side: str  # "scheduler" | "worker"
    engine_id: str
    tp_rank: int = 0
    tp_size: int = 1
    stale_after_s: float = 120.0  # close a request's open phases as failed after this
    linger_s: float = 300.0  # keep a finished request this long to absorb late events


class _Req:
    """Everything one process learned about one request (times in ns, 0 = unknown)."""

    __slots__ = (
        "alloc",
        "arrival",
        "base",
        "done",
        "emitted",
        "failed",
        "finish_status",
        "finished",
        "handles",
        "handshakes",
        "last_seen",
        "load_start",
        "local_id",
        "n_blocks",
        "n_desc",
        "n_done",
        "notif_expected",
        "notif_times",
        "parent_id",
        "post_start",
        "prep_end",
        "prompt_len",
        "push_starts",
        "recv_done",
        "reg_arrival",
        "reg_sent",
        "remote_engine",
        "results_done",
        "sched",
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
        self.arrival = self.alloc = self.sched = self.finished = self.recv_done = 0
        self.reg_arrival = self.reg_sent = self.load_start = self.prep_end = 0
        self.post_start = self.xfer_done = self.results_done = self.last_seen = 0
        self.prompt_len = self.n_blocks = self.n_desc = self.notif_expected = self.n_done = 0
        self.finish_status = ""
        self.remote_engine = ""
        self.xfer_error = ""
        self.failed = ""
        self.push_starts: list[int] = []
        self.handshakes: list[tuple[int, int, str, str | None]] = []
        self.notif_times: list[int] = []
        self.handles: set[int] = set()
        self.telemetry: list[Any] = []
        self.emitted: set[str] = set()
        self.done = False


class SpanBuilder:
    """Feed it drained events; it calls `emit(spans)` as phases complete."""

    def __init__(
        self,
        config: BuilderConfig,
        resource: Resource,
        emit: Callable[[list[ReadableSpan]], None],
    ) -> None:
        self.cfg = config
        self.resource = resource
        self.emit = emit
        self._reqs: dict[str, _Req] = {}
        self._handle_req: dict[int, str] = {}
        self._handshakes: list[tuple[int, int, str, str | None]] = []
        self._rand = random.Random()
        self.spans_built = 0
        self.requests_seen = 0
        self.orphans = 0  # requests seen only through stray events, not traced
        self._handlers: dict[int, Callable[..., None]] = {
            ev.S_NEW: self._on_new,
            ev.S_ALLOC: self._on_alloc,
            ev.S_SCHEDULED: self._on_scheduled,
            ev.S_FINISHED: self._on_finished,
            ev.S_RECV_DONE: self._on_recv_done,
            ev.S_SEND_DONE: self._on_send_done,
            ev.W_FACTS: self._on_facts,
            ev.W_LOAD_START: self._on_load_start,
            ev.W_PUSH_START: self._on_push_start,
            ev.W_HANDSHAKE: self._on_handshake,
            ev.W_RESULTS: self._on_results,
            ev.W_TP: self._on_tp,
            ev.N_SEND_NOTIF: self._on_send_notif,
            ev.N_NOTIFS: self._on_notifs,
            ev.N_PREP: self._on_prep,
            ev.N_POST: self._on_post,
            ev.N_STATE: self._on_state,
            ev.N_TELEMETRY: self._on_telemetry,
        }

    # ------------------------------------------------------------------ driving
    def feed(self, events: Iterable[tuple]) -> None:
        touched: dict[str, _Req] = {}
        handlers = self._handlers
        for event in events:
            handler = handlers.get(event[0])
            if handler is None:
                continue
            for req in handler(event[1], *event[2:]) or ():
                req.last_seen = event[1]
                touched[req.base] = req
        out: list[ReadableSpan] = []
        for req in touched.values():
            self._try_emit(req, out, final=False)
        if out:
            self.spans_built += len(out)
            self.emit(out)

    def sweep(self, now_ns: int | None = None) -> None:
        """Close requests that stopped making progress: open phases end as ERROR."""
        now_ns = now_ns or time.time_ns()
        limit = int(self.cfg.stale_after_s * 1e9)
        linger = int(self.cfg.linger_s * 1e9)
        out: list[ReadableSpan] = []
        for base, req in list(self._reqs.items()):
            idle = now_ns - req.last_seen
            if req.done:
                if idle > linger:
                    del self._reqs[base]
            elif idle > limit:
                self._try_emit(req, out, final=True)
                del self._reqs[base]
            elif req.xfer_done and now_ns - req.xfer_done > 1e9 and len(req.telemetry) < req.n_done:
                req.n_done = len(req.telemetry)  # telemetry never came: emit without it
                self._try_emit(req, out, final=False)
        if len(self._handle_req) > 4 * len(self._reqs) + 64:
            self._handle_req = {h: b for h, b in self._handle_req.items() if b in self._reqs}
        self._handshakes = [h for h in self._handshakes if now_ns - h[1] < limit]
        if out:
            self.spans_built += len(out)
            self.emit(out)

    def flush_all(self) -> None:
        """At shutdown: emit whatever is known, open phases marked ERROR."""
        self.sweep(now_ns=2**62)

    @property
    def open_requests(self) -> int:
        return len(self._reqs)

    # ------------------------------------------------------------------ helpers
    def _req(self, req_id: str) -> _Req:
        base = request_key(req_id)
        req = self._reqs.get(base)
        if req is None:
            req = self._reqs[base] = _Req(base)
            self.requests_seen += 1
        if not req.local_id:
            req.local_id = req_id
        return req

    def _set_context(self, req: _Req, traceparent: str | None) -> None:
        parent = parse_traceparent(traceparent)
        if parent is not None:
            req.trace_id, req.parent_id = parent.trace_id, parent.span_id
        else:
            req.trace_id, req.parent_id = trace_id_for(req.base), 0

    def _engine_span_id(self, req: _Req) -> int:
        return span_id_for(req.trace_id, self.cfg.role, req.base)

    # ------------------------------------------------------------ scheduler events
    def _on_new(self, t, req_id, arrival_s, prompt_len, traceparent, *_flags):
        req = self._req(req_id)
        req.local_id = req_id
        req.arrival = int(arrival_s * 1e9) if arrival_s else t
        req.prompt_len = prompt_len
        self._set_context(req, traceparent)
        return (req,)

    def _on_alloc(self, t, req_id, n_blocks, n_tokens, remote_engine):
        req = self._req(req_id)
        req.alloc = req.alloc or t
        req.n_blocks = n_blocks
        req.remote_engine = remote_engine or req.remote_engine
        return (req,)

    def _on_scheduled(self, t, req_id):
        req = self._req(req_id)
        req.sched = req.sched or t
        return (req,)

    def _on_finished(self, t, req_id, status, n_blocks):
        req = self._req(req_id)
        req.finished = req.finished or t
        req.finish_status = status
        if n_blocks:
            req.n_blocks = n_blocks
        return (req,)

    def _on_recv_done(self, t, req_ids):
        reqs = [self._req(r) for r in req_ids]
        for req in reqs:
            req.recv_done = req.recv_done or t
        return reqs

    def _on_send_done(self, t, req_ids):
        return [self._req(r) for r in req_ids]

    # --------------------------------------------------------------- worker events
    def _on_facts(self, t, facts):
        touched = []
        for fact in facts:
            handler = self._handlers.get(fact[0])
            if handler is not None and fact[0] < ev.W_FACTS:
                touched.extend(handler(fact[1], *fact[2:]) or ())
        return touched

    def _on_tp(self, t, rank, size):
        if rank != self.cfg.tp_rank or size != self.cfg.tp_size:
            self.cfg = BuilderConfig(**{**self.cfg.__dict__, "tp_rank": rank, "tp_size": size})

    def _on_load_start(self, t, req_id, remote_engine, remote_req_id, n_blocks):
        req = self._req(req_id)
        req.load_start = req.load_start or t
        req.remote_engine = remote_engine or req.remote_engine
        req.n_blocks = n_blocks or req.n_blocks
        return (req,)

    def _on_push_start(self, t, p_req_id, d_req_id, d_engine, n_blocks):
        req = self._req(p_req_id)
        req.push_starts.append(t)
        req.remote_engine = d_engine
        req.n_blocks = n_blocks or req.n_blocks
        return (req,)

    def _on_handshake(self, t, t_end, engine, error):
        record = (t, t_end, engine, error)
        self._handshakes.append(record)
        touched = []
        for req in self._reqs.values():  # requests waiting on this engine
            if req.remote_engine == engine and not req.done:
                req.handshakes.append(record)
                touched.append(req)
        return touched

    def _on_results(self, t, sending, recving, failed):
        touched = []
        for req_id in failed:
            req = self._req(req_id)
            req.failed = req.failed or semconv.ERR_TRANSFER
            req.results_done = req.results_done or t
            touched.append(req)
        for req_id in (*sending, *recving):
            req = self._req(req_id)
            req.results_done = req.results_done or t
            touched.append(req)
        return touched

    # ------------------------------------------------------------------- NIXL tap
    def _on_send_notif(self, t, agent, msg):
        if not isinstance(msg, bytes | bytearray) or not msg.startswith(ev.PUSH_REG_PREFIX):
            return ()
        reg = _decode_reg(msg)
        if reg is None:
            return ()
        req = self._req(reg["request_id"])
        req.reg_sent = req.reg_sent or t
        req.remote_engine = str(reg.get("remote_engine_id", req.remote_engine))
        return (req,)

    def _on_notifs(self, t, notifs):
        touched = []
        for msgs in notifs.values():
            for msg in msgs:
                if msg.startswith(ev.HEARTBEAT_PREFIX):
                    continue
                if msg.startswith(ev.PUSH_REG_PREFIX):
                    reg = _decode_reg(msg)
                    if reg is None:
                        continue
                    req = self._req(reg["request_id"])
                    req.reg_arrival = req.reg_arrival or t
                    req.remote_engine = str(reg.get("decode_engine_id", req.remote_engine))
                else:
                    text = msg.decode("utf-8", "replace")
                    req_id, _, peer_tp = text.rpartition(":")
                    if not req_id:
                        continue
                    req = self._req(req_id)
                    req.notif_times.append(t)
                    req.notif_expected = self._expected_notifs(peer_tp)
                touched.append(req)
        return touched

    def _expected_notifs(self, peer_tp: str) -> int:
        try:
            peer = int(peer_tp)
        except ValueError:
            return 1
        return max(1, peer // max(1, self.cfg.tp_size))

    def _on_prep(self, t, t_end, op, notif_msg, handle, n_desc):
        text = (
            notif_msg.decode("utf-8", "replace") if isinstance(notif_msg, bytes) else str(notif_msg)
        )
        req_id = text.rpartition(":")[0] or text
        req = self._req(req_id)
        self._handle_req[handle] = req.base
        req.handles.add(handle)
        req.prep_end = max(req.prep_end, t_end)
        req.n_desc += n_desc
        return (req,)

    def _req_for_handle(self, handle) -> _Req | None:
        base = self._handle_req.get(handle)
        return self._reqs.get(base) if base is not None else None

    def _on_post(self, t, t_end, handle, state):
        req = self._req_for_handle(handle)
        if req is None:
            return ()
        req.post_start = min(req.post_start, t) if req.post_start else t
        if state == "ERR":
            req.xfer_error = "NIXL transfer post returned ERR"
        return (req,)

    def _on_state(self, t, handle, state):
        req = self._req_for_handle(handle)
        if req is None:
            return ()
        req.handles.discard(handle)  # the handle -> request map stays for its telemetry
        req.n_done += 1
        if state == "DONE":
            req.xfer_done = max(req.xfer_done, t)
        else:
            req.xfer_error = f"NIXL transfer state {state}"
            req.xfer_done = max(req.xfer_done, t)
        return (req,)

    def _on_telemetry(self, t, handle, telemetry):
        req = self._req_for_handle(handle)
        if req is None or telemetry is None:
            return ()
        req.telemetry.append(telemetry)
        return (req,)

    # ------------------------------------------------------------------ emission
    def _try_emit(self, req: _Req, out: list[ReadableSpan], *, final: bool) -> None:
        if req.done:
            return
        if not req.trace_id:
            if not final:
                return  # context not known yet (metadata not shipped yet)
            if not req.arrival:
                # Only stray events (e.g. a late notification for a request that ended
                # long ago): never start a second, partial trace for it.
                req.done = True
                self.orphans += 1
                return
            self._set_context(req, None)
        if self.cfg.side == "scheduler":
            self._emit_engine_span(req, out, final)
        else:
            emit = {
                ("push", "prefill"): self._emit_push_prefill,
                ("push", "decode"): self._emit_push_decode,
                ("pull", "prefill"): self._emit_pull_prefill,
                ("pull", "decode"): self._emit_pull_decode,
            }[(self.cfg.mode, self.cfg.role)]
            emit(req, out, final)

    def _emit_engine_span(self, req: _Req, out: list[ReadableSpan], final: bool) -> None:
        if not req.arrival:
            req.done = final  # only worker-ish events seen: nothing to build
            return
        events = []
        status = None
        if self.cfg.role == "prefill":
            name = semconv.SPAN_PREFILL
            end = req.finished
            if req.sched:
                events.append(Event(semconv.EVENT_COMPUTE_STARTED, timestamp=req.sched))
            if not end and not final:
                return
            if not end:
                end, status = req.last_seen, (semconv.ERR_UPSTREAM, "request never finished")
            elif (
                req.finish_status
                and not req.finish_status.startswith("FINISHED_LENGTH")
                and (req.finish_status != "FINISHED_STOPPED")
            ):
                status = (semconv.ERR_UPSTREAM, f"prefill ended {req.finish_status}")
        else:
            name = semconv.SPAN_DECODE
            end = req.sched
            if req.alloc:
                events.append(Event(semconv.EVENT_BLOCKS_ALLOCATED, timestamp=req.alloc))
            if req.recv_done:
                events.append(Event(semconv.EVENT_KV_RECEIVED, timestamp=req.recv_done))
            if not end:
                if req.finished:
                    end = req.finished
                    status = (
                        semconv.ERR_UPSTREAM,
                        f"finished before first token ({req.finish_status})",
                    )
                elif final:
                    end, status = req.last_seen, (semconv.ERR_NOTIFY_TIMEOUT, "never scheduled")
                else:
                    return
        attrs = self._attrs(req)
        attrs[semconv.PROMPT_TOKENS] = req.prompt_len
        attrs[semconv.THREAD] = "scheduler"
        if name == semconv.SPAN_DECODE:
            attrs[semconv.DECODE_END] = "first_token_scheduled"
        if req.n_blocks:
            attrs[semconv.KV_BLOCKS] = req.n_blocks
        out.append(
            self._span(
                name,
                req,
                req.arrival,
                end,
                attrs,
                span_id=self._engine_span_id(req),
                parent_id=req.parent_id,
                events=events,
                error=status,
            )
        )
        req.emitted.add(name)
        req.done = True

    # push, P worker: rendezvous, handshake (P->D), desc_prep, write
    def _emit_push_prefill(self, req: _Req, out: list[ReadableSpan], final: bool) -> None:
        rdv_start = (
            min(t for t in (req.reg_arrival, req.finished) if t)
            if (req.reg_arrival or req.finished)
            else 0
        )
        match = req.push_starts[0] if req.push_starts else 0
        if (
            semconv.SPAN_KV_RENDEZVOUS not in req.emitted
            and rdv_start
            and (match or final or req.results_done)
        ):
            attrs = self._attrs(req)
            attrs[semconv.THREAD] = "push_writer"
            first = (
                "registration"
                if req.reg_arrival and (not req.finished or req.reg_arrival <= req.finished)
                else "prefill"
            )
            attrs[semconv.RENDEZVOUS_FIRST] = first
            events = []
            if req.reg_arrival:
                events.append(Event(semconv.EVENT_REGISTRATION_ARRIVED, timestamp=req.reg_arrival))
            if req.finished:
                events.append(Event(semconv.EVENT_PREFILL_FINISHED, timestamp=req.finished))
            error = None
            end = match
            if not end:
                end = req.results_done or req.last_seen
                if not req.reg_arrival:
                    error = (
                        semconv.ERR_LEASE_EXPIRED
                        if req.results_done
                        else semconv.ERR_REGISTRATION_TIMEOUT,
                        "no registration from the decode instance arrived",
                    )
                else:
                    error = (semconv.ERR_TRANSFER, "prefill blocks never handed to the writer")
            self._add(out, req, semconv.SPAN_KV_RENDEZVOUS, rdv_start, end, attrs, events, error)
        if not match:
            if final or req.results_done:
                req.done = True
            return
        self._emit_handshake(
            req, out, match, req.push_starts[-1] if len(req.push_starts) > 1 else 0
        )
        self._emit_transfer(
            req, out, req.push_starts[-1], semconv.SPAN_KV_WRITE, "push_writer", final
        )

    # push, D worker: register, notify
    def _emit_push_decode(self, req: _Req, out: list[ReadableSpan], final: bool) -> None:
        if semconv.SPAN_KV_REGISTER not in req.emitted and req.alloc and (req.reg_sent or final):
            attrs = self._attrs(req)
            attrs[semconv.THREAD] = "push_writer"
            if req.n_blocks:
                attrs[semconv.KV_BLOCKS] = req.n_blocks
            error = None
            end = req.reg_sent
            hs = [h for h in req.handshakes if h[2] == req.remote_engine]
            events = [
                Event(semconv.EVENT_HANDSHAKE, {"duration_ms": (h[1] - h[0]) / 1e6}, h[1])
                for h in hs
            ]
            if not end:
                end = req.last_seen
                failed = [h for h in hs if h[3]]
                error = (
                    (semconv.ERR_HANDSHAKE, failed[0][3])
                    if failed
                    else (semconv.ERR_REGISTRATION_TIMEOUT, "registration was never sent")
                )
            self._add(out, req, semconv.SPAN_KV_REGISTER, req.alloc, end, attrs, events, error)
        self._emit_notify(req, out, final, done_time=req.results_done)

    # pull, D worker: handshake, desc_prep, read
    def _emit_pull_decode(self, req: _Req, out: list[ReadableSpan], final: bool) -> None:
        if not req.load_start:
            if final:
                req.done = True
            return
        hs_end = self._emit_handshake(req, out, req.load_start, 0)
        self._emit_transfer(
            req, out, max(req.load_start, hs_end), semconv.SPAN_KV_READ, "model_runner", final
        )

    # pull, P worker: notify (READ completions from D)
    def _emit_pull_prefill(self, req: _Req, out: list[ReadableSpan], final: bool) -> None:
        self._emit_notify(req, out, final, done_time=req.results_done)

    def _emit_handshake(
        self, req: _Req, out: list[ReadableSpan], wait_start: int, resume: int
    ) -> int:
        """kv.handshake for a handshake this request waited on; returns its end (0 if none)."""
        waited = [h for h in req.handshakes if h[1] >= wait_start] or [
            h
            for h in self._handshakes
            if h[2] == req.remote_engine
            and h[0] <= (resume or req.prep_end or h[1])
            and h[1] >= wait_start
        ]
        if not waited:
            return 0
        t0, t1, engine, error = waited[-1]
        if semconv.SPAN_KV_HANDSHAKE not in req.emitted:
            attrs = self._attrs(req)
            attrs[semconv.THREAD] = "handshake"
            attrs[semconv.REMOTE_ENGINE_ID] = engine
            err = (semconv.ERR_HANDSHAKE, error) if error else None
            self._add(out, req, semconv.SPAN_KV_HANDSHAKE, max(t0, wait_start), t1, attrs, [], err)
        return t1

    def _emit_transfer(
        self,
        req: _Req,
        out: list[ReadableSpan],
        prep_start: int,
        name: str,
        thread: str,
        final: bool,
    ) -> None:
        if semconv.SPAN_KV_DESC_PREP not in req.emitted and req.prep_end:
            attrs = self._attrs(req)
            attrs[semconv.THREAD] = thread
            attrs[semconv.KV_DESCRIPTORS] = req.n_desc
            if req.n_blocks:
                attrs[semconv.KV_BLOCKS] = req.n_blocks
            self._add(
                out,
                req,
                semconv.SPAN_KV_DESC_PREP,
                min(prep_start, req.prep_end),
                req.prep_end,
                attrs,
            )
        if name in req.emitted:
            return
        complete = req.post_start and req.xfer_done and not req.handles
        # vLLM asks NIXL for the telemetry right after seeing DONE: wait for it briefly.
        waiting_telemetry = len(req.telemetry) < req.n_done and req.last_seen - req.xfer_done < 1e9
        if (not complete or waiting_telemetry) and not (final or req.failed):
            return
        attrs = self._attrs(req)
        attrs[semconv.THREAD] = thread
        if req.n_blocks:
            attrs[semconv.KV_BLOCKS] = req.n_blocks
        post_us = xfer_us = 0.0
        if req.telemetry:
            attrs[semconv.KV_BYTES] = sum(int(getattr(x, "totalBytes", 0)) for x in req.telemetry)
            attrs[semconv.KV_DESCRIPTORS] = sum(
                int(getattr(x, "descCount", 0)) for x in req.telemetry
            )
            post_us = max(float(getattr(x, "postDuration", 0)) for x in req.telemetry)
            xfer_us = max(float(getattr(x, "xferDuration", 0)) for x in req.telemetry)
            attrs[semconv.NIXL_POST_US] = post_us
            attrs[semconv.NIXL_XFER_US] = xfer_us
        start = req.post_start or req.prep_end or prep_start
        end = req.xfer_done or req.results_done or req.last_seen
        if req.telemetry and req.xfer_done:
            attrs[semconv.POLL_LAG_US] = max(0.0, (end - start) / 1e3 - xfer_us)
        error = None
        if req.xfer_error or req.failed:
            error = (semconv.ERR_TRANSFER, req.xfer_error or "transfer reported failed")
        elif not complete:
            error = (semconv.ERR_TRANSFER, "transfer never completed")
        self._add(out, req, name, start, max(start, end), attrs, [], error)
        req.done = True

    def _emit_notify(self, req: _Req, out: list[ReadableSpan], final: bool, done_time: int) -> None:
        if semconv.SPAN_KV_NOTIFY in req.emitted:
            return
        received = len(req.notif_times)
        if not received and not done_time:
            if final:  # registered (D push) / served (P pull) but nothing ever came back
                start = req.reg_sent or req.alloc or req.last_seen
                if start:
                    attrs = self._attrs(req)
                    attrs[semconv.NOTIFY_EXPECTED] = max(1, req.notif_expected)
                    attrs[semconv.NOTIFY_RECEIVED] = 0
                    self._add(
                        out,
                        req,
                        semconv.SPAN_KV_NOTIFY,
                        start,
                        max(start, req.last_seen),
                        attrs,
                        [],
                        (semconv.ERR_NOTIFY_TIMEOUT, "no completion notification arrived"),
                    )
                req.done = True
            return
        if not done_time and not final:
            return
        expected = max(1, req.notif_expected)
        attrs = self._attrs(req)
        attrs[semconv.THREAD] = "model_runner"
        attrs[semconv.NOTIFY_EXPECTED] = expected
        attrs[semconv.NOTIFY_RECEIVED] = received
        start = req.notif_times[0] if received else done_time
        end = done_time or req.notif_times[-1]
        events = [Event(semconv.EVENT_NOTIFICATION, timestamp=t) for t in req.notif_times]
        error = None
        if req.failed:
            error = (req.failed, "transfer reported failed")
        elif received < expected:
            error = (
                semconv.ERR_NOTIFY_TIMEOUT,
                f"{received} of {expected} completion notifications arrived",
            )
        self._add(out, req, semconv.SPAN_KV_NOTIFY, start, max(start, end), attrs, events, error)
        req.done = True

    # ------------------------------------------------------------------ span making
    def _attrs(self, req: _Req) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            semconv.MODE: self.cfg.mode,
            semconv.ROLE: self.cfg.role,
            semconv.ENGINE_ID: self.cfg.engine_id,
            semconv.REQUEST_ID: req.base,
            semconv.LOCAL_REQUEST_ID: req.local_id,
        }
        if self.cfg.side == "worker":
            attrs[semconv.TP_RANK] = self.cfg.tp_rank
        if req.remote_engine:
            attrs[semconv.REMOTE_ENGINE_ID] = req.remote_engine
        return attrs

    def _add(
        self,
        out: list[ReadableSpan],
        req: _Req,
        name: str,
        start: int,
        end: int,
        attrs: dict[str, Any],
        events: list[Event] | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        out.append(
            self._span(
                name,
                req,
                start,
                end,
                attrs,
                span_id=self._rand.getrandbits(64) or 1,
                parent_id=self._engine_span_id(req),
                events=events or [],
                error=error,
            )
        )
        req.emitted.add(name)

    def _span(
        self,
        name: str,
        req: _Req,
        start: int,
        end: int,
        attrs: dict[str, Any],
        *,
        span_id: int,
        parent_id: int,
        events: list[Event],
        error: tuple[str, str] | None,
    ) -> ReadableSpan:
        if error:
            attrs[semconv.ERROR_TYPE] = error[0]
            status = Status(StatusCode.ERROR, error[1])
        else:
            status = Status(StatusCode.UNSET)
        return ReadableSpan(
            name=name,
            context=SpanContext(req.trace_id, span_id, False, _FLAGS),
            parent=SpanContext(req.trace_id, parent_id, True, _FLAGS) if parent_id else None,
            resource=self.resource,
            attributes=attrs,
            events=events,
            kind=SpanKind.INTERNAL,
            instrumentation_scope=_SCOPE,
            status=status,
            start_time=start,
            end_time=max(start, end),
        )


def _decode_reg(msg: bytes) -> dict[str, Any] | None:
    if msgspec is None:
        return None
    try:
        reg = msgspec.msgpack.decode(msg[len(ev.PUSH_REG_PREFIX) :])
    except Exception:
        return None
    if not isinstance(reg, dict) or not isinstance(reg.get("request_id"), str):
        return None
    return reg
