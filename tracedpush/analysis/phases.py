"""Names of the phases a request's TTFT is cut into (the analysis' own vocabulary).

Span names belong to `tracedpush.semconv`; phases are what the critical path reports.
Several phases come from gaps between spans (a request in flight, a handoff between
threads), so they have no span of their own. `PHASES` is in pipeline order, which the
console uses for stacking and colours.
"""

from __future__ import annotations

from typing import Final

PROXY: Final = "proxy"  # the proxy's own work: receipt -> leg sent; first token -> client
NETWORK: Final = "network"  # request / response in flight between the proxy and an engine
PREFILL: Final = "prefill"  # P: arrival at P's API server -> request finished (queue+compute)
DECODE_ADMISSION: Final = "decode admission"  # D: arrival -> KV work starts (alloc, queue)
REGISTRATION: Final = "registration"  # push, D: kv.register (blocks allocated -> reg sent)
REGISTRATION_WAIT: Final = "registration wait"  # push: reg sent (D) -> seen by P's writer
RENDEZVOUS_WAIT: Final = "rendezvous wait"  # push, P: prefill done -> writer picks it up
HANDSHAKE: Final = "handshake"  # NIXL agent handshake on first contact
DESC_PREP: Final = "descriptor prep"  # kv.desc_prep + posting the transfer
WRITE: Final = "WRITE"  # push: NIXL WRITE posted -> data landed (NIXL xferDuration)
READ: Final = "READ"  # pull: NIXL READ posted -> completion (minus polling lag)
POLL_LAG: Final = "completion polling lag"  # completion seen only at the next engine step
NOTIFICATION: Final = "notification"  # push: data landed -> first notification seen on D
NOTIFY_COUNTING: Final = "notification counting"  # kv.notify: first -> last notification
RELAY: Final = "relay"  # pull: kv.relay in the proxy (P's answer -> D's request)
DECODE_SCHEDULING: Final = "decode scheduling"  # D: KV complete -> first token scheduled
FIRST_DECODE_STEP: Final = "first decode step"  # D: scheduled -> first token at the proxy
UNATTRIBUTED: Final = "unattributed"  # a gap whose bounding spans are missing

PHASES: Final = (
    PROXY,
    NETWORK,
    PREFILL,
    DECODE_ADMISSION,
    REGISTRATION,
    REGISTRATION_WAIT,
    RENDEZVOUS_WAIT,
    HANDSHAKE,
    DESC_PREP,
    WRITE,
    READ,
    POLL_LAG,
    NOTIFICATION,
    NOTIFY_COUNTING,
    RELAY,
    DECODE_SCHEDULING,
    FIRST_DECODE_STEP,
    UNATTRIBUTED,
)

DESCRIPTIONS: Final = {
    PROXY: "the proxy's own work (before sending a leg, relaying the first token)",
    NETWORK: "a request or response in flight between the proxy and an engine",
    PREFILL: "prefill on P: arrival at its API server -> request finished",
    DECODE_ADMISSION: "D: arrival -> its KV work starts (scheduling, block allocation)",
    REGISTRATION: "push, D: blocks allocated -> registration sent (kv.register)",
    REGISTRATION_WAIT: "push: registration sent by D -> picked up by P's writer",
    RENDEZVOUS_WAIT: "push, P: second rendezvous input -> descriptor prep starts",
    HANDSHAKE: "NIXL handshake with a peer seen for the first time",
    DESC_PREP: "building NIXL descriptors and posting the transfer",
    WRITE: "push: NIXL WRITE posted -> data landed (NIXL's transfer time)",
    READ: "pull: NIXL READ posted -> completion, without the polling lag",
    POLL_LAG: "completion noticed only at the next engine step",
    NOTIFICATION: "push: data landed on D -> first completion notification seen",
    NOTIFY_COUNTING: "kv.notify: first -> last expected completion notification",
    RELAY: "pull: the proxy relays P's kv_transfer_params to D",
    DECODE_SCHEDULING: "D: KV complete -> request scheduled for its first step",
    FIRST_DECODE_STEP: "D: first step computed and the token sent to the proxy",
    UNATTRIBUTED: "a gap whose bounding spans are missing from the trace",
}
