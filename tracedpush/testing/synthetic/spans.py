"""A request's span tree (docs/spans.md) from its timeline, on the processes that emit it.

The proxy's root and legs, P's and D's engine spans, and each mode's KV spans with the
attributes the connectors set. A dropped span is simply not emitted (its children hang
from its parent), which is how lost spans look to the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind

from tracedpush import semconv as sc
from tracedpush.testing.synthetic.deployment import DECODE_INSTANCE, PREFILL_INSTANCE
from tracedpush.testing.synthetic.encode import Emitter, Process
from tracedpush.testing.synthetic.pull import PullLeg
from tracedpush.testing.synthetic.push import PushLeg
from tracedpush.testing.synthetic.timeline import Arrival, Finish, PrefillLeg

REMOTE_D = {sc.REMOTE_ENGINE_ID: DECODE_INSTANCE, sc.REMOTE_HOST: "d-host", sc.REMOTE_PORT: 5600}
REMOTE_P = {sc.REMOTE_ENGINE_ID: PREFILL_INSTANCE, sc.REMOTE_HOST: "p-host", sc.REMOTE_PORT: 5500}
WORKER = {sc.TP_RANK: 0}
MODELS_ID = 0x6D6F64656C73  # proxy.models: its root's id with these bits flipped


class _Tree:
    """Emits one request's spans; span ids are drawn in emission order."""

    def __init__(self, em: Emitter, procs: Mapping[str, Process], a: Arrival) -> None:
        self.em, self.procs, self.a = em, procs, a
        common = {sc.MODE: a.mode, sc.REQUEST_ID: a.rid}
        self.common = common
        self.eng_p = {
            **common,
            sc.ROLE: "prefill",
            sc.ENGINE_ID: PREFILL_INSTANCE,
            sc.LOCAL_REQUEST_ID: a.local_id,
        }
        self.eng_d = {
            **common,
            sc.ROLE: "decode",
            sc.ENGINE_ID: DECODE_INSTANCE,
            sc.LOCAL_REQUEST_ID: a.local_id,
        }
        self.kv = {sc.KV_BLOCKS: a.blocks, sc.KV_DESCRIPTORS: a.blocks}

    def emit(
        self,
        proc: str,
        parent: int,
        name: str,
        start: float,
        end: float,
        attrs: Mapping[str, Any],
        **kw: Any,
    ) -> int:
        """The new span's id, or `parent` when this request drops `name`."""
        if name in self.a.dropped:
            return parent
        return self.em.span(
            self.procs[proc], self.a.trace_id, parent, name, start, end, attrs, **kw
        )

    def xfer_attrs(self, poll_lag: float) -> dict[str, Any]:
        return {
            **self.kv,
            sc.KV_BYTES: self.a.kv_bytes,
            sc.NIXL_POST_US: 40,
            sc.NIXL_XFER_US: round(self.a.xfer * 1000),
            sc.POLL_LAG_US: round(poll_lag * 1000),
        }


def _received(
    http_received: bool, http: float, arrival: float, core: float
) -> list[tuple[str, float]]:
    """An engine span's first events: http_received, vllm_arrival and core_received, with
    the middleware."""
    if not http_received:
        return []
    return [
        (sc.EVENT_HTTP_RECEIVED, http),
        (sc.EVENT_VLLM_ARRIVAL, arrival),
        (sc.EVENT_CORE_RECEIVED, core),
    ]


def emit_request(
    em: Emitter,
    procs: Mapping[str, Process],
    a: Arrival,
    pre: PrefillLeg,
    leg: PushLeg | PullLeg,
    fin: Finish,
    *,
    http_received: bool,
) -> None:
    tree = _Tree(em, procs, a)
    common, emit = tree.common, tree.emit
    # the proxy loop's time between the legs (pull's relay), and its figures at D's send,
    # which D's first token, coming in, also has (the loop idle meanwhile)
    relayed = leg.d_sent - leg.relay_start if isinstance(leg, PullLeg) else 0.0
    at_d = a.loop_at(leg.d_sent, relayed)
    root = emit(
        "proxy",
        0,
        sc.SPAN_REQUEST,
        a.t,
        fin.end,
        {
            **common,
            sc.ROLE: "proxy",
            sc.PROMPT_TOKENS: a.prompt,
            sc.OUTPUT_TOKENS: a.outs,
            sc.STREAM: True,
            sc.TTFT_MS: round(fin.ft - a.t, 3),
            sc.HTTP_METHOD: "POST",
            sc.HTTP_ROUTE: "/v1/completions",
            sc.HTTP_STATUS: 200,
        },
        kind=SpanKind.SERVER,
        events=[(sc.EVENT_FIRST_TOKEN, fin.ft, a.token_out(at_d, fin.ft - fin.pd_ft))],
    )
    if a.lookup is not None and root:  # its id is not drawn: later draws stay as they were
        proxy = tree.procs["proxy"]
        models = {sc.MODELS_FETCHED: True, sc.MODELS_ANSWERED: True}
        start, end = (em.ns(t, proxy) for t in a.lookup)
        proxy.add(a.trace_id, root ^ MODELS_ID, root, sc.SPAN_PROXY_MODELS, start, end, {
            **common, sc.ROLE: "proxy", **models})  # fmt: skip
    proxy_leg = {**common, sc.ROLE: "proxy", sc.HTTP_METHOD: "POST", sc.HTTP_STATUS: 200}
    ppid = emit(
        "proxy",
        root,
        sc.SPAN_PROXY_PREFILL,
        pre.pp_start,
        pre.pp_end,
        {**proxy_leg, sc.ENGINE_ID: PREFILL_INSTANCE, sc.UPSTREAM_URL: "http://p-host:8100"},
        kind=SpanKind.CLIENT,
        events=[(sc.EVENT_REQUEST_SENT, pre.p_sent, a.loop_at(pre.p_sent))],
    )
    prefill = emit(
        "p_sched",
        ppid,
        sc.SPAN_PREFILL,
        pre.pre_start,
        pre.pre_end,
        {
            **tree.eng_p,
            sc.THREAD: "scheduler",
            sc.PROMPT_TOKENS: a.prompt,
            sc.PREFILL_STEPS: pre.steps,
        },
        events=[
            *_received(http_received, pre.p_http, pre.p_arrival, pre.p_core),
            (sc.EVENT_SCHEDULER_RECEIVED, pre.p_sched),
            (sc.EVENT_COMPUTE_STARTED, pre.compute_start),
        ],
    )
    if isinstance(leg, PullLeg):
        emit(
            "proxy",
            root,
            sc.SPAN_KV_RELAY,
            leg.relay_start,
            leg.relay_end,
            {**common, sc.ROLE: "proxy", **a.loop_at(pre.p_sent)},  # at P's answer
        )
    pdid = emit(
        "proxy",
        root,
        sc.SPAN_PROXY_DECODE,
        leg.pd_start,
        fin.pd_end,
        {**proxy_leg, sc.ENGINE_ID: DECODE_INSTANCE, sc.UPSTREAM_URL: "http://d-host:8200"},
        kind=SpanKind.CLIENT,
        events=[
            (sc.EVENT_REQUEST_SENT, leg.d_sent, at_d),
            (sc.EVENT_FIRST_TOKEN, fin.pd_ft, at_d),
        ],
    )
    decode = emit(
        "d_sched",
        pdid,
        sc.SPAN_DECODE,
        fin.dec_start,
        fin.dec_end,
        {
            **tree.eng_d,
            sc.THREAD: "scheduler",
            sc.PROMPT_TOKENS: a.prompt,
            sc.DECODE_END: "first_token_scheduled",
        },
        events=[
            *_received(http_received, leg.d_http, leg.d_arrival, leg.d_core),
            (sc.EVENT_SCHEDULER_RECEIVED, leg.d_sched),
            (sc.EVENT_BLOCKS_ALLOCATED, leg.alloc),
        ],
    )
    p_side = {**tree.eng_p, **WORKER, **REMOTE_D}
    d_side = {**tree.eng_d, **WORKER, **REMOTE_P}
    if isinstance(leg, PushLeg):
        _rendezvous_spans(tree, leg, prefill, decode, p_side, d_side)
        mover = _Side("p_work", prefill, p_side, "push_writer")  # P's writer WRITEs
        peer = _Side("d_work", decode, d_side, "model_runner")
        transfer = (sc.SPAN_KV_WRITE, leg.w_start, leg.w_end)
    else:
        mover = _Side("d_work", decode, d_side, "model_runner")  # D's model runner READs
        peer = _Side("p_work", prefill, p_side, "model_runner")
        transfer = (sc.SPAN_KV_READ, leg.r_start, leg.r_end)
    mover_attrs = {**mover.attrs, sc.THREAD: mover.thread}
    if leg.handshake:
        emit(mover.proc, mover.parent, sc.SPAN_KV_HANDSHAKE, *leg.handshake, mover_attrs)
    emit(
        mover.proc,
        mover.parent,
        sc.SPAN_KV_DESC_PREP,
        leg.dp_start,
        leg.dp_end,
        {**mover.attrs, **tree.kv, sc.THREAD: mover.thread},
    )
    emit(
        mover.proc,
        mover.parent,
        *transfer,
        {**mover.attrs, **tree.xfer_attrs(leg.poll_lag), sc.THREAD: mover.thread},
    )
    emit(
        peer.proc,
        peer.parent,
        sc.SPAN_KV_NOTIFY,
        leg.notify,
        leg.notify,
        {
            **peer.attrs,
            sc.THREAD: peer.thread,
            sc.NOTIFY_EXPECTED: 1,
            sc.NOTIFY_RECEIVED: 1,
        },
    )


@dataclass(frozen=True, slots=True)
class _Side:
    """An engine's side of the KV transfer: its worker process, parent span, attributes."""

    proc: str
    parent: int
    attrs: dict[str, Any]
    thread: str


def _rendezvous_spans(
    tree: _Tree,
    leg: PushLeg,
    prefill: int,
    decode: int,
    p_side: dict[str, Any],
    d_side: dict[str, Any],
) -> None:
    """Push: D registers its blocks, P's writer waits for registration and prefill."""
    tree.emit(
        "d_work",
        decode,
        sc.SPAN_KV_REGISTER,
        leg.reg_start,
        leg.reg_end,
        {**d_side, sc.THREAD: "push_writer", sc.KV_BLOCKS: tree.a.blocks},
    )
    tree.emit(
        "p_work",
        prefill,
        sc.SPAN_KV_RENDEZVOUS,
        leg.rdv_start,
        leg.rdv_end,
        {**p_side, sc.THREAD: "push_writer", sc.RENDEZVOUS_FIRST: leg.rdv_first},
        events=sorted(
            [
                (sc.EVENT_REGISTRATION_ARRIVED, leg.reg_arrival),
                (sc.EVENT_PREFILL_FINISHED, leg.fin),
                (sc.EVENT_HANDED_TO_WRITER, leg.handed),
            ],
            key=lambda e: e[1],
        ),
    )
