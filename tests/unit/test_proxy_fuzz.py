"""Property-based fuzzing of the proxy's request schema (Hypothesis).

Bodies (valid ones, near-valid mutations of valid ones, wrong types, huge ints,
non-finite numbers, unicode and lone surrogates, nested junk, raw bytes) go to a real
proxy in front of stub engines, for both generate routes and both modes. Properties:

* the proxy never answers 5xx (the stubs produce no upstream failure);
* every 4xx is OpenAI error JSON whose ``param`` names a field the message mentions,
  or whose message is about the request body, and no engine saw that request;
* a 200 only for a body the oracle accepts, and a 200 for every body it
  accepts (the proxy refuses nothing valid);
* every body an engine receives passes the proxy's own validation and the oracle.

The oracle and the body strategies live in tracedpush/testing/fuzz.py
(``RequestSchema``, shared with the real-engine fuzz in tests/e2e/test_fuzz_engines.py):
the oracle is written from vLLM 0.32's request models, taking JSON types strictly, plus
what cannot work through P/D; it shares no code with tracedpush/proxy/fields.py.
``TRACEDPUSH_FUZZ_EXAMPLES`` sets the number of examples (default 300; ``make fuzz`` runs 5000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from tracedpush.proxy.params import check_token_ids, validate_client_body
from tracedpush.testing.fuzz import Case, RequestSchema, as_sent
from tracedpush.testing.stub_engine import Rig, StubEngine, proxy_rig

EXAMPLES = int(os.environ.get("TRACEDPUSH_FUZZ_EXAMPLES", "300"))
MODEL = "stub-model"
VOCAB = 1000
SCHEMA = RequestSchema(MODEL, VOCAB)


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
    return SCHEMA.refuses(route, client_part)


async def check(rig: Rig, case: Case) -> None:
    p, d = rig.prefill[0], rig.decode[0]
    before = (len(p.requests), len(d.requests))
    resp = await rig.client.post(
        case.route, data=case.raw, headers={"Content-Type": "application/json"}
    )
    text = await resp.text()
    assert resp.status < 500, text
    expected = SCHEMA.refuses(case.route, as_sent(case.raw))
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
@given(case=SCHEMA.cases())
def test_proxy_answers_every_body_safely(rigs: Rigs, case: Case) -> None:
    rigs.loop.run_until_complete(asyncio.wait_for(check(rigs.by_mode[case.mode], case), 30))
