"""Pull mode worker spans.

D (decode) worker: `kv.handshake` (D->P, first contact), `kv.desc_prep` (start_load_kv
took the request -> READ prepped), `kv.read`. P (prefill) worker: `kv.notify` (the READ
completion notifications from D).
"""

from __future__ import annotations

from tracedpush import semconv
from tracedpush.telemetry.emitter import Emitter, Out
from tracedpush.telemetry.request_state import RequestState


class PullDecodeEmitter(Emitter):
    def emit(self, req: RequestState, out: Out, final: bool) -> None:
        if not req.load_start:
            if final:
                req.done = True
            return
        hs_end = self.handshake(req, out, req.load_start, 0)
        start = max(req.load_start, hs_end)
        self.transfer(req, out, start, semconv.SPAN_KV_READ, "model_runner", final)


class PullPrefillEmitter(Emitter):
    def emit(self, req: RequestState, out: Out, final: bool) -> None:
        self.notify(req, out, final, done_time=req.results_done)
