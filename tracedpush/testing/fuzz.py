"""The proxy's request schema as Hypothesis strategies, with an independent oracle.

Shared by the fuzz test against stub engines (tests/unit/test_proxy_fuzz.py) and the one
against real vLLM engines (tests/e2e/test_fuzz_engines.py): both need the same bodies
and the same judgement, for a different served model and vocabulary. So everything that
depends on those is built by :class:`RequestSchema`::

    schema = RequestSchema("tiny-qwen2", vocab=512, max_tokens=8)
    @given(case=schema.cases(modes=("push",)))
    def test(case): ... schema.refuses(case.route, as_sent(case.raw)) ...

The oracle (:meth:`RequestSchema.refuses`) is written from vLLM 0.32's request models
(``CompletionRequest``, ``ChatCompletionRequest``, ``SamplingParams._verify_args``),
taking JSON types strictly, plus what cannot work through P/D; it shares no code with
tracedpush/proxy/fields.py, so a rule the proxy gets wrong is not also wrong here.
Nested structures the engines validate themselves (tools, response formats, content
parts) are judged by JSON type only, as the proxy does: a real engine may still refuse
a body the oracle accepts (its 4xx is relayed).

Needs Hypothesis (the ``dev`` extra) but not vLLM: the stub-engine fuzz runs without it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
I64 = 2**63


# ======================================================================= predicates
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


def is_bool(v: Any) -> bool:
    return type(v) is bool


def good_salt(v: Any) -> bool:
    return type(v) is str and 1 <= len(v) <= 128 and not any(c in v for c in "@/\\\x00")


def good_stream_options(v: Any) -> bool:
    return type(v) is dict and all(
        v.get(k) is None or type(v[k]) is bool for k in ("include_usage", "continuous_usage_stats")
    )


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


def parts_ok(content: Any) -> bool:
    return type(content) is list and all(
        type(p) is dict and type(p.get("type")) is str for p in content
    )


# ================================================ strategies that know no model or vocabulary
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
content = (
    st.none()
    | mostly(st.text(max_size=20), risky_text)
    | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2)
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": content}
)


# ============================================================================= cases
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


# ============================================================ the schema, per deployment
class RequestSchema:
    """The oracle and the body strategies for one served model and vocabulary.

    ``model`` is the name the engines serve (anything else is a 404); ``vocab`` the
    number of token ids (0 to vocab-1) the model accepts. ``max_tokens`` None draws
    valid limits up to 64 and leaves bodies without one (stub engines generate nothing);
    an int draws them up to it and gives every generated body that has no integer limit
    one (chat's default is the rest of the context), so that real engines stay cheap.
    """

    def __init__(self, model: str, vocab: int, max_tokens: int | None = None) -> None:
        self.model, self.vocab, self.max_tokens = model, vocab, max_tokens
        self.rules = self._rules()
        self.completions_rules: dict[str, Callable[[Any], bool]] = {
            **self.rules,
            "n": lambda v: is_int(v) and v == 1,
            "suffix": nullable(lambda v: type(v) is str),
            "echo": lambda v: v is None or v is False,
            "logprobs": lambda v: v is None,  # vLLM reads false as 0: sampled token's logprob
        }
        self.chat_rules: dict[str, Callable[[Any], bool]] = {
            **self.rules,
            "n": lambda v: v is None or (is_int(v) and v == 1),
            "max_completion_tokens": nullable(lambda v: in_i64(v) and v >= 1),
            "echo": lambda v: v is None or v is False,  # fields.WHY_PD_CHAT
            "add_generation_prompt": is_bool,
            "continue_final_message": is_bool,
            "tools": nullable(lambda v: type(v) is list and all(type(t) is dict for t in v)),
            "tool_choice": nullable(lambda v: type(v) in (str, dict)),
            "logprobs": lambda v: v is None or v is False,
            "top_logprobs": lambda v: v is None or v is False or (is_int(v) and v == 0),
        }
        self._strategies()

    def __repr__(self) -> str:  # Hypothesis prints strategies built from it
        return f"RequestSchema({self.model!r}, {self.vocab}, max_tokens={self.max_tokens})"

    # ------------------------------------------------------------------------ oracle
    def token_ids(self, v: Any) -> bool:
        return type(v) is list and len(v) > 0 and all(is_int(t) and 0 <= t < self.vocab for t in v)

    def good_bias(self, v: Any) -> bool:
        return type(v) is dict and all(
            k.isascii() and k.isdigit() and int(k) < self.vocab and is_num(b) for k, b in v.items()
        )

    def _rules(self) -> dict[str, Callable[[Any], bool]]:
        """Both routes: each key's predicate on a present value (null included)."""
        return {
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
            "use_beam_search": lambda v: v is False,  # true: vLLM's beam requests, no KV
            "logit_bias": nullable(self.good_bias),
            "allowed_token_ids": nullable(self.token_ids),
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

    def refuses(self, route: str, body: Any) -> str | None:
        """Why vLLM (or P/D) would not take ``body``; None when it would."""
        if type(body) is not dict:
            return "not an object"
        if not numbers_finite(body):
            return "NaN/Infinity is not JSON"
        for s in strings_in(body):
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                return "lone surrogate"
        if "kv_transfer_params" in body:
            return "kv_transfer_params is the proxy's"
        if body.get("model") != self.model:
            return "model"
        if route == CHAT:
            messages = body.get("messages")
            if type(messages) is not list or not messages:
                return "messages"
            for m in messages:
                if type(m) is not dict or type(m.get("role")) is not str:
                    return "message"
                c = m.get("content")
                if c is None and "content" in m and m["role"] != "assistant":
                    return "content"  # null: an assistant's only (vLLM's message models)
                if not (c is None or type(c) is str or parts_ok(c)):
                    return "content"
            rules = self.chat_rules
        else:
            prompt = body.get("prompt")
            one = prompt[0] if type(prompt) is list and len(prompt) == 1 else None
            ok_one = (type(one) is str and one != "") or self.token_ids(one)
            if not ((type(prompt) is str and prompt) or self.token_ids(prompt) or ok_one):
                return "prompt"
            rules = self.completions_rules
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

    # -------------------------------------------------------------------- strategies
    def _strategies(self) -> None:
        vocab, top = self.vocab, self.max_tokens or 64
        self.token_list = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8)
        common: dict[str, st.SearchStrategy[Any]] = {
            "temperature": st.none() | st.floats(0, 2),
            "top_p": st.floats(0, 1, exclude_min=True),
            "top_k": st.integers(-1, 100),
            "min_p": st.floats(0, 1),
            "frequency_penalty": st.floats(-2, 2),
            "presence_penalty": st.integers(-2, 2),
            "repetition_penalty": st.floats(0.01, 10),
            "seed": st.none() | st.integers(-I64, I64 - 1),
            "stop": st.none()
            | st.text(min_size=1, max_size=5)
            | st.lists(st.text(min_size=1), max_size=3),
            "stop_token_ids": st.lists(st.integers(0, vocab), max_size=3),
            "max_tokens": st.none() | st.integers(1, top),
            "min_tokens": st.integers(0, 4),
            "stream": st.none() | st.booleans(),
            "ignore_eos": st.booleans(),
            "logit_bias": st.dictionaries(
                st.integers(0, vocab - 1).map(str), small_floats, max_size=2
            ),
            "allowed_token_ids": self.token_list,
            "user": text,
            "best_of": st.none() | st.just(1),
            "prompt_logprobs": st.none(),
            "cache_salt": st.text(alphabet="abc-_0", min_size=1, max_size=10),
            "x_unknown_field": json_safe,
        }
        self.valid_completions: dict[str, st.SearchStrategy[Any]] = {
            **common,
            "echo": st.sampled_from([None, False]),
            "logprobs": st.none(),
            "n": st.just(1),
            "suffix": st.none() | text,
        }
        self.valid_chat: dict[str, st.SearchStrategy[Any]] = {
            **common,
            "logprobs": st.sampled_from([None, False]),
            "top_logprobs": st.sampled_from([None, 0]),
            "n": st.sampled_from([None, 1]),
            "echo": st.booleans(),
            "max_completion_tokens": st.none() | st.integers(1, top),
            "continue_final_message": st.booleans(),
        }
        self.known_keys = sorted(
            {
                *self.chat_rules,
                *self.completions_rules,
                *("model", "prompt", "messages", "kv_transfer_params"),
            }
        )

    def consistent(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """Make a drawn body satisfy vLLM's cross-field rules."""
        if body.get("stream") is True:
            body["stream_options"] = {"include_usage": bool(len(body) % 2)}
        if route == CHAT and body.get("continue_final_message"):
            body["add_generation_prompt"] = False
        return body

    def capped(self, route: str, body: Any) -> Any:
        """With ``max_tokens`` set: a token limit for a body that has no integer one
        (absent or null means 16 on completions and the rest of the context on chat)."""
        if self.max_tokens is None or type(body) is not dict:
            return body
        keys = ("max_tokens", "max_completion_tokens") if route == CHAT else ("max_tokens",)
        if all(body.get(k) is None for k in keys):
            body[keys[-1]] = self.max_tokens
        return body

    def valid_body(self, route: str) -> st.SearchStrategy[dict[str, Any]]:
        return _valid_body(self, route)

    def mutated_body(self, route: str) -> st.SearchStrategy[dict[str, Any]]:
        return _mutated_body(self, route)

    def one_field_wrong(self, route: str) -> st.SearchStrategy[dict[str, Any]]:
        """A valid body with one field set to a near miss: the sharpest test of each
        rule, since nothing else in the body is wrong."""
        return _one_field_wrong(self, route)

    def perturbations(self, value: Any) -> st.SearchStrategy[Any]:
        """Values near a valid one: shifted past a bound, negated, emptied, one token id
        past the vocabulary. Generic on purpose: the generator knows no field's rule."""
        if type(value) in (int, float):
            return st.sampled_from([value - 3, value + 3, -value - 1, value * 10 + 1, value + 0.5])
        if type(value) is str:
            return st.sampled_from(["", value + "\ud800"])
        if type(value) is list:
            return st.sampled_from([[], [*value, self.vocab], [*value, -1], [*value, ""], [value]])
        if type(value) is dict:
            return st.sampled_from([{}, {**value, str(self.vocab): 1}, {"include_usage": True}])
        return near_misses

    def cases(self, modes: Sequence[str] = ("push", "pull")) -> st.SearchStrategy[Case]:
        """Bodies of every kind (valid, one field wrong, mutated, junk, raw bytes) for
        both generate routes, each for one of ``modes``."""
        return _cases(self, tuple(modes))


@st.composite
def _valid_body(draw: st.DrawFn, schema: RequestSchema, route: str) -> dict[str, Any]:
    if route == CHAT:
        base: dict[str, Any] = {
            "model": schema.model,
            "messages": draw(st.lists(message, min_size=1, max_size=3)),
        }
        optional = schema.valid_chat
    else:
        words = mostly(st.text(min_size=1, max_size=30), risky_text)
        tokens = schema.token_list
        prompt = draw(words | tokens | tokens.map(lambda t: [t]))
        base, optional = {"model": schema.model, "prompt": prompt}, schema.valid_completions
    keys = draw(st.sets(st.sampled_from(sorted(optional)), max_size=6))
    base.update({k: draw(optional[k]) for k in sorted(keys)})
    return schema.consistent(route, base)


@st.composite
def _mutated_body(draw: st.DrawFn, schema: RequestSchema, route: str) -> dict[str, Any]:
    body = draw(schema.valid_body(route))
    model = schema.model
    if draw(st.integers(0, 5)) == 0:  # a string model the engines may not serve: 404
        body["model"] = draw(st.sampled_from([model, model.upper(), model + " ", "gpt-4"]) | text)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(schema.known_keys) | st.text(max_size=8))
        if key in body and draw(st.booleans()):
            del body[key]
        else:
            body[key] = draw(near_misses)
    return body


@st.composite
def _one_field_wrong(draw: st.DrawFn, schema: RequestSchema, route: str) -> dict[str, Any]:
    body = draw(schema.valid_body(route))
    chat = route == CHAT
    valid = schema.valid_chat if chat else schema.valid_completions
    keys = sorted({*valid, *(schema.chat_rules if chat else schema.completions_rules)})
    key = draw(st.sampled_from(keys))
    if key in valid and draw(st.booleans()):
        body[key] = draw(valid[key].flatmap(schema.perturbations))
    else:
        body[key] = draw(near_misses)
    if route == COMPLETIONS and draw(st.integers(0, 5)) == 0:
        body["prompt"] = draw(schema.valid_body(route))["prompt"]
        body["prompt"] = draw(schema.perturbations(body["prompt"]))
    return body


@st.composite
def _cases(draw: st.DrawFn, schema: RequestSchema, modes: tuple[str, ...]) -> Case:
    mode = draw(st.sampled_from(list(modes)))
    route = draw(st.sampled_from([COMPLETIONS, CHAT]))
    kinds = ["valid", "valid", "one", "one", "one", "one", "mutated", "junk", "bytes"]
    kind = draw(st.sampled_from(kinds))
    if kind == "bytes":
        valid = schema.valid_body(route).map(lambda b: schema.capped(route, b))
        raw = draw(st.binary(max_size=64) | valid.map(lambda b: encode(b, True)[:-3]))
        return Case(mode, route, None, raw)
    if kind == "junk":
        body = draw(junk)
    elif kind == "valid":
        body = draw(schema.valid_body(route))
    elif kind == "one":
        body = draw(schema.one_field_wrong(route))
    else:
        body = draw(schema.mutated_body(route))
    body = schema.capped(route, body)
    # Mostly \u-escaped (ASCII) JSON; raw UTF-8 otherwise, where a lone surrogate makes
    # the bytes themselves invalid.
    return Case(mode, route, body, encode(body, draw(st.integers(0, 3)) > 0))
