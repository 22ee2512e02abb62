"""The span contract: every span name and attribute key tracedpush emits.

This is the one module that owns them (like OpenTelemetry's semantic-convention
packages). Producers (connector, proxy) and consumers (analysis, console) import the
constants from here; docs/spans.md documents each one. Renaming anything here is a
breaking change for users' Jaeger queries.

Where OpenTelemetry's semantic conventions define a key (service, host, process,
HTTP, server, error), it is taken from `opentelemetry.semconv`, so ours cannot drift
from the standard; ``tracedpush.*`` keys are only for what no convention covers.
"""

from __future__ import annotations

from typing import Final

from opentelemetry.semconv._incubating.attributes import (
    host_attributes,
    process_attributes,
)
from opentelemetry.semconv._incubating.attributes import (
    service_attributes as service_incubating,
)
from opentelemetry.semconv.attributes import (
    error_attributes,
    http_attributes,
    server_attributes,
    service_attributes,
)

# --------------------------------------------------------------------------- services
SERVICE_PROXY: Final = "tracedpush-proxy"
SERVICE_PREFILL: Final = "vllm-prefill"
SERVICE_DECODE: Final = "vllm-decode"

INSTRUMENTATION_SCOPE: Final = "tracedpush"

# ------------------------------------------------------------------------------ spans
# proxy
SPAN_REQUEST: Final = "tracedpush.request"  # root, SERVER: proxy receipt -> response done
SPAN_PROXY_PREFILL: Final = "proxy.prefill"  # CLIENT: request to P -> P's response done
SPAN_PROXY_DECODE: Final = "proxy.decode"  # CLIENT: request to D -> D's stream done
SPAN_KV_RELAY: Final = "kv.relay"  # pull: P's response in hand -> D's request sent
SPAN_PROXY_MODELS: Final = "proxy.models"  # the request waited for the model catalog

# engines (scheduler side)
SPAN_PREFILL: Final = "prefill"  # P: request arrival -> request finished
SPAN_DECODE: Final = "decode"  # D: request arrival -> first token scheduled

# KV transfer phases
SPAN_KV_REGISTER: Final = "kv.register"  # push, D: blocks allocated -> registration sent
SPAN_KV_RENDEZVOUS: Final = "kv.rendezvous"  # push, P: first of {reg, prefill done} -> second
SPAN_KV_HANDSHAKE: Final = "kv.handshake"  # either mode: NIXL agent handshake
SPAN_KV_DESC_PREP: Final = "kv.desc_prep"  # descriptor prep (P in push, D in pull)
SPAN_KV_WRITE: Final = "kv.write"  # push, P: WRITE posted -> completion observed
SPAN_KV_READ: Final = "kv.read"  # pull, D: READ posted -> completion observed
SPAN_KV_NOTIFY: Final = "kv.notify"  # first -> last expected completion notification

# per-process step traces (one trace per engine process, not per request)
SPAN_ENGINE_STEPS: Final = "engine.steps"  # a batch of engine steps (parallel arrays)
SPAN_ENGINE_THREADS: Final = "engine.threads"  # one OS sample of the process's threads
SPAN_ENGINE_EXPORT: Final = "engine.export"  # the process's export and drop counters

PROXY_SPANS: Final = (
    SPAN_REQUEST,
    SPAN_PROXY_PREFILL,
    SPAN_PROXY_DECODE,
    SPAN_KV_RELAY,
    SPAN_PROXY_MODELS,
)
ENGINE_SPANS: Final = (SPAN_PREFILL, SPAN_DECODE)
KV_SPANS: Final = (
    SPAN_KV_REGISTER,
    SPAN_KV_RENDEZVOUS,
    SPAN_KV_HANDSHAKE,
    SPAN_KV_DESC_PREP,
    SPAN_KV_WRITE,
    SPAN_KV_READ,
    SPAN_KV_NOTIFY,
)
PROCESS_SPANS: Final = (SPAN_ENGINE_STEPS, SPAN_ENGINE_THREADS, SPAN_ENGINE_EXPORT)
ALL_SPANS: Final = PROXY_SPANS + ENGINE_SPANS + KV_SPANS + PROCESS_SPANS

# Spans every complete request has, per mode (kv.handshake only when one happens).
REQUIRED_SPANS: Final = {
    "push": (
        SPAN_REQUEST,
        SPAN_PROXY_PREFILL,
        SPAN_PROXY_DECODE,
        SPAN_PREFILL,
        SPAN_DECODE,
        SPAN_KV_REGISTER,
        SPAN_KV_RENDEZVOUS,
        SPAN_KV_DESC_PREP,
        SPAN_KV_WRITE,
        SPAN_KV_NOTIFY,
    ),
    "pull": (
        SPAN_REQUEST,
        SPAN_PROXY_PREFILL,
        SPAN_PROXY_DECODE,
        SPAN_KV_RELAY,
        SPAN_PREFILL,
        SPAN_DECODE,
        SPAN_KV_DESC_PREP,
        SPAN_KV_READ,
        SPAN_KV_NOTIFY,
    ),
}

# ---------------------------------------------------------------- resource attributes
# (standard OpenTelemetry resource keys; service.instance.id, host.name and process.pid
# are still "development" conventions, hence the _incubating module)
RES_SERVICE_NAME: Final = service_attributes.SERVICE_NAME
RES_SERVICE_INSTANCE_ID: Final = service_incubating.SERVICE_INSTANCE_ID  # engine id / host:port
RES_HOST_NAME: Final = host_attributes.HOST_NAME
RES_PROCESS_PID: Final = process_attributes.PROCESS_PID
RES_TRACEDPUSH_VERSION: Final = "tracedpush.version"
RES_VLLM_VERSION: Final = "vllm.version"
# true on a process that writes `engine.export` records (every engine process, and the
# proxy when it exports): one seen in the store with no record was killed before its
# first (or lost them all), and the report's trace completeness names it
RES_EXPORT_RECORDS: Final = "tracedpush.export.records"

# -------------------------------------------------------------------- span attributes
MODE: Final = "tracedpush.mode"  # "push" | "pull"
ROLE: Final = "tracedpush.role"  # "proxy" | "prefill" | "decode"
ENGINE_ID: Final = "tracedpush.engine_id"  # vLLM kv_transfer_config engine_id
REQUEST_ID: Final = "tracedpush.request_id"  # the client's X-Request-Id (context.request_key)
LOCAL_REQUEST_ID: Final = "tracedpush.request_id.local"  # the engine's own request id
TP_RANK: Final = "tracedpush.tp_rank"
THREAD: Final = "tracedpush.thread"  # "scheduler" | "model_runner" | "push_writer" | ...

REMOTE_ENGINE_ID: Final = "tracedpush.remote.engine_id"
REMOTE_HOST: Final = "tracedpush.remote.host"
REMOTE_PORT: Final = "tracedpush.remote.port"

PROMPT_TOKENS: Final = "tracedpush.prompt_tokens"
KV_BLOCKS: Final = "tracedpush.kv.blocks"  # number of KV blocks moved / registered
KV_BYTES: Final = "tracedpush.kv.bytes"  # bytes moved (NIXL totalBytes)
KV_DESCRIPTORS: Final = "tracedpush.kv.descriptors"  # NIXL descCount
NIXL_POST_US: Final = "tracedpush.nixl.post_duration_us"  # NIXL postDuration
NIXL_XFER_US: Final = "tracedpush.nixl.xfer_duration_us"  # NIXL xferDuration
POLL_LAG_US: Final = "tracedpush.kv.poll_lag_us"  # observed done - (post + xferDuration)
RENDEZVOUS_FIRST: Final = "tracedpush.rendezvous.first"  # "registration" | "prefill"
NOTIFY_EXPECTED: Final = "tracedpush.notify.expected"
NOTIFY_RECEIVED: Final = "tracedpush.notify.received"
# int[]: the sender's TP rank of each notification, in arrival order (-1: a sender no
# handshake of this worker named); push D only, where D handshook with P's ranks.
NOTIFY_RANKS: Final = "tracedpush.notify.ranks"
DECODE_END: Final = "tracedpush.decode.end"  # what ends `decode`: "first_token_scheduled"
PREFILL_STEPS: Final = "tracedpush.prefill.steps"  # prefill: engine steps that computed it
SIDE: Final = "tracedpush.side"  # resource + step spans: "scheduler" | "worker"

# engine.steps: parallel arrays, one element per engine step of this process.
# Scheduler side (EngineCore): what each step scheduled.
STEP_SEQ: Final = "tracedpush.step.seq"  # int[]: step number (scheduler and worker agree)
STEP_START_NS: Final = "tracedpush.step.start_ns"  # int[]: Unix ns (sched: schedule done)
STEP_DURATION_US: Final = "tracedpush.step.duration_us"  # int[] (worker): bind -> clear
STEP_PREFILL_TOKENS: Final = "tracedpush.step.prefill_tokens"  # int[] (sched)
STEP_DECODE_REQS: Final = "tracedpush.step.decode_reqs"  # int[] (sched): 1-token requests
STEP_NUM_REQS: Final = "tracedpush.step.num_reqs"  # int[] (sched): requests scheduled
# Worker side (model-runner thread): connector time inside each step, per call, in us.
STEP_CONNECTOR_US: Final = "tracedpush.step.connector_us"  # int[]: all connector calls
STEP_BIND_US: Final = "tracedpush.step.bind_us"  # int[]: bind_connector_metadata
STEP_LOAD_US: Final = "tracedpush.step.start_load_us"  # int[]: start_load_kv
STEP_SAVE_US: Final = "tracedpush.step.wait_save_us"  # int[]: wait_for_save
STEP_RESULTS_US: Final = "tracedpush.step.results_us"  # int[]: get_finished/transfer results
STEP_LOADS_STARTED: Final = "tracedpush.step.loads_started"  # int[]: KV transfers handed off
STEP_LOADS_FINISHED: Final = "tracedpush.step.loads_finished"  # int[]: KV transfers done

# engine.threads: parallel arrays, one element per OS thread of the sampled processes.
THREAD_PID: Final = "tracedpush.thread.pid"  # int[]
THREAD_TID: Final = "tracedpush.thread.tid"  # int[]
THREAD_PROCESS: Final = "tracedpush.thread.process"  # str[]: api_server|engine_core|worker
THREAD_NAME: Final = "tracedpush.thread.name"  # str[]: Python thread name, else OS comm
THREAD_ROLE: Final = "tracedpush.thread.role"  # str[]: see THREAD_ROLES
THREAD_CPU_MS: Final = "tracedpush.thread.cpu_ms"  # float[]: utime+stime since thread start
# float[]: runnable without a CPU since thread start (schedstat run delay); -1: not known
THREAD_CPU_WAIT_MS: Final = "tracedpush.thread.cpu_wait_ms"
THREAD_CORE: Final = "tracedpush.thread.core"  # int[]: core it last ran on (at the sample)
THREAD_AFFINITY: Final = "tracedpush.thread.affinity"  # str[]: Cpus_allowed_list
# cumulative events this process's hooks recorded (their cost is events x per-event cost)
EVENTS_RECORDED: Final = "tracedpush.events.recorded"
THREAD_ROLES: Final = (
    "model_runner",  # the worker's main thread (forward passes, connector hooks)
    "engine_core",  # EngineCore's busy loop (scheduling)
    "push_writer",  # vLLM's nixl-push-writer thread
    "nixl",  # NIXL agent's native threads (its UCX progress thread), found at start
    "compute",  # a worker's other native threads (OpenMP / torch pools)
    "tracedpush",  # our builder and exporter threads
    "api_server",  # the API server's event loop
    "other",
)

# engine.export: parallel arrays, one element per exporter of the process. Counts are
# cumulative since the process started (a record dropped by a full store is made up
# for by the next one that lands).
EXPORT_EXPORTER: Final = "tracedpush.export.exporter"  # str[]: "jsonl" | "otlp" | "console"
EXPORT_EXPORTED: Final = "tracedpush.export.exported"  # int[]: spans delivered
EXPORT_QUEUED: Final = "tracedpush.export.queued"  # int[]: spans waiting in its queue
EXPORT_FAILING: Final = "tracedpush.export.failing"  # bool[]: its last attempt failed
# bool: the record the process wrote as it shut down; a process with none was killed
EXPORT_FINAL: Final = "tracedpush.export.final"
EXPORT_DROPPED_QUEUE_FULL: Final = "tracedpush.export.dropped.queue_full"  # int[]
EXPORT_DROPPED_EXPORT_FAILED: Final = "tracedpush.export.dropped.export_failed"  # int[]
EXPORT_DROPPED_STORE_FULL: Final = "tracedpush.export.dropped.store_full"  # int[]
# (one int) events the builder discarded because it fell too far behind
EVENTS_DROPPED: Final = "tracedpush.events.dropped"
# Why spans were dropped: the reasons counted per exporter (also the `reason` of
# SpanSink.stats() and of /metrics), each with its engine.export key.
DROP_QUEUE_FULL: Final = "queue_full"  # the exporter's bounded queue was full
DROP_EXPORT_FAILED: Final = "export_failed"  # the exporter failed or timed out on the batch
DROP_STORE_FULL: Final = "store_full"  # the traces directory had no room (ENOSPC/EDQUOT/EFBIG)
DROP_REASONS: Final = (DROP_QUEUE_FULL, DROP_EXPORT_FAILED, DROP_STORE_FULL)
EXPORT_DROPPED: Final = {
    DROP_QUEUE_FULL: EXPORT_DROPPED_QUEUE_FULL,
    DROP_EXPORT_FAILED: EXPORT_DROPPED_EXPORT_FAILED,
    DROP_STORE_FULL: EXPORT_DROPPED_STORE_FULL,
}

# proxy-side
UPSTREAM_URL: Final = "tracedpush.upstream"  # base URL of the engine a leg went to
TTFT_MS: Final = "tracedpush.ttft_ms"  # proxy-measured: receipt -> first token out
OUTPUT_TOKENS: Final = "tracedpush.output_tokens"
STREAM: Final = "tracedpush.stream"
# proxy.models: the lookup asked the engines' /v1/models (its own refresh or one in flight
# it joined; False: it only read the model's vocabulary), and whether they answered (False:
# neither did within the health timeout, so the model went unchecked)
MODELS_FETCHED: Final = "tracedpush.models.fetched"
MODELS_ANSWERED: Final = "tracedpush.models.answered"
RESENT_REASON: Final = "tracedpush.resent.reason"  # on the request_resent event
# on the request_sent event: from the request's receipt to that send, the proxy's event-loop
# thread was on a CPU this long (its work on every request it had), and runnable without a
# CPU this long (the kernel's schedstat run_delay; Linux only). The rest of the interval
# the loop was idle, waiting for I/O.
LOOP_ON_CPU_MS: Final = "tracedpush.loop.on_cpu_ms"
LOOP_CPU_WAIT_MS: Final = "tracedpush.loop.cpu_wait_ms"
# tracedpush.request: the proxy's sampler, named as OTEL_TRACES_SAMPLER names it
# ("parentbased_traceidratio"), and the probability it kept this request with (absent when
# a client's traceparent decided under a parent-based sampler: that rate is the client's)
SAMPLER: Final = "tracedpush.sampler"
SAMPLER_RATIO: Final = "tracedpush.sampler.ratio"  # float in (0, 1]
# standard OpenTelemetry HTTP / server / error keys used on proxy and failed spans
HTTP_METHOD: Final = http_attributes.HTTP_REQUEST_METHOD
HTTP_ROUTE: Final = http_attributes.HTTP_ROUTE
HTTP_STATUS: Final = http_attributes.HTTP_RESPONSE_STATUS_CODE
SERVER_ADDRESS: Final = server_attributes.SERVER_ADDRESS
SERVER_PORT: Final = server_attributes.SERVER_PORT
ERROR_TYPE: Final = error_attributes.ERROR_TYPE

# span events
EVENT_FIRST_TOKEN: Final = "first_token"  # on tracedpush.request and proxy.decode
EVENT_REQUEST_SENT: Final = "request_sent"  # proxy.prefill, proxy.decode: bytes written
# proxy.prefill, proxy.decode: the engine closed the kept-alive connection unanswered and
# the bytes were written again on a new one; attribute RESENT_REASON (what the first failed with)
EVENT_REQUEST_RESENT: Final = "request_resent"
EVENT_HTTP_RECEIVED: Final = "http_received"  # prefill, decode: engine's HTTP server has it
# prefill, decode: vLLM's arrival_time (its API server starts rendering the prompt)
EVENT_VLLM_ARRIVAL: Final = "vllm_arrival"
# prefill, decode: the EngineCore process's input thread decoded it (connector/core_input.py)
EVENT_CORE_RECEIVED: Final = "core_received"
EVENT_SCHEDULER_RECEIVED: Final = "scheduler_received"  # prefill, decode: its scheduler has it
EVENT_COMPUTE_STARTED: Final = "compute_started"  # prefill: first scheduled for compute
EVENT_BLOCKS_ALLOCATED: Final = "blocks_allocated"  # decode: D's KV blocks allocated
EVENT_KV_RECEIVED: Final = "kv_received"  # decode: scheduler learned the KV arrived
EVENT_REGISTRATION_ARRIVED: Final = "registration_arrived"  # kv.rendezvous (P's writer saw it)
EVENT_PREFILL_FINISHED: Final = "prefill_finished"  # kv.rendezvous
EVENT_HANDED_TO_WRITER: Final = "handed_to_writer"  # kv.rendezvous: P's worker queued blocks
EVENT_NOTIFICATION: Final = "notification"  # kv.notify: one per completion notification
EVENT_HANDSHAKE: Final = "handshake"  # kv.register: D's notif-only handshake to P
# tracedpush.request: P refused the connection, the request went to another P
EVENT_PREFILL_REROUTED: Final = "prefill_rerouted"  # attributes: UPSTREAM_URL (the new P)

# Error reasons (error.type values) for failed phases.
ERR_HANDSHAKE: Final = "handshake_failed"
ERR_TRANSFER: Final = "transfer_failed"
ERR_LEASE_EXPIRED: Final = "lease_expired"
ERR_REGISTRATION_TIMEOUT: Final = "registration_timeout"
ERR_NOTIFY_TIMEOUT: Final = "notifications_missing"
ERR_UPSTREAM: Final = "upstream_error"
ERR_UPSTREAM_TIMEOUT: Final = "upstream_timeout"
ERR_CLIENT_DISCONNECT: Final = "client_disconnected"

# ------------------------------------------------------------------- trace context
# The proxy passes W3C trace context to each engine inside kv_transfer_params under
# this key: {"traceparent": "00-<trace>-<span>-01"}. Engines without it derive the
# trace id from the base request id, so P and D still share one trace.
KV_PARAMS_TRACE_KEY: Final = "tracedpush_trace"
# The engine API server middleware (`tracedpush.connector.http`) adds the moment the
# HTTP server had the request, in Unix ns, inside that dict.
TRACE_RECEIVED_NS_KEY: Final = "received_ns"

# ---------------------------------------------------------------------------- metrics
# Prometheus metric names (docs/metrics.md). Counters are registered without the
# `_total` suffix, which prometheus_client adds on exposition: query them with it.
# Engines' /metrics (registered through vLLM's connector Prometheus mechanism, beside
# vLLM's own labels `model_name` and `engine`):
METRIC_KV_PHASE: Final = "tracedpush_kv_phase_seconds"  # histogram {mode, role, phase}
METRIC_KV_FAILURES: Final = "tracedpush_kv_failures"  # counter {mode, role, reason}
METRIC_KV_BYTES: Final = "tracedpush_kv_bytes"  # counter {mode, role}: bytes moved by NIXL
# counters {mode, role, process, thread}: the engine's threads' CPU, and their wait for a
# CPU (engine.threads' cpu_ms / cpu_wait_ms differences, summed by process and role)
METRIC_THREAD_CPU: Final = "tracedpush_thread_cpu_seconds"
METRIC_THREAD_CPU_WAIT: Final = "tracedpush_thread_cpu_wait_seconds"
# engines' (and collect's) /metrics: spans the process dropped, by DROP_REASONS; the
# proxy's is tracedpush_proxy_spans_dropped_total, beside its other tracedpush_proxy_*
METRIC_SPANS_DROPPED: Final = "tracedpush_spans_dropped"  # counter {reason}
# `tracedpush collect`'s /metrics (from each complete trace's critical path):
METRIC_TTFT_PHASE: Final = "tracedpush_ttft_phase_seconds"  # histogram {mode, phase}
METRIC_TTFT: Final = "tracedpush_ttft_seconds"  # histogram {mode}: critical-path TTFT
METRIC_COLLECT_TRACES: Final = "tracedpush_collect_traces"  # counter {outcome}
METRIC_COLLECT_SPANS: Final = "tracedpush_collect_spans"  # counter: spans received
# Buckets of METRIC_KV_PHASE and METRIC_TTFT_PHASE (the same, so the engines' and the
# critical path's phase histograms line up): phases range from ~100 us (descriptor prep)
# to seconds (prefill compute on a loaded P, a first-contact handshake).
PHASE_BUCKETS: Final = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
    *(0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
# label keys
LABEL_MODE: Final = "mode"  # "push" | "pull"
LABEL_ROLE: Final = "role"  # "prefill" | "decode"
LABEL_PHASE: Final = "phase"
LABEL_REASON: Final = "reason"  # one of KV_FAILURE_REASONS
LABEL_OUTCOME: Final = "outcome"  # collect: "complete" | "expired"
LABEL_PROCESS: Final = "process"  # "api_server" | "engine_core" | "worker"
LABEL_THREAD: Final = "thread"  # one of THREAD_ROLES
# Engine-local KV phases (values of `phase` on METRIC_KV_PHASE). They carry the same
# names as the report's TTFT phases (tracedpush.analysis.phases) for the same mechanism.
KV_PHASE_REGISTRATION: Final = "registration"  # push, D: kv.register
KV_PHASE_REGISTRATION_WAIT: Final = "registration wait"  # push, P: prefill done -> reg. in
KV_PHASE_RENDEZVOUS: Final = "rendezvous"  # push, P: kv.rendezvous, first input -> second
KV_PHASE_STEP_HANDOFF: Final = "step handoff"  # push, P: inputs ready -> worker takes it
KV_PHASE_WRITER_QUEUE: Final = "writer queue"  # push, P: handed_to_writer -> WRITE starts
KV_PHASE_DESC_PREP: Final = "descriptor prep"  # kv.desc_prep (P in push, D in pull)
KV_PHASE_WRITE: Final = "WRITE"  # push, P: kv.write
KV_PHASE_READ: Final = "READ"  # pull, D: kv.read
KV_PHASE_NOTIFY: Final = "notification counting"  # kv.notify
KV_PHASE_HANDSHAKE: Final = "handshake"  # kv.handshake
KV_PHASES: Final = (
    KV_PHASE_REGISTRATION,
    KV_PHASE_REGISTRATION_WAIT,
    KV_PHASE_RENDEZVOUS,
    KV_PHASE_STEP_HANDOFF,
    KV_PHASE_WRITER_QUEUE,
    KV_PHASE_DESC_PREP,
    KV_PHASE_WRITE,
    KV_PHASE_READ,
    KV_PHASE_NOTIFY,
    KV_PHASE_HANDSHAKE,
)
# values of `reason` on METRIC_KV_FAILURES: the error.type of the failed KV span
KV_FAILURE_REASONS: Final = (
    ERR_HANDSHAKE,
    ERR_TRANSFER,
    ERR_LEASE_EXPIRED,
    ERR_REGISTRATION_TIMEOUT,
    ERR_NOTIFY_TIMEOUT,
)
# The phase each KV span is observed as on METRIC_KV_PHASE (its duration, when it ended
# without error). The other phases come from span events: "registration wait",
# "step handoff" and "writer queue" from kv.rendezvous's events (push, P), "step handoff"
# on pull D from blocks_allocated to kv.desc_prep's start, "handshake" on push D from
# kv.register's handshake events.
KV_SPAN_PHASE: Final = {
    SPAN_KV_REGISTER: KV_PHASE_REGISTRATION,
    SPAN_KV_RENDEZVOUS: KV_PHASE_RENDEZVOUS,
    SPAN_KV_HANDSHAKE: KV_PHASE_HANDSHAKE,
    SPAN_KV_DESC_PREP: KV_PHASE_DESC_PREP,
    SPAN_KV_WRITE: KV_PHASE_WRITE,
    SPAN_KV_READ: KV_PHASE_READ,
    SPAN_KV_NOTIFY: KV_PHASE_NOTIFY,
}
# The phases each (mode, role) engine observes: its histogram series exist from the start.
KV_PHASES_BY_ROLE: Final = {
    ("push", "prefill"): (
        KV_PHASE_REGISTRATION_WAIT,
        KV_PHASE_RENDEZVOUS,
        KV_PHASE_STEP_HANDOFF,
        KV_PHASE_WRITER_QUEUE,
        KV_PHASE_HANDSHAKE,
        KV_PHASE_DESC_PREP,
        KV_PHASE_WRITE,
    ),
    ("push", "decode"): (KV_PHASE_REGISTRATION, KV_PHASE_HANDSHAKE, KV_PHASE_NOTIFY),
    ("pull", "prefill"): (KV_PHASE_NOTIFY,),
    ("pull", "decode"): (
        KV_PHASE_STEP_HANDOFF,
        KV_PHASE_HANDSHAKE,
        KV_PHASE_DESC_PREP,
        KV_PHASE_READ,
    ),
}
# engines' /metrics: metric observations lost between our span builder and vLLM's stats
# (the bounded hand-off was full: nothing drained it for a long time)
METRIC_OBSERVATIONS_DROPPED: Final = "tracedpush_metric_observations_dropped"  # counter
# `tracedpush collect` (docs/collect.md): export requests refused as malformed, traces
# waiting for their spans, and the values of `outcome` on METRIC_COLLECT_TRACES. Its
# store and forward drops are METRIC_SPANS_DROPPED {reason}.
METRIC_COLLECT_REJECTED: Final = "tracedpush_collect_rejected"  # counter
METRIC_COLLECT_PENDING: Final = "tracedpush_collect_pending_traces"  # gauge
OUTCOME_COMPLETE: Final = "complete"  # assembled and analysed (critical path observed)
OUTCOME_EXPIRED: Final = "expired"  # incomplete at the trace timeout, or evicted
