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
