"""Environment variables as flag defaults: one behaviour for every command."""

from __future__ import annotations

import pytest

from tracedpush import envs
from tracedpush.cli import build_parser


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_and_empty_mean_not_given(monkeypatch: pytest.MonkeyPatch, value: str | None):
    if value is None:
        monkeypatch.delenv("TP_X", raising=False)
    else:
        monkeypatch.setenv("TP_X", value)
    assert envs.env_str("TP_X", "d") == "d"
    assert envs.env_int("TP_X", 7) == 7
    assert envs.env_float("TP_X", 1.5) == 1.5
    assert envs.env_bool("TP_X", True) is True
    assert envs.env_list("TP_X") is None


def test_values_parse(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TP_X", " 42 ")
    assert envs.env_str("TP_X") == "42"
    assert envs.env_int("TP_X", 0) == 42
    assert envs.env_float("TP_X", 0.0) == 42.0
    monkeypatch.setenv("TP_X", "a b  c")
    assert envs.env_list("TP_X") == ["a", "b", "c"]
    for text, truth in (("Off", False), ("no", False), ("1", True), ("TRUE", True)):
        monkeypatch.setenv("TP_X", text)
        assert envs.env_bool("TP_X", not truth) is truth


@pytest.mark.parametrize(
    ("reader", "value"),
    [(envs.env_int, "8k"), (envs.env_float, "fast"), (envs.env_bool, "maybe")],
)
def test_a_bad_value_stops_with_the_variable_named(monkeypatch: pytest.MonkeyPatch, reader, value):
    monkeypatch.setenv("TP_X", value)
    with pytest.raises(SystemExit, match=f"TP_X='{value}'"):
        reader("TP_X", 0)


@pytest.mark.parametrize(
    ("command", "var", "dest", "default"),
    [("up", "TRACEDPUSH_PORT", "port", 8000), ("proxy", "TRACEDPUSH_PROXY_PORT", "port", 8000)],
)
def test_commands_treat_an_empty_variable_as_unset(
    monkeypatch: pytest.MonkeyPatch, command: str, var: str, dest: str, default: int
):
    monkeypatch.setenv(var, "")
    args = build_parser([command]).parse_args([command])
    assert getattr(args, dest) == default
    monkeypatch.setenv(var, "9123")
    assert getattr(build_parser([command]).parse_args([command]), dest) == 9123
