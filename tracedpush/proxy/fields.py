"""The OpenAI request fields the proxy checks before any engine sees a request.

Why check what vLLM checks again: in push mode P and D get the request at the same
time, and in pull mode D gets it only after P did the whole prefill, so a body one
engine refuses (or chokes on) wastes the other's work, and each engine answers its
own way. Refused here, the client gets one OpenAI error naming the field and no
engine is touched. The rules are vLLM 0.32's (``CompletionRequest``,
``ChatCompletionRequest``, ``SamplingParams._verify_args``) with JSON types taken
strictly (vLLM's pydantic would also take ``"0.5"`` for a number; the OpenAI schema
does not). Fields not listed pass through untouched (vLLM ignores unknown ones), and
nested structures the engines validate themselves (``tools``, ``response_format``,
message content parts) are only checked for their JSON type.

Some features cannot work through P/D at all (``PD_UNSUPPORTED``): the prefill
engine's answer is discarded and the decode engine receives the prompt only as KV.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_JSON_DEPTH = 100  # far above any real request; keeps copies and re-encoding safe
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default

Check = Callable[[Any], str | None]  # None when fine, else why not ("must be ...")


# ----------------------------------------------------------------------- predicates
def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> Check:
    """A finite JSON number within [lo, hi] ((lo, hi] with ``lo_open``)."""
    low = "any" if lo is None else f"{'(' if lo_open else '['}{lo:g}"
    high = "any" if hi is None else f"{hi:g}]"
    why = "must be a number" if lo is None and hi is None else f"must be a number in {low}, {high}"

    def check(value: Any) -> str | None:
        if not _finite_number(value):
            return why
        if lo is not None and (value <= lo if lo_open else value < lo):
            return why
        if hi is not None and value > hi:
            return why
        return None

    return check


def integer(lo: int = INT64_MIN, hi: int = INT64_MAX) -> Check:
    why = "must be a 64-bit integer" if lo == INT64_MIN else f"must be an integer >= {lo}"

    def check(value: Any) -> str | None:
        return None if is_int(value) and lo <= value <= hi else why

    return check


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def string(value: Any) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def json_object(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be an object"


def string_or_object(value: Any) -> str | None:
    return None if isinstance(value, str | dict) else "must be a string or an object"


def list_of_objects(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, dict) for v in value)
    return None if ok else "must be a list of objects"


def int_list(lo: int = INT64_MIN, *, nonempty: bool = False) -> Check:
    what = "integers" if lo == INT64_MIN else f"integers >= {lo}"
    why = f"must be a {'non-empty ' if nonempty else ''}list of {what}"

    def check(value: Any) -> str | None:
        if not isinstance(value, list) or (nonempty and not value):
            return why
        ok = all(is_int(v) and lo <= v <= INT64_MAX for v in value)
        return None if ok else why

    return check


def nonempty_strings(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
    return None if ok else "must be a list of non-empty strings"


def stop(value: Any) -> str | None:
    """vLLM refuses an empty stop string ('stop cannot contain an empty string')."""
    if isinstance(value, str):
        return None if value else "must be a non-empty string or a list of them"
    return None if nonempty_strings(value) is None else "must be a string or a list of strings"


TOKEN_KEY_RE = re.compile(r"^[0-9]{1,19}$")


def logit_bias(value: Any) -> str | None:
    """Token-id strings to numbers (vLLM turns each key into an int)."""
    if not isinstance(value, dict):
        return "must be an object mapping token ids to numbers"
    for key, bias in value.items():
        if not TOKEN_KEY_RE.fullmatch(key) or not _finite_number(bias):
            return "must map token ids (decimal strings) to numbers"
    return None


CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


def cache_salt(value: Any) -> str | None:
    ok = (
        isinstance(value, str)
        and 0 < len(value) <= 128
        and not CACHE_SALT_FORBIDDEN.intersection(value)
    )
    return None if ok else "must be a non-empty string of at most 128 characters without @ / \\"


def stream_options(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "must be an object"
    for key in ("include_usage", "continuous_usage_stats"):
        if value.get(key) is not None and not isinstance(value[key], bool):
            return f"{key} must be true or false"
    return None


# --------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Field:
    check: Check
    nullable: bool = True  # vLLM types it ``X | None``


def _f(check: Check, nullable: bool = True) -> Field:
    return Field(check, nullable)


COMMON_FIELDS: dict[str, Field] = {
    "max_tokens": _f(integer(1)),
    "stream": _f(boolean),
    "stream_options": _f(stream_options),
    "temperature": _f(number(0, 2)),
    "top_p": _f(number(0, 1, lo_open=True)),
    "top_k": _f(integer(-1)),
    "min_p": _f(number(0, 1)),
    "frequency_penalty": _f(number(-2, 2)),
    "presence_penalty": _f(number(-2, 2)),
    "repetition_penalty": _f(number(0, lo_open=True)),
    "length_penalty": _f(number(), nullable=False),
    "seed": _f(integer()),
    "stop": _f(stop),
    "stop_token_ids": _f(int_list()),
    "min_tokens": _f(integer(0), nullable=False),
    "ignore_eos": _f(boolean, nullable=False),
    "skip_special_tokens": _f(boolean, nullable=False),
    "spaces_between_special_tokens": _f(boolean, nullable=False),
    "include_stop_str_in_output": _f(boolean, nullable=False),
    "use_beam_search": _f(boolean, nullable=False),
    "logit_bias": _f(logit_bias),
    "allowed_token_ids": _f(int_list(0, nonempty=True)),
    "bad_words": _f(nonempty_strings, nullable=False),
    "priority": _f(integer(), nullable=False),
    "truncate_prompt_tokens": _f(integer(-1)),
    "stream_interval": _f(integer(1)),
    "cache_salt": _f(cache_salt),
    "user": _f(string),
    "return_token_ids": _f(boolean),
    "response_format": _f(json_object),
    "structured_outputs": _f(json_object),
    "vllm_xargs": _f(json_object),
}
COMPLETIONS_FIELDS: dict[str, Field] = {
    **COMMON_FIELDS,
    "suffix": _f(string),
    "add_special_tokens": _f(boolean, nullable=False),
    "return_tokens_as_token_ids": _f(boolean),
}
CHAT_FIELDS: dict[str, Field] = {
    **COMMON_FIELDS,
    "max_completion_tokens": _f(integer(1)),
    "echo": _f(boolean, nullable=False),  # refused when true: WHY_PD_CHAT
    "add_generation_prompt": _f(boolean, nullable=False),
    "continue_final_message": _f(boolean, nullable=False),
    "add_special_tokens": _f(boolean, nullable=False),
    "include_reasoning": _f(boolean, nullable=False),
    "parallel_tool_calls": _f(boolean),
    "tools": _f(list_of_objects),
    "tool_choice": _f(string_or_object),
    "chat_template": _f(string),
    "chat_template_kwargs": _f(json_object),
    "return_tokens_as_token_ids": _f(boolean),
}


def field_problem(fields: dict[str, Field], body: dict[str, Any]) -> tuple[str, str] | None:
    """The first listed field whose value vLLM would refuse, as (key, why)."""
    for key, spec in fields.items():
        if key not in body:
            continue
        value = body[key]
        if value is None:
            if not spec.nullable:
                return key, "must not be null"
            continue
        if why := spec.check(value):
            return key, why
    return None


# ------------------------------------------------------------- P/D-incompatible use
PREFILL_DISCARDED = (
    "the prefill engine computes the prompt and the proxy discards its answer, and the "
    "decode engine receives the prompt only as KV"
)
WHY_PD: dict[str, str] = {
    "best_of": "it asks for several sequences per request, and the prefill and decode legs "
    "are paired by request id, one sequence each",
    "use_beam_search": "vLLM runs a beam search as requests of its own (ids ending in "
    "'-beam'), whose prefill answer carries no kv_transfer_params, and the prefill and "
    "decode legs are paired by request id, one sequence each",
    "echo": "echo returns the prompt with the completion (with 'logprobs', the prompt's "
    f"log-probabilities too); {PREFILL_DISCARDED}",
    "prompt_logprobs": f"{PREFILL_DISCARDED}; asked for prompt log-probabilities, the "
    "decode engine skips the transferred KV and recomputes the whole prompt itself",
    "logprobs": f"{PREFILL_DISCARDED}, so the proxy returns no log-probabilities",
    "top_logprobs": f"{PREFILL_DISCARDED}, so the proxy returns no log-probabilities",
}
# Where chat differs (vLLM 0.32's ChatCompletionRequest.to_sampling_params and
# serving_chat; seen on a real engine, with and without the proxy).
WHY_PD_CHAT: dict[str, str] = {
    "echo": "vLLM turns a chat echo into prompt log-probabilities (prompt_logprobs = "
    "top_logprobs, 0 by default), so the decode engine would skip the transferred KV and "
    "recompute the whole prompt itself; streamed, vLLM 0.32 also ends the answer with an "
    "error event (its DeltaMessage refuses the echoed content)",
}


def _off(value: Any, *, false: bool = False, zero: bool = False) -> bool:
    """Null is always off; ``false`` and the integer 0 only where they mean off."""
    if value is None:
        return True
    if value is False:
        return false
    return zero and is_int(value) and value == 0


def pd_unsupported(route_is_chat: bool, body: dict[str, Any]) -> tuple[str, str] | None:
    """The first feature P/D cannot serve, as (key, message); None when there is none.

    vLLM reads ``false`` in an integer field as 0: ``"prompt_logprobs": false`` asks
    for prompt log-probabilities, so only null (or absence) is off there.
    """
    best_of = body.get("best_of")
    checks: list[tuple[str, bool]] = [
        ("best_of", _off(best_of) or (is_int(best_of) and best_of == 1)),
        ("prompt_logprobs", _off(body.get("prompt_logprobs"))),
        ("use_beam_search", _off(body.get("use_beam_search"), false=True)),
    ]
    if route_is_chat:
        checks += [
            ("echo", _off(body.get("echo"), false=True)),
            ("logprobs", _off(body.get("logprobs"), false=True)),
            ("top_logprobs", _off(body.get("top_logprobs"), false=True, zero=True)),
        ]
    else:
        checks += [
            ("echo", _off(body.get("echo"), false=True)),
            ("logprobs", _off(body.get("logprobs"))),
        ]
    for key, off in checks:
        if not off:
            got = short(body[key])
            why = (WHY_PD_CHAT if route_is_chat else {}).get(key) or WHY_PD[key]
            return key, f"'{key}' is not supported through P/D disaggregation (got {got}): " + why
    return None


# ---------------------------------------------------------------- JSON-level checks
SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _walk(value: Any) -> Any:
    """Every (depth, item) below ``value``, iteratively (bodies may nest deeply)."""
    stack: list[tuple[int, Any]] = [(1, value)]
    while stack:
        depth, item = stack.pop()
        yield depth, item
        if isinstance(item, dict):
            stack.extend((depth + 1, k) for k in item)
            stack.extend((depth + 1, v) for v in item.values())
        elif isinstance(item, list):
            stack.extend((depth + 1, v) for v in item)


def json_shape_problem(text: str, body: Any) -> tuple[str | None, str] | None:
    """(top-level key or None, why) for a parsed body no engine should get.

    Two things JSON allows that break later: nesting deep enough to exhaust Python's
    recursion when the body is copied or re-encoded, and escaped lone surrogates
    (``"\\ud800"``), which are not Unicode text and fail in the engine's tokenizer. Both
    are looked for only when the JSON text hints at them (brackets, ``\\ud8..``
    escapes), so ordinary bodies cost three scans of the text.
    """
    deep = text.count("[") + text.count("{") > MAX_JSON_DEPTH
    surrogates = SURROGATE_ESCAPE_RE.search(text) is not None
    if not deep and not surrogates:
        return None
    items = body.items() if isinstance(body, dict) else [(None, body)]
    for key, value in items:
        for depth, item in _walk(value):
            if deep and depth > MAX_JSON_DEPTH - 1:
                return key, f"nests deeper than {MAX_JSON_DEPTH} levels"
            if surrogates and isinstance(item, str) and _has_lone_surrogate(item):
                return key, "holds an unpaired UTF-16 surrogate (\\ud800-\\udfff), not text"
        if surrogates and isinstance(key, str) and _has_lone_surrogate(key):
            return key, "is a key with an unpaired UTF-16 surrogate"
    return None


def _repr() -> reprlib.Repr:
    r = reprlib.Repr()  # Python 3.11's takes no keyword arguments
    r.maxlevel, r.maxlist, r.maxdict = 2, 4, 4
    r.maxstring = r.maxother = r.maxlong = 40
    return r


_REPR = _repr()


def short(value: Any) -> str:
    """A value for an error message, cut so a huge one cannot flood the answer."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return _REPR.repr(value)
