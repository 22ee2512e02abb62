"""One request's timeline up to and after the KV handoff (true clock, ms from run start).

The simulation's state (`Deployment`) and the parts of a request both modes share: its
arrival (`Arrival`), the proxy's prefill leg (`PrefillLeg`), what D's side of the
handoff must provide (`DecodeLeg`, filled by `push` or `pull`) and the end of the
request (`Finish`). Every draw comes from the run's one generator, in a fixed order, so
a seed always gives the same traces.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from tracedpush import semconv as sc
from tracedpush.testing.synthetic.deployment import (
    BLOCK_TOKENS,
    KV_BYTES_PER_TOKEN,
    MODEL_LOOKUP_MS,
    PREFILL_CHUNK_TOKENS,
    PROXY_BUILD_MS,
)
from tracedpush.testing.synthetic.encode import Emitter


class Deployment:
    """One mode's 1P1D: a FIFO prefill engine, P's push writer thread, the proxy's load."""

    def __init__(
        self,
        rng: random.Random,
        mode: str,
        *,
        registration_late: float,
        http_received: bool,
    ) -> None:
        self.rng, self.mode = rng, mode
        self.registration_late = registration_late  # push: share of late D registrations
        self.http_received = http_received  # the engines' HTTP middleware is on
        self.p_free = 0.0  # prefill engine busy until
        self.w_free = 0.0  # push writer thread busy until
        self.inflight: list[float] = []  # end times of requests in flight at the proxy
        self.last_end_ms = 0.0

    def net(self) -> float:
        return 0.25 + self.rng.expovariate(10.0)  # one way, ~0.35 ms mean, symmetric

    def admit(self, t: float) -> int:
        """The proxy's load when a request arrives at `t`, the request included."""
        self.inflight = [e for e in self.inflight if e > t]
        return len(self.inflight) + 1

    def leave(self, end: float) -> None:
        self.inflight.append(end)
        self.last_end_ms = max(self.last_end_ms, end)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request as it reaches the proxy at `t`, and the load it meets there."""

    rid: str
    mode: str
    t: float
    prompt: int
    outs: int
    first: bool  # the run's first request: pays the NIXL handshake
    load: int
    trace_id: int
    local_id: str
    dropped: frozenset[str]  # span names this request loses

    @property
    def lookup(self) -> tuple[float, float] | None:
        """The wait for the proxy's model catalog (ms), the mode's first request's only."""
        return (self.t + 0.05, self.t + 0.05 + MODEL_LOOKUP_MS) if self.first else None

    @property
    def legs_from(self) -> float:
        """When the proxy can start the request's legs (after any catalog wait)."""
        return self.lookup[1] if self.lookup else self.t

    def _crowded(self, per_other: float, most: float) -> float:
        """ms the proxy's event loop waited for a CPU over one stretch: ``per_other`` ms
        for each other request in flight, at most ``most`` (no draw, so later draws stay
        as they were)."""
        return round(min(most, per_other * (self.load - 1)), 3)

    @property
    def loop_wait(self) -> float:
        """From receipt to the first leg's bytes out: less than the legs take to build."""
        return self._crowded(0.05, 0.25)

    @property
    def relay_wait(self) -> float:
        """During pull's relay (P's answer -> D's bytes out): less than the relay takes."""
        return self._crowded(0.02, 0.08)

    @property
    def token_wait(self) -> float:
        """Between D's first token in and out to the client: of the 0.1 ms that takes."""
        return self._crowded(0.01, 0.06)

    def token_out(self, at_d: Mapping[str, float], out: float) -> dict[str, float]:
        """The loop figures as D's first token leaves for the client, ``out`` ms after it
        came in with figures ``at_d``: busy all along but for its wait."""
        return {
            sc.LOOP_ON_CPU_MS: round(at_d[sc.LOOP_ON_CPU_MS] + out - self.token_wait, 3),
            sc.LOOP_CPU_WAIT_MS: round(at_d[sc.LOOP_CPU_WAIT_MS] + self.token_wait, 3),
        }

    def loop_at(self, sent: float, relay: float = 0.0) -> dict[str, float]:
        """The loop figures since receipt (the proxy's ``loop_cpu``) for a leg sent at
        ``sent``: busy from the catalog's answer until the first send but for its wait,
        then, for pull's D leg, the ``relay`` ms from P's answer but for the relay's wait."""
        first = min(sent, self.legs_from + 0.5)
        on_cpu = max(0.0, first - self.legs_from - self.loop_wait)
        waited = self.loop_wait
        if relay:
            on_cpu += relay - self.relay_wait
            waited += self.relay_wait
        return {sc.LOOP_ON_CPU_MS: round(on_cpu, 3), sc.LOOP_CPU_WAIT_MS: round(waited, 3)}

    @property
    def step(self) -> float:
        """D's decode step period (ms), which is also the TPOT."""
        return 6.0 + 0.6 * self.load + self.prompt * 0.0004

    @property
    def blocks(self) -> int:
        return -(-self.prompt // BLOCK_TOKENS)

    @property
    def kv_bytes(self) -> int:
        return self.prompt * KV_BYTES_PER_TOKEN

    @property
    def xfer(self) -> float:
        return 0.05 + self.kv_bytes / 5e6  # ms at 5 GB/s


def arrive(
    dep: Deployment,
    em: Emitter,
    drop_spans: Mapping[str, float],
    rid: str,
    t: float,
    prompt: int,
    outs: int,
    *,
    first: bool,
) -> Arrival:
    load = dep.admit(t)
    dropped = frozenset(n for n, pr in drop_spans.items() if dep.rng.random() < pr)
    trace_id = em.new_id(16)
    local = f"{rid}-{em.new_id(4):08x}"
    return Arrival(rid, dep.mode, t, prompt, outs, first, load, trace_id, local, dropped)


@dataclass(frozen=True, slots=True)
class PrefillLeg:
    """The proxy -> P leg. Every engine leg is network (proxy -> HTTP server), API server
    (HTTP, validation: to vLLM's arrival_time, 60% of it here), engine input
    (tokenization, IPC: to the EngineCore's input thread, 60% of the rest), engine busy
    (the EngineCore's loop finishing its step), then queue wait (FIFO)."""

    pp_start: float  # proxy.prefill span
    p_sent: float  # its bytes leave the proxy
    p_http: float  # P's HTTP server has it
    p_arrival: float  # vLLM's arrival_time
    p_sched: float  # P's scheduler has it
    compute_start: float
    pre_start: float  # prefill span: HTTP receipt, or vLLM's arrival without middleware
    pre_end: float
    pp_end: float
    steps: int  # prefill engine steps (chunks)

    @property
    def p_core(self) -> float:
        """The EngineCore's input thread has it (core_received)."""
        return _core(self.p_arrival, self.p_sched)


def _core(arrival: float, sched: float) -> float:
    """core_received: 60% of vLLM's arrival -> the scheduler's (no draw: later draws stay)."""
    return arrival + 0.6 * (sched - arrival)


def prefill_leg(dep: Deployment, a: Arrival) -> PrefillLeg:
    rng = dep.rng
    pp_start = a.legs_from + 0.2 + rng.random() * 0.1
    p_sent = pp_start + PROXY_BUILD_MS
    p_http = p_sent + dep.net()
    p_api = 0.4 + a.prompt * 0.0002 + rng.uniform(0.0, 0.3) * a.load
    p_arrival = p_http + 0.6 * p_api
    p_sched = p_http + p_api
    compute_start = max(p_sched + rng.uniform(0.05, 0.3), dep.p_free)  # FIFO queue
    dep.p_free = compute_start + (4.0 + a.prompt * 0.03)  # + compute time
    pre_end = dep.p_free + 0.2
    return PrefillLeg(
        pp_start=pp_start,
        p_sent=p_sent,
        p_http=p_http,
        p_arrival=p_arrival,
        p_sched=p_sched,
        compute_start=compute_start,
        pre_start=p_http if dep.http_received else p_arrival,
        pre_end=pre_end,
        pp_end=pre_end + 0.8 + dep.net(),
        steps=-(-a.prompt // PREFILL_CHUNK_TOKENS),
    )


@dataclass(frozen=True, slots=True)
class DecodeLeg:
    """The proxy -> D leg and the KV transfer, as both modes have them."""

    pd_start: float  # proxy.decode span
    d_sent: float
    d_http: float
    d_api: float  # D's API-server time
    d_sched: float
    alloc: float  # D allocated the request's blocks
    handshake: tuple[float, float] | None  # first request only
    dp_start: float  # kv.desc_prep
    dp_end: float
    poll_lag: float  # transfer done -> its completion seen
    notify: float  # kv.notify (an instant)
    kv_done: float  # D can schedule the first token
    handoff: float  # step handoff on the path (ms)

    @property
    def d_arrival(self) -> float:
        """vLLM's arrival_time on D: 60% of D's API-server time after its HTTP receipt, as P's."""
        return self.d_http + 0.6 * self.d_api

    @property
    def d_core(self) -> float:
        """D's EngineCore input thread has it (core_received)."""
        return _core(self.d_arrival, self.d_sched)


@dataclass(frozen=True, slots=True)
class Finish:
    """D's decode span, the first token and the end of the request."""

    dec_start: float
    dec_end: float  # first token scheduled
    pd_ft: float  # first token at the proxy's decode leg
    ft: float  # first token sent to the client
    end: float
    pd_end: float


def finish(dep: Deployment, a: Arrival, leg: DecodeLeg) -> Finish:
    dec_start = leg.d_http if dep.http_received else leg.d_arrival
    dec_end = leg.kv_done + dep.rng.uniform(0.1, a.step)
    pd_ft = dec_end + a.step + 0.3 + dep.net()
    ft = pd_ft + 0.1
    end = ft + (a.outs - 1) * a.step + 0.2
    dep.leave(end)
    return Finish(dec_start, dec_end, pd_ft, ft, end, end - 0.1)
