"""Names of the phases a request's TTFT is cut into (the analysis' own vocabulary).

Span names belong to `tracedpush.semconv`; phases are what the critical path reports.
Each phase names one mechanism and is bounded by two events of the trace (a span's start
or end, or a span event such as ``http_received``); several come from gaps between spans
(a request in flight, a handoff between threads), so they have no span of their own.
`PHASES` is in pipeline order, which the console uses for stacking and colours.

Renamed in JSON version 2 (issue 8): ``prefill`` -> api server + queue wait + prefill
compute; ``decode admission`` -> api server + queue wait (+ step handoff in pull);
``rendezvous wait`` -> step handoff + writer queue (+ registration delivery); the pull
``network`` segment after prefill -> ``response``; the old ``registration wait``
(registration sent on D -> seen on P) -> ``registration delivery``.
"""

from __future__ import annotations

from typing import Final

from tracedpush import semconv as sc

# every leg (P's, D's)
NETWORK: Final = "network"  # the leg's bytes leave the proxy -> the engine's kernel has them
API_SERVER: Final = "api server"  # http_received -> vllm_arrival (else scheduler_received)
ENGINE_INPUT: Final = "engine input"  # vllm_arrival -> core_received (else scheduler_received)
ENGINE_BUSY: Final = "engine busy"  # core_received -> scheduler_received
QUEUE_WAIT: Final = "queue wait"  # scheduler_received -> compute_started / blocks_allocated
PREFILL_COMPUTE: Final = "prefill compute"  # P: compute_started -> prefill finished
# pull, after prefill
RESPONSE: Final = "response"  # P finished -> the proxy has P's answer (proxy.prefill end)
RELAY: Final = "relay"  # kv.relay start (P's answer) -> D's request bytes out
# push, D's side of the rendezvous
REGISTRATION: Final = "registration"  # kv.register: blocks allocated -> registration sent
REGISTRATION_DELIVERY: Final = "registration delivery"  # kv.register end -> P's writer has it
REGISTRATION_WAIT: Final = "registration wait"  # P: prefill finished -> registration arrived
# handing the KV over
STEP_HANDOFF: Final = "step handoff"  # inputs ready -> the worker takes it at its next step
WRITER_QUEUE: Final = "writer queue"  # push: handed_to_writer -> writer starts it
HANDSHAKE: Final = "handshake"  # NIXL agent handshake on first contact
DESC_PREP: Final = "descriptor prep"  # kv.desc_prep + posting the transfer
WRITE: Final = "WRITE"  # push: NIXL WRITE posted -> data landed (NIXL xferDuration)
READ: Final = "READ"  # pull: NIXL READ posted -> completion (minus polling lag)
POLL_LAG: Final = "completion polling lag"  # completion seen only at the next engine step
NOTIFICATION: Final = "notification"  # push: data landed -> first notification seen on D
NOTIFY_COUNTING: Final = "notification counting"  # kv.notify: first -> last notification
DECODE_SCHEDULING: Final = "decode scheduling"  # D: KV complete -> first token scheduled
FIRST_DECODE_STEP: Final = "first decode step"  # D: scheduled -> first token at the proxy
MODEL_LOOKUP: Final = "model lookup"  # proxy.models: the proxy's model catalog missed
PROXY: Final = "proxy"  # the proxy's own work: receipt -> leg's bytes out; token -> client
PROXY_CPU_WAIT: Final = "proxy CPU wait"  # of the proxy's time on the path: loop had no CPU
UNATTRIBUTED: Final = "unattributed"  # a gap whose bounding spans or events are missing

PHASES: Final = (
    NETWORK,
    API_SERVER,
    ENGINE_INPUT,
    ENGINE_BUSY,
    QUEUE_WAIT,
    PREFILL_COMPUTE,
    RESPONSE,
    RELAY,
    REGISTRATION,
    REGISTRATION_DELIVERY,
    REGISTRATION_WAIT,
    STEP_HANDOFF,
    WRITER_QUEUE,
    HANDSHAKE,
    DESC_PREP,
    WRITE,
    READ,
    POLL_LAG,
    NOTIFICATION,
    NOTIFY_COUNTING,
    DECODE_SCHEDULING,
    FIRST_DECODE_STEP,
    MODEL_LOOKUP,
    PROXY,
    PROXY_CPU_WAIT,
    UNATTRIBUTED,
)

# Phase names of JSON version 1 that no longer exist (see the module docstring).
REMOVED: Final = ("prefill", "decode admission", "rendezvous wait")

DESCRIPTIONS: Final = {
    NETWORK: "transport: a leg's bytes leave the proxy -> they are in the engine host's "
    "socket (proxy.prefill / proxy.decode request_sent -> http_received)",
    API_SERVER: "the engine's API server until vLLM takes the request in: waiting for its "
    "loop and core, HTTP parsing, validation (http_received -> vllm_arrival; without that "
    "event, to scheduler_received: engine input too)",
    ENGINE_INPUT: "vLLM's arrival_time -> the EngineCore process has it: the prompt "
    "rendered and tokenized, the request sent to the EngineCore and decoded by its input "
    "thread (vllm_arrival -> core_received; without that event, to scheduler_received: "
    "engine busy too)",
    ENGINE_BUSY: "the EngineCore has the request -> its scheduler takes it: the busy loop "
    "finishing the engine step it was in, which it adds new requests only between "
    "(core_received -> scheduler_received)",
    QUEUE_WAIT: "the scheduler's waiting queue (scheduler_received -> compute_started on P, "
    "-> blocks_allocated on D; vLLM's request_queue_time on P)",
    PREFILL_COMPUTE: "P: first scheduled -> prefill finished, chunked steps included "
    "(compute_started -> prefill end; vLLM's request_prefill_time)",
    RESPONSE: "pull: P finished -> the proxy has P's answer (prefill end -> proxy.prefill end)",
    RELAY: "pull: the proxy relays P's kv_transfer_params to D (kv.relay start -> "
    "proxy.decode request_sent)",
    REGISTRATION: "push, D: blocks allocated -> registration sent (kv.register)",
    REGISTRATION_DELIVERY: "push: registration sent by D -> drained by P's writer "
    "(kv.register end -> registration_arrived)",
    REGISTRATION_WAIT: "push, P: prefill finished -> D's registration arrived (engine-local; "
    "overlaps D's chain, so never on the critical path)",
    STEP_HANDOFF: "both inputs ready -> the worker takes the request up at its next engine "
    "step (push: max(prefill_finished, registration_arrived) -> handed_to_writer; pull, D: "
    "blocks_allocated -> kv.desc_prep start)",
    WRITER_QUEUE: "push, P: handed to the push writer -> the writer starts it "
    "(handed_to_writer -> kv.rendezvous end)",
    HANDSHAKE: "NIXL handshake with a peer seen for the first time (kv.handshake)",
    DESC_PREP: "building NIXL descriptors and posting the transfer "
    "(kv.desc_prep start -> kv.write / kv.read start)",
    WRITE: "push: NIXL WRITE posted -> data landed (NIXL's xferDuration; vLLM's nixl_xfer_time)",
    READ: "pull: NIXL READ posted -> completion, without the polling lag "
    "(NIXL's xferDuration; vLLM's nixl_xfer_time)",
    POLL_LAG: "the transfer's completion noticed only at the next engine step",
    NOTIFICATION: "push: data landed on D -> first completion notification seen",
    NOTIFY_COUNTING: "kv.notify: first -> last expected completion notification",
    DECODE_SCHEDULING: "D: KV complete -> request scheduled for its first step",
    FIRST_DECODE_STEP: "D: first step computed and the token sent to the proxy",
    MODEL_LOOKUP: "the proxy waited for its model catalog: the engines' /v1/models (its first "
    "requests if they came before its start-up lookup finished, a model it had not seen, "
    "engines that did not answer) or the model's vocabulary read (proxy.models)",
    PROXY: "the proxy's own work (receipt -> a leg's bytes out, relaying the first token)",
    PROXY_CPU_WAIT: "of receipt -> a leg's bytes out, of pull's relay and of the first "
    "token's way out, the time the proxy's event loop was runnable without a CPU (the "
    "kernel's run delay, on the request_sent and first_token events and kv.relay; "
    "interleaved with its work, drawn as one block before the send)",
    UNATTRIBUTED: "a gap whose bounding spans or events are missing from the trace",
}

# The phase each span stands for: the critical path's segment for a span that is hidden
# (off the path; `critical_path` splits a hidden prefill into its sub-phases), and the
# colour the console gives the span. The proxy's own spans enclose whole legs, so they
# are never hidden; they stand for the phase they mostly account for.
SPAN_PHASE: Final = {
    sc.SPAN_PREFILL: PREFILL_COMPUTE,
    sc.SPAN_DECODE: QUEUE_WAIT,
    sc.SPAN_KV_REGISTER: REGISTRATION,
    sc.SPAN_KV_RENDEZVOUS: WRITER_QUEUE,
    sc.SPAN_KV_HANDSHAKE: HANDSHAKE,
    sc.SPAN_KV_DESC_PREP: DESC_PREP,
    sc.SPAN_KV_WRITE: WRITE,
    sc.SPAN_KV_READ: READ,
    sc.SPAN_KV_NOTIFY: NOTIFY_COUNTING,
    sc.SPAN_KV_RELAY: RELAY,
    sc.SPAN_PROXY_MODELS: MODEL_LOOKUP,
    sc.SPAN_REQUEST: PROXY,
    sc.SPAN_PROXY_PREFILL: NETWORK,
    sc.SPAN_PROXY_DECODE: NETWORK,
}

# One colour per phase (hex; tab20-like, distinct neighbours in `PHASES` order), shared by
# every view of the phases: the console's charts, legends and stacked bars.
COLORS: Final = {
    NETWORK: "#c7c7c7",
    API_SERVER: "#dbdb8d",
    ENGINE_INPUT: "#e7cb94",
    ENGINE_BUSY: "#843c39",
    QUEUE_WAIT: "#98df8a",
    PREFILL_COMPUTE: "#2ca02c",
    RESPONSE: "#aec7e8",
    RELAY: "#9467bd",
    REGISTRATION: "#17becf",
    REGISTRATION_DELIVERY: "#9edae5",
    REGISTRATION_WAIT: "#f7b6d2",
    STEP_HANDOFF: "#bcbd22",
    WRITER_QUEUE: "#7f7f7f",
    HANDSHAKE: "#8c564b",
    DESC_PREP: "#e377c2",
    WRITE: "#1f77b4",
    READ: "#d62728",
    POLL_LAG: "#ff9896",
    NOTIFICATION: "#ff7f0e",
    NOTIFY_COUNTING: "#ffbb78",
    DECODE_SCHEDULING: "#c5b0d5",
    FIRST_DECODE_STEP: "#393b79",
    MODEL_LOOKUP: "#8c6d31",
    PROXY: "#9e9e9e",
    PROXY_CPU_WAIT: "#5a5a5a",
    UNATTRIBUTED: "#000000",
}
