"""Prefill coordinates: the --prefill URL fragment, P's answers, and how they merge."""

from __future__ import annotations

import pytest

from tracedpush.proxy.coords import (
    CoordinateBook,
    KVCoordinates,
    coords_from_params,
    parse_instance,
)


def test_parse_plain_and_fragment_urls():
    spec = parse_instance("http://127.0.0.1:8100/", "prefill")
    assert spec.url == "http://127.0.0.1:8100" and spec.fields == {}
    spec = parse_instance(
        "http://p0:8100#engine_id=prefill-0, host=10.0.0.5,port=5600,tp=2,pp=1", "prefill"
    )
    assert spec.url == "http://p0:8100"
    assert spec.fields == {
        "engine_id": "prefill-0",
        "host": "10.0.0.5",
        "port": "5600",
        "tp": "2",
        "pp": "1",
    }
    assert parse_instance("http://d:8200#engine_id=decode-0", "decode").engine_id == "decode-0"
    assert parse_instance("http://p:1#engine_id=a&port=7", "prefill").fields["port"] == "7"


@pytest.mark.parametrize(
    ("spec", "role", "needle"),
    [
        ("127.0.0.1:8100", "prefill", "http://host:port"),
        ("ftp://h:1", "prefill", "http://host:port"),
        ("http://p:8100#engine=x", "prefill", "unknown key 'engine'"),
        ("http://p:8100#port=abc", "prefill", "port must be an integer"),
        ("http://p:8100#port=70000", "prefill", "out of range"),
        ("http://p:8100#tp=0", "prefill", "out of range"),
        ("http://p:8100#engine_id", "prefill", "not key=value"),
        ("http://d:8200#port=5700", "decode", "unknown key 'port'"),
    ],
)
def test_parse_errors_say_what_is_wrong(spec, role, needle):
    with pytest.raises(ValueError, match=needle):
        parse_instance(spec, role)


def answer(**overrides) -> dict:
    params = {
        "remote_engine_id": "prefill-0",
        "remote_host": "10.0.0.5",
        "remote_port": 5600,
        "tp_size": 1,
        "pp_size": 1,
        "dcp_size": 1,
        "transfer_mode": "push",
    }
    return params | overrides


def test_coords_from_p_answer():
    assert coords_from_params(answer()) == KVCoordinates("prefill-0", "10.0.0.5", 5600, 1, 1, 1)
    assert coords_from_params(answer(pp_size=None, dcp_size=None)).pp_size == 1


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"remote_engine_id": None}, "remote_engine_id"),
        ({"remote_host": ""}, "remote_host"),
        ({"remote_port": "5600"}, "remote_port"),
        ({"remote_port": 0}, "remote_port"),
        ({"tp_size": None}, "tp_size"),
        ({"pp_size": 0}, "pp_size"),
    ],
)
def test_coords_from_bad_answer_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        coords_from_params(answer(**overrides))
    with pytest.raises(ValueError):
        coords_from_params(None)


def test_complete_flag_is_used_until_p_answers():
    book = CoordinateBook("http://p0:8100", {"engine_id": "prefill-0", "port": "5600", "tp": "2"})
    # host defaults to the URL's host
    assert book.effective() == KVCoordinates("prefill-0", "p0", 5600, 2, 1, None)


def test_incomplete_flag_means_unknown_until_learned():
    book = CoordinateBook("http://p0:8100", {"host": "10.9.9.9"})
    assert book.effective() is None
    book.learn(coords_from_params(answer()), "response")
    # address from the flag, identity from P
    assert book.effective() == KVCoordinates("prefill-0", "10.9.9.9", 5600, 1, 1, 1)
    assert book.describe()["learned_from"] == "response"


def test_p_identity_beats_a_stale_flag_but_the_flag_keeps_the_address():
    flag = {"engine_id": "old-id", "port": "15600", "host": "nat.example", "tp": "4"}
    book = CoordinateBook("http://p0:8100", flag)
    book.learn(coords_from_params(answer(remote_engine_id="new-id", tp_size=1)), "response")
    eff = book.effective()
    assert (eff.engine_id, eff.tp_size) == ("new-id", 1)
    assert (eff.host, eff.port) == ("nat.example", 15600)
