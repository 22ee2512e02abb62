"""Emitters: turn a request's state into spans once a phase is complete.

One emitter per process, picked at construction (`builder.emitter_for`): the scheduler side
emits the engine span (`prefill` / `decode`); each worker emits the `kv.*` phases of
its mode and role (`push_emitter`, `pull_emitter`). The transfer, handshake and
notification spans both modes share live here.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import Event, ReadableSpan

from tracedpush import semconv
from tracedpush.telemetry.request_state import Handshake, Peers, RequestState
from tracedpush.telemetry.span_factory import Error, SpanFactory

Out = list[ReadableSpan]


class Emitter:
    # Its spans feed the engine's metrics (kv.* phases): an unsampled request still goes
    # through it, as phase records (builder._observe_only).
    observed = True

    def __init__(
        self, spans: SpanFactory, handshakes: list[Handshake], peers: Peers | None = None
    ) -> None:
        self.spans = spans
        self.handshakes = handshakes  # the tracker's list of every handshake seen
        self.peers = peers if peers is not None else Peers()  # agent name -> peer rank

    def emit(self, req: RequestState, out: Out, final: bool) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- shared phases
    def handshake(self, req: RequestState, out: Out, wait_start: int, resume: int) -> int:
        """kv.handshake for a handshake this request waited on; returns its end (0 if none)."""
        waited = [h for h in req.handshakes if h[1] >= wait_start] or [
            h
            for h in self.handshakes
            if h[2] == req.remote_engine
            and h[0] <= (resume or req.prep_end or h[1])
            and h[1] >= wait_start
        ]
        if not waited:
            return 0
        t0, t1, engine, error = waited[-1]
        if semconv.SPAN_KV_HANDSHAKE not in req.emitted:
            attrs = self.spans.attrs(req)
            attrs[semconv.THREAD] = "handshake"
            attrs[semconv.REMOTE_ENGINE_ID] = engine
            err = (semconv.ERR_HANDSHAKE, error) if error else None
            self.spans.child(
                out, req, semconv.SPAN_KV_HANDSHAKE, max(t0, wait_start), t1, attrs, [], err
            )
        return t1

    def transfer(
        self, req: RequestState, out: Out, prep_start: int, name: str, thread: str, final: bool
    ) -> None:
        """kv.desc_prep, then kv.write / kv.read once the transfer completed."""
        if semconv.SPAN_KV_DESC_PREP not in req.emitted and req.prep_end:
            attrs = self.spans.attrs(req)
            attrs[semconv.THREAD] = thread
            attrs[semconv.KV_DESCRIPTORS] = req.n_desc
            if req.n_blocks:
                attrs[semconv.KV_BLOCKS] = req.n_blocks
            start = min(prep_start, req.prep_end)
            self.spans.child(out, req, semconv.SPAN_KV_DESC_PREP, start, req.prep_end, attrs)
        if name in req.emitted:
            return
        complete = req.post_start and req.xfer_done and not req.handles
        # vLLM asks NIXL for the telemetry right after seeing DONE: wait for it briefly.
        waiting_telemetry = len(req.telemetry) < req.n_done and req.last_seen - req.xfer_done < 1e9
        if (not complete or waiting_telemetry) and not (final or req.failed):
            return
        attrs = self.spans.attrs(req)
        attrs[semconv.THREAD] = thread
        if req.n_blocks:
            attrs[semconv.KV_BLOCKS] = req.n_blocks
        xfer_us = 0.0
        if req.telemetry:
            tel = req.telemetry
            attrs[semconv.KV_BYTES] = sum(int(getattr(x, "totalBytes", 0)) for x in tel)
            attrs[semconv.KV_DESCRIPTORS] = sum(int(getattr(x, "descCount", 0)) for x in tel)
            xfer_us = max(float(getattr(x, "xferDuration", 0)) for x in tel)
            attrs[semconv.NIXL_POST_US] = max(float(getattr(x, "postDuration", 0)) for x in tel)
            attrs[semconv.NIXL_XFER_US] = xfer_us
        start = req.post_start or req.prep_end or prep_start
        end = req.xfer_done or req.results_done or req.last_seen
        if req.telemetry and req.xfer_done:
            attrs[semconv.POLL_LAG_US] = max(0.0, (end - start) / 1e3 - xfer_us)
        error: Error = None
        if req.xfer_error or req.failed:
            error = (semconv.ERR_TRANSFER, req.xfer_error or "transfer reported failed")
        elif not complete:
            error = (semconv.ERR_TRANSFER, "transfer never completed")
        self.spans.child(out, req, name, start, max(start, end), attrs, [], error)
        req.done = True

    def notify(self, req: RequestState, out: Out, final: bool, done_time: int) -> None:
        """kv.notify: first -> last completion notification (or its absence)."""
        if semconv.SPAN_KV_NOTIFY in req.emitted:
            return
        received = len(req.notif_times)
        if not received and not done_time:
            if final:  # registered (D push) / served (P pull) but nothing ever came back
                start = req.reg_sent or req.alloc or req.last_seen
                if start:
                    attrs = self.spans.attrs(req)
                    attrs[semconv.NOTIFY_EXPECTED] = max(1, req.notif_expected)
                    attrs[semconv.NOTIFY_RECEIVED] = 0
                    if req.reg_agents:
                        attrs[semconv.NOTIFY_RANKS] = []
                    waited = self._silent(req)
                    ended = req.finished and self.spans.cfg.role == "decode"
                    error = (
                        semconv.ERR_NOTIFY_TIMEOUT,
                        "no completion notification arrived"
                        + (f" before the request ended ({req.finish_status})" if ended else "")
                        + (f" (none from {waited})" if waited else ""),
                    )
                    end = max(start, req.last_seen)
                    self.spans.child(out, req, semconv.SPAN_KV_NOTIFY, start, end, attrs, [], error)
                req.done = True
            return
        if not done_time and not final:
            return
        expected = max(1, req.notif_expected)
        attrs = self.spans.attrs(req)
        attrs[semconv.THREAD] = "model_runner"
        attrs[semconv.NOTIFY_EXPECTED] = expected
        attrs[semconv.NOTIFY_RECEIVED] = received
        ranks = [self.peers.rank(a) for a in req.notif_agents]
        if any(r is not None for r in ranks):
            attrs[semconv.NOTIFY_RANKS] = [r[2] if r is not None else -1 for r in ranks]
        start = req.notif_times[0] if received else done_time
        end = done_time or req.notif_times[-1]
        events = [Event(semconv.EVENT_NOTIFICATION, timestamp=t) for t in req.notif_times]
        error: Error = None
        if req.failed:
            error = (req.failed, "transfer reported failed")
        elif received < expected:
            silent = self._silent(req)
            error = (
                semconv.ERR_NOTIFY_TIMEOUT,
                f"{received} of {expected} completion notifications arrived"
                + (f"; none from {silent}" if silent else ""),
            )
        self.spans.child(
            out, req, semconv.SPAN_KV_NOTIFY, start, max(start, end), attrs, events, error
        )
        req.done = True

    def _silent(self, req: RequestState) -> str:
        """The peer ranks that were asked (D push: each P rank D registered with) and
        never notified, named ("rank 1 of prefill-engine-001"); "" when unknown."""
        heard = set(req.notif_agents)
        return self.peers.describe([a for a in req.reg_agents if a not in heard])
