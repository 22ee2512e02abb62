"""A real Prometheus for tests: scrape given targets, then ask it what it stored.

Why a real one: the dashboards' queries, the `_total` suffixes, OpenMetrics exemplars
and histogram buckets are only proven by the server that will run them. Debian's
``prometheus`` package (2.42, installed by scripts/install.sh) is enough; each run gets
a generated config (1 s scrapes, exemplar storage on), a temporary TSDB and a free port,
and the process is always terminated.

    with run_prometheus({"engines": ["127.0.0.1:8100"]}) as prom:
        prom.wait_for_targets()
        prom.query('sum by (mode) (rate(tracedpush_kv_bytes_total[30s]))')
        prom.query_exemplars("tracedpush_ttft_phase_seconds_bucket", start, end)

`panel_queries(dashboard_json)` gives every panel's PromQL with Grafana's template
variables substituted, to run or to `promtool check rules`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracedpush.testing.net import free_port

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
READY_TIMEOUT_S = 20.0


def find_binary(name: str, default: str) -> str | None:
    """`default` if executable, else `name` on PATH, else None (callers skip)."""
    if os.access(default, os.X_OK):
        return default
    return shutil.which(name)


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered a query with an error."""


class Prometheus:
    """A running Prometheus server (see `run_prometheus`): its URL and HTTP API."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], workdir: Path) -> None:
        self.url = url
        self.process = process
        self.workdir = workdir

    @property
    def log(self) -> str:
        """Its stderr so far (for failure messages)."""
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def api(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """GET /api/v1/<path>; the `data` of a success, else PrometheusError."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:  # 400/422: a bad query, with a JSON reason
            try:
                body = json.load(err)
            except ValueError:
                raise PrometheusError(f"{url}: HTTP {err.code}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {dict(params or {})}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: the result series (`{"metric": {...}, "value": [t, "v"]}`);
        a scalar or string result comes back as one series without labels."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """Exemplars of the series `expr` selects between `start` and `end` (Unix s):
        `[{"seriesLabels": {...}, "exemplars": [{"labels": {"trace_id": ...}, "value",
        "timestamp"}]}]`."""
        return self.api("query_exemplars", {"query": expr, "start": start, "end": end})

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets, each with `health` ("up", "down", "unknown")."""
        return self.api("targets", {"state": "active"})["activeTargets"]

    def wait_for_targets(self, timeout_s: float = 15.0) -> list[dict[str, Any]]:
        """Until every target has been scraped successfully at least once."""
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return targets
            if time.monotonic() > deadline:
                raise PrometheusError(
                    "targets not up: "
                    + ", ".join(f"{t['scrapeUrl']} {t['health']} {t['lastError']}" for t in targets)
                )
            time.sleep(0.2)

    def wait_for(self, expr: str, timeout_s: float = 15.0) -> list[dict[str, Any]]:
        """Until `expr` returns at least one series (e.g. a rate() needs two scrapes)."""
        deadline = time.monotonic() + timeout_s
        while not (result := self.query(expr)):
            if time.monotonic() > deadline:
                raise PrometheusError(f"no series for {expr!r} after {timeout_s} s")
            time.sleep(0.25)
        return result


def prometheus_config(
    jobs: Mapping[str, Sequence[str]],
    *,
    scrape_interval: str = "1s",
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A scrape config: one job per `jobs` entry (`{job: ["host:port", ...]}`), with
    optional target labels per job; `honor_labels` so a scraped `mode`/`role` wins over
    a target label of the same name (as in examples/prometheus.yml)."""
    labels = labels or {}
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": list(targets),
                        **({"labels": dict(labels[job])} if job in labels else {}),
                    }
                ],
            }
            for job, targets in jobs.items()
        ],
    }


@contextlib.contextmanager
def run_prometheus(
    jobs: Mapping[str, Sequence[str]] | Sequence[str],
    *,
    scrape_interval: str = "1s",
    labels: Mapping[str, Mapping[str, str]] | None = None,
    binary: str | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[Prometheus]:
    """Start Prometheus on `jobs` (`{job: [targets]}`, or a list of targets for one job
    named "test"), wait until /-/ready, yield it, and always stop it (SIGTERM, then
    SIGKILL) and remove its TSDB."""
    binary = binary or find_binary("prometheus", PROMETHEUS)
    if binary is None:
        raise PrometheusError("no prometheus binary (Debian: apt-get install prometheus)")
    if not isinstance(jobs, Mapping):
        jobs = {"test": list(jobs)}
    workdir = Path(tempfile.mkdtemp(prefix="tracedpush-prometheus-"))
    config = workdir / "prometheus.yml"
    # JSON is YAML: no YAML library needed to write the config.
    config.write_text(
        json.dumps(prometheus_config(jobs, scrape_interval=scrape_interval, labels=labels))
    )
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C of the test run is ours to forward, not its
    )
    prom = Prometheus(f"http://127.0.0.1:{port}", process, workdir)
    try:
        _wait_ready(prom, ready_timeout_s)
        yield prom
    finally:
        _stop(process)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_ready(prom: Prometheus, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if prom.process.poll() is not None:
            raise PrometheusError(f"prometheus exited ({prom.process.returncode}):\n{prom.log}")
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise PrometheusError(f"prometheus not ready after {timeout_s} s:\n{prom.log}")
        time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


# ------------------------------------------------------------------ dashboards' queries
# Grafana's built-in interval variables, as a dashboard at its default range sets them.
BUILTINS = {
    "__rate_interval": "30s",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}


def _regex_escape(value: str) -> str:
    """Grafana's escaping of a multi-value variable for a Prometheus regex matcher
    (regex metacharacters, with the backslash doubled for PromQL's string)."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def template_values(
    dashboard: Mapping[str, Any],
    values: Mapping[str, str | Sequence[str]] | None = None,
    *,
    rate_interval: str = "30s",
) -> dict[str, str]:
    """What each of the dashboard's variables becomes in a query: `values[name]` when
    given (several values: a regex alternation, as Grafana formats them), else every
    option of a custom variable ("All"); data-source variables keep their query."""
    values = values or {}
    out = {**BUILTINS, "__rate_interval": rate_interval}
    for var in (dashboard.get("templating") or {}).get("list") or []:
        name, kind = var["name"], var.get("type")
        chosen = values.get(name)
        if chosen is None and kind == "custom":
            chosen = [v.strip() for v in str(var.get("query", "")).split(",") if v.strip()]
        elif chosen is None:
            chosen = str(var.get("query", ""))
        if isinstance(chosen, str):
            out[name] = chosen
        else:
            escaped = [_regex_escape(v) for v in chosen]
            out[name] = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    return out


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Replace `${name}`, `${name:format}`, `[[name]]` and `$name` (longest name first,
    so `$__range_s` is not read as `$__range`)."""
    for name in sorted(variables, key=len, reverse=True):
        value = variables[name]
        expr = re.sub(r"\$\{" + re.escape(name) + r"(?::[^}]*)?\}", lambda _, v=value: v, expr)
        expr = expr.replace(f"[[{name}]]", value)
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", lambda _, v=value: v, expr)
    return expr


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # a collapsed row's panels


def panel_targets(
    dashboard: Mapping[str, Any],
    values: Mapping[str, str | Sequence[str]] | None = None,
    *,
    rate_interval: str = "30s",
) -> list[tuple[str, str]]:
    """`(panel title, PromQL)` for every query of every panel, variables substituted."""
    variables = template_values(dashboard, values, rate_interval=rate_interval)
    return [
        (str(panel.get("title", "")), substitute(target["expr"], variables))
        for panel in _panels(dashboard.get("panels") or [])
        for target in panel.get("targets") or []
        if target.get("expr")
    ]


def panel_queries(
    dashboard: Mapping[str, Any],
    values: Mapping[str, str | Sequence[str]] | None = None,
    *,
    rate_interval: str = "30s",
) -> list[str]:
    """Every panel's PromQL with template variables substituted ($mode -> (push|pull)
    unless `values` picks, $__rate_interval -> `rate_interval`, ...)."""
    return [expr for _, expr in panel_targets(dashboard, values, rate_interval=rate_interval)]


# ------------------------------------------------------------------------------ promtool
def promtool(*args: str, binary: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool (stdout and stderr captured); PrometheusError if it is missing."""
    binary = binary or find_binary("promtool", PROMTOOL)
    if binary is None:
        raise PrometheusError("no promtool binary (Debian: apt-get install prometheus)")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def check_queries(exprs: Sequence[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on one recording rule per expression: PromQL parses."""
    rules = {
        "groups": [
            {
                "name": "panel-queries",
                "rules": [
                    {"record": f"tracedpush:panel_query:{i}", "expr": expr}
                    for i, expr in enumerate(exprs)
                ],
            }
        ]
    }
    path = workdir / "panel-queries.rules.yml"
    path.write_text(json.dumps(rules, indent=1))
    return promtool("check", "rules", str(path))
