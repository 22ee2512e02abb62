"""What the proxy refuses before any engine sees it, end to end over HTTP.

Each case goes through a real proxy (aiohttp TestServer) in front of stub engines and
checks the status, the OpenAI error JSON (``param`` names the field, the message
says it) and that neither stub received a generate request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracedpush.proxy.app import STATE
from tracedpush.proxy.command import add_arguments, build_config
from tracedpush.proxy.models import vocab_size_of
from tracedpush.testing.stub_engine import Rig, StubEngine, proxy_rig

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPT = {"model": "stub-model", "prompt": "a b c", "max_tokens": 4}
MESSAGES = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
VOCAB = 1000


def run(scenario: Callable[[], Any], limit: float = 30) -> None:
    asyncio.run(asyncio.wait_for(scenario(), limit))


def model_dir(tmp_path: Path, vocab: int = VOCAB) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    return tmp_path


def untouched(rig: Rig) -> bool:
    return not any(stub.requests for stub in (*rig.prefill, *rig.decode))


async def refused(
    rig: Rig, route: str, *, json_body: Any = None, data: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    if data is None:
        resp = await rig.client.post(route, json=json_body)
    else:
        resp = await rig.client.post(route, data=data)
    assert resp.content_type == "application/json", await resp.text()
    error = (await resp.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert untouched(rig), "an engine received a refused request"
    return resp.status, error


# ----------------------------------------------------------- fields and P/D features
FIELD_CASES = [
    # (route, extra keys, param, words the message must hold)
    (COMPLETIONS, {"n": 2}, "n", "paired by request id"),
    (COMPLETIONS, {"n": None}, "n", "must be 1"),
    (COMPLETIONS, {"best_of": 3}, "best_of", "P/D"),
    (COMPLETIONS, {"echo": True}, "echo", "discards its answer"),
    (COMPLETIONS, {"logprobs": 0}, "logprobs", "discards its answer"),
    (COMPLETIONS, {"logprobs": False}, "logprobs", "P/D"),  # vLLM reads false as 0: on
    (COMPLETIONS, {"prompt_logprobs": 1}, "prompt_logprobs", "recomputes the whole prompt"),
    (CHAT, {"echo": True}, "echo", "recompute the whole prompt"),
    (CHAT, {"logprobs": True}, "logprobs", "KV"),
    (CHAT, {"top_logprobs": 2}, "top_logprobs", "KV"),
    (CHAT, {"prompt_logprobs": 0}, "prompt_logprobs", "recomputes"),
    (COMPLETIONS, {"temperature": "0.5"}, "temperature", "number"),
    (COMPLETIONS, {"temperature": 2.5}, "temperature", "[0, 2]"),
    (CHAT, {"top_p": 0}, "top_p", "(0, 1]"),
    (COMPLETIONS, {"top_k": -2}, "top_k", ">= -1"),
    (COMPLETIONS, {"frequency_penalty": True}, "frequency_penalty", "number"),
    (COMPLETIONS, {"repetition_penalty": 0}, "repetition_penalty", "number"),
    (COMPLETIONS, {"max_tokens": 3.0}, "max_tokens", "integer"),
    (CHAT, {"max_completion_tokens": "8"}, "max_completion_tokens", "integer"),
    (COMPLETIONS, {"seed": 2**63}, "seed", "64-bit"),
    (COMPLETIONS, {"seed": "42"}, "seed", "integer"),
    (COMPLETIONS, {"stop": ["a", 1]}, "stop", "strings"),
    (COMPLETIONS, {"stop": ""}, "stop", "non-empty"),
    (CHAT, {"stop_token_ids": [1, "2"]}, "stop_token_ids", "integers"),
    (COMPLETIONS, {"stream": "yes"}, "stream", "true or false"),
    (COMPLETIONS, {"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    (COMPLETIONS, {"stream": True, "stream_options": []}, "stream_options", "object"),
    (COMPLETIONS, {"min_tokens": 20, "max_tokens": None}, "min_tokens", "16"),  # default
    (CHAT, {"min_tokens": 9, "max_completion_tokens": 8}, "min_tokens", "8"),
    (CHAT, {"min_tokens": None}, "min_tokens", "null"),
    (COMPLETIONS, {"ignore_eos": 1}, "ignore_eos", "true or false"),
    (COMPLETIONS, {"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
    (COMPLETIONS, {"allowed_token_ids": []}, "allowed_token_ids", "non-empty"),
    (COMPLETIONS, {"cache_salt": "a/b"}, "cache_salt", "128"),
    (COMPLETIONS, {"user": 5}, "user", "string"),
    (CHAT, {"continue_final_message": True}, "continue_final_message", "add_generation_prompt"),
    (CHAT, {"tools": "none"}, "tools", "objects"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages", "content"),
    # P answers vLLM's beam requests without kv_transfer_params (found by the engine fuzz)
    (COMPLETIONS, {"use_beam_search": True}, "use_beam_search", "'-beam'"),
    (CHAT, {"use_beam_search": True}, "use_beam_search", "P/D disaggregation"),
    # vLLM takes a null content on an assistant message only (found by the engine fuzz)
    (CHAT, {"messages": [{"role": "user", "content": None}]}, "messages", "only on an assistant"),
    (COMPLETIONS, {"prompt": [1, -2]}, "prompt", "token ids"),
    (COMPLETIONS, {"kv_transfer_params": {}}, "kv_transfer_params", "must not be sent"),
]


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_each_bad_field_is_a_400_naming_it_and_no_engine_sees_it(mode):
    async def scenario():
        async with proxy_rig(mode) as rig:
            for route, extra, param, words in FIELD_CASES:
                body = (MESSAGES if route == CHAT else PROMPT) | extra
                status, error = await refused(rig, route, json_body=body)
                assert (status, error["param"]) == (400, param), (extra, error)
                assert f"'{param}" in error["message"] and words in error["message"], error
                assert error["type"] == "invalid_request_error"

    run(scenario)


def test_valid_requests_with_many_fields_pass():
    """The checks refuse nothing vLLM takes that works through P/D."""

    async def scenario():
        async with proxy_rig("push") as rig:
            common = {
                "temperature": 0,
                "top_p": 1,
                "top_k": -1,
                "min_p": 0.1,
                "seed": -(2**63),
                "stop": ["\n", "END"],
                "stop_token_ids": [2],
                "frequency_penalty": -2,
                "presence_penalty": 2.0,
                "repetition_penalty": 1.1,
                "logit_bias": {"5": -100},
                "min_tokens": 2,
                "max_tokens": 4,
                "user": "u",
                "n": 1,
                "best_of": 1,
                "prompt_logprobs": None,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                "cache_salt": "salt",
                "some_future_field": {"anything": [1, None]},
            }
            completions = PROMPT | common | {"echo": False, "logprobs": None, "prompt": [1, 2]}
            chat = MESSAGES | common | {"echo": False, "logprobs": False, "top_logprobs": 0}
            chat["messages"] = [
                {"role": "system", "content": "be brief"},
                {"role": "assistant", "content": None},
                {"role": "user"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ]
            for route, body in ((COMPLETIONS, completions), (CHAT, chat)):
                resp = await rig.client.post(route, json=body)
                assert resp.status == 200, await resp.text()
                await resp.read()
            assert len(rig.decode[0].requests) == 2

    run(scenario)


# --------------------------------------------------------------------- JSON and size
@pytest.mark.parametrize(
    ("raw", "param", "words"),
    [
        (b"{not json", None, "not valid JSON"),
        (b'{"model": "stub-model", "prompt": "a", "temperature": NaN}', None, "NaN"),
        (b'{"model": "stub-model", "prompt": "a", "temperature": 1e999}', None, "out of range"),
        (b"[1, 2]", None, "JSON object"),
        (b"[" * 5000 + b"]" * 5000, None, "nests too deeply"),
        (b'{"model": "stub-model", "prompt": "a", "x": ' + b"[" * 150 + b"]" * 150 + b"}", "x",
         "nests deeper"),
        (b'{"model": "stub-model", "prompt": "a\\ud800"}', "prompt", "surrogate"),
        (b'{"model": "stub-model", "prompt": "a\xed\xa0\x80"}', None, "not UTF-8"),  # found by fuzz
        (b'{"model": "stub-model", "prompt": "a", "seed": ' + b"9" * 5000 + b"}", None, "digits"),
    ],
)  # fmt: skip
def test_malformed_json_is_a_400_and_no_engine_sees_it(raw, param, words):
    async def scenario():
        async with proxy_rig("push") as rig:
            status, error = await refused(rig, COMPLETIONS, data=raw)
            assert (status, error["param"]) == (400, param)
            assert words in error["message"]
            assert "request body" in error["message"] or f"'{param}'" in error["message"]

    run(scenario)


def test_oversized_body_is_our_413_naming_the_limit():
    async def scenario():
        async with proxy_rig("pull", max_body_bytes=1000) as rig:
            body = PROMPT | {"prompt": "x" * 2000}
            status, error = await refused(rig, COMPLETIONS, json_body=body)
            assert (status, error["code"], error["param"]) == (413, 413, None)
            assert "request body" in error["message"] and "1000 bytes" in error["message"]
            assert "--max-body-bytes" in error["message"]

            async def chunks():  # no Content-Length: aiohttp counts while reading
                for _ in range(4):
                    yield b"y" * 400

            status, error = await refused(rig, COMPLETIONS, data=chunks())
            assert status == 413 and "1000 bytes" in error["message"]
            # Just under the limit passes.
            ok = await rig.client.post(COMPLETIONS, json=PROMPT | {"prompt": "x" * 900})
            assert ok.status == 200

    run(scenario)


# ------------------------------------------------------------------------ vocabulary
def test_out_of_vocabulary_token_ids_are_refused_with_the_vocab_from_the_model_dir(tmp_path):
    async def scenario():
        root = str(model_dir(tmp_path))
        prefill, decode = (
            StubEngine("prefill", model_root=root),
            StubEngine("decode", model_root=root),
        )
        async with proxy_rig("push", [prefill], [decode]) as rig:
            for key, body in [
                ("prompt", PROMPT | {"prompt": [1, VOCAB - 1, VOCAB]}),
                ("prompt", PROMPT | {"prompt": [[VOCAB + 5]]}),
                ("allowed_token_ids", PROMPT | {"allowed_token_ids": [VOCAB]}),
                ("logit_bias", PROMPT | {"logit_bias": {str(VOCAB): 1}}),
            ]:
                status, error = await refused(rig, COMPLETIONS, json_body=body)
                assert (status, error["param"]) == (400, key)
                assert (
                    "out of vocabulary" in error["message"]
                    and f"{VOCAB} token ids" in (error["message"])
                )
            resp = await rig.client.post(COMPLETIONS, json=PROMPT | {"prompt": [0, VOCAB - 1]})
            assert resp.status == 200

    run(scenario)


def test_vocab_flag_wins_and_unknown_vocab_skips_the_check(tmp_path):
    async def scenario():
        async with proxy_rig("pull", vocab_size=10) as rig:  # stubs report no root
            status, error = await refused(rig, COMPLETIONS, json_body=PROMPT | {"prompt": [10]})
            assert status == 400 and "10 token ids" in error["message"]
        async with proxy_rig("pull") as rig:  # no flag, no readable root: no check
            resp = await rig.client.post(COMPLETIONS, json=PROMPT | {"prompt": [10**9]})
            assert resp.status == 200

    run(scenario)


def test_vocab_size_is_the_larger_of_config_and_tokenizer(tmp_path):
    model_dir(tmp_path, 100)
    assert vocab_size_of(tmp_path) == 100
    tokenizer = {"model": {"vocab": {"a": 0, "b": 99}}, "added_tokens": [{"id": 104}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert vocab_size_of(tmp_path) == 105
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {"130": {"content": "<x>"}}})
    )
    assert vocab_size_of(tmp_path) == 131
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 200}}))
    assert vocab_size_of(tmp_path) == 200
    (tmp_path / "config.json").write_text("{}")
    assert vocab_size_of(tmp_path) is None  # no model vocabulary: unknown, not guessed
    assert vocab_size_of(tmp_path / "missing") is None


# ---------------------------------------------------------------------------- models
def test_unknown_model_is_a_404_model_not_found_listing_the_served_ones():
    async def scenario():
        prefill = StubEngine("prefill", models=("stub-model", "other"))
        decode = StubEngine("decode", models=("stub-model", "lora-a"))
        async with proxy_rig("push", [prefill], [decode]) as rig:
            for name in ("missing", "other", "lora-a"):  # served by one role only: unusable
                status, error = await refused(rig, CHAT, json_body=MESSAGES | {"model": name})
                assert (status, error["param"], error["code"]) == (404, "model", "model_not_found")
                assert f"'{name}'" in error["message"] and "'stub-model'" in error["message"]
            resp = await rig.client.post(CHAT, json=MESSAGES)
            assert resp.status == 200
            # One refresh for the first miss; the misses after it within the TTL reuse it.
            assert (prefill.models_asked, decode.models_asked) == (1, 1)

    run(scenario)


def test_a_model_added_later_is_found_after_the_ttl():
    async def scenario():
        decode = StubEngine("decode", models=("stub-model",))
        async with proxy_rig("pull", decode=[decode], model_cache_ttl=0.2) as rig:
            body = PROMPT | {"model": "new-lora"}
            assert (await refused(rig, COMPLETIONS, json_body=body))[0] == 404
            decode.models = ("stub-model", "new-lora")
            rig.prefill[0].models = decode.models
            assert (await refused(rig, COMPLETIONS, json_body=body))[0] == 404  # within TTL
            await asyncio.sleep(0.25)
            assert (await rig.client.post(COMPLETIONS, json=body)).status == 200

    run(scenario)


def test_models_are_not_checked_when_the_engines_cannot_be_asked_or_with_the_flag_off():
    async def scenario():
        stubs = (
            [StubEngine("prefill", models_status=500)],
            [StubEngine("decode", models_status=401)],
        )
        async with proxy_rig("pull", *stubs) as rig:
            resp = await rig.client.post(COMPLETIONS, json=PROMPT | {"model": "anything"})
            assert resp.status == 200  # the engines refuse it themselves if they must
        async with proxy_rig("pull", model_check=False) as rig:
            resp = await rig.client.post(COMPLETIONS, json=PROMPT | {"model": "anything"})
            assert resp.status == 200
            assert rig.decode[0].models_asked == 0
            assert rig.client.app[STATE].models.refreshes == 0

    run(scenario)


def test_the_catalog_is_learnt_at_start_so_no_request_waits_for_it(tmp_path):
    """The proxy asks the engines' /v1/models and reads the model's vocabulary as it
    starts (its /health waits for that): requests then pay no catalog lookup and get no
    ``proxy.models`` span."""

    async def scenario():
        root = str(model_dir(tmp_path))
        stubs = [StubEngine("prefill", model_root=root)], [StubEngine("decode", model_root=root)]
        async with proxy_rig("pull", *stubs, ready=False) as rig:
            assert (await rig.client.get("/health")).status == 200
            assert rig.client.app[STATE].models.refreshes == 1  # learnt before /health said ok
            for _ in range(3):
                assert (await rig.client.post(COMPLETIONS, json=PROMPT)).status == 200
            assert (rig.prefill[0].models_asked, rig.decode[0].models_asked) == (1, 1)
            assert len(rig.spans("tracedpush.request")) == 3
            assert rig.spans("proxy.models") == []
            # the vocabulary was read at start too: an id past it is refused, unasked
            resp = await rig.client.post(COMPLETIONS, json=PROMPT | {"prompt": [VOCAB]})
            assert (resp.status, (await resp.json())["error"]["param"]) == (400, "prompt")
            assert len(rig.prefill[0].requests) == 3 and rig.spans("proxy.models") == []

    run(scenario)


@pytest.mark.parametrize("knows_key", [True, False])
def test_the_start_up_catalog_asks_engines_with_a_key_with_vllm_api_key(knows_key):
    """Engines started with --api-key refuse an unkeyed /v1/models (401). The proxy's
    start-up lookup sends the key in VLLM_API_KEY (the engines' own variable), so no
    request waits for the catalog; without it, the first request (with its client's
    key) looks the catalog up and shows the wait as ``proxy.models``."""

    async def scenario():
        stubs = [StubEngine("prefill", api_key="k3y")], [StubEngine("decode", api_key="k3y")]
        key = "k3y" if knows_key else None
        async with proxy_rig("pull", *stubs, ready=False, engine_api_key=key) as rig:
            assert (await rig.client.get("/health")).status == 200
            auth = {"Authorization": "Bearer k3y"}
            for _ in range(2):
                resp = await rig.client.post(COMPLETIONS, json=PROMPT, headers=auth)
                assert resp.status == 200
            assert len(rig.spans("proxy.models")) == (0 if knows_key else 1)
            assert rig.client.app[STATE].models.refreshes == (1 if knows_key else 2)
            other = PROMPT | {"model": "other"}
            resp = await rig.client.post(COMPLETIONS, json=other, headers=auth)
            assert resp.status == 404  # the catalog is known either way: the check holds

    run(scenario)


@pytest.mark.parametrize("answered", [True, False])
def test_a_request_that_waits_for_the_catalog_says_so_in_a_span(answered):
    """A request that came before the start-up lookup finished (D slow to list its
    models), or while the engines could not be asked, waited for the catalog: that wait
    is a ``proxy.models`` span under its root (the critical path's `model lookup`), not
    the proxy's own time."""

    async def scenario():
        status = 200 if answered else 500
        stubs = (
            [StubEngine("prefill", models_status=status)],
            [StubEngine("decode", models_status=status, models_delay=0.3)],
        )
        async with proxy_rig("pull", *stubs, ready=False) as rig:
            if not answered:  # the start-up lookup failed: the next request asks again
                await asyncio.wait({rig.client.app[STATE].models_warm}, timeout=5)
            assert (await rig.client.post(COMPLETIONS, json=PROMPT)).status == 200
            (root,) = rig.spans("tracedpush.request")
            (models,) = rig.spans("proxy.models")
            assert models.parent.span_id == root.context.span_id
            assert models.context.trace_id == root.context.trace_id
            assert 0.25e9 <= models.end_time - models.start_time < 5e9
            assert models.attributes["tracedpush.models.fetched"] is True
            assert models.attributes["tracedpush.models.answered"] is answered
            (leg,) = rig.spans("proxy.prefill")
            assert root.start_time <= models.start_time and models.end_time <= leg.start_time
            assert rig.decode[0].models_asked == (1 if answered else 2)
            # the next request finds the catalog (or, unanswered, its last try within
            # the TTL) and does not wait
            assert (await rig.client.post(COMPLETIONS, json=PROMPT)).status == 200
            assert len(rig.spans("proxy.models")) == 1

    run(scenario)


# ---------------------------------------------------------------------------- routes
def test_unknown_route_is_a_json_404_listing_the_routes_and_wrong_method_a_405():
    async def scenario():
        async with proxy_rig("pull") as rig:
            resp = await rig.client.post("/v1/responses", json=PROMPT)
            error = (await resp.json())["error"]
            assert resp.status == 404 and "/v1/responses" in error["message"]
            for route in ("POST /v1/completions", "POST /v1/chat/completions", "GET /health"):
                assert route in error["message"]
            resp = await rig.client.get(COMPLETIONS)
            error = (await resp.json())["error"]
            assert resp.status == 405 and resp.headers["Allow"] == "POST"
            assert "GET /v1/completions" in error["message"] and "POST" in error["message"]
            assert untouched(rig)
            assert (await rig.client.get("/health")).status == 200  # known routes unchanged

    run(scenario)


# ----------------------------------------------------------------------------- flags
def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--mode", "pull", "--prefill", "http://p:1", "--decode",
                              "http://d:2", *argv])  # fmt: skip


def test_input_flags_and_their_environment_fallbacks(monkeypatch, tmp_path):
    config = build_config(parse())
    assert config.max_body_bytes == 64 * 1024 * 1024
    assert config.vocab_size is None and config.model_check is True
    config = build_config(
        parse("--max-body-bytes", "5000", "--vocab-size", "77", "--no-model-check")
    )
    assert (config.max_body_bytes, config.vocab_size, config.model_check) == (5000, 77, False)
    assert build_config(parse("--model-dir", str(model_dir(tmp_path, 321)))).vocab_size == 321
    monkeypatch.setenv("TRACEDPUSH_PROXY_MAX_BODY_BYTES", "123")
    monkeypatch.setenv("TRACEDPUSH_PROXY_VOCAB_SIZE", "45")
    monkeypatch.setenv("TRACEDPUSH_PROXY_MODEL_CHECK", "0")
    config = build_config(parse())
    assert (config.max_body_bytes, config.vocab_size, config.model_check) == (123, 45, False)
    with pytest.raises(ValueError, match="--model-dir"):
        monkeypatch.delenv("TRACEDPUSH_PROXY_VOCAB_SIZE")
        build_config(parse("--model-dir", str(tmp_path / "nothing")))
    with pytest.raises(ValueError, match="--max-body-bytes"):
        build_config(parse("--max-body-bytes", "0"))
