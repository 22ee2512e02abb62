"""What the analysis should find for a request: its ground truth, known by construction.

The phases expected on the critical path, in order, and those expected hidden behind
it, follow from the timeline (which rendezvous input came first, whether a handshake or
a step handoff happened); the engine-local phases the simulation timed exactly are
returned in milliseconds for comparison with the analysis' engine phases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracedpush import semconv as sc
from tracedpush.analysis import phases as ph
from tracedpush.testing.synthetic.pull import PullLeg
from tracedpush.testing.synthetic.push import PushLeg
from tracedpush.testing.synthetic.timeline import Arrival, PrefillLeg


@dataclass(slots=True)
class SyntheticRequest:
    """Ground truth for one generated request (true clock, ms from the proxy's receipt)."""

    trace_id: str
    request_id: str
    mode: str
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float
    tpot_ms: float
    start_unix_ns: int
    rendezvous_first: str | None  # push: "registration" or "prefill"
    expected_path: tuple[str, ...]  # phases expected on the critical path, in order
    expected_hidden: tuple[str, ...]  # phases expected to be hidden
    dropped: tuple[str, ...] = ()  # span names removed to simulate loss
    # engine-local phases the simulation knows exactly: {"prefill"|"decode": {phase: ms}}
    expected_engine_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    prefill_steps: int = 0


def expected_path(
    leg: PushLeg | PullLeg,
    lookup: bool = False,
    cpu_wait: bool = False,
    relay_wait: bool = False,
    engine_input: bool = True,
    token_wait: bool = False,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(phases on the critical path in order, phases hidden); `lookup`: the request
    waited for the proxy's model catalog after receipt; `cpu_wait`: the proxy's event loop
    waited for a CPU before the first leg's bytes left; `relay_wait`: and in pull's relay;
    `token_wait`: and as the first token went out; `engine_input`: the engine spans have
    vllm_arrival and core_received (with http_received)."""
    api = [ph.API_SERVER, ph.ENGINE_INPUT, ph.ENGINE_BUSY] if engine_input else [ph.API_SERVER]
    if isinstance(leg, PushLeg):
        p_leg = [ph.PROXY, ph.NETWORK, *api, ph.QUEUE_WAIT]
        p_parts = [*api, ph.QUEUE_WAIT, ph.PREFILL_COMPUTE]
        if leg.rdv_first == "registration":  # prefill came second: P's leg is on the path
            path = [*p_leg, ph.PREFILL_COMPUTE]
            hidden = [ph.REGISTRATION]
        else:
            path = [*p_leg, ph.REGISTRATION, ph.REGISTRATION_DELIVERY]
            hidden = [*p_parts, ph.REGISTRATION_WAIT]
        if leg.handoff > 0:
            path.append(ph.STEP_HANDOFF)
        path += [ph.WRITER_QUEUE, ph.DESC_PREP]
        if leg.handshake:
            path += [ph.HANDSHAKE, ph.DESC_PREP]
        path += [ph.WRITE, ph.NOTIFICATION, ph.DECODE_SCHEDULING]
        hidden.append(ph.POLL_LAG)
    else:
        engine_leg = [ph.NETWORK, *api, ph.QUEUE_WAIT]
        path = [ph.PROXY, *engine_leg, ph.PREFILL_COMPUTE, ph.RESPONSE, ph.PROXY, ph.RELAY]
        path += [ph.PROXY_CPU_WAIT] if relay_wait else []
        path += [*engine_leg, ph.STEP_HANDOFF]
        if leg.handshake:
            path += [ph.HANDSHAKE, ph.STEP_HANDOFF]
        path += [ph.DESC_PREP, ph.READ, ph.POLL_LAG, ph.DECODE_SCHEDULING]
        hidden = [sc.SPAN_KV_NOTIFY]
    path += [ph.FIRST_DECODE_STEP, ph.PROXY]
    path += [ph.PROXY_CPU_WAIT] if token_wait else []
    if cpu_wait:
        path[1:1] = [ph.PROXY_CPU_WAIT]
    if lookup:
        path[1:1] = [ph.MODEL_LOOKUP, ph.PROXY]
    return tuple(path), tuple(hidden)


def engine_truth(
    a: Arrival, pre: PrefillLeg, leg: PushLeg | PullLeg, *, http_received: bool
) -> dict[str, dict[str, float]]:
    """{"prefill"|"decode": {phase: ms}} for the engine phases the simulation timed."""
    truth = {
        "prefill": {
            ph.QUEUE_WAIT: pre.compute_start - pre.p_sched,
            ph.PREFILL_COMPUTE: pre.pre_end - pre.compute_start,
        },
        "decode": {ph.QUEUE_WAIT: leg.alloc - leg.d_sched},
    }
    if http_received:
        truth["prefill"][ph.API_SERVER] = pre.p_arrival - pre.p_http
        truth["prefill"][ph.ENGINE_INPUT] = pre.p_core - pre.p_arrival
        truth["prefill"][ph.ENGINE_BUSY] = pre.p_sched - pre.p_core
        truth["decode"][ph.API_SERVER] = leg.d_arrival - leg.d_http
        truth["decode"][ph.ENGINE_INPUT] = leg.d_core - leg.d_arrival
        truth["decode"][ph.ENGINE_BUSY] = leg.d_sched - leg.d_core
    transfer_ms = round(a.xfer * 1000) / 1000  # as the spans report it (whole µs)
    if isinstance(leg, PushLeg):
        truth["prefill"].update(
            {
                ph.WRITE: transfer_ms,
                ph.STEP_HANDOFF: leg.handoff,
                ph.WRITER_QUEUE: leg.writer_q,
                ph.REGISTRATION_WAIT: leg.reg_wait,
            }
        )
    else:
        truth["decode"].update({ph.READ: transfer_ms, ph.STEP_HANDOFF: leg.handoff})
    return truth
