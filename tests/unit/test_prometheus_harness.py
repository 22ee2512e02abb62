"""tracedpush.testing.prometheus against a real Prometheus (Debian's 2.42) scraping a
real target: a prometheus_client server in this process exposing collect-like
histograms with an OpenMetrics exemplar. Also: the dashboards' queries run on it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from tracedpush import semconv as sc
from tracedpush.dashboards import build_all
from tracedpush.testing.net import free_port
from tracedpush.testing.prometheus import (
    PROMETHEUS,
    Prometheus,
    PrometheusError,
    find_binary,
    panel_queries,
    panel_targets,
    prometheus_config,
    run_prometheus,
    substitute,
    template_values,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

needs_prometheus = pytest.mark.skipif(
    find_binary("prometheus", PROMETHEUS) is None,
    reason="prometheus not installed (Debian package prometheus; scripts/install.sh)",
)


class Target:
    """What `tracedpush collect` will expose: per-phase and total TTFT histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.phase = Histogram(
            sc.METRIC_TTFT_PHASE, "TTFT by phase", ["mode", "phase"], registry=self.registry
        )
        self.ttft = Histogram(sc.METRIC_TTFT, "TTFT", ["mode"], registry=self.registry)
        self.port = free_port()
        self.server, self.thread = start_http_server(
            self.port, addr="127.0.0.1", registry=self.registry
        )

    def observe(self) -> None:
        self.phase.labels("push", "WRITE").observe(0.02, exemplar={"trace_id": TRACE_ID})
        self.phase.labels("pull", "READ").observe(0.03)
        self.ttft.labels("push").observe(0.2, exemplar={"trace_id": TRACE_ID})
        self.ttft.labels("pull").observe(0.25)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def scraped() -> Iterator[tuple[Prometheus, Target, float]]:
    target = Target()
    target.observe()
    started = time.time()
    try:
        with run_prometheus({"collect": [f"127.0.0.1:{target.port}"]}) as prom:
            prom.wait_for_targets()
            target.observe()  # a second value, so rate() is not zero
            prom.wait_for(f"rate({sc.METRIC_TTFT_PHASE}_count[30s]) > 0")
            yield prom, target, started
    finally:
        target.close()


@needs_prometheus
def test_prometheus_scrapes_the_target_and_answers_queries(scraped):
    prom, target, _ = scraped
    (t,) = prom.targets()
    assert t["health"] == "up" and t["labels"]["job"] == "collect"
    assert t["scrapeUrl"] == f"http://127.0.0.1:{target.port}/metrics"
    series = prom.query(f"{sc.METRIC_TTFT_PHASE}_count")
    labels = {(s["metric"]["mode"], s["metric"]["phase"]) for s in series}
    assert labels == {("push", "WRITE"), ("pull", "READ")}
    assert all(float(s["value"][1]) >= 1 for s in series)
    assert float(prom.query("scalar(sum(up))")[0]["value"][1]) == 1
    with pytest.raises(PrometheusError, match="parse error"):
        prom.query("sum(")


@needs_prometheus
def test_exemplars_come_back_with_their_trace_id(scraped):
    prom, _, started = scraped
    result = prom.query_exemplars(
        f'{sc.METRIC_TTFT_PHASE}_bucket{{mode="push"}}', started - 5, time.time() + 5
    )
    trace_ids = {e["labels"]["trace_id"] for s in result for e in s["exemplars"]}
    assert trace_ids == {TRACE_ID}
    (series,) = [s for s in result if s["exemplars"]]  # the bucket 0.02 s fell in
    assert series["seriesLabels"]["phase"] == "WRITE"
    assert series["seriesLabels"]["le"] == "0.025"
    none = prom.query_exemplars(
        f'{sc.METRIC_TTFT_PHASE}_bucket{{mode="pull"}}', started - 5, time.time() + 5
    )
    assert not [e for s in none for e in s["exemplars"]]  # pull observed none


@needs_prometheus
def test_every_dashboard_query_runs_and_the_critical_path_ones_have_data(scraped):
    """Each panel's PromQL, variables substituted, is accepted by a real Prometheus
    (empty results are fine: no engine or proxy here); the critical-path panels fed by
    the collect-like target return series."""
    prom = scraped[0]
    for name, dashboard in build_all().items():
        for title, expr in panel_targets(dashboard):
            try:
                prom.query(expr)
            except PrometheusError as err:
                pytest.fail(f"{name} / {title}: {err}")
    critical = build_all()["tracedpush-critical-path.json"]
    by_title = dict(panel_targets(critical, {"mode": "push"}))
    assert prom.query(by_title["TTFT attribution by phase ($mode)"])
    (write,) = prom.query(by_title["WRITE"])
    assert 0 < float(write["value"][1]) <= 0.025  # p50 of 0.02 s observations


def test_panel_queries_substitute_grafana_variables():
    dashboard: dict[str, Any] = {
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {"name": "mode", "type": "custom", "query": "push,pull"},
                {"name": "phase", "type": "custom", "query": "WRITE,descriptor prep,a.b"},
            ]
        },
        "panels": [
            {
                "type": "row",
                "title": "r",
                "panels": [
                    {"title": "nested", "targets": [{"expr": 'x{mode=~"$mode"}[$__rate_interval]'}]}
                ],
            },
            {
                "title": "p",
                "targets": [
                    {"expr": 'y{phase=~"${phase}", ds="${datasource}"}[$__range_s]'},
                    {"refId": "B"},  # no expr: not a PromQL query
                ],
            },
        ],
    }
    assert panel_queries(dashboard) == [
        'x{mode=~"(push|pull)"}[30s]',
        'y{phase=~"(WRITE|descriptor prep|a\\\\.b)", ds="prometheus"}[3600]',
    ]
    assert panel_queries(dashboard, {"mode": "push"}, rate_interval="5s")[0] == (
        'x{mode=~"push"}[5s]'
    )
    assert panel_queries(dashboard, {"mode": ["pull"]})[0] == 'x{mode=~"pull"}[30s]'
    variables = template_values(dashboard)
    assert substitute("$__range $__range_s [[mode]] ${mode:regex}", variables) == (
        "1h 3600 (push|pull) (push|pull)"
    )


def test_the_generated_config_scrapes_every_second_and_honors_labels():
    config = prometheus_config({"engines": ["a:1", "b:2"]}, labels={"engines": {"role": "decode"}})
    assert config["global"]["scrape_interval"] == "1s"
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["static_configs"] == [{"targets": ["a:1", "b:2"], "labels": {"role": "decode"}}]


@needs_prometheus
def test_prometheus_is_terminated_and_its_storage_removed():
    with run_prometheus(["127.0.0.1:1"]) as prom:
        process, workdir = prom.process, prom.workdir
        assert (workdir / "prometheus.yml").is_file()
        assert process.poll() is None
    assert process.poll() is not None
    assert not workdir.exists()
