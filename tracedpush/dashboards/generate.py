"""The four tracedpush dashboards, built with grafana-foundation-sdk.

Every panel queries one Prometheus data source (the ``datasource`` variable) and is
filtered by the ``mode`` variable (push, pull, or both). vLLM's own metrics carry no
``mode`` or ``role``: the scrape config gives each engine target those labels
(examples/prometheus.yml), with ``honor_labels`` so tracedpush's engine metrics, which
carry them already, keep theirs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dash_m

from tracedpush import semconv as sc
from tracedpush.analysis import phases
from tracedpush.dashboards import descriptions as words

DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
MODE = 'mode=~"$mode"'
QUANTILES = (0.5, 0.9)
TAGS = ["tracedpush", "vllm", "nixl", "disaggregated-prefill"]

# the proxy's /metrics (tracedpush/proxy/metrics.py)
PROXY_TTFT = "tracedpush_proxy_ttft_seconds"
PROXY_TPOT = "tracedpush_proxy_tpot_seconds"
PROXY_REQUESTS = "tracedpush_proxy_requests_total"
PROXY_SPANS_DROPPED = "tracedpush_proxy_spans_dropped_total"
# engines' /metrics (docs/metrics.md; not in semconv)
OBSERVATIONS_DROPPED = "tracedpush_metric_observations_dropped_total"


def counter(name: str) -> str:
    """prometheus_client exposes a counter registered as `name` as `name_total`."""
    return name if name.endswith("_total") else name + "_total"


# ----------------------------------------------------------------------- building blocks
def query(expr: str, legend: str, *, exemplar: bool = False) -> prom_b.Dataquery:
    q = prom_b.Dataquery().expr(expr).legend_format(legend).range().datasource(DATASOURCE)
    return q.exemplar(True) if exemplar else q


def quantiles(
    bucket: str, by: str, selector: str, legend: str, *, exemplar: bool = False
) -> list[prom_b.Dataquery]:
    """p50 and p90 of a histogram, aggregated `by` (le is added)."""
    return [
        query(
            f"histogram_quantile({q}, sum by (le, {by}) (rate({bucket}{{{selector}}}[{RATE}])))",
            f"{legend} p{round(q * 100)}",
            exemplar=exemplar,
        )
        for q in QUANTILES
    ]


def panel(
    title: str,
    description: str,
    targets: Sequence[prom_b.Dataquery],
    *,
    unit: str = "s",
    span: int = 12,
    height: int = 8,
    stacked: bool = False,
    repeat: str | None = None,
) -> ts_b.Panel:
    p = (
        ts_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(height)
        .min(0)
        .line_width(1)
        .fill_opacity(60 if stacked else 10)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
        .targets([t.ref_id(chr(ord("A") + i)) for i, t in enumerate(targets)])
    )
    if stacked:
        p = p.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    if repeat:
        p = p.repeat(repeat).repeat_direction("h").max_per_row(2)
    return p


def new_dashboard(uid: str, title: str, description: str) -> dash_b.Dashboard:
    return (
        dash_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dash_b.DatasourceVariable("datasource")
            .label("Prometheus")
            .type("prometheus")
            .description("The Prometheus that scrapes the engines, the proxy and collect.")
        )
        .with_variable(
            dash_b.CustomVariable("mode")
            .label("mode")
            .description("push: P WRITEs into D's blocks; pull: D READs from P.")
            .values("push,pull")
            .multi(True)
            .include_all(True)
            .current(dash_m.VariableOption(selected=True, text=["All"], value=["$__all"]))
        )
    )


def row(title: str) -> dash_b.Row:
    """An empty, expanded row: Grafana strips panels nested in an expanded row, so the
    panels that follow it are added to the dashboard itself."""
    return dash_b.Row(title)


# ----------------------------------------------------------------------------- overview
def pd_overview() -> dash_b.Dashboard:
    d = new_dashboard(
        "tracedpush-pd-overview",
        "tracedpush: P/D overview",
        "What clients see through the tracedpush proxy, push vs pull: TTFT, TPOT, request "
        "rate, failures by failed leg. Source: the proxy's /metrics.",
    )
    d.with_row(row("Latency (proxy-measured)"))
    d.with_panel(
        panel(
            "TTFT p50 / p90 by mode",
            "Proxy receipt -> first token written to the client (non-streamed: the whole "
            f"response), from `{PROXY_TTFT}`. Where it goes: the Critical path dashboard.",
            quantiles(f"{PROXY_TTFT}_bucket", "mode", MODE, "{{mode}}"),
        )
    )
    d.with_panel(
        panel(
            "TPOT p50 / p90 by mode",
            "Streamed requests: (last token - first token written to the client) / "
            f"(output tokens - 1), vLLM's definition, from `{PROXY_TPOT}`. Non-streamed "
            "and single-token requests have none.",
            quantiles(f"{PROXY_TPOT}_bucket", "mode", MODE, "{{mode}}"),
        )
    )
    d.with_row(row("Traffic and errors"))
    d.with_panel(
        panel(
            "Requests by mode and status",
            "Client requests answered per second, by HTTP status (499: the client left).",
            [
                query(
                    f"sum by (mode, status) (rate({PROXY_REQUESTS}{{{MODE}}}[{RATE}]))",
                    "{{mode}} {{status}}",
                )
            ],
            unit="reqps",
            span=8,
        )
    )
    d.with_panel(
        panel(
            "Errors by failed leg",
            "Requests whose prefill or decode leg failed (connect error, timeout, 5xx, "
            "broken stream), per second, by the leg that failed; and other non-2xx answers "
            "(invalid requests, client disconnects: leg none).",
            [
                query(
                    f'sum by (mode, leg) (rate({PROXY_REQUESTS}{{{MODE}, leg!="none"}}[{RATE}]))',
                    "{{mode}} {{leg}} leg failed",
                ),
                query(
                    f"sum by (mode, status) (rate({PROXY_REQUESTS}"
                    f'{{{MODE}, leg="none", status!~"2.."}}[{RATE}]))',
                    "{{mode}} {{status}} (no leg failed)",
                ),
            ],
            unit="reqps",
            span=8,
        )
    )
    d.with_panel(
        panel(
            "Error ratio by mode",
            "Share of answered requests that were not 2xx.",
            [
                query(
                    f'sum by (mode) (rate({PROXY_REQUESTS}{{{MODE}, status!~"2.."}}[{RATE}])) '
                    f"/ sum by (mode) (rate({PROXY_REQUESTS}{{{MODE}}}[{RATE}]))",
                    "{{mode}}",
                )
            ],
            unit="percentunit",
            span=8,
        )
    )
    d.with_row(row("Load and health"))
    d.with_panel(
        panel(
            "In flight: proxy and per engine",
            "Client requests being served by the proxy, and legs outstanding per engine "
            "(the proxy routes each leg to the least-loaded healthy engine).",
            [
                query(
                    f"sum by (mode) (tracedpush_proxy_requests_in_flight{{{MODE}}})",
                    "proxy {{mode}}",
                ),
                query(
                    "sum by (role, url) (tracedpush_proxy_upstream_outstanding)", "{{role}} {{url}}"
                ),
            ],
            unit="short",
            span=8,
        )
    )
    d.with_panel(
        panel(
            "Engine health (proxy's checks)",
            "1 when the engine's last /health check from the proxy passed.",
            [query("min by (role, url) (tracedpush_proxy_upstream_healthy)", "{{role}} {{url}}")],
            unit="short",
            span=8,
        )
    )
    d.with_panel(
        panel(
            "Proxy spans dropped",
            "Spans the proxy's own exporters dropped, by reason: "
            + "; ".join(f"{r}: {words.semconv_comments().get(r, r)}" for r in sc.DROP_REASONS)
            + ". Traces with dropped spans are incomplete.",
            [
                query(
                    f"sum by (reason) (rate({PROXY_SPANS_DROPPED}[{RATE}]))",
                    "{{reason}}",
                )
            ],
            unit="ops",
            span=8,
        )
    )
    return d


# ---------------------------------------------------------------------------- KV handoff
def kv_handoff() -> dash_b.Dashboard:
    kv_phase = sc.METRIC_KV_PHASE
    d = new_dashboard(
        "tracedpush-kv-handoff",
        "tracedpush: KV handoff",
        "The KV handoff measured by tracedpush's connector on each engine: per-phase "
        f"latency (`{kv_phase}`), failures, bytes, dropped spans. Engine-local: a phase "
        "here may overlap others and be off the critical path.",
    )
    d.with_row(row("All phases"))
    d.with_panel(
        panel(
            "KV phase p90 by mode, role and phase",
            f"`{kv_phase}`: {words.metric(kv_phase)}. Phases:\n\n"
            + words.phase_list(sc.KV_PHASES, words.kv_phase),
            [
                query(
                    f"histogram_quantile(0.9, sum by (le, mode, role, phase) "
                    f"(rate({kv_phase}_bucket{{{MODE}}}[{RATE}])))",
                    "{{mode}} {{role}} {{phase}} p90",
                )
            ],
            span=24,
            height=10,
        )
    )
    d.with_row(row("Per phase: p50 / p90 by mode and role"))
    for phase in sc.KV_PHASES:
        d.with_panel(
            panel(
                f"{phase}",
                words.kv_phase(phase),
                quantiles(
                    f"{kv_phase}_bucket",
                    "mode, role",
                    f'{MODE}, phase="{phase}"',
                    "{{mode}} {{role}}",
                ),
                span=8,
                height=7,
            )
        )
    d.with_row(row("Failures, bytes, dropped spans"))
    failures = counter(sc.METRIC_KV_FAILURES)
    d.with_panel(
        panel(
            "KV failures by reason",
            f"`{failures}` per second: the error.type of the failed KV span. Reasons:\n\n"
            + "\n".join(
                f"* **{r}**" + (f": {c}" if (c := words.semconv_comments().get(r)) else "")
                for r in sc.KV_FAILURE_REASONS
            ),
            [
                query(
                    f"sum by (mode, role, reason) (rate({failures}{{{MODE}}}[{RATE}]))",
                    "{{mode}} {{role}} {{reason}}",
                )
            ],
            unit="ops",
            span=8,
        )
    )
    kv_bytes = counter(sc.METRIC_KV_BYTES)
    d.with_panel(
        panel(
            "KV bytes moved",
            f"`{kv_bytes}` per second: {words.metric(kv_bytes)} (NIXL totalBytes).",
            [
                query(
                    f"sum by (mode, role) (rate({kv_bytes}{{{MODE}}}[{RATE}]))",
                    "{{mode}} {{role}}",
                )
            ],
            unit="Bps",
            span=8,
        )
    )
    dropped = counter(sc.METRIC_SPANS_DROPPED)
    d.with_panel(
        panel(
            "Spans dropped (engines and proxy)",
            f"`{dropped}` (engines) and `{PROXY_SPANS_DROPPED}` per second, by reason: "
            + "; ".join(f"{r}: {words.semconv_comments().get(r, r)}" for r in sc.DROP_REASONS)
            + ". Dropped spans leave traces incomplete (collect then expires them). Also "
            f"`{OBSERVATIONS_DROPPED}`: KV phase observations lost before vLLM's stats "
            "collection (this dashboard then under-counts).",
            [
                query(f"sum by (job, reason) (rate({dropped}[{RATE}]))", "{{job}} {{reason}}"),
                query(
                    f"sum by (job, reason) (rate({PROXY_SPANS_DROPPED}[{RATE}]))",
                    "{{job}} {{reason}}",
                ),
                query(
                    f"sum by (job) (rate({OBSERVATIONS_DROPPED}[{RATE}]))",
                    "{{job}} metric observations dropped",
                ),
            ],
            unit="ops",
            span=8,
        )
    )
    return d


# ------------------------------------------------------------------------- critical path
def critical_path() -> dash_b.Dashboard:
    phase_m, ttft_m = sc.METRIC_TTFT_PHASE, sc.METRIC_TTFT
    traces = counter(sc.METRIC_COLLECT_TRACES)
    d = new_dashboard(
        "tracedpush-critical-path",
        "tracedpush: critical path",
        "Where TTFT goes, from each complete trace's critical path (`tracedpush collect`'s "
        f"/metrics: `{phase_m}`, `{ttft_m}`). Exemplars link a point to its trace.",
    )
    d.with_row(row("TTFT attribution"))
    d.with_panel(
        panel(
            "TTFT attribution by phase ($mode)",
            "Mean seconds per request each phase adds to the critical-path TTFT (rate of "
            f"`{phase_m}_sum` by phase / rate of `{ttft_m}_count`); the stack adds up to the "
            "mean TTFT. One panel per selected mode. Phases:\n\n"
            + words.phase_list(phases.PHASES, words.ttft_phase),
            [
                query(
                    f"sum by (phase) (rate({phase_m}_sum{{{MODE}}}[{RATE}])) / scalar("
                    f"sum(rate({ttft_m}_count{{{MODE}}}[{RATE}])))",
                    "{{phase}}",
                )
            ],
            span=12,
            height=10,
            stacked=True,
            repeat="mode",
        )
    )
    d.with_panel(
        panel(
            "Critical-path TTFT p50 / p90 by mode",
            f"`{ttft_m}`: {words.metric(ttft_m)}. Compare with the proxy-measured TTFT "
            "(P/D overview): the difference is what the traces could not attribute.",
            quantiles(f"{ttft_m}_bucket", "mode", MODE, "{{mode}}", exemplar=True),
        )
    )
    d.with_panel(
        panel(
            "Phase p90 by mode and phase",
            f"p90 of each phase's contribution (`{phase_m}`), with exemplars (a trace id "
            "per point: click through to the trace).",
            [
                query(
                    f"histogram_quantile(0.9, sum by (le, mode, phase) "
                    f"(rate({phase_m}_bucket{{{MODE}}}[{RATE}])))",
                    "{{mode}} {{phase}} p90",
                    exemplar=True,
                )
            ],
        )
    )
    d.with_panel(
        panel(
            "Traces collected by outcome",
            f"`{traces}` per second: {words.semconv_comments().get(sc.LABEL_OUTCOME, '')} "
            "(expired: spans still missing when collect gave up on the trace).",
            [query(f"sum by (outcome) (rate({traces}[{RATE}]))", "{{outcome}}")],
            unit="ops",
        )
    )
    d.with_row(row("Per phase: p50 / p90 by mode, with exemplars"))
    for phase in phases.PHASES:
        d.with_panel(
            panel(
                phase,
                words.ttft_phase(phase),
                quantiles(
                    f"{phase_m}_bucket",
                    "mode",
                    f'{MODE}, phase="{phase}"',
                    "{{mode}}",
                    exemplar=True,
                ),
                span=8,
                height=7,
            )
        )
    return d


# --------------------------------------------------------------------- NIXL and engines
def nixl_engines() -> dash_b.Dashboard:
    d = new_dashboard(
        "tracedpush-nixl-engines",
        "tracedpush: NIXL and engines",
        "vLLM's own metrics on each engine's /metrics (`vllm:*`): NIXL transfer timing "
        "and failures, scheduler queue, KV cache. `mode` and `role` come from the scrape "
        "config's target labels.",
    )
    by = "mode, role, instance"
    legend = "{{mode}} {{role}} {{instance}}"
    d.with_row(row("NIXL (vLLM's NixlConnector stats)"))
    d.with_panel(
        panel(
            "NIXL transfer time p50 / p90",
            "`vllm:nixl_xfer_time_seconds`: NIXL's xferDuration per transfer (push: the WRITE "
            "on P; pull: the READ on D). " + words.ttft_phase(phases.WRITE),
            quantiles("vllm:nixl_xfer_time_seconds_bucket", by, MODE, legend),
        )
    )
    d.with_panel(
        panel(
            "NIXL post time p50 / p90",
            "`vllm:nixl_post_time_seconds`: NIXL's postDuration, posting a transfer. Part of "
            "the descriptor prep phase: " + words.ttft_phase(phases.DESC_PREP),
            quantiles("vllm:nixl_post_time_seconds_bucket", by, MODE, legend),
        )
    )
    d.with_panel(
        panel(
            "NIXL failures and expired KV",
            "Per second: `vllm:nixl_num_failed_transfers_total` (handshake and notification "
            "failures included), `vllm:nixl_num_failed_notifications_total`, "
            "`vllm:nixl_num_kv_expired_reqs_total` (P's KV lease expired before D took it) "
            "and `vllm:nixl_num_notifications_after_expiry_total`.",
            [
                query(
                    f"sum by ({by}) (rate(vllm:nixl_num_failed_transfers_total{{{MODE}}}[{RATE}]))",
                    f"failed transfers {legend}",
                ),
                query(
                    f"sum by ({by}) (rate(vllm:nixl_num_failed_notifications_total{{{MODE}}}"
                    f"[{RATE}]))",
                    f"failed notifications {legend}",
                ),
                query(
                    f"sum by ({by}) (rate(vllm:nixl_num_kv_expired_reqs_total{{{MODE}}}[{RATE}]))",
                    f"KV expired {legend}",
                ),
                query(
                    f"sum by ({by}) (rate(vllm:nixl_num_notifications_after_expiry_total"
                    f"{{{MODE}}}[{RATE}]))",
                    f"notifications after expiry {legend}",
                ),
            ],
            unit="ops",
        )
    )
    d.with_panel(
        panel(
            "Prompt tokens by source on decode",
            "`vllm:prompt_tokens_by_source_total` on D, per second: external_kv_transfer = "
            "tokens whose KV crossed the connector; local_compute = D computed them itself.",
            [
                query(
                    f"sum by (mode, source) (rate(vllm:prompt_tokens_by_source_total{{{MODE}, "
                    f'role="decode"}}[{RATE}]))',
                    "{{mode}} {{source}}",
                )
            ],
            unit="short",
        )
    )
    d.with_row(row("Engines (vLLM scheduler)"))
    d.with_panel(
        panel(
            "Queue time p50 / p90",
            "`vllm:request_queue_time_seconds`: time in the scheduler's waiting queue. "
            + words.ttft_phase(phases.QUEUE_WAIT),
            quantiles("vllm:request_queue_time_seconds_bucket", by, MODE, legend),
        )
    )
    d.with_panel(
        panel(
            "KV cache usage",
            "`vllm:kv_cache_usage_perc`: fraction of the engine's KV blocks in use (1 = full: "
            "new requests wait, push registrations cannot get blocks).",
            [query(f"max by ({by}) (vllm:kv_cache_usage_perc{{{MODE}}})", legend)],
            unit="percentunit",
        )
    )
    d.with_panel(
        panel(
            "Requests running",
            "`vllm:num_requests_running`: requests in the engine's model execution batches.",
            [query(f"sum by ({by}) (vllm:num_requests_running{{{MODE}}})", legend)],
            unit="short",
        )
    )
    d.with_panel(
        panel(
            "Requests waiting",
            "`vllm:num_requests_waiting`: requests waiting to be scheduled (on D this "
            "includes requests waiting for their KV).",
            [query(f"sum by ({by}) (vllm:num_requests_waiting{{{MODE}}})", legend)],
            unit="short",
        )
    )
    d.with_row(row("Engine threads (tracedpush, from /proc)"))
    threads = "mode, role, instance, process, thread"
    thread_legend = "{{mode}} {{role}} {{instance}} {{process}} {{thread}}"
    for metric, title, what in (
        (
            counter(sc.METRIC_THREAD_CPU_WAIT),
            "Threads waiting for a CPU (s/s)",
            "runnable without a CPU (the kernel's schedstat run delay): 1 = a thread that "
            "wanted a core all the time and never had one. Where a thread ran says who "
            "shared a core; its wait says whom that cost (an API server or EngineCore "
            "starved by a busy-polling worker on the same core, docs/findings.md)",
        ),
        (
            counter(sc.METRIC_THREAD_CPU),
            "Threads on a CPU (s/s)",
            "on a CPU (utime + stime): 1 = a whole core",
        ),
    ):
        d.with_panel(
            panel(
                title,
                f"`{metric}` per second, by engine process and thread role: the time this "
                f"engine's threads were {what}. Roles: model_runner (a worker's main "
                "thread), compute (its OpenMP / torch threads), nixl (NIXL's UCX progress "
                "thread), push_writer, engine_core, api_server, tracedpush (our builders "
                "and exporters), other. The engine's process spans `engine.threads` carry "
                "the same numbers per thread (the report's Contention section).",
                [query(f"sum by ({threads}) (rate({metric}{{{MODE}}}[{RATE}]))", thread_legend)],
                unit="percentunit",
            )
        )
    return d


# ------------------------------------------------------------------------------- output
# file name (under dashboards/) -> builder
DASHBOARDS: dict[str, Callable[[], dash_b.Dashboard]] = {
    "tracedpush-pd-overview.json": pd_overview,
    "tracedpush-kv-handoff.json": kv_handoff,
    "tracedpush-critical-path.json": critical_path,
    "tracedpush-nixl-engines.json": nixl_engines,
}


def build_all() -> dict[str, dict[str, Any]]:
    """`{file name: dashboard JSON object}`, as Grafana imports it."""
    return {
        name: json.loads(json.dumps(build().build(), cls=JSONEncoder))
        for name, build in DASHBOARDS.items()
    }


def render_all() -> dict[str, str]:
    """`{file name: file text}`: stable (indent 2, trailing newline) so the committed
    files diff cleanly and a stale one is detected byte for byte."""
    return {
        name: json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
        for name, obj in build_all().items()
    }
