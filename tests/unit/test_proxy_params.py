"""What the proxy lets through to an engine: client bodies, leg bodies, kv params."""

from __future__ import annotations

import copy

import pytest

from tracedpush import semconv
from tracedpush.proxy.coords import KVCoordinates
from tracedpush.proxy.errors import BadRequest
from tracedpush.proxy.params import (
    REQUIRED_DECODE_KEYS,
    decode_body,
    decode_params_problems,
    is_sane_request_id,
    new_request_id,
    prefill_body,
    push_decode_params,
    validate_client_body,
)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

# The keys vLLM 0.32's decode side reads with [] (a KeyError there kills the
# EngineCore): push_scheduler.update_state_after_alloc and
# metadata.add_new_req_to_recv. The push scheduler seeds remote_block_ids itself, but
# request_finished's abort path reaches add_new_req_to_recv too, so it is sent anyway.
D_INDEXED_KEYS = {
    "remote_engine_id",
    "remote_host",
    "remote_port",
    "tp_size",
    "remote_request_id",
    "remote_block_ids",
}


def pull_params() -> dict:
    """P's kv_transfer_params as vLLM's pull request_finished returns them."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[4, 5, 6]],
        "remote_engine_id": "prefill-0",
        "remote_request_id": "cmpl-tp-1-0-0123abcd",
        "remote_host": "10.0.0.5",
        "remote_port": 5600,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": 40,
        "remote_blocks_expiry_time": 1234.5,
        "transfer_mode": "pull",
    }


def bad(route: str, body, mode: str = "pull") -> BadRequest:
    with pytest.raises(BadRequest) as info:
        validate_client_body(route, body, mode)
    assert info.value.status == 400
    return info.value


# ----------------------------------------------------------------------- client bodies
def test_valid_bodies_pass():
    validate_client_body(COMPLETIONS, {"model": "m", "prompt": "hi", "max_tokens": 5}, "pull")
    validate_client_body(COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}, "push")
    validate_client_body(COMPLETIONS, {"model": "m", "prompt": ["one prompt"]}, "push")
    validate_client_body(
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
        "push",
    )


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (COMPLETIONS, [1, 2], None),
        (COMPLETIONS, {"prompt": "x"}, "model"),
        (COMPLETIONS, {"model": "", "prompt": "x"}, "model"),
        (COMPLETIONS, {"model": "m"}, "prompt"),
        (COMPLETIONS, {"model": "m", "prompt": ""}, "prompt"),
        (COMPLETIONS, {"model": "m", "prompt": ["a", "b"]}, "prompt"),
        (COMPLETIONS, {"model": "m", "prompt": {"x": 1}}, "prompt"),
        (CHAT, {"model": "m"}, "messages"),
        (CHAT, {"model": "m", "messages": []}, "messages"),
        (CHAT, {"model": "m", "messages": ["hi"]}, "messages"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": "5"}, "max_tokens"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
        (
            CHAT,
            {"model": "m", "messages": [{"role": "user"}], "max_completion_tokens": -1},
            "max_completion_tokens",
        ),
        (COMPLETIONS, {"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "n": 2}, "n"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "stream_options": 3}, "stream_options"),
    ],
)
def test_malformed_bodies_are_rejected_naming_the_key(route, body, param):
    err = bad(route, body)
    assert err.param == param
    if param:
        assert param in err.message


def test_client_kv_transfer_params_are_refused_and_problems_named():
    body = {
        "model": "m",
        "prompt": "x",
        "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "p"},
    }
    err = bad(COMPLETIONS, body, mode="push")
    assert err.param == "kv_transfer_params"
    assert "must not be sent by clients" in err.message
    # The keys whose absence would crash D are named.
    for key in ("remote_request_id", "remote_host", "remote_port", "tp_size"):
        assert f"kv_transfer_params.{key}" in err.message


def test_even_well_formed_client_kv_params_are_refused():
    body = {"model": "m", "prompt": "x", "kv_transfer_params": pull_params()}
    assert bad(COMPLETIONS, body).param == "kv_transfer_params"
    body = {"model": "m", "prompt": "x", "kv_transfer_params": "nope"}
    assert "not an object" in bad(COMPLETIONS, body).message


# ------------------------------------------------------------------------- leg bodies
def test_prefill_body_asks_one_unstreamed_token_and_keeps_kv():
    client = {
        "model": "m",
        "prompt": "x",
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "min_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.3,
    }
    original = copy.deepcopy(client)
    body = prefill_body(client)
    assert body["max_tokens"] == 1 and body["max_completion_tokens"] == 1
    assert body["stream"] is False
    assert "stream_options" not in body and "min_tokens" not in body
    assert body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    assert body["temperature"] == 0.3
    assert client == original  # the client's body is reused for D


def test_decode_body_keeps_client_settings_and_asks_usage_only_when_streaming():
    kv = pull_params()
    body, injected = decode_body({"model": "m", "prompt": "x", "max_tokens": 9}, kv)
    assert body["max_tokens"] == 9 and body["kv_transfer_params"] is kv and not injected
    body, injected = decode_body({"model": "m", "prompt": "x", "stream": True}, kv)
    assert injected and body["stream_options"] == {"include_usage": True}
    client = {
        "model": "m",
        "prompt": "x",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    body, injected = decode_body(client, kv)
    assert not injected and body["stream_options"] == {"include_usage": True}


# ------------------------------------------------------------------- decode kv params
def test_push_params_hold_every_key_the_decode_engine_indexes():
    params = KVCoordinates("prefill-0", "10.0.0.5", 5600, tp_size=2, pp_size=1).decode_params(
        "tp-abc"
    )
    assert params.keys() >= D_INDEXED_KEYS
    assert REQUIRED_DECODE_KEYS.keys() >= D_INDEXED_KEYS
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_block_ids"] == []
    assert params["remote_request_id"] == "tp-abc"
    assert (params["remote_port"], params["tp_size"], params["pp_size"]) == (5600, 2, 1)
    assert decode_params_problems(params, "push") == []


def test_pull_params_from_vllm_pass_and_unknown_keys_are_allowed():
    params = pull_params() | {"some_future_key": [1], "remote_prefill_cached_tokens": 0}
    params[semconv.KV_PARAMS_TRACE_KEY] = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }
    assert decode_params_problems(params, "pull") == []


@pytest.mark.parametrize("key", sorted(REQUIRED_DECODE_KEYS))
def test_each_missing_required_key_is_named(key):
    params = pull_params()
    del params[key]
    problems = dict(decode_params_problems(params, "pull"))
    assert key in problems and "missing" in problems[key]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("do_remote_prefill", False),
        ("do_remote_decode", True),
        ("remote_engine_id", ""),
        ("remote_host", 5),
        ("remote_port", "5600"),
        ("remote_port", 70000),
        ("remote_port", True),
        ("remote_request_id", None),
        ("remote_block_ids", "1,2"),
        ("remote_block_ids", [[1, "2"]]),
        ("remote_block_ids", []),  # pull: nothing to read would trip vLLM's assert
        ("tp_size", 0),
        ("pp_size", "1"),
        ("dcp_size", 0),
        ("remote_num_tokens", -1),
        ("remote_blocks_expiry_time", "soon"),
        ("transfer_mode", "push"),  # a push P behind a pull proxy
        (semconv.KV_PARAMS_TRACE_KEY, {"traceparent": "00-zz-yy-01"}),
        (semconv.KV_PARAMS_TRACE_KEY, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ],
)
def test_each_bad_value_is_named(key, value):
    params = pull_params()
    params[key] = value
    assert key in dict(decode_params_problems(params, "pull"))


def test_push_rejects_block_ids_and_non_dicts():
    params = push_decode_params(
        engine_id="p", host="h", port=1, tp_size=1, pp_size=1, request_id="r"
    )
    params["remote_block_ids"] = [[1]]
    assert "remote_block_ids" in dict(decode_params_problems(params, "push"))
    assert decode_params_problems(None, "push") == [("kv_transfer_params", "must be an object")]


# ------------------------------------------------------------------------ request ids
def test_request_id_sanity():
    assert is_sane_request_id("tp-0123abcd")
    assert is_sane_request_id("client.req_42")
    for insane in ("", "a b", "a:b", "a,b", "x" * 129, "é", "a\nb", None):
        assert not is_sane_request_id(insane)
    rid = new_request_id()
    assert rid.startswith("tp-") and is_sane_request_id(rid) and rid != new_request_id()
