"""Property-based fuzzing of the proxy's request schema with real engines (issue 11, item 6).

The stub-engine fuzz (tests/unit/test_proxy_fuzz.py) shows the proxy refuses what it
should; only real vLLM engines show that what it lets through cannot hurt them. The same
bodies (tracedpush/testing/fuzz.py, built for the tiny Qwen2: its served name and its
vocabulary from config.json) go over HTTP to the real proxy of the shared 1P1D, in each
mode. Generated requests stay cheap: at most 8 tokens each (a body without an integer
limit gets one), prompts of at most 30 characters, 8 token ids or 3 short messages.

Properties, per case:

* no 5xx other than a documented upstream failure: 502/504 whose message starts with
  the leg (``prefill leg:`` / ``decode leg:``). With healthy engines there should be
  none: they are counted and printed;
* every 4xx is OpenAI error JSON. The proxy's own refusals: ``param`` names a field
  the message mentions, or the message is about the request body (as in the unit
  fuzz), and the oracle refuses the body. An engine's own 4xx, relayed as
  ``<leg> leg: <url> answered <status>: <engine's message>``: the status is the
  engine's, the engine's message names a top-level key of the body that the schema
  knows (vLLM's validation errors carry the field's location, ``body.messages.0...``),
  and the oracle accepts the body (a body the oracle refuses must not have reached an
  engine): what the proxy checks by JSON type only, or not at all (a null content on a
  user message, ``suffix``);
* a 200 only for a body the oracle accepts, with a whole answer: JSON with choices, or
  an SSE stream ending in ``[DONE]`` without an error event.

Every ``CHECK_EVERY`` cases and at the end: every process of the deployment alive and
its /health 200, the engines' pids unchanged (0 crashes, 0 restarts); at the end the
engines idle (``vllm:kv_cache_usage_perc`` back to 0).

Budget: ``TRACEDPUSH_FUZZ_ENGINE_EXAMPLES`` per mode (default 100, in `make test`);
the soak variant (`make soak`) runs ``TRACEDPUSH_FUZZ_ENGINE_SOAK_EXAMPLES`` per mode
(default 1500: 3000 cases across the modes, at least the 2000 issue 11 asks for).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from tracedpush.launcher import Deployment
from tracedpush.launcher.metrics import metric_sum
from tracedpush.testing.figures import Figures
from tracedpush.testing.fuzz import NOT_JSON, Case, RequestSchema, as_sent

MODES = [pytest.param(m, marks=pytest.mark.pd(m), id=m) for m in ("push", "pull")]
EXAMPLES = int(os.environ.get("TRACEDPUSH_FUZZ_ENGINE_EXAMPLES", "100"))
SOAK_EXAMPLES = int(os.environ.get("TRACEDPUSH_FUZZ_ENGINE_SOAK_EXAMPLES", "1500"))
MAX_TOKENS = 8
CHECK_EVERY = 50  # cases between engine health checks
IDLE_WITHIN_S = 60.0  # P's KV lease (30 s) in pull mode, plus slack
REQUEST_TIMEOUT_S = 60.0

pytestmark = [pytest.mark.e2e]

LEG_ERROR = re.compile(r"^(prefill|decode) leg: ")
RELAYED = re.compile(r"^(prefill|decode) leg: (\S+) answered (\d{3}): (.*)\Z", re.S)
ENGINES = ("prefill", "decode")


@dataclass
class Tally:
    """What the run saw; printed at the end, and recorded as figures."""

    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    upstream_5xx: list[str] = field(default_factory=list)
    accepted: int = 0  # bodies the oracle accepts: each went to both engines
    relayed: Counter[str] = field(default_factory=Counter)  # engine 4xx, by key named
    relayed_example: dict[str, str] = field(default_factory=dict)  # the first, per key


def _post(url: str, route: str, raw: bytes) -> tuple[int, str]:
    """One request on a fresh connection (the proxy may close one after an error)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", route, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _engine_pids(pd: Deployment) -> dict[str, int | None]:
    return {p.name: p.pid for p in pd.processes if p.name.split("-")[0] in ENGINES}


def _assert_engines_fine(pd: Deployment, pids: dict[str, int | None]) -> None:
    """0 crashes: every process alive with /health 200, and no engine restarted."""
    health = pd.healthy()
    assert all(health.values()), f"unhealthy after fuzzing: {health}"
    assert _engine_pids(pd) == pids, f"an engine restarted: {pids} -> {_engine_pids(pd)}"


def _wait_idle(pd: Deployment) -> dict[str, float]:
    """Seconds until each engine holds no KV (fails after IDLE_WITHIN_S)."""
    t0 = time.monotonic()
    urls = {"prefill": pd.prefill_url, "decode": pd.decode_url}
    freed: dict[str, float] = {}
    while True:
        held = {n: metric_sum(u, "vllm:kv_cache_usage_perc") for n, u in urls.items()}
        for name, usage in held.items():
            if not usage:
                freed.setdefault(name, round(time.monotonic() - t0, 1))
            else:
                freed.pop(name, None)
        if len(freed) == len(urls):
            return freed
        assert time.monotonic() - t0 < IDLE_WITHIN_S, f"KV still held: {held}"
        time.sleep(0.5)


def _names_a_key(message: str, body: Any, known: list[str]) -> str | None:
    """The top-level key of ``body`` an engine's message names, if any: one of the
    schema's ``known`` keys (a generated key such as "a" would match any sentence), and
    ``model`` only quoted ("This model's maximum context length" is about the prompt)."""
    if type(body) is not dict:
        return None
    for key in sorted((k for k in body if k in known), key=len, reverse=True):
        if key == "model":
            continue
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(key)}(?![A-Za-z0-9_])", message):
            return key
    if re.search(r"\bmodel\b['\"]", message) or "model_not_found" in message:
        return "model"
    return None


def _whole_answer(sent: dict[str, Any], text: str) -> None:
    """A 200 carries a complete answer: nothing failed after the status was sent."""
    if sent.get("stream") is True:
        events = re.findall(r"^data: (.*)$", text, re.M)
        assert events and events[-1].strip() == "[DONE]", f"stream cut short: {text[-300:]!r}"
        for e in events[:-1]:
            assert "error" not in json.loads(e), f"error event in a 200 stream: {e}"
    else:
        answer = json.loads(text)
        assert answer.get("choices"), f"200 without choices: {text[:300]}"


def _check(pd: Deployment, schema: RequestSchema, tally: Tally, case: Case) -> None:
    status, text = _post(pd.proxy_url, case.route, case.raw)
    tally.cases += 1
    tally.statuses[status] += 1
    sent = as_sent(case.raw)
    expected = schema.refuses(case.route, sent)
    tally.accepted += expected is None
    if status >= 500:
        error = json.loads(text)["error"]
        tally.upstream_5xx.append(f"{status} {error['message'][:200]}")
        event(f"{status} (upstream)")
        assert status in (502, 504) and LEG_ERROR.match(error["message"]), text
        return
    if status >= 400:
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        relayed = RELAYED.match(error["message"])
        if relayed:  # the engine's own refusal
            event(f"{status} (engine)")
            assert int(relayed.group(3)) == status, error
            key = _names_a_key(relayed.group(4), sent, schema.known_keys)
            assert key is not None, f"engine's {status} names no field of the body: {error}"
            tally.relayed[key] += 1
            tally.relayed_example.setdefault(key, relayed.group(4)[:160])
            assert expected is None, f"a body the oracle refuses ({expected}) reached {error}"
            return
        event(f"{status} ({expected or 'valid'})")
        param, message = error["param"], error["message"]
        assert param is None or (type(param) is str and param in message), error
        if param is None:
            assert "request body" in message, error
        assert expected is not None, f"valid body refused: {error}"
        return
    event(f"{status} ({expected or 'valid'})")
    assert status == 200, text[:500]
    assert expected is None, f"invalid body ({expected}) was answered 200"
    assert sent is not NOT_JSON
    _whole_answer(sent, text)


def _fuzz(pd: Deployment, mode: str, examples: int, figures: Figures) -> None:
    config = json.loads((pd.model / "config.json").read_text())
    schema = RequestSchema(pd.model_name, int(config["vocab_size"]), max_tokens=MAX_TOKENS)
    pids = _engine_pids(pd)
    _assert_engines_fine(pd, pids)
    _wait_idle(pd)
    tally = Tally()
    t0 = time.monotonic()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=schema.cases(modes=(mode,)))
    def prop(case: Case) -> None:
        _check(pd, schema, tally, case)
        if tally.cases % CHECK_EVERY == 0:
            _assert_engines_fine(pd, pids)

    prop()
    seconds = time.monotonic() - t0
    idle_s = _wait_idle(pd)
    _assert_engines_fine(pd, pids)
    statuses = dict(sorted(tally.statuses.items()))
    print(
        f"\nfuzz vs real engines, {mode}: {tally.cases} cases in {seconds:.1f}s; "
        f"oracle accepted {tally.accepted}; statuses {statuses}; "
        f"5xx {len(tally.upstream_5xx)}; engine 4xx by field "
        f"{dict(tally.relayed)}; engine restarts 0; KV freed {idle_s} s after the last case"
    )
    for line in tally.upstream_5xx:
        print(f"  upstream failure: {line}")
    for key, message in tally.relayed_example.items():
        print(f"  engine 4xx naming {key!r}: {message!r}")
    figures.record(
        cases=tally.cases,
        seconds=round(seconds, 1),
        oracle_accepted=tally.accepted,
        upstream_5xx=len(tally.upstream_5xx),
        engine_4xx=sum(tally.relayed.values()),
        engine_restarts=0,
        prefill_idle_after_s=idle_s["prefill"],
        decode_idle_after_s=idle_s["decode"],
        **{f"status_{k}": v for k, v in statuses.items()},
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", MODES)
def test_real_engines_survive_fuzzed_requests(pd: Deployment, mode: str, figures: Figures) -> None:
    _fuzz(pd, mode, EXAMPLES, figures)


@pytest.mark.soak
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", MODES)
def test_real_engines_survive_fuzzed_requests_soak(
    pd: Deployment, mode: str, figures: Figures
) -> None:
    _fuzz(pd, mode, SOAK_EXAMPLES, figures)
