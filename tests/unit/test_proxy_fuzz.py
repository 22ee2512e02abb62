"""Property-based fuzzing of the proxy's request schema (Hypothesis).

Bodies (valid ones, near-valid mutations of valid ones, wrong types, huge ints,
non-finite numbers, unicode and lone surrogates, nested junk, raw bytes) go to a real
proxy in front of stub engines, for both generate routes and both modes. Properties:

* the proxy never answers 5xx (the stubs produce no upstream failure);
* every 4xx is OpenAI error JSON whose ``param`` names a field the message mentions,
  or whose message is about the request body, and no engine saw that request;
* a 200 only for a body the oracle below accepts, and a 200 for every body it
  accepts (the proxy refuses nothing valid);
* every body an engine receives passes the proxy's own validation and the oracle.

The oracle (``vllm_refuses``) is written here from vLLM 0.32's request models
(``CompletionRequest``, ``ChatCompletionRequest``, ``SamplingParams._verify_args``),
taking JSON types strictly, plus what cannot work through P/D; it shares no code
with tracedpush/proxy/fields.py. ``TRACEDPUSH_FUZZ_EXAMPLES`` sets the number of
examples (default 300; ``make fuzz`` runs 5000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tracedpush.proxy.params import check_token_ids, validate_client_body
from tracedpush.testing.stub_engine import Rig, StubEngine, proxy_rig

EXAMPLES = int(os.environ.get("TRACEDPUSH_FUZZ_EXAMPLES", "300"))
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
MODEL = "stub-model"
VOCAB = 1000
I64 = 2**63


# =============================================================================== oracle
def is_int(v: Any) -> bool:
    return type(v) is int


def is_num(v: Any) -> bool:
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def in_i64(v: Any) -> bool:
    return is_int(v) and -I64 <= v < I64


def nullable(pred: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or pred(v)


def strs_nonempty(v: Any) -> bool:
    return type(v) is list and all(type(s) is str and s != "" for s in v)


def token_ids(v: Any) -> bool:
    return type(v) is list and len(v) > 0 and all(is_int(t) and 0 <= t < VOCAB for t in v)


def is_bool(v: Any) -> bool:
    return type(v) is bool


def good_bias(v: Any) -> bool:
    return type(v) is dict and all(
        k.isascii() and k.isdigit() and int(k) < VOCAB and is_num(b) for k, b in v.items()
    )


def good_salt(v: Any) -> bool:
    return type(v) is str and 1 <= len(v) <= 128 and not any(c in v for c in "@/\\\x00")


def good_stream_options(v: Any) -> bool:
    return type(v) is dict and all(
        v.get(k) is None or type(v[k]) is bool for k in ("include_usage", "continuous_usage_stats")
    )


# Both routes: each key's predicate on a present value (null included).
RULES: dict[str, Callable[[Any], bool]] = {
    "temperature": nullable(lambda v: is_num(v) and 0 <= v <= 2),
    "top_p": nullable(lambda v: is_num(v) and 0 < v <= 1),
    "min_p": nullable(lambda v: is_num(v) and 0 <= v <= 1),
    "top_k": nullable(lambda v: in_i64(v) and v >= -1),
    "frequency_penalty": nullable(lambda v: is_num(v) and abs(v) <= 2),
    "presence_penalty": nullable(lambda v: is_num(v) and abs(v) <= 2),
    "repetition_penalty": nullable(lambda v: is_num(v) and v > 0),
    "length_penalty": is_num,
    "seed": nullable(in_i64),
    "max_tokens": nullable(lambda v: in_i64(v) and v >= 1),
    "min_tokens": lambda v: in_i64(v) and v >= 0,
    "stop": nullable(lambda v: (type(v) is str and v != "") or strs_nonempty(v)),
    "stop_token_ids": nullable(lambda v: type(v) is list and all(in_i64(t) for t in v)),
    "stream": nullable(is_bool),
    "stream_options": nullable(good_stream_options),
    "ignore_eos": is_bool,
    "skip_special_tokens": is_bool,
    "use_beam_search": is_bool,
    "logit_bias": nullable(good_bias),
    "allowed_token_ids": nullable(token_ids),
    "bad_words": strs_nonempty,
    "priority": in_i64,
    "cache_salt": nullable(good_salt),
    "user": nullable(lambda v: type(v) is str),
    "response_format": nullable(lambda v: type(v) is dict),
    "add_special_tokens": is_bool,
    # P/D: one sequence per request id, and nothing that needs P's discarded answer.
    "best_of": lambda v: v is None or (is_int(v) and v == 1),
    "prompt_logprobs": lambda v: v is None,
}
COMPLETIONS_RULES = {
    **RULES,
    "n": lambda v: is_int(v) and v == 1,
    "suffix": nullable(lambda v: type(v) is str),
    "echo": lambda v: v is None or v is False,
    "logprobs": lambda v: v is None,  # vLLM reads false as 0: sampled token's logprob
}
CHAT_RULES = {
    **RULES,
    "n": lambda v: v is None or (is_int(v) and v == 1),
    "max_completion_tokens": nullable(lambda v: in_i64(v) and v >= 1),
    "echo": is_bool,  # chat's echo repeats the last message's text: fine through P/D
    "add_generation_prompt": is_bool,
    "continue_final_message": is_bool,
    "tools": nullable(lambda v: type(v) is list and all(type(t) is dict for t in v)),
    "tool_choice": nullable(lambda v: type(v) in (str, dict)),
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": lambda v: v is None or v is False or (is_int(v) and v == 0),
}


def strings_in(value: Any) -> Iterator[str]:
    if type(value) is str:
        yield value
    elif type(value) is list:
        for v in value:
            yield from strings_in(v)
    elif type(value) is dict:
        for k, v in value.items():
            yield k
            yield from strings_in(v)


def numbers_finite(value: Any) -> bool:
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(numbers_finite(v) for v in value)
    if type(value) is dict:
        return all(numbers_finite(v) for v in value.values())
    return True


def vllm_refuses(route: str, body: Any) -> str | None:
    """Why vLLM (or P/D) would not take ``body``; None when it would."""
    if type(body) is not dict:
        return "not an object"
    if not numbers_finite(body):
        return "NaN/Infinity is not JSON"
    for text in strings_in(body):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "lone surrogate"
    if "kv_transfer_params" in body:
        return "kv_transfer_params is the proxy's"
    if body.get("model") != MODEL:
        return "model"
    if route == CHAT:
        messages = body.get("messages")
        if type(messages) is not list or not messages:
            return "messages"
        for m in messages:
            if type(m) is not dict or type(m.get("role")) is not str:
                return "message"
            c = m.get("content")
            if not (c is None or type(c) is str or parts_ok(c)):
                return "content"
        rules = CHAT_RULES
    else:
        prompt = body.get("prompt")
        one = prompt[0] if type(prompt) is list and len(prompt) == 1 else None
        ok_one = (type(one) is str and one != "") or token_ids(one)
        if not ((type(prompt) is str and prompt) or token_ids(prompt) or ok_one):
            return "prompt"
        rules = COMPLETIONS_RULES
    for key, ok in rules.items():
        if key in body and not ok(body[key]):
            return key
    if body.get("stream_options") and body.get("stream") is not True:
        return "stream_options without stream"
    if route == CHAT:
        top = body.get("max_completion_tokens") or body.get("max_tokens")
        if body.get("add_generation_prompt", True) and body.get("continue_final_message"):
            return "add_generation_prompt and continue_final_message"
    else:
        top = body.get("max_tokens") or 16
    if top is not None and body.get("min_tokens", 0) > top:
        return "min_tokens"
    return None


def parts_ok(content: Any) -> bool:
    return type(content) is list and all(
        type(p) is dict and type(p.get("type")) is str for p in content
    )


# ========================================================================== strategies
# Unicode an engine must get intact, or not at all: lone surrogates ("Cs", sent as
# \ud800 escapes), control characters, other scripts, symbols.
risky_text = st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=2) | st.text(
    alphabet=st.characters(categories=["Cc", "Lo", "So", "Zs"]), min_size=1, max_size=4
)


def mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``rare`` one draw in eight: enough to be exercised, rare enough not to mask the
    other rules in a body."""
    return st.integers(0, 7).flatmap(lambda i: rare if i == 0 else usual)


text = mostly(st.text(max_size=12), risky_text)
small_floats = st.floats(min_value=-3, max_value=3, allow_nan=False)
EDGES = [0, 1, -1, 2, 16, 17, 0.0, -0.0, 1.0, 2.0000001, -2.0000001, 1e-300, 1e308,
         I64 - 1, I64, -I64, -I64 - 1, 2**70, True, False, None, "", "1", "0.5", [], {},
         [1], ["a"], [""], [[1]], {"include_usage": True}, {"5": 1}, float("nan"),
         float("inf")]  # fmt: skip
junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.text(alphabet=st.characters(categories=["Cs", "Lo", "So"]), max_size=4)
    | st.sampled_from(EDGES),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
# Junk that is still strict JSON text (for keys the engines ignore).
json_safe = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
# Values just past the limits of the numeric fields (0, 1, 2, -1, -2, int64, 16 = the
# completions max_tokens default), plus the edges and junk above.
BOUNDARIES = [-2.0000001, -2, -1.5, -1, -0.5, -1e-9, 0, 1e-9, 0.5, 1, 1.0000001, 2,
              2.0000001, 3, 16, 17, I64 - 1, I64, -I64, -I64 - 1]  # fmt: skip
near_misses = (
    st.sampled_from(BOUNDARIES) | st.sampled_from(EDGES) | st.floats(-5, 5) | st.booleans() | junk
)
token_list = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)
VALID_COMMON: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.none() | st.floats(0, 2),
    "top_p": st.floats(0, 1, exclude_min=True),
    "top_k": st.integers(-1, 100),
    "min_p": st.floats(0, 1),
    "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.integers(-2, 2),
    "repetition_penalty": st.floats(0.01, 10),
    "seed": st.none() | st.integers(-I64, I64 - 1),
    "stop": st.none() | st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, VOCAB), max_size=3),
    "max_tokens": st.none() | st.integers(1, 64),
    "min_tokens": st.integers(0, 4),
    "stream": st.none() | st.booleans(),
    "ignore_eos": st.booleans(),
    "logit_bias": st.dictionaries(st.integers(0, VOCAB - 1).map(str), small_floats, max_size=2),
    "allowed_token_ids": token_list,
    "user": text,
    "best_of": st.none() | st.just(1),
    "prompt_logprobs": st.none(),
    "cache_salt": st.text(alphabet="abc-_0", min_size=1, max_size=10),
    "x_unknown_field": json_safe,
}
VALID_COMPLETIONS = {
    **VALID_COMMON,
    "echo": st.sampled_from([None, False]),
    "logprobs": st.none(),
    "n": st.just(1),
    "suffix": st.none() | text,
}
VALID_CHAT = {
    **VALID_COMMON,
    "logprobs": st.sampled_from([None, False]),
    "top_logprobs": st.sampled_from([None, 0]),
    "n": st.sampled_from([None, 1]),
    "echo": st.booleans(),
    "max_completion_tokens": st.none() | st.integers(1, 64),
    "continue_final_message": st.booleans(),
}
KNOWN_KEYS = sorted(
    {*CHAT_RULES, *COMPLETIONS_RULES, "model", "prompt", "messages", "kv_transfer_params"}
)
content = (
    st.none()
    | mostly(st.text(max_size=20), risky_text)
    | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": content}
)


def _consistent(route: str, body: dict[str, Any]) -> dict[str, Any]:
    """Make a drawn body satisfy vLLM's cross-field rules."""
    if body.get("stream") is True:
        body["stream_options"] = {"include_usage": bool(len(body) % 2)}
    if route == CHAT and body.get("continue_final_message"):
        body["add_generation_prompt"] = False
    return body


@st.composite
def valid_body(draw: st.DrawFn, route: str) -> dict[str, Any]:
    if route == CHAT:
        base: dict[str, Any] = {
            "model": MODEL,
            "messages": draw(st.lists(message, min_size=1, max_size=3)),
        }
        optional = VALID_CHAT
    else:
        words = mostly(st.text(min_size=1, max_size=30), risky_text)
        prompt = draw(words | token_list | token_list.map(lambda t: [t]))
        base, optional = {"model": MODEL, "prompt": prompt}, VALID_COMPLETIONS
    keys = draw(st.sets(st.sampled_from(sorted(optional)), max_size=6))
    base.update({k: draw(optional[k]) for k in sorted(keys)})
    return _consistent(route, base)


@st.composite
def mutated_body(draw: st.DrawFn, route: str) -> dict[str, Any]:
    body = draw(valid_body(route))
    if draw(st.integers(0, 5)) == 0:  # a string model the engines may not serve: 404
        body["model"] = draw(st.sampled_from([MODEL, MODEL.upper(), MODEL + " ", "gpt-4"]) | text)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KNOWN_KEYS) | st.text(max_size=8))
        if key in body and draw(st.booleans()):
            del body[key]
        else:
            body[key] = draw(near_misses)
    return body


def perturbations(value: Any) -> st.SearchStrategy[Any]:
    """Values near a valid one: shifted past a bound, negated, emptied, one token id
    past the vocabulary. Generic on purpose: the generator knows no field's rule."""
    if type(value) in (int, float):
        return st.sampled_from([value - 3, value + 3, -value - 1, value * 10 + 1, value + 0.5])
    if type(value) is str:
        return st.sampled_from(["", value + "\ud800"])
    if type(value) is list:
        return st.sampled_from([[], [*value, VOCAB], [*value, -1], [*value, ""], [value]])
    if type(value) is dict:
        return st.sampled_from([{}, {**value, str(VOCAB): 1}, {"include_usage": True}])
    return near_misses


@st.composite
def one_field_wrong(draw: st.DrawFn, route: str) -> dict[str, Any]:
    """A valid body with one field set to a near miss: the sharpest test of each rule,
    since nothing else in the body is wrong."""
    body = draw(valid_body(route))
    valid = VALID_CHAT if route == CHAT else VALID_COMPLETIONS
    keys = sorted({*valid, *(CHAT_RULES if route == CHAT else COMPLETIONS_RULES)})
    key = draw(st.sampled_from(keys))
    if key in valid and draw(st.booleans()):
        body[key] = draw(valid[key].flatmap(perturbations))
    else:
        body[key] = draw(near_misses)
    if route == COMPLETIONS and draw(st.integers(0, 5)) == 0:
        body["prompt"] = draw(valid_body(route))["prompt"]
        body["prompt"] = draw(perturbations(body["prompt"]))
    return body


@dataclass
class Case:
    mode: str
    route: str
    body: Any  # what the bytes were made from (None: raw bytes); the oracle reads raw
    raw: bytes


NOT_JSON = object()


def as_sent(raw: bytes) -> Any:
    """What the bytes say, as a JSON reader sees them: ``"\\ud800\\udc00"`` is one
    character (an escaped pair), and bytes that are not UTF-8 are not JSON text."""
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return NOT_JSON


def encode(body: Any, ascii_only: bool) -> bytes:
    return json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@st.composite
def cases(draw: st.DrawFn) -> Case:
    mode = draw(st.sampled_from(["push", "pull"]))
    route = draw(st.sampled_from([COMPLETIONS, CHAT]))
    kinds = ["valid", "valid", "one", "one", "one", "one", "mutated", "junk", "bytes"]
    kind = draw(st.sampled_from(kinds))
    if kind == "bytes":
        raw = draw(st.binary(max_size=64) | valid_body(route).map(lambda b: encode(b, True)[:-3]))
        return Case(mode, route, None, raw)
    if kind == "junk":
        body = draw(junk)
    elif kind == "valid":
        body = draw(valid_body(route))
    elif kind == "one":
        body = draw(one_field_wrong(route))
    else:
        body = draw(mutated_body(route))
    # Mostly \u-escaped (ASCII) JSON; raw UTF-8 otherwise, where a lone surrogate makes
    # the bytes themselves invalid.
    return Case(mode, route, body, encode(body, draw(st.integers(0, 3)) > 0))


# ================================================================================ rig
@dataclass
class Rigs:
    """A proxy per mode on one event loop (short repr: Hypothesis prints its arguments)."""

    loop: asyncio.AbstractEventLoop
    by_mode: dict[str, Rig]

    def __repr__(self) -> str:
        return "Rigs(push, pull)"


@pytest.fixture(scope="module")
def rigs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rigs]:
    """A proxy per mode in front of stubs whose /v1/models reports a model directory."""
    model_dir = tmp_path_factory.mktemp("model")
    (model_dir / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    started: dict[str, Rig] = {}

    async def start() -> None:
        for mode in ("push", "pull"):
            stubs = [
                StubEngine(role, mode=mode, model_root=str(model_dir))
                for role in ("prefill", "decode")
            ]
            started[mode] = await stack.enter_async_context(proxy_rig(mode, stubs[:1], stubs[1:]))

    loop.run_until_complete(start())
    try:
        yield Rigs(loop, started)
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


async def _until(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.005)


def _engine_side_problem(route: str, body: dict[str, Any], mode: str) -> str | None:
    """What is wrong with a leg body an engine received (its kv params aside)."""
    client_part = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    try:
        validate_client_body(route, client_part, mode)
        check_token_ids(route, client_part, VOCAB)
    except Exception as exc:
        return f"the proxy's own validation refuses it: {exc}"
    return vllm_refuses(route, client_part)


async def check(rig: Rig, case: Case) -> None:
    p, d = rig.prefill[0], rig.decode[0]
    before = (len(p.requests), len(d.requests))
    resp = await rig.client.post(
        case.route, data=case.raw, headers={"Content-Type": "application/json"}
    )
    text = await resp.text()
    assert resp.status < 500, text
    expected = vllm_refuses(case.route, as_sent(case.raw))
    event(f"{resp.status} ({expected or 'valid'})")  # pytest --hypothesis-show-statistics
    if resp.status >= 400:
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        param, message = error["param"], error["message"]
        assert param is None or (type(param) is str and param in message), error
        if param is None:
            assert "request body" in message, error
        assert (len(p.requests), len(d.requests)) == before, "an engine saw a refused request"
        assert expected is not None, f"valid body refused: {error}"
        return
    assert resp.status == 200
    assert expected is None, f"invalid body ({expected}) reached the engines"
    await _until(lambda: len(p.requests) > before[0] and len(d.requests) > before[1])
    for leg in (*p.requests[before[0] :], *d.requests[before[1] :]):
        problem = _engine_side_problem(leg.path, leg.body, rig.config.mode)
        assert problem is None, f"{leg.path} got {leg.body!r}: {problem}"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ in the checkout; failures print their reproducer
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_proxy_answers_every_body_safely(rigs: Rigs, case: Case) -> None:
    rigs.loop.run_until_complete(asyncio.wait_for(check(rigs.by_mode[case.mode], case), 30))
