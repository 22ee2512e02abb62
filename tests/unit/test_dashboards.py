"""The Grafana dashboards are generated (tracedpush.dashboards): the committed JSON is
what the generator makes today, every panel query parses (promtool), and the panels say
what they show, in the words of analysis.phases and semconv."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import phases
from tracedpush.dashboards import DASHBOARDS, build_all, render_all
from tracedpush.dashboards import descriptions as words
from tracedpush.testing.prometheus import (
    PROMTOOL,
    check_queries,
    find_binary,
    panel_queries,
    panel_targets,
)

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards"


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return build_all()


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_committed_dashboards_are_what_the_generator_makes():
    """Regenerated in memory, byte for byte; and no hand-written leftovers beside them."""
    for name, text in render_all().items():
        path = DASHBOARD_DIR / name
        assert path.is_file(), f"{path} missing: run `make dashboards`"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `make dashboards`"
    on_disk = {p.name for p in DASHBOARD_DIR.glob("*.json")}
    assert on_disk == set(DASHBOARDS), f"not generated: {sorted(on_disk - set(DASHBOARDS))}"


def test_every_panel_query_parses_with_promtool(dashboards, tmp_path: Path):
    if find_binary("promtool", PROMTOOL) is None:
        pytest.skip("promtool not installed (Debian package prometheus; scripts/install.sh)")
    for name, dashboard in dashboards.items():
        for values in (None, {"mode": "push"}, {"mode": ["push", "pull"]}):
            exprs = panel_queries(dashboard, values)
            assert exprs, name
            out = check_queries(exprs, tmp_path)
            assert out.returncode == 0, f"{name} {values}: {out.stdout}{out.stderr}"


def test_variables_are_all_substituted(dashboards):
    for name, dashboard in dashboards.items():
        for title, expr in panel_targets(dashboard):
            assert "$" not in expr and "[[" not in expr, f"{name} / {title}: {expr}"


def test_each_dashboard_has_a_datasource_and_a_multi_mode_variable(dashboards):
    for name, dashboard in dashboards.items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        mode = variables["mode"]
        assert mode["type"] == "custom" and mode["multi"] and mode["includeAll"], name
        assert mode["query"].split(",") == ["push", "pull"], name


def test_every_panel_is_described_and_uses_the_datasource_variable(dashboards):
    for name, dashboard in dashboards.items():
        assert dashboard["uid"] and dashboard["title"].startswith("tracedpush: "), name
        for panel in _panels(dashboard):
            where = f"{name} / {panel['title']}"
            assert len(panel.get("description", "")) > 20, where
            assert panel["datasource"]["uid"] == "${datasource}", where
            refs = [t["refId"] for t in panel["targets"]]
            assert len(set(refs)) == len(refs) and all(refs), where
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", where


def test_queries_follow_the_mode_variable(dashboards):
    """Everything that has a mode filters on it; only mode-less series (per engine URL,
    per exporter, collect's outcomes) are exempt."""
    exempt = ("upstream_", "spans_dropped", "observations_dropped", "collect_traces")
    for name, dashboard in dashboards.items():
        for panel in _panels(dashboard):
            for target in panel["targets"]:
                expr = target["expr"]
                if not any(e in expr for e in exempt):
                    assert 'mode=~"$mode"' in expr, f"{name} / {panel['title']}: {expr}"


def test_counters_are_queried_with_their_total_suffix(dashboards):
    """prometheus_client and vLLM expose counters as <name>_total (the old hand-written
    dashboard queried vllm:nixl_num_failed_transfers without it: no data, ever)."""
    counters = [
        "vllm:nixl_num_failed_transfers",
        "vllm:nixl_num_failed_notifications",
        "vllm:nixl_num_kv_expired_reqs",
        "vllm:nixl_num_notifications_after_expiry",
        "vllm:prompt_tokens_by_source",
        sc.METRIC_KV_FAILURES,
        sc.METRIC_KV_BYTES,
        sc.METRIC_SPANS_DROPPED,
        sc.METRIC_COLLECT_TRACES,
        "tracedpush_proxy_spans_dropped",
    ]
    exprs = [e for d in dashboards.values() for e in panel_queries(d)]
    text = "\n".join(exprs)
    for name in counters:
        uses = re.findall(re.escape(name) + r"[A-Za-z0-9_]*", text)
        assert uses, f"{name} is not on any dashboard"
        assert all(u == name + "_total" for u in uses), (name, set(uses))
    assert "tracedpush_proxy_requests_total{" in text  # (its prefix is also a gauge's)


def test_the_four_dashboards_cover_their_metrics(dashboards):
    def text(file: str) -> str:
        return "\n".join(panel_queries(dashboards[file]))

    overview = text("tracedpush-pd-overview.json")
    for metric in ("tracedpush_proxy_ttft_seconds_bucket", "tracedpush_proxy_tpot_seconds_bucket"):
        assert f"histogram_quantile(0.5, sum by (le, mode) (rate({metric}" in overview
        assert f"histogram_quantile(0.9, sum by (le, mode) (rate({metric}" in overview
    assert 'leg!="none"' in overview
    kv = text("tracedpush-kv-handoff.json")
    assert "sum by (le, mode, role) (rate(tracedpush_kv_phase_seconds_bucket" in kv
    for phase in sc.KV_PHASES:
        assert f'phase="{phase}"' in kv
    critical = text("tracedpush-critical-path.json")
    assert "sum by (phase) (rate(tracedpush_ttft_phase_seconds_sum" in critical
    for phase in phases.PHASES:
        assert f'phase="{phase}"' in critical
    nixl = text("tracedpush-nixl-engines.json")
    for metric in (
        "vllm:nixl_xfer_time_seconds_bucket",
        "vllm:nixl_post_time_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert metric in nixl


def test_phase_panels_are_described_from_phases_and_semconv(dashboards):
    """Not retyped: each per-phase panel's description is analysis.phases.DESCRIPTIONS
    (critical path) or the semconv comment plus that description (engine KV phases)."""
    critical = {p["title"]: p for p in _panels(dashboards["tracedpush-critical-path.json"])}
    for phase in phases.PHASES:
        assert critical[phase]["description"] == phases.DESCRIPTIONS[phase]
    kv = {p["title"]: p for p in _panels(dashboards["tracedpush-kv-handoff.json"])}
    comments = words.semconv_comments()
    assert comments[sc.KV_PHASE_WRITE] == "push, P: kv.write"
    for phase in sc.KV_PHASES:
        description = kv[phase]["description"]
        assert comments[phase] in description
        if phase in phases.DESCRIPTIONS:
            assert phases.DESCRIPTIONS[phase] in description
    stacked = critical["TTFT attribution by phase ($mode)"]
    assert all(f"**{p}**" in stacked["description"] for p in phases.PHASES)


def test_exemplars_are_on_where_collect_exports_them(dashboards):
    critical = _panels(dashboards["tracedpush-critical-path.json"])
    with_exemplars = [p["title"] for p in critical if any(t.get("exemplar") for t in p["targets"])]
    # every per-phase panel, the phase p90 and the critical-path TTFT panel
    assert set(phases.PHASES) <= set(with_exemplars)
    assert "Phase p90 by mode and phase" in with_exemplars
    for panel in critical:
        for target in panel["targets"]:
            if target.get("exemplar"):
                assert "_bucket" in target["expr"], panel["title"]  # exemplars ride on buckets
    attribution = next(p for p in critical if p["title"].startswith("TTFT attribution"))
    assert attribution["repeat"] == "mode"
    assert attribution["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


def test_generator_cli_check_and_no_vllm_import(tmp_path: Path):
    """`python -m tracedpush.dashboards --check` flags a stale directory, writing fixes
    it; and generating never imports vLLM (dashboards are built on any laptop)."""
    cmd = [sys.executable, "-m", "tracedpush.dashboards", "--out", str(tmp_path)]
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 1
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert subprocess.run([*cmd, "--check"], capture_output=True).returncode == 0
    assert json.loads((tmp_path / "tracedpush-kv-handoff.json").read_text())["uid"]
    code = (
        "import sys, tracedpush.dashboards as d; d.render_all(); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'nixl')]"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
