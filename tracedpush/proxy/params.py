"""Request bodies for each leg, and validation of everything that reaches an engine.

vLLM's NIXL connectors index ``kv_transfer_params`` with ``[]`` on the decode side
(``push_scheduler.update_state_after_alloc``: remote_engine_id, remote_host,
remote_port, tp_size; ``metadata.add_new_req_to_recv``: remote_block_ids,
remote_engine_id, remote_request_id, remote_host, remote_port). A missing key there
raises inside the EngineCore and kills it for every later request, and an empty
``remote_block_ids`` in pull mode trips an ``assert`` in the pull scheduler. So the
proxy checks every dict it sends to D (built by itself in push mode, relayed from P in
pull mode) against the schema below, and never lets a client supply one.
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from tracedpush import semconv
from tracedpush.proxy import fields
from tracedpush.proxy.errors import BadRequest

ROUTE_COMPLETIONS = "/v1/completions"
ROUTE_CHAT = "/v1/chat/completions"
GENERATE_ROUTES = (ROUTE_COMPLETIONS, ROUTE_CHAT)

KV_PARAMS = "kv_transfer_params"

# What P receives in both modes: "compute the prompt, keep its KV for a remote decode".
PREFILL_KV_PARAMS: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False}

# X-Request-Id: vLLM embeds it in NIXL notification ids ("<id>:<n>") and heartbeats
# ("HB:<id>,<id>"), so ':' and ',' are excluded along with anything non-printable.
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
TRACEPARENT_RE = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")


def new_request_id() -> str:
    return f"tp-{uuid.uuid4().hex}"


def is_sane_request_id(value: str | None) -> bool:
    return bool(value) and REQUEST_ID_RE.fullmatch(value) is not None


# ----------------------------------------------------------------------- client body
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(_is_int(t) and t >= 0 for t in value)


def validate_client_body(route: str, body: Any, mode: str) -> None:
    """Raise BadRequest (naming the key) for anything no engine should see.

    The checks and why they exist: docs/proxy.md, "What never reaches an engine";
    the field rules live in fields.py.
    """
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if KV_PARAMS in body:
        raise BadRequest(client_kv_params_message(body[KV_PARAMS], mode), param=KV_PARAMS)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    chat = route == ROUTE_CHAT
    if chat:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    _check_n(body, chat)
    if unsupported := fields.pd_unsupported(chat, body):
        raise BadRequest(unsupported[1], param=unsupported[0])
    table = fields.CHAT_FIELDS if chat else fields.COMPLETIONS_FIELDS
    if problem := fields.field_problem(table, body):
        key, why = problem
        raise BadRequest(f"'{key}' {why}, got {fields.short(body[key])}", param=key)
    _check_combinations(body, chat)


def _check_n(body: dict[str, Any], chat: bool) -> None:
    n = body.get("n", 1)
    if (n is None and chat) or (_is_int(n) and n == 1):
        return
    raise BadRequest(
        f"'n' must be 1 through P/D disaggregation (got {fields.short(n)}): the prefill and "
        "decode requests are paired by request id, one sequence each",
        param="n",
    )


def _check_combinations(body: dict[str, Any], chat: bool) -> None:
    """Rules across fields that vLLM enforces (each a 400 from the engine otherwise)."""
    if body.get("stream_options") and not body.get("stream"):
        raise BadRequest(
            "'stream_options' can only be given with \"stream\": true", param="stream_options"
        )
    if chat:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
    else:  # vLLM's CompletionRequest defaults max_tokens to 16
        limit = body.get("max_tokens") or fields.COMPLETIONS_DEFAULT_MAX_TOKENS
    min_tokens = body.get("min_tokens", 0)
    if limit is not None and min_tokens > limit:
        raise BadRequest(
            f"'min_tokens' ({min_tokens}) must not exceed the maximum number of tokens ({limit})",
            param="min_tokens",
        )
    if chat and body.get("add_generation_prompt", True) and body.get("continue_final_message"):
        raise BadRequest(
            "'continue_final_message' cannot be true together with 'add_generation_prompt' "
            "(which defaults to true)",
            param="continue_final_message",
        )


def check_token_ids(route: str, body: dict[str, Any], vocab_size: int | None) -> None:
    """Token ids the model does not have: vLLM refuses them, so P and D both would.

    Skipped when the vocabulary size is unknown (``None``).
    """
    if vocab_size is None:
        return
    keys = ("allowed_token_ids",) if route == ROUTE_CHAT else ("prompt", "allowed_token_ids")
    for key in keys:
        ids = body.get(key)
        if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list):
            ids = ids[0]  # a one-element list holding the token-id prompt
        if not isinstance(ids, list):
            continue
        for i, token in enumerate(ids):
            if _is_int(token) and token >= vocab_size:
                raise BadRequest(
                    f"'{key}' token id {token} (index {i}) is out of vocabulary: the model "
                    f"has {vocab_size} token ids (0-{vocab_size - 1})",
                    param=key,
                )
    bias = body.get("logit_bias")
    if isinstance(bias, dict):
        for key in bias:
            if int(key) >= vocab_size:
                raise BadRequest(
                    f"'logit_bias' token id {key} is out of vocabulary: the model has "
                    f"{vocab_size} token ids (0-{vocab_size - 1})",
                    param="logit_bias",
                )


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str) and prompt:
        return
    if _is_token_list(prompt) and all(t <= fields.INT64_MAX for t in prompt):
        return
    if (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(p, str) or _is_token_list(p) for p in prompt)
    ):
        raise BadRequest(
            f"'prompt' holds {len(prompt)} prompts; batched prompts are not supported "
            "through P/D disaggregation (send one request per prompt)",
            param="prompt",
        )
    if isinstance(prompt, list) and len(prompt) == 1:
        only = prompt[0]
        if (isinstance(only, str) and only) or (
            _is_token_list(only) and all(t <= fields.INT64_MAX for t in only)
        ):
            return
    raise BadRequest(
        "'prompt' is required: a non-empty string or a non-empty list of token ids "
        "(integers 0 to 2^63-1)",
        param="prompt",
    )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(
                f"'messages[{i}]' must be an object with a string 'role'", param="messages"
            )
        content = message.get("content")
        if content is None and "content" in message and message["role"] != "assistant":
            # vLLM's message models take a null content on an assistant message only
            # (one with tool calls); on any other role the engine answers 400
            raise BadRequest(
                f"'messages[{i}].content' may be null only on an assistant message "
                f"(this one's role is {message['role']!r})",
                param="messages",
            )
        if content is not None and not isinstance(content, str) and not _is_parts(content):
            raise BadRequest(
                f"'messages[{i}].content' must be a string, a list of content parts "
                "(objects with a string 'type') or null",
                param="messages",
            )


def _is_parts(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
    )


def client_kv_params_message(value: Any, mode: str) -> str:
    message = (
        f"'{KV_PARAMS}' must not be sent by clients: the proxy builds it for each leg, "
        "and a bad one can crash the decode engine"
    )
    if isinstance(value, dict):
        problems = decode_params_problems(value, mode)
        if problems:
            message += "; it is also malformed: " + describe_problems(problems)
    else:
        message += f"; it is also not an object ({type(value).__name__})"
    return message


# ------------------------------------------------------------------------ leg bodies
def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """P's request: one token, not streamed, KV kept for a remote decode."""
    out = copy.deepcopy(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    for key in ("stream_options", "min_tokens", "n"):
        out.pop(key, None)
    out[KV_PARAMS] = dict(PREFILL_KV_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """D's request: the client's own body plus ``kv_params``.

    Streams ask D for a usage chunk (to learn token counts); the bool says the proxy
    added it, so the relay drops that chunk instead of showing the client something
    it did not ask for.
    """
    out = copy.deepcopy(body)
    out[KV_PARAMS] = kv_params
    injected_usage = False
    if out.get("stream"):
        options = dict(out.get("stream_options") or {})
        if not options.get("include_usage"):
            options["include_usage"] = True
            injected_usage = True
        out["stream_options"] = options
    return out, injected_usage


def push_decode_params(
    *,
    engine_id: str,
    host: str,
    port: int,
    tp_size: int,
    pp_size: int,
    request_id: str,
    dcp_size: int | None = None,
) -> dict[str, Any]:
    """D's params in push mode: P's coordinates plus every key D indexes with [].

    ``remote_request_id`` is the base id both legs were sent with (P's internal id adds
    a random suffix the proxy cannot know; push pairs requests by base id).
    ``remote_block_ids`` is empty: in push mode P learns D's blocks, not the reverse.
    """
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_host": host,
        "remote_port": port,
        "remote_request_id": request_id,
        "remote_block_ids": [],
        "tp_size": tp_size,
        "pp_size": pp_size,
    }
    if dcp_size is not None:
        params["dcp_size"] = dcp_size
    return params


# ------------------------------------------------------------------- kv params schema
def _nonempty_str(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "must be a non-empty string"


def _port(v: Any) -> str | None:
    return None if _is_int(v) and 0 < v < 65536 else "must be an integer port (1-65535)"


def _pos_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 1 else "must be an integer >= 1"


def _opt_nonneg_int(v: Any) -> str | None:
    return None if v is None or (_is_int(v) and v >= 0) else "must be an integer >= 0 or null"


def _opt_pos_int(v: Any) -> str | None:
    return None if v is None or (_is_int(v) and v >= 1) else "must be an integer >= 1 or null"


def _opt_number(v: Any) -> str | None:
    ok = v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    return None if ok else "must be a number or null"


def _block_ids(v: Any) -> str | None:
    """A flat list of ints, or one list of ints per KV cache group."""
    if not isinstance(v, list | tuple):
        return "must be a list"
    if all(_is_int(b) and b >= 0 for b in v):
        return None
    if all(isinstance(g, list | tuple) and all(_is_int(b) and b >= 0 for b in g) for g in v):
        return None
    return "must be a list of block ids (or of per-group lists of block ids)"


def _transfer_mode(v: Any) -> str | None:
    return None if v in (None, "push", "pull") else "must be 'push' or 'pull'"


def _trace(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object"
    tp = v.get("traceparent")
    if not isinstance(tp, str) or not TRACEPARENT_RE.fullmatch(tp):
        return "must hold a W3C 'traceparent' (00-<32 hex>-<16 hex>-<2 hex>)"
    return None


REQUIRED_DECODE_KEYS: dict[str, Any] = {
    "remote_engine_id": _nonempty_str,
    "remote_host": _nonempty_str,
    "remote_port": _port,
    "remote_request_id": _nonempty_str,
    "remote_block_ids": _block_ids,
    "tp_size": _pos_int,
}
OPTIONAL_DECODE_KEYS: dict[str, Any] = {
    "pp_size": _pos_int,
    "dcp_size": _pos_int,
    "remote_num_tokens": _opt_nonneg_int,
    "remote_blocks_expiry_time": _opt_number,
    "remote_block_size": _opt_pos_int,
    "remote_prefill_cached_tokens": _opt_nonneg_int,
    "transfer_mode": _transfer_mode,
    semconv.KV_PARAMS_TRACE_KEY: _trace,
}


def decode_params_problems(params: Any, mode: str) -> list[tuple[str, str]]:
    """Every problem with D's kv_transfer_params, as (key, why); empty when safe.

    Unknown keys are allowed: the NIXL schedulers only read the keys they know
    (newer vLLM versions add some), so they cannot crash an engine.
    """
    if not isinstance(params, dict):
        return [(KV_PARAMS, "must be an object")]
    problems: list[tuple[str, str]] = []
    if params.get("do_remote_prefill") is not True:
        problems.append(("do_remote_prefill", "must be true"))
    if params.get("do_remote_decode") is not False:
        problems.append(("do_remote_decode", "must be false"))
    for key, check in REQUIRED_DECODE_KEYS.items():
        if key not in params:
            problems.append((key, "missing (required by the decode engine)"))
        elif why := check(params[key]):
            problems.append((key, why))
    for key, check in OPTIONAL_DECODE_KEYS.items():
        if key in params and (why := check(params[key])):
            problems.append((key, why))
    blocks = params.get("remote_block_ids")
    if mode == "pull" and isinstance(blocks, list | tuple) and not _has_blocks(blocks):
        problems.append(("remote_block_ids", "is empty: there is no KV for D to read"))
    if mode == "push" and isinstance(blocks, list | tuple) and blocks:
        problems.append(("remote_block_ids", "must be empty in push mode"))
    if params.get("transfer_mode") not in (None, mode):
        problems.append(
            ("transfer_mode", f"is {params['transfer_mode']!r} but the proxy runs {mode!r}")
        )
    return problems


def _has_blocks(blocks: list[Any] | tuple[Any, ...]) -> bool:
    return any((isinstance(b, list | tuple) and b) or _is_int(b) for b in blocks)


def describe_problems(problems: list[tuple[str, str]]) -> str:
    return "; ".join(f"{KV_PARAMS}.{key} {why}" for key, why in problems)
