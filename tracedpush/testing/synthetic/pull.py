"""Pull timeline: the proxy relays P's KV coordinates to D, whose worker READs the KV.

D's worker picks the request up at its next step after allocating its blocks, prepares
descriptors, posts the READ and sees it complete when it polls; P only gets notified.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracedpush.testing.synthetic.deployment import PROXY_BUILD_MS
from tracedpush.testing.synthetic.timeline import Arrival, DecodeLeg, Deployment, PrefillLeg


@dataclass(frozen=True, slots=True)
class PullLeg(DecodeLeg):
    relay_start: float  # kv.relay on the proxy: P's answer -> D's request
    relay_end: float
    r_start: float  # kv.read
    r_end: float


def pull_leg(dep: Deployment, a: Arrival, pre: PrefillLeg) -> PullLeg:
    rng, step = dep.rng, a.step
    relay_start = pre.pp_end + 0.05
    relay_end = relay_start + 0.1 + rng.uniform(0.0, 0.1)
    pd_start = relay_end
    d_sent = pd_start + PROXY_BUILD_MS
    d_http = d_sent + dep.net()
    d_api = 0.3 + a.prompt * 0.0001 + rng.uniform(0.0, 0.2)
    d_sched = d_http + d_api
    alloc = d_sched + rng.uniform(0.1, 1.0)
    load_start = alloc + rng.uniform(0.2, step)  # D's worker, at its next step
    hs = (load_start + 0.05, load_start + 15.0) if a.first else None
    dp_start = (hs[1] if hs else load_start) + 0.05
    handoff = dp_start - alloc - (hs[1] - hs[0] if hs else 0.0)
    dp_end = dp_start + 0.3 + a.blocks * 0.02 * (1 + 0.2 * a.load)
    r_start = dp_end + 0.05
    poll_lag = rng.uniform(0.0, step)
    r_end = r_start + a.xfer + poll_lag
    notify = r_start + a.xfer + 0.1 + rng.uniform(0.0, 5.0)
    return PullLeg(
        pd_start=pd_start,
        d_sent=d_sent,
        d_http=d_http,
        d_api=d_api,
        d_sched=d_sched,
        alloc=alloc,
        handshake=hs,
        dp_start=dp_start,
        dp_end=dp_end,
        poll_lag=poll_lag,
        notify=notify,
        kv_done=r_end,
        handoff=handoff,
        relay_start=relay_start,
        relay_end=relay_end,
        r_start=r_start,
        r_end=r_end,
    )
