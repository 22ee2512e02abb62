"""The EngineCore input-thread stamp (`tracedpush.connector.core_input`), on vLLM's real
`EngineCore` class: its `preprocess_add_request` is replaced by a stand-in for the test
(building a real EngineCore needs a model), which the wrapper must call exactly as vLLM's
input thread would have called the original."""

from __future__ import annotations

from time import time_ns
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.v1.engine.core import EngineCore, EngineCoreProc

from tracedpush.connector import core_input


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """vLLM's method replaced by one that records its calls; the wrapper undone after."""
    calls: list[tuple] = []

    def preprocess_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((self, request, args, kwargs))
        return "vllm's answer"

    monkeypatch.setattr(EngineCore, "preprocess_add_request", preprocess_add_request)
    yield calls
    core_input.uninstall()


def test_stamps_each_request_as_the_input_thread_has_it(stand_in: list[tuple]) -> None:
    assert core_input.install()
    assert core_input.install()  # a second connector in the process: wrapped once
    wrapped = EngineCore.preprocess_add_request
    assert EngineCoreProc.preprocess_add_request is wrapped  # the input thread's class
    engine, req = object(), SimpleNamespace(request_id="req-1")
    before = time_ns()
    answer = EngineCoreProc.preprocess_add_request(engine, req, 7, key="v")
    assert answer == "vllm's answer"
    assert stand_in == [(engine, req, (7,), {"key": "v"})]
    stamp = core_input.received("req-1")
    assert before <= stamp <= time_ns()
    assert core_input.received("req-1") == 0  # popped: taken once


def test_a_request_it_cannot_stamp_still_reaches_vllm(stand_in: list[tuple]) -> None:
    core_input.install()
    odd = SimpleNamespace()  # no request_id: the stamp fails, quietly
    assert EngineCore.preprocess_add_request(object(), odd) == "vllm's answer"
    assert [c[1] for c in stand_in] == [odd]
    assert not core_input.RECEIVED


def test_stamps_never_grow_past_the_limit(
    stand_in: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests vLLM refused before its scheduler saw them leave stamps nobody pops."""
    monkeypatch.setattr(core_input, "LIMIT", 4)
    core_input.install()
    for i in range(10):
        EngineCore.preprocess_add_request(object(), SimpleNamespace(request_id=f"r{i}"))
    assert len(core_input.RECEIVED) <= 4
    assert core_input.received("r9") > 0


def test_uninstall_gives_vllms_method_back(stand_in: list[tuple]) -> None:
    original = EngineCore.preprocess_add_request
    core_input.install()
    assert EngineCore.preprocess_add_request is not original
    EngineCore.preprocess_add_request(object(), SimpleNamespace(request_id="x"))
    core_input.uninstall()
    assert EngineCore.preprocess_add_request is original
    assert core_input.received("x") == 0  # stamps dropped with it
