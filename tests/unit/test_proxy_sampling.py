"""The proxy's sampler: the OpenTelemetry SDK's, from OTEL_TRACES_SAMPLER[_ARG].

Stub engines record what each leg carried, so the sampled flag is checked on the wire:
an unsampled request produces no proxy span and reaches P and D with the sampled bit off
(in the `traceparent` header and in kv_transfer_params), a sampled one with it on. The
SDK also sets W3C level 2's random-trace-id bit on the ids it makes: flags 02 and 03.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBasedTraceIdRatio,
    TraceIdRatioBased,
)

from tracedpush import semconv
from tracedpush.analysis.sampling import kept_at
from tracedpush.proxy import sampling
from tracedpush.proxy.command import _traces_note, add_arguments, build_config
from tracedpush.telemetry.context import parse_traceparent
from tracedpush.testing.stub_engine import proxy_rig

BODY = {"model": "stub-model", "prompt": "a b c d", "max_tokens": 2}
MODES = ("push", "pull")
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def run(scenario, limit: float = 60) -> None:
    asyncio.run(asyncio.wait_for(scenario(), limit))


@pytest.fixture
def sampler_env(monkeypatch: pytest.MonkeyPatch):
    """Set the sampler variables; `proxy_rig`'s TracerProvider reads them (the SDK)."""

    def set_env(name: str, arg: str | None = None) -> None:
        monkeypatch.setenv(sampling.ENV_SAMPLER, name)
        if arg is None:
            monkeypatch.delenv(sampling.ENV_SAMPLER_ARG, raising=False)
        else:
            monkeypatch.setenv(sampling.ENV_SAMPLER_ARG, arg)

    return set_env


def legs_of(rig, request_id: str) -> dict[str, tuple[str, str]]:
    """{role: (header traceparent, kv_transfer_params traceparent)} of one request."""
    out = {}
    for stub in (*rig.prefill, *rig.decode):
        for rec in stub.requests:
            if rec.headers.get("X-Request-Id") == request_id:
                kv = rec.body["kv_transfer_params"][semconv.KV_PARAMS_TRACE_KEY]
                out[stub.role] = (rec.headers["traceparent"], kv["traceparent"])
    assert set(out) == {"prefill", "decode"}, out
    return out


async def settle(rig, n_roots: int) -> None:
    """The root and P's leg may end after the client has its answer (push): wait."""
    async with asyncio.timeout(5):
        while (
            len(rig.spans(semconv.SPAN_REQUEST)) < n_roots
            or len(rig.spans(semconv.SPAN_PROXY_PREFILL)) < n_roots
        ):
            await asyncio.sleep(0.01)


def sampled_on_the_wire(rig) -> int:
    """Requests whose decode leg carried the sampled bit."""
    return sum(
        parse_traceparent(r.headers["traceparent"]).sampled for d in rig.decode for r in d.requests
    )


@pytest.mark.parametrize("mode", MODES)
def test_always_off_builds_no_span_and_sends_the_sampled_bit_off(sampler_env, mode):
    sampler_env("always_off")

    async def scenario():
        async with proxy_rig(mode) as rig:
            resp = await rig.client.post(
                "/v1/completions", json=BODY, headers={"X-Request-Id": "off-1"}
            )
            assert resp.status == 200
            await resp.read()
            await asyncio.sleep(0.1)  # anything left to end would have ended
            assert rig.spans() == []
            for header, kv in legs_of(rig, "off-1").values():
                assert header[-3:] in ("-00", "-02") and kv == header  # 02: random id bit
                assert parse_traceparent(kv).sampled is False

    run(scenario)


@pytest.mark.parametrize("mode", MODES)
def test_traceidratio_samples_by_trace_id_and_the_flag_follows(sampler_env, mode):
    """At 50%, each request is kept exactly when its trace id passes the ratio test (the
    analysis' `kept_at` agrees with the SDK); kept ones have every proxy span and the
    sampled bit on both legs, the others no span and the bit off."""
    sampler_env("traceidratio", "0.5")
    n = 24

    async def scenario():
        async with proxy_rig(mode) as rig:
            for i in range(n):
                headers = {"X-Request-Id": f"ratio-{i}"}
                resp = await rig.client.post("/v1/completions", json=BODY, headers=headers)
                assert resp.status == 200
                await resp.read()
            await settle(rig, sampled_on_the_wire(rig))
            roots = rig.spans(semconv.SPAN_REQUEST)
            kept = {s.attributes[semconv.REQUEST_ID]: s for s in roots}
            assert 0 < len(kept) < n  # 2 * 2^-24 that it is not so
            for i in range(n):
                rid = f"ratio-{i}"
                legs = legs_of(rig, rid)
                parents = {parse_traceparent(kv) for _, kv in legs.values()}
                (trace_id,) = {p.trace_id for p in parents}  # one trace across P and D
                sampled = rid in kept
                assert {p.sampled for p in parents} == {sampled}
                assert all(h == kv for h, kv in legs.values())
                assert kept_at(f"{trace_id:032x}", 0.5) is sampled
                if sampled:
                    root = kept[rid]
                    assert root.context.trace_id == trace_id
                    assert root.attributes[semconv.SAMPLER] == "traceidratio"
                    assert root.attributes[semconv.SAMPLER_RATIO] == 0.5
            spans = rig.spans()
            assert {s.context.trace_id for s in spans} == {r.context.trace_id for r in roots}
            per_request = 3 if mode == "push" else 4
            assert len(spans) == per_request * len(kept)

    run(scenario)


def test_parentbased_honours_a_client_traceparent_either_way(sampler_env):
    """parentbased_traceidratio at 0: no trace the proxy starts is kept, but a client's
    sampled traceparent is (with no ratio recorded: that rate is the client's), and a
    client's flags 00 travel on to the engines under the client's trace id."""
    sampler_env("parentbased_traceidratio", "0")

    async def scenario():
        async with proxy_rig("pull") as rig:
            for rid, flags in (("client-01", "01"), ("client-00", "00"), ("none", None)):
                headers = {"X-Request-Id": rid}
                if flags:
                    headers["traceparent"] = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-{flags}"
                resp = await rig.client.post("/v1/completions", json=BODY, headers=headers)
                assert resp.status == 200
                await resp.read()
            await settle(rig, 1)
            await asyncio.sleep(0.1)  # the others would have ended by now
            (root,) = rig.spans(semconv.SPAN_REQUEST)
            assert root.attributes[semconv.REQUEST_ID] == "client-01"
            assert f"{root.context.trace_id:032x}" == CLIENT_TRACE
            assert root.attributes[semconv.SAMPLER] == "parentbased_traceidratio"
            assert semconv.SAMPLER_RATIO not in root.attributes
            assert len(rig.spans()) == 4  # root, both legs, kv.relay
            for rid, sampled, trace in (
                ("client-01", True, CLIENT_TRACE),
                ("client-00", False, CLIENT_TRACE),
                ("none", False, None),
            ):
                for _, kv in legs_of(rig, rid).values():
                    parent = parse_traceparent(kv)
                    assert parent.sampled is sampled, rid
                    if trace:
                        assert f"{parent.trace_id:032x}" == trace

    run(scenario)


def test_default_sampler_keeps_every_request_and_says_so(monkeypatch):
    monkeypatch.delenv(sampling.ENV_SAMPLER, raising=False)

    async def scenario():
        async with proxy_rig("push") as rig:
            await (await rig.client.post("/v1/completions", json=BODY)).read()
            await settle(rig, 1)
            (root,) = rig.spans(semconv.SPAN_REQUEST)
        assert root.attributes[semconv.SAMPLER] == "parentbased_always_on"
        assert root.attributes[semconv.SAMPLER_RATIO] == 1.0

    run(scenario)


@pytest.mark.parametrize(
    ("sampler", "name", "ratio", "parent_based"),
    [
        (ALWAYS_ON, "always_on", 1.0, False),
        (ALWAYS_OFF, "always_off", 0.0, False),
        (DEFAULT_ON, "parentbased_always_on", 1.0, True),
        (DEFAULT_OFF, "parentbased_always_off", 0.0, True),
        (TraceIdRatioBased(0.01), "traceidratio", 0.01, False),
        (ParentBasedTraceIdRatio(0.25), "parentbased_traceidratio", 0.25, True),
    ],
)
def test_describe_names_each_builtin_sampler(sampler, name, ratio, parent_based):
    assert sampling.describe(sampler) == sampling.SamplerInfo(name, ratio, parent_based)


@pytest.mark.parametrize("name", sampling.SAMPLERS)
def test_the_sdk_builds_from_the_environment_what_describe_names(monkeypatch, name):
    monkeypatch.setenv(sampling.ENV_SAMPLER, name.upper())  # the SDK ignores case
    monkeypatch.setenv(sampling.ENV_SAMPLER_ARG, "0.01")
    sampling.check_env()
    info = sampling.describe(TracerProvider().sampler)
    assert info.name == name
    assert info.ratio == (0.01 if "ratio" in name else 0.0 if "off" in name else 1.0)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"OTEL_TRACES_SAMPLER": "ratio"}, "OTEL_TRACES_SAMPLER='ratio' is not one of"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1%"}, "[0, 1]"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, "[0, 1]"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "nan"}, "[0, 1]"),
    ],
)
def test_settings_the_sdk_would_replace_by_sample_all_are_refused(env, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        sampling.check_env(env)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_TRACES_SAMPLER": "traceidratio"},  # the specification's default ratio, 1.0
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
        {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "whatever"},  # unused
    ],
)
def test_good_settings_pass(env):
    sampling.check_env(env)


def test_the_command_refuses_a_bad_sampler_and_names_it_in_the_ready_line(monkeypatch, tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--mode", "pull", "--prefill", "http://p:1", "--decode", "http://d:2"]
    args = parser.parse_args([*argv, "--traces", str(tmp_path)])
    monkeypatch.setenv(sampling.ENV_SAMPLER, "traceidratio")
    monkeypatch.setenv(sampling.ENV_SAMPLER_ARG, "2")
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG='2'"):
        build_config(args)
    monkeypatch.setenv(sampling.ENV_SAMPLER_ARG, "0.01")
    build_config(args)
    note = _traces_note(args, TracerProvider())
    assert note == f"trace files in {tmp_path}; sampler traceidratio at 1%"
    monkeypatch.delenv(sampling.ENV_SAMPLER)
    assert _traces_note(args, TracerProvider()) == f"trace files in {tmp_path}"


def test_up_hands_the_sampler_variables_to_the_proxy(monkeypatch, tmp_path):
    """`tracedpush up` starts the proxy with its own environment: the sampler set for
    `up` (or in DeploymentConfig.env, which wins) is the proxy's."""
    import json

    from tracedpush.launcher import Deployment, DeploymentConfig

    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    monkeypatch.setenv(sampling.ENV_SAMPLER, "parentbased_traceidratio")
    monkeypatch.setenv(sampling.ENV_SAMPLER_ARG, "0.01")
    config = DeploymentConfig(mode="push", model=model, run_dir=tmp_path / "run")
    _, env = Deployment(config, log=None, lock=False).proxy_process()
    assert env[sampling.ENV_SAMPLER] == "parentbased_traceidratio"
    assert env[sampling.ENV_SAMPLER_ARG] == "0.01"
    config = DeploymentConfig(
        mode="push", model=model, run_dir=tmp_path / "run", env={sampling.ENV_SAMPLER_ARG: "0.1"}
    )
    _, env = Deployment(config, log=None, lock=False).proxy_process()
    assert env[sampling.ENV_SAMPLER_ARG] == "0.1"
