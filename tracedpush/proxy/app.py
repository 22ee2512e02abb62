"""The proxy's aiohttp application: OpenAI routes in, a prefill and a decode leg out.

pull: P (1 token, ``do_remote_decode``) -> validate P's ``kv_transfer_params`` -> D.
push: P and D at once with the same X-Request-Id; D carries P's NIXL coordinates
(coords.py) so it can register its blocks with P while P is still computing. If one leg
fails before D has produced a token, the other is cancelled (closing its connection is
what makes vLLM abort it) and the client gets a 502/504 naming the failed leg.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.trace import Span, TracerProvider

from tracedpush import semconv
from tracedpush.proxy import spans as proxy_spans
from tracedpush.proxy.coords import InstanceSpec, coords_from_params, probe
from tracedpush.proxy.errors import (
    BadRequest,
    ModelNotFound,
    NoInstance,
    PayloadTooLarge,
    ProxyError,
    RouteError,
    UpstreamFailure,
    sse_error_event,
)
from tracedpush.proxy.fields import json_shape_problem, short
from tracedpush.proxy.loop_cpu import LoopCpu, spent_ms
from tracedpush.proxy.metrics import ProxyMetrics, sink_drop_stats
from tracedpush.proxy.models import (
    MODEL_CACHE_TTL_S,
    ModelCard,
    ModelCatalog,
    cards_from_answer,
)
from tracedpush.proxy.params import (
    GENERATE_ROUTES,
    KV_PARAMS,
    check_token_ids,
    decode_body,
    decode_params_problems,
    describe_problems,
    is_sane_request_id,
    new_request_id,
    prefill_body,
    validate_client_body,
)
from tracedpush.proxy.routing import HealthMonitor, Instance, Pool, check_health
from tracedpush.proxy.sse import inspect_event
from tracedpush.proxy.upstream import SendClock, Timeouts, UpstreamClient, send_clock_trace

log = logging.getLogger(__name__)

MODES = ("push", "pull")
KV_DISCOVERY = ("learn", "probe")
CLIENT_GONE = (semconv.ERR_CLIENT_DISCONNECT, "client disconnected")
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class ProxyConfig:
    mode: str
    prefill: list[InstanceSpec]
    decode: list[InstanceSpec]
    timeouts: Timeouts = field(default_factory=Timeouts)
    trace_context: bool = True  # put a traceparent into each leg's kv_transfer_params
    kv_discovery: str = "learn"  # push: "learn" from P's answers, or also "probe" at start
    health_interval: float = 5.0  # seconds between health checks; 0 disables them
    health_timeout: float = 2.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger bodies get a 413, unread
    vocab_size: int | None = None  # None: learn it from the model directory, else skip
    model_check: bool = True  # 404 for models the engines do not list in /v1/models
    model_cache_ttl: float = MODEL_CACHE_TTL_S  # at most one /v1/models refresh per ttl
    # the engines' --api-key (VLLM_API_KEY): the proxy's own calls (the start-up
    # /v1/models, the coordinate probe) send it; requests carry their clients'
    # Authorization as they came
    engine_api_key: str | None = None

    @property
    def engine_auth(self) -> dict[str, str]:
        """The header of the proxy's own calls to the engines ({} without a key)."""
        key = self.engine_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.kv_discovery not in KV_DISCOVERY:
            raise ValueError(f"kv_discovery must be one of {KV_DISCOVERY}")
        if not self.prefill or not self.decode:
            raise ValueError("at least one prefill and one decode instance are required")
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError("vocab_size must be >= 1 (or None: unknown)")


def _client_auth(request: web.Request) -> dict[str, str]:
    """The client's ``Authorization``, for a call made on its behalf ({} without one):
    engines started with --api-key refuse every /v1 route without it."""
    auth = request.headers.get("Authorization")
    return {"Authorization": auth} if auth else {}


class ProxyState:
    """Everything the handlers share; one per application."""

    def __init__(self, config: ProxyConfig, provider: TracerProvider | None) -> None:
        self.config = config
        self.mode = config.mode
        self.prefill = Pool("prefill", [Instance.from_spec(s) for s in config.prefill])
        self.decode = Pool("decode", [Instance.from_spec(s) for s in config.decode])
        self.spans = proxy_spans.ProxySpans(provider, config.mode)
        self.metrics = ProxyMetrics(config.mode, sink_drop_stats(provider))
        self.active_ids: set[str] = set()
        # push: prefill legs left to finish after their request ended (see push_flow)
        self.finishing: set[asyncio.Task[Any]] = set()
        self.models = ModelCatalog(vocab_size=config.vocab_size, ttl=config.model_cache_ttl)
        self.models_warm: asyncio.Task[None] | None = None  # learning the catalog at start
        self.upstream: UpstreamClient  # set at startup
        self.loop_cpu = LoopCpu()  # the event loop's CPU clock, for request_sent (loop_cpu.py)
        self.monitor: HealthMonitor | None = None

    @property
    def instances(self) -> list[Instance]:
        return self.prefill.instances + self.decode.instances

    def claim_request_id(self, offered: str | None) -> str:
        """The client's X-Request-Id if sane and not in flight, else a fresh one.

        Push pairs P and D by this id, so two requests in flight must never share it.
        """
        if offered is not None and not is_sane_request_id(offered):
            log.info("ignoring X-Request-Id %r: not [A-Za-z0-9._-]{1,128}", offered[:200])
            offered = None
        elif offered is not None and offered in self.active_ids:
            log.warning("X-Request-Id %r is already in flight; using a fresh id", offered)
            offered = None
        request_id = offered or new_request_id()
        self.active_ids.add(request_id)
        return request_id


STATE = web.AppKey("tracedpush_proxy", ProxyState)

# Idle connections to engines are dropped before the engine drops them: vLLM's API server
# (uvicorn) closes a keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s). With
# aiohttp's default (15 s) the proxy could send a leg on a connection the engine was
# closing at that moment, and the leg failed with "Server disconnected" (seen under load).
UPSTREAM_KEEPALIVE_S = 2.0


class ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


class Exchange:
    """One client request: its spans, its legs, and the response written so far."""

    def __init__(self, state: ProxyState, request: web.Request, route: str) -> None:
        self.state, self.request, self.route = state, request, route
        self.receipt_ns = time.time_ns()
        self.root = state.spans.start_request(
            request.headers, method=request.method, route=route, start_ns=self.receipt_ns
        )
        # the loop's CPU clock, for the legs' request_sent events: none when unsampled
        self.receipt_cpu = state.loop_cpu.sample() if self.root.is_recording() else None
        self.deadline = state.upstream.deadline()
        self.body: dict[str, Any] = {}
        self.stream = False
        self.request_id = ""
        self.response: web.StreamResponse | None = None
        self.status: int | None = None
        self.first_token_ns: int | None = None  # first token written to the client
        self.last_token_ns: int | None = None  # last token written (streamed; for TPOT)
        self.decode_token_ns: int | None = None  # first token received from D
        self.last_byte_ns: int | None = None
        self.prefill_done_ns: int | None = None
        self.prefill_done_loop: dict[str, float] = {}  # the loop's figures then (pull's relay)
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.token_events = 0
        self.client_gone = False
        self.done_sent = False  # the [DONE] sentinel reached the client
        self.decode_started = False  # D's leg began: the request may have reached D
        self.tasks: list[asyncio.Task[Any]] = []
        self.finish_alone: set[asyncio.Task[Any]] = set()  # never cancelled: see push_flow
        self._cancel_causes: dict[asyncio.Task[Any], tuple[str, str]] = {}

    # -------------------------------------------------------------- leg plumbing
    def send_clock(self) -> SendClock:
        """A leg's send clock; it reads the loop's CPU clock when the request has one."""
        return SendClock(None if self.receipt_cpu is None else self.state.loop_cpu)

    def loop_since_receipt(self) -> dict[str, float]:
        """The loop's figures since receipt, now, as span or event attributes (none when
        the request is not recorded: it has no receipt sample)."""
        if self.receipt_cpu is None:
            return {}
        now = self.state.loop_cpu.sample()
        return proxy_spans.loop_attributes(spent_ms(self.receipt_cpu, now))

    def decode_token(self, span: Span) -> None:
        """D's first token reached the proxy: ``span``'s first_token event, once, with the
        loop's figures (the root's first_token, as the token leaves, has them too)."""
        if self.decode_token_ns is None:
            self.decode_token_ns = time.time_ns()
            attrs = self.loop_since_receipt()
            span.add_event(semconv.EVENT_FIRST_TOKEN, attrs, timestamp=self.decode_token_ns)

    def leg_headers(self, span: Span) -> dict[str, str]:
        trace = proxy_spans.trace_headers(span)
        return {"X-Request-Id": self.request_id, **trace, **_client_auth(self.request)}

    def add_trace_context(self, kv: dict[str, Any], span: Span) -> dict[str, Any]:
        if self.state.config.trace_context and (ctx := proxy_spans.kv_trace_context(span)):
            kv[semconv.KV_PARAMS_TRACE_KEY] = ctx
        return kv

    def cancel(self, task: asyncio.Task[Any], error_type: str, description: str) -> None:
        if not task.done():
            self._cancel_causes.setdefault(task, (error_type, description))
            task.cancel()

    def cancel_cause(self) -> tuple[str, str]:
        task = asyncio.current_task()
        return self._cancel_causes.get(task, CLIENT_GONE) if task else CLIENT_GONE

    def note_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            self.output_tokens = usage["completion_tokens"]

    # ------------------------------------------------------------ client writes
    def mark_first_token(
        self, at_ns: int | None = None, loop: dict[str, float] | None = None
    ) -> None:
        """The first token left for the client (at ``at_ns``, the loop's figures ``loop``;
        both taken now when not given)."""
        if self.first_token_ns is None:
            self.first_token_ns = at_ns or time.time_ns()
            attrs = self.loop_since_receipt() if loop is None else loop
            self.root.add_event(semconv.EVENT_FIRST_TOKEN, attrs, timestamp=self.first_token_ns)
            self.state.metrics.observe_ttft((self.first_token_ns - self.receipt_ns) / 1e9)

    async def send_json(self, raw: bytes, status: int = 200) -> None:
        response = web.Response(
            body=raw,
            status=status,
            content_type="application/json",
            headers={"X-Request-Id": self.request_id} if self.request_id else None,
        )
        self.response, self.status = response, status
        try:
            await response.prepare(self.request)
            await response.write_eof()
        except ConnectionResetError as exc:
            raise ClientGone(str(exc)) from None
        self.last_byte_ns = time.time_ns()

    async def write_event(self, event: bytes, *, has_token: bool, done: bool = False) -> None:
        if self.done_sent:
            return  # nothing follows [DONE] for an OpenAI client
        try:
            if self.response is None:
                response = web.StreamResponse(
                    status=200,
                    headers={
                        "Content-Type": "text/event-stream",
                        "Cache-Control": "no-cache",
                        "X-Request-Id": self.request_id,
                    },
                )
                self.response, self.status = response, 200
                await response.prepare(self.request)
            sent_ns = time.time_ns()  # the token leaves now; write() may wait on the socket
            first = has_token and self.first_token_ns is None
            loop = self.loop_since_receipt() if first else None  # the loop's figures, then
            await self.response.write(event)
        except ConnectionResetError as exc:
            raise ClientGone(str(exc)) from None
        if has_token:
            self.mark_first_token(sent_ns, loop)
            self.last_token_ns = sent_ns
        if done:
            # The client has its whole answer; it may hang up before our EOF.
            self.done_sent = True
            self.last_byte_ns = time.time_ns()

    async def end_stream(self) -> None:
        assert self.response is not None
        try:
            await self.response.write_eof()
        except ConnectionResetError as exc:
            if not self.done_sent:
                raise ClientGone(str(exc)) from None
            return  # it hung up after [DONE]: served; the last byte was [DONE]
        self.last_byte_ns = time.time_ns()

    async def answer_error(self, err: ProxyError) -> None:
        """A JSON error if nothing was sent yet; else an SSE error event, then the end."""
        try:
            if self.response is None:
                await self.send_json(json.dumps(err.body()).encode(), status=err.status)
            elif self.last_byte_ns is None:
                await self.response.write(sse_error_event(err))
                await self.end_stream()
        except (ClientGone, ConnectionResetError):
            pass


# ------------------------------------------------------------------------- the legs
async def prefill_leg(ex: Exchange, inst: Instance) -> dict[str, Any]:
    """P's call; returns P's answer. Learns P's coordinates from it."""
    state = ex.state
    span = state.spans.start_leg(ex.root, semconv.SPAN_PROXY_PREFILL, inst)
    body = prefill_body(ex.body)
    ex.add_trace_context(body[KV_PARAMS], span)
    sent = ex.send_clock()
    try:
        resp = await state.upstream.post(
            "prefill", inst, ex.route, body, ex.leg_headers(span), deadline=ex.deadline, sent=sent
        )
        proxy_spans.sent(span, sent, ex.receipt_cpu)
        span.set_attribute(semconv.HTTP_STATUS, resp.status)
        data, _ = await state.upstream.read_json("prefill", inst, resp, deadline=ex.deadline)
        ex.prefill_done_ns = time.time_ns()
        ex.prefill_done_loop = ex.loop_since_receipt()
        if ex.prompt_tokens is None and isinstance(data.get("usage"), dict):
            ex.note_usage({"prompt_tokens": data["usage"].get("prompt_tokens")})
        _learn_from_prefill(ex, inst, span, data.get(KV_PARAMS))
        return data
    except UpstreamFailure as err:
        proxy_spans.fail(span, err.error_type, err.message)
        raise
    except asyncio.CancelledError:
        if ex.done_sent:
            # Push: the client has its answer, so P's KV reached D; P's own HTTP answer
            # (slow under load) is no longer needed.
            span.add_event("abandoned_after_response")
        else:
            proxy_spans.fail(span, *ex.cancel_cause())
        raise
    finally:
        # a leg that failed after sending still says so
        proxy_spans.sent(span, sent, ex.receipt_cpu)
        proxy_spans.end(span, ex.prefill_done_ns)


def _learn_from_prefill(ex: Exchange, inst: Instance, span: Span, kv: Any) -> None:
    mode = ex.state.mode
    if isinstance(kv, dict) and kv.get("transfer_mode") not in (None, mode):
        raise UpstreamFailure(
            "prefill",
            f"{inst.url} runs vLLM's NIXL {kv['transfer_mode']} connector but the proxy "
            f"runs in {mode} mode (kv_transfer_params.transfer_mode)",
        )
    try:
        coords = coords_from_params(kv)
    except ValueError as exc:
        log.debug("prefill %s answer has no usable coordinates: %s", inst.url, exc)
        return
    assert inst.coords is not None
    inst.coords.learn(coords, "response")
    span.set_attribute(semconv.ENGINE_ID, coords.engine_id)


async def decode_leg(ex: Exchange, inst: Instance, span: Span, kv: dict[str, Any]) -> None:
    """D's call, relayed to the client (SSE event by event, or the whole JSON)."""
    state = ex.state
    ex.decode_started = True
    body, injected_usage = decode_body(ex.body, kv)
    loop = asyncio.get_running_loop()
    first_byte_at = loop.time() + state.upstream.timeouts.first_byte
    sent = ex.send_clock()
    try:
        resp = await state.upstream.post(
            "decode",
            inst,
            ex.route,
            body,
            ex.leg_headers(span),
            deadline=ex.deadline,
            first_byte_at=first_byte_at,
            sent=sent,
        )
        proxy_spans.sent(span, sent, ex.receipt_cpu)
        span.set_attribute(semconv.HTTP_STATUS, resp.status)
        if ex.stream and resp.status == 200:
            await _relay_stream(ex, inst, span, resp, injected_usage, first_byte_at)
        else:
            data, raw = await state.upstream.read_json("decode", inst, resp, deadline=ex.deadline)
            ex.decode_token(span)
            ex.note_usage(data.get("usage"))
            proxy_spans.end(span)  # D's answer fully received
            await ex.send_json(raw)
            ex.mark_first_token(ex.last_byte_ns)  # non-streamed: the response is the token
    except UpstreamFailure as err:
        proxy_spans.fail(span, err.error_type, err.message)
        raise
    except ClientGone:
        proxy_spans.fail(span, *CLIENT_GONE)
        raise
    except asyncio.CancelledError:
        if not ex.done_sent:  # after [DONE] the rest of D's stream is of no use
            proxy_spans.fail(span, *ex.cancel_cause())
        raise
    finally:
        proxy_spans.sent(span, sent, ex.receipt_cpu)
        proxy_spans.end(span)


async def _relay_stream(
    ex: Exchange,
    inst: Instance,
    span: Span,
    resp: aiohttp.ClientResponse,
    injected_usage: bool,
    first_byte_at: float,
) -> None:
    try:
        events = ex.state.upstream.events(
            "decode", inst, resp, deadline=ex.deadline, first_byte_at=first_byte_at
        )
        async for event in events:
            info = inspect_event(event)
            ex.note_usage(info.usage)
            if info.error:
                proxy_spans.fail(span, semconv.ERR_UPSTREAM, f"decode stream error: {info.error}")
            if injected_usage and info.usage_only:
                continue  # the client did not ask for the usage chunk
            if info.has_token:
                ex.token_events += 1
                ex.decode_token(span)
            await ex.write_event(event, has_token=info.has_token, done=info.done)
    except BaseException:
        resp.close()
        raise
    resp.release()
    if ex.response is None:
        raise UpstreamFailure("decode", f"{inst.url} ended its stream without sending anything")
    proxy_spans.end(span)  # D's stream fully received
    await ex.end_stream()


# ------------------------------------------------------------------------- the flows
async def pull_flow(ex: Exchange, p: Instance, d: Instance) -> None:
    state = ex.state
    answer = await prefill_leg(ex, p)
    relay = state.spans.start_relay(
        ex.root, ex.prefill_done_ns or time.time_ns(), ex.prefill_done_loop
    )
    kv = answer.get(KV_PARAMS)
    problems = decode_params_problems(kv, "pull")
    if problems:
        err = UpstreamFailure(
            "prefill",
            f"{p.url} returned kv_transfer_params the decode engine cannot take: "
            + describe_problems(problems),
        )
        proxy_spans.fail(relay, err.error_type, err.message)
        relay.end()
        raise err
    assert isinstance(kv, dict)
    kv = dict(kv)
    sent_ns = time.time_ns()
    relay.end(end_time=sent_ns)
    span = state.spans.start_leg(ex.root, semconv.SPAN_PROXY_DECODE, d, start_ns=sent_ns)
    await decode_leg(ex, d, span, ex.add_trace_context(kv, span))


async def push_flow(ex: Exchange, p: Instance, d: Instance) -> None:
    state = ex.state
    assert p.coords is not None
    coords = p.coords.effective()
    if coords is None:
        # First contact with a P whose coordinates are unknown: run P first and learn
        # them from its answer (P keeps the KV under its lease until D registers).
        log.info("prefill %s: coordinates unknown, sending this request sequentially", p.url)
        await prefill_leg(ex, p)
        coords = p.coords.effective()
        if coords is None:
            raise UpstreamFailure(
                "prefill",
                f"{p.url} did not report its NIXL coordinates (kv_transfer_params "
                "remote_engine_id/remote_host/remote_port/tp_size); give them with "
                "--prefill 'URL#engine_id=...,port=...'",
            )
        kv = coords.decode_params(ex.request_id)
        span = state.spans.start_leg(ex.root, semconv.SPAN_PROXY_DECODE, d)
        await decode_leg(ex, d, span, ex.add_trace_context(kv, span))
        return

    kv = coords.decode_params(ex.request_id)
    if problems := decode_params_problems(kv, "push"):  # defence: never send a bad one
        raise UpstreamFailure("prefill", "coordinates are invalid: " + describe_problems(problems))
    span = state.spans.start_leg(ex.root, semconv.SPAN_PROXY_DECODE, d)
    ex.add_trace_context(kv, span)
    p_task = asyncio.create_task(prefill_leg(ex, p), name=f"prefill {ex.request_id}")
    d_task = asyncio.create_task(decode_leg(ex, d, span, kv), name=f"decode {ex.request_id}")
    ex.tasks += [p_task, d_task]
    # Once D has the request it registers blocks with P and, in vLLM 0.32, frees them
    # only when P's WRITE lands, even if the request is aborted meanwhile. Cancelling
    # P's leg aborts P's prefill, so no WRITE ever comes and D holds the blocks for good
    # (measured: a client leaving before its first token left D's KV in use). So P's
    # leg is never cancelled in push mode: it runs to its end (bounded by the leg's
    # timeouts), P pushes the KV, and D lets the blocks go. The cost is the prefill of
    # a request nobody waits for.
    ex.finish_alone.add(p_task)
    pending: set[asyncio.Task[Any]] = {p_task, d_task}
    while d_task in pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if p_task in done and not p_task.cancelled() and (p_exc := p_task.exception()):
            if ex.decode_token_ns is None:
                # D cannot produce a token without P's KV: stop waiting for it.
                ex.cancel(d_task, semconv.ERR_UPSTREAM, "cancelled: the prefill leg failed")
                await asyncio.gather(d_task, return_exceptions=True)
                raise p_exc
            log.warning("prefill leg failed after decode's first token: %s", p_exc)
    if d_exc := d_task.exception():
        raise d_exc  # P's leg finishes alone (see above)
    if not p_task.done():  # D is done, so P's KV arrived; its answer should be too
        remaining = max(0.0, ex.deadline - asyncio.get_running_loop().time())
        await asyncio.wait({p_task}, timeout=remaining)
        ex.cancel(p_task, semconv.ERR_UPSTREAM_TIMEOUT, "prefill answer outlived the request")


# ---------------------------------------------------------------------- the handlers
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: valid JSON, but no engine can take infinity
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _too_large(limit: int, size: int | None) -> PayloadTooLarge:
    got = f" (got {size} bytes)" if size is not None else ""
    return PayloadTooLarge(
        f"request body is larger than the proxy's limit of {limit} bytes{got}; "
        "the limit is set with --max-body-bytes (TRACEDPUSH_PROXY_MAX_BODY_BYTES)"
    )


async def _read_body(request: web.Request, limit: int) -> Any:
    """The parsed body; 413 past ``limit`` (unread when Content-Length says so), 400
    for anything that is not strict JSON (NaN and Infinity included) or that nests too
    deeply or carries unpaired surrogates (fields.json_shape_problem)."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit, request.content_length)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # chunked: aiohttp counted past client_max_size
        raise _too_large(limit, None) from None
    try:
        # Strictly: json.loads(bytes) would decode with surrogatepass and let lone
        # surrogates through as text.
        text = raw.decode(json.detect_encoding(raw))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not UTF-8 text: {exc}") from None
    try:
        body = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is not usable JSON: it nests too deeply") from None
    if problem := json_shape_problem(text, body):
        key, why = problem
        if key is None:
            raise BadRequest(f"request body {why}")
        raise BadRequest(f"'{key}' {why}", param=key)
    return body


def _pick(pool: Pool) -> Instance:
    inst = pool.pick()
    if inst is None:
        raise NoInstance(f"no healthy {pool.role} instance (of {len(pool.instances)})")
    return inst


async def _fetch_models(state: ProxyState, headers: dict[str, str]) -> list[ModelCard] | None:
    """The models both roles serve, from one usable P and one usable D; None if neither
    answered. Bounded by the health timeout: a busy engine delays only this miss."""
    pools = (state.prefill, state.decode)
    targets = [next((i for i in pool.instances if i.usable), None) for pool in pools]
    timeout = aiohttp.ClientTimeout(total=state.config.health_timeout)

    async def ask(inst: Instance) -> list[ModelCard] | None:
        try:
            async with state.upstream.session.get(
                f"{inst.url}/v1/models", headers=headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                return cards_from_answer(await resp.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("cannot list the models of %s %s: %s", inst.role, inst.url, exc)
            return None

    answers = await asyncio.gather(*(ask(i) for i in targets if i is not None))
    lists = [cards for cards in answers if cards is not None]
    if not lists:
        return None
    common = set.intersection(*({c.name for c in cards} for cards in lists))
    return [c for c in lists[-1] if c.name in common]  # D's cards (roots) when D answered


async def _check_model(ex: Exchange, body: dict[str, Any]) -> int | None:
    """404 for a model the engines do not serve; returns its vocabulary size if known."""
    state = ex.state
    if not state.config.model_check:
        return state.config.vocab_size
    headers = _client_auth(ex.request)
    start_ns = time.time_ns()
    found = await state.models.lookup(body["model"], lambda: _fetch_models(state, headers))
    if found.waited:  # a catalog miss: the request's time, on its critical path
        state.spans.model_lookup(ex.root, start_ns, found.fetched, found.known is not None)
    if found.known is False:
        served = ", ".join(repr(name) for name in found.served) or "no model"
        raise ModelNotFound(
            f"'model' {short(body['model'])} does not exist: the engines serve {served}",
            param="model",
        )
    return found.vocab_size


async def _serve(ex: Exchange) -> None:
    state = ex.state
    body = await _read_body(ex.request, state.config.max_body_bytes)
    validate_client_body(ex.route, body, state.mode)
    check_token_ids(ex.route, body, await _check_model(ex, body))
    ex.body, ex.stream = body, bool(body.get("stream"))
    ex.root.set_attribute(semconv.STREAM, ex.stream)
    ex.request_id = state.claim_request_id(ex.request.headers.get("X-Request-Id"))
    ex.root.set_attribute(semconv.REQUEST_ID, ex.request_id)
    p, d = _pick(state.prefill), _pick(state.decode)
    flow = pull_flow if state.mode == "pull" else push_flow
    try:
        with state.prefill.acquire(p), state.decode.acquire(d):
            await flow(ex, p, d)
    except UpstreamFailure as err:
        if (other := _prefill_instead(ex, p, err)) is None:
            raise
        with state.prefill.acquire(other), state.decode.acquire(d):
            await flow(ex, other, d)


def _prefill_instead(ex: Exchange, p: Instance, err: UpstreamFailure) -> Instance | None:
    """Another P for a request whose P refused the connection before any engine saw it.

    A P that died moments ago refuses connections until a health check marks it down
    (a refusal marks it at once, with periodic checks on). Nothing reached P, D was not
    contacted and the client has no answer yet, so sending the request to another P
    loses nothing. Once, and only then: after D got the request (push), it waits for
    that P's KV, and a second failure is the answer.
    """
    if err.leg != "prefill" or err.sent or ex.decode_started or ex.response is not None:
        return None
    other = ex.state.prefill.pick()
    if other is None or other is p:
        return None
    log.warning("prefill %s refused a connection; %s goes to %s", p.url, ex.request_id, other.url)
    ex.root.add_event(semconv.EVENT_PREFILL_REROUTED, {semconv.UPSTREAM_URL: other.url})
    return other


def _finish(ex: Exchange, failed_leg: str | None) -> None:
    root, state = ex.root, ex.state
    status = ex.status if ex.status is not None else 499
    root.set_attribute(semconv.HTTP_STATUS, status)
    if ex.prompt_tokens is not None:
        root.set_attribute(semconv.PROMPT_TOKENS, ex.prompt_tokens)
    output = ex.output_tokens if ex.output_tokens is not None else ex.token_events or None
    if output is not None:
        root.set_attribute(semconv.OUTPUT_TOKENS, output)
    if ex.first_token_ns is not None:
        root.set_attribute(semconv.TTFT_MS, (ex.first_token_ns - ex.receipt_ns) / 1e6)
    root.end(end_time=ex.last_byte_ns)
    state.metrics.finished(499 if ex.client_gone else status, failed_leg)
    if status == 200 and not ex.client_gone:
        state.metrics.observe_tpot(ex.first_token_ns, ex.last_token_ns, output)
    state.active_ids.discard(ex.request_id)


async def handle_generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    ex = Exchange(state, request, route)
    state.metrics.in_flight += 1
    failed_leg: str | None = None
    try:
        await _serve(ex)
    except ProxyError as err:
        if isinstance(err, UpstreamFailure):
            failed_leg = err.leg
        if err.status >= 500:
            error_type = getattr(err, "error_type", semconv.ERR_UPSTREAM)
            proxy_spans.fail(ex.root, error_type, err.message)
        log.info("request %s: %s %s", ex.request_id or "-", err.status, err.message)
        await ex.answer_error(err)
    except ClientGone:
        ex.client_gone = True
        proxy_spans.fail(ex.root, *CLIENT_GONE)
    except asyncio.CancelledError:
        # A client that closes right after the last byte (e.g. on [DONE]) was served.
        if ex.last_byte_ns is None:
            ex.client_gone = True
            proxy_spans.fail(ex.root, *CLIENT_GONE)
        raise
    finally:
        legs = [t for t in ex.tasks if t not in ex.finish_alone or t.done()]
        for task in legs:
            ex.cancel(task, *CLIENT_GONE)
        for task in set(ex.tasks) - set(legs):
            _finish_alone(state, task)
        try:
            if legs:
                await asyncio.gather(*legs, return_exceptions=True)
        except asyncio.CancelledError:
            pass  # cancelled again while tidying up: the legs are cancelled already
        finally:
            _finish(ex, failed_leg)  # the root span always ends
            state.metrics.in_flight -= 1
    return ex.response if ex.response is not None else web.Response(status=499)


def _finish_alone(state: ProxyState, task: asyncio.Task[Any]) -> None:
    """Let a leg run to its end after its request has ended, holding a reference to it."""
    state.finishing.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        state.finishing.discard(t)
        if not t.cancelled() and (exc := t.exception()) is not None:
            log.info("%s, finished after its request: %s", t.get_name(), exc)

    task.add_done_callback(done)


async def handle_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        d = _pick(state.decode)
        status, raw, content_type = await state.upstream.get(
            "decode", d, "/v1/models", _client_auth(request), deadline=state.upstream.deadline()
        )
    except ProxyError as err:
        return web.json_response(err.body(), status=err.status)
    return web.Response(body=raw, status=status, content_type=content_type or "application/json")


async def handle_health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    warm = state.models_warm
    if warm is not None and not warm.done():  # ready = no request waits for the catalog
        await asyncio.wait({warm}, timeout=state.config.health_timeout)
    if state.config.health_interval <= 0:  # no background checks: check now
        await asyncio.gather(
            *(
                check_health(state.upstream.session, i, state.config.health_timeout)
                for i in state.instances
            )
        )
    ok = state.prefill.healthy_count > 0 and state.decode.healthy_count > 0
    body = {
        "status": "ok" if ok else "unavailable",
        "mode": state.mode,
        "prefill": [i.describe() for i in state.prefill.instances],
        "decode": [i.describe() for i in state.decode.instances],
    }
    return web.json_response(body, status=200 if ok else 503)


async def handle_metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    text = state.metrics.render([state.prefill, state.decode])
    return web.Response(
        text=text,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


# ------------------------------------------------------------------------ lifecycle
async def _probe_prefill(state: ProxyState, inst: Instance) -> None:
    if inst.role != "prefill" or inst.coords is None or inst.coords.learned is not None:
        return
    try:
        coords = await probe(
            state.upstream.session,
            inst.url,
            state.config.timeouts.first_byte,
            state.config.engine_auth,
        )
    except Exception as exc:  # a failed probe leaves learning-from-answers in place
        log.warning("coordinate probe of %s failed: %s", inst.url, exc)
        return
    inst.coords.learn(coords, "probe")


async def _lifecycle(app: web.Application) -> Any:
    state = app[STATE]
    config = state.config
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[send_clock_trace()],
    )
    # Passive marking (a refused connection excludes the instance) only when periodic
    # checks run to bring it back.
    state.upstream = UpstreamClient(
        session, config.timeouts, passive_health=config.health_interval > 0
    )
    probing = config.mode == "push" and config.kv_discovery == "probe"

    async def on_healthy(inst: Instance) -> None:
        if probing:
            await _probe_prefill(state, inst)

    state.monitor = HealthMonitor(
        session, state.instances, config.health_interval, config.health_timeout, on_healthy
    )
    startup_probes: list[asyncio.Task[None]] = []
    if config.health_interval > 0:
        state.monitor.start()
    elif probing:
        startup_probes = [
            asyncio.create_task(_probe_prefill(state, i)) for i in state.prefill.instances
        ]
    if config.model_check:  # so that no request waits for the catalog (`ModelCatalog.warm`)
        state.models_warm = asyncio.create_task(
            state.models.warm(lambda: _fetch_models(state, config.engine_auth))
        )
        startup_probes.append(state.models_warm)
    yield
    for task in startup_probes:
        task.cancel()
    await asyncio.gather(*startup_probes, return_exceptions=True)
    await state.monitor.stop()
    await state.upstream.close()
    await session.close()
    state.loop_cpu.close()


def _routes(app: web.Application) -> list[str]:
    return [
        f"{r.method} {r.resource.canonical}"
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    ]


@web.middleware
async def route_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown routes and wrong methods answer OpenAI error JSON, not aiohttp's text."""
    exc = request.match_info.http_exception
    if exc is None:
        return await handler(request)
    route = f"{request.method} {request.path[:200]}"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods - {"HEAD"}))
        err = RouteError(f"method not allowed: {route}; {request.path} accepts {allowed}", 405)
        headers = {"Allow": ",".join(sorted(exc.allowed_methods))}
        return web.json_response(err.body(), status=err.status, headers=headers)
    err = RouteError(
        f"no such route: {route}; the proxy serves " + ", ".join(_routes(request.app)), 404
    )
    return web.json_response(err.body(), status=err.status)


def create_app(
    config: ProxyConfig, tracer_provider: TracerProvider | None = None
) -> web.Application:
    """The proxy as an aiohttp app; tests pass a TracerProvider with an in-memory exporter.

    Serve it with ``handler_cancellation=True`` (as ``command.py`` and aiohttp's
    TestServer do): that is how a client disconnect reaches the handler and closes
    both legs.
    """
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[route_errors])
    app[STATE] = ProxyState(config, tracer_provider)
    for route in GENERATE_ROUTES:
        app.router.add_post(route, handle_generate)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.cleanup_ctx.append(_lifecycle)
    return app
