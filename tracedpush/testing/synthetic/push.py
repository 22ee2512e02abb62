"""Push timeline: D registers its blocks with P, P's writer WRITEs the KV into them.

The rendezvous waits for both D's registration and P's finished prefill; a share of
registrations arrive late (D admission delayed), so both orders occur. P's worker
hands finished blocks to the writer at its next step; the writer serves requests in
order, posts each WRITE and moves on; D learns of it from a notification it polls for.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracedpush.testing.synthetic.deployment import PROXY_BUILD_MS
from tracedpush.testing.synthetic.timeline import Arrival, DecodeLeg, Deployment, PrefillLeg


@dataclass(frozen=True, slots=True)
class PushLeg(DecodeLeg):
    reg_start: float  # kv.register on D (at block allocation)
    reg_end: float
    reg_arrival: float  # the registration reached P
    fin: float  # P's scheduler finished the prefill (prefill_finished)
    handed: float  # P's worker handed the blocks to the writer
    rdv_start: float  # kv.rendezvous: first of registration / finished prefill
    rdv_end: float  # the writer starts on it
    rdv_first: str  # "registration" or "prefill"
    writer_q: float  # waited for the writer (ms)
    reg_wait: float  # P waited for the registration after prefill (ms)
    w_start: float  # kv.write
    w_end: float


def push_leg(dep: Deployment, a: Arrival, pre: PrefillLeg) -> PushLeg:
    rng, step = dep.rng, a.step
    p_step = 4.0 + 1.5 * a.load  # P's engine step (another request's chunk) under load
    pd_start = a.legs_from + 0.25 + rng.random() * 0.1
    d_sent = pd_start + PROXY_BUILD_MS
    d_http = d_sent + dep.net()
    d_api = 0.3 + a.prompt * 0.0001 + rng.uniform(0.0, 0.2)
    d_sched = d_http + d_api
    alloc = d_sched + rng.uniform(0.2, step)
    if rng.random() < dep.registration_late:
        alloc = max(alloc, pre.pre_end + rng.uniform(1.0, 10.0))
    reg_start = alloc
    reg_end = reg_start + 0.3 + (10.0 if a.first else 0.0) + a.blocks * 0.001
    reg_arrival = reg_end + 0.2 + rng.uniform(0.0, 0.3)
    fin = pre.pre_end
    # P's worker takes the finished blocks up at its next step, after its forward
    handed = fin + rng.uniform(0.05, p_step)
    ready = max(fin, reg_arrival)
    # the writer starts it once it has both, after the requests queued before it
    w_ready = max(handed, ready)
    rdv_end = max(w_ready, dep.w_free) + rng.uniform(0.05, 0.3)
    hs = (rdv_end + 0.05, rdv_end + 12.0) if a.first else None
    dp_start = (hs[1] if hs else rdv_end) + 0.05 + rng.uniform(0.0, 0.1)
    dp_end = dp_start + 0.15 + a.blocks * 0.002
    w_start = dp_end + 0.05
    poll_lag = rng.uniform(0.0, step)
    dep.w_free = w_start  # the writer posts and moves on
    landed = w_start + a.xfer
    notify = landed + 0.1 + rng.uniform(0.0, step)
    return PushLeg(
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
        kv_done=notify,
        handoff=max(handed - ready, 0.0),
        reg_start=reg_start,
        reg_end=reg_end,
        reg_arrival=reg_arrival,
        fin=fin,
        handed=handed,
        rdv_start=min(reg_arrival, fin),
        rdv_end=rdv_end,
        rdv_first="registration" if reg_arrival <= fin else "prefill",
        writer_q=rdv_end - w_ready,
        reg_wait=max(reg_arrival - fin, 0.0),
        w_start=w_start,
        w_end=w_start + a.xfer + poll_lag,
    )
