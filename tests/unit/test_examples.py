"""The deployment recipe in examples/: Prometheus' config passes `promtool check
config`; the OpenTelemetry Collector's config and Grafana's provisioning files hang
together (no Collector or Grafana binary on the build machines: see each test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tracedpush.collect.service import METRICS_PORT, OTLP_HTTP_PORT
from tracedpush.testing.prometheus import PROMTOOL, find_binary, promtool

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_prometheus_config_passes_promtool():
    if find_binary("promtool", PROMTOOL) is None:
        pytest.skip("promtool not installed (Debian package prometheus; scripts/install.sh)")
    out = promtool("check", "config", str(EXAMPLES / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_prometheus_scrapes_engines_proxy_and_collect_with_mode_and_role():
    config = _load("prometheus.yml")
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"vllm", "tracedpush-proxy", "tracedpush-collect"}
    vllm = jobs["vllm"]
    # the dashboards filter vLLM's own series on these target labels; honor_labels keeps
    # the mode/role tracedpush_kv_* series carry instead of renaming them exported_*
    assert vllm["honor_labels"] is True
    for static in vllm["static_configs"]:
        assert static["labels"]["mode"] in ("push", "pull")
        assert static["labels"]["role"] in ("prefill", "decode")
    assert config["storage"]["exemplars"]["max_exemplars"] > 0


def test_otel_collector_config_is_consistent():
    """The substitute for `otelcol validate` (no Collector binary here): the sections
    exist, every pipeline names only defined receivers, processors and exporters, and
    traces go to both Jaeger and tracedpush collect over OTLP/HTTP."""
    config = _load("otel-collector.yaml")
    for section in ("receivers", "processors", "exporters", "service"):
        assert isinstance(config.get(section), dict), section
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces"}
    for name, pipeline in pipelines.items():
        assert pipeline["receivers"] and pipeline["exporters"], name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{name}: {kind} {component} undefined"
    exporters = config["exporters"]
    for component in pipelines["traces"]["exporters"]:
        assert component.split("/")[0] == "otlphttp", component
        assert exporters[component]["endpoint"].startswith("http://"), component
    endpoints = {exporters[c]["endpoint"] for c in pipelines["traces"]["exporters"]}
    # collect on its default ports (tracedpush collect --help)
    assert endpoints == {"http://jaeger:4318", f"http://collect:{OTLP_HTTP_PORT}"}
    assert (
        f"collect:{METRICS_PORT}"
        in _load("prometheus.yml")["scrape_configs"][2]["static_configs"][0]["targets"]
    )


def test_grafana_provisioning_links_exemplars_to_jaeger_and_loads_the_dashboards():
    sources = _load("grafana/provisioning/datasources/tracedpush.yaml")
    by_uid = {d["uid"]: d for d in sources["datasources"]}
    prom = next(d for d in sources["datasources"] if d["type"] == "prometheus")
    (link,) = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id"  # the exemplar label collect sets
    assert by_uid[link["datasourceUid"]]["type"] == "jaeger"
    providers = _load("grafana/provisioning/dashboards/tracedpush.yaml")["providers"]
    (provider,) = providers
    assert provider["type"] == "file" and provider["options"]["path"]


def _pipelines_consistent(config: dict[str, Any]) -> dict[str, Any]:
    for section in ("receivers", "processors", "exporters", "service"):
        assert isinstance(config.get(section), dict), section
    pipelines = config["service"]["pipelines"]
    for name, pipeline in pipelines.items():
        assert pipeline["receivers"] and pipeline["exporters"], name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{name}: {kind} {component} undefined"
    return pipelines


def _seconds(text: str) -> float:
    value, unit = float(text[:-1]), text[-1]
    return value * {"s": 1, "m": 60, "h": 3600}[unit]


def test_fleet_collectors_keep_whole_traces_together_for_tail_sampling():
    """docs/fleet.md: gateways route by trace id to samplers that tail-sample; the
    sampler's wait outlasts a request, and every span still reaches collect."""
    gateway = _load("otel-collector-gateway.yaml")
    (pipeline,) = _pipelines_consistent(gateway).values()
    assert pipeline["exporters"] == ["loadbalancing"]  # nothing else sees partial traces
    assert "tail_sampling" not in gateway["processors"]
    lb = gateway["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    assert "endpoint" not in lb["protocol"]["otlp"]  # the resolver supplies it

    sampler = _load("otel-collector-sampler.yaml")
    pipelines = _pipelines_consistent(sampler)
    # the gateways' resolver port is the samplers' OTLP/gRPC port
    grpc = sampler["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert grpc.endswith(f":{lb['resolver']['dns']['port']}")
    sampled = pipelines["traces/sampled"]
    assert "tail_sampling" in sampled["processors"]
    assert sampled["processors"].index("tail_sampling") < sampled["processors"].index("batch")
    assert sampled["exporters"] == ["otlphttp/jaeger"]
    everything = pipelines["traces/all"]
    assert "tail_sampling" not in everything["processors"]
    assert sampler["exporters"][everything["exporters"][0]]["endpoint"] == (
        f"http://collect:{OTLP_HTTP_PORT}"
    )

    ts = sampler["processors"]["tail_sampling"]
    policies = {p["type"]: p for p in ts["policies"]}
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert policies["latency"]["latency"]["threshold_ms"] > 0
    assert 0 < policies["probabilistic"]["probabilistic"]["sampling_percentage"] < 100
    # the root span comes last, at the end of the request: wait past the longest request
    assert _seconds(ts["decision_wait"]) >= 60
    # a trace evicted before its decision is lost: room for a full wait's worth of traces
    assert ts["num_traces"] >= ts["expected_new_traces_per_sec"] * _seconds(ts["decision_wait"])
    assert ts["decision_cache"]["sampled_cache_size"] > 0  # late spans follow the decision
