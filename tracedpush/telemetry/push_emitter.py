"""Push mode worker spans.

P (prefill) worker: `kv.rendezvous` (first input -> the writer starts the request, with
the events `registration_arrived`, `prefill_finished` and `handed_to_writer`),
`kv.handshake` (P->D, first contact), `kv.desc_prep`, `kv.write`.
D (decode) worker: `kv.register` (blocks allocated -> registration sent), `kv.notify`.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import Event

from tracedpush import semconv
from tracedpush.telemetry.emitter import Emitter, Out
from tracedpush.telemetry.request_state import RequestState
from tracedpush.telemetry.span_factory import Error


class PushPrefillEmitter(Emitter):
    def emit(self, req: RequestState, out: Out, final: bool) -> None:
        match = req.push_starts[0] if req.push_starts else 0
        if semconv.SPAN_KV_RENDEZVOUS not in req.emitted and (match or final or req.results_done):
            self._rendezvous(req, out, match)
        if not match:
            if final or req.results_done:
                req.done = True
            return
        resume = req.push_starts[-1] if len(req.push_starts) > 1 else 0
        self.handshake(req, out, match, resume)
        self.transfer(req, out, req.push_starts[-1], semconv.SPAN_KV_WRITE, "push_writer", final)

    def _rendezvous(self, req: RequestState, out: Out, match: int) -> None:
        inputs = [t for t in (req.reg_arrival, req.finished) if t]
        if not inputs:
            return
        attrs = self.spans.attrs(req)
        attrs[semconv.THREAD] = "push_writer"
        reg_first = req.reg_arrival and (not req.finished or req.reg_arrival <= req.finished)
        attrs[semconv.RENDEZVOUS_FIRST] = "registration" if reg_first else "prefill"
        events = []
        if req.reg_arrival:
            events.append(Event(semconv.EVENT_REGISTRATION_ARRIVED, timestamp=req.reg_arrival))
        if req.finished:
            events.append(Event(semconv.EVENT_PREFILL_FINISHED, timestamp=req.finished))
        if req.handoff:
            events.append(Event(semconv.EVENT_HANDED_TO_WRITER, timestamp=req.handoff))
        error: Error = None
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
        start = min(inputs)
        self.spans.child(out, req, semconv.SPAN_KV_RENDEZVOUS, start, end, attrs, events, error)


class PushDecodeEmitter(Emitter):
    def emit(self, req: RequestState, out: Out, final: bool) -> None:
        if not req.alloc:  # no blocks yet, so nothing registered and nothing to wait for
            if final:  # e.g. aborted in D's queue
                req.done = True
            return
        if semconv.SPAN_KV_REGISTER not in req.emitted and (req.reg_sent or final):
            self._register(req, out)
        self.notify(req, out, final, done_time=req.results_done)

    def _register(self, req: RequestState, out: Out) -> None:
        attrs = self.spans.attrs(req)
        attrs[semconv.THREAD] = "push_writer"
        if req.n_blocks:
            attrs[semconv.KV_BLOCKS] = req.n_blocks
        hs = [h for h in req.handshakes if h[2] == req.remote_engine]
        events = [
            Event(semconv.EVENT_HANDSHAKE, {"duration_ms": (h[1] - h[0]) / 1e6}, h[1]) for h in hs
        ]
        error: Error = None
        end = req.reg_sent
        if not end:
            end = req.last_seen
            failed = [h for h in hs if h[3]]
            error = (
                (semconv.ERR_HANDSHAKE, failed[0][3] or "")
                if failed
                else (semconv.ERR_REGISTRATION_TIMEOUT, "registration was never sent")
            )
        self.spans.child(out, req, semconv.SPAN_KV_REGISTER, req.alloc, end, attrs, events, error)
