"""`tracedpush collect` as a command (a real subprocess: ready line, SIGTERM, exit code;
`tracedpush report` on what it stored) and `tracedpush up --collect`'s wiring (checked
without starting anything)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tracedpush.cli import main
from tracedpush.launcher import Deployment, DeploymentConfig, servers
from tracedpush.launcher.command import add_arguments, config_from_args
from tracedpush.testing.collect import ONE_HOST, export_all, grpc_exporter, scrape
from tracedpush.testing.net import free_port
from tracedpush.testing.synthetic import generate


def _start(*args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracedpush", "collect", "--host", "127.0.0.1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _wait_for(lines: queue.Queue[str], text: str, timeout: float = 30) -> str:
    seen = []
    while True:
        line = lines.get(timeout=timeout)
        seen.append(line)
        if text in line:
            return line
        if not line:
            raise AssertionError(f"no {text!r} in output:\n{''.join(seen)}")


def test_collect_serves_until_sigterm_and_report_reads_its_store(tmp_path: Path, capsys):
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    traces = tmp_path / "traces"
    proc, lines = _start(
        "--traces",
        str(traces),
        "--otlp-http-port",
        str(http),
        "--otlp-grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics),
    )
    try:
        ready = _wait_for(lines, "tracedpush collect ready")
        assert f"http://127.0.0.1:{http}/v1/traces" in ready
        assert f"127.0.0.1:{grpc_port}" in ready and f":{metrics}/metrics" in ready
        run = generate(6, seed=8, hosts=ONE_HOST, engine_steps=False)
        sent = export_all([grpc_exporter(grpc_port)], run.spans.values(), batch=100)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=5) as r:
            assert json.loads(r.read())["status"] == "ok"
        # a second collector on the same ports fails clearly instead of sharing them
        clash = subprocess.run(
            [sys.executable, "-m", "tracedpush", "collect", "--host", "127.0.0.1",
             "--no-trace-files", "--otlp-http-port", str(http), "--otlp-grpc-port", "0",
             "--metrics-port", "0"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert clash.returncode == 1 and "cannot listen" in clash.stderr
        deadline_scrape = scrape(f"http://127.0.0.1:{metrics}/metrics")
        assert deadline_scrape.value("tracedpush_collect_spans_total") == sent
        proc.send_signal(signal.SIGTERM)
        stopped = _wait_for(lines, "tracedpush collect stopped")
        assert f"{sent} spans received" in stopped
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    capsys.readouterr()
    assert main(["report", "--traces", str(traces), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["requests"]) == 6
    assert all(r["complete"] for r in report["requests"])


def test_bad_flags_stop_before_listening():
    out = subprocess.run(
        [sys.executable, "-m", "tracedpush", "collect", "--otlp-http-port", "0",
         "--otlp-grpc-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "nothing to collect" in out.stderr


def test_up_collect_wires_every_process_to_the_collector(model: Path, tmp_path: Path):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--collect", "--model", str(model), "--run-dir", str(tmp_path / "run"),
         "--collect-port", "14318", "--collect-forward", "http://jaeger:4318"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.collect and config.collect_port == 14318
    d = Deployment(config, log=None, lock=False)
    url = "http://127.0.0.1:14318"
    assert d.collect_url == url
    assert d.urls()["collect OTLP/HTTP"] == f"{url}/v1/traces"
    assert d.urls()["collect metrics"] == "http://127.0.0.1:9464/metrics"
    assert d.ports()[14318] == "collect OTLP/HTTP" and d.ports()[9464] == "collect /metrics"

    collect, _ = d.collect_process()
    argv = collect.argv
    assert argv[argv.index("--traces") + 1] == str(d.traces_dir)
    assert argv[argv.index("--otlp-http-port") + 1] == "14318"
    assert argv[argv.index("--otlp-grpc-port") + 1] == "0"
    assert argv[argv.index("--forward") + 1] == "http://jaeger:4318"
    assert collect.health_url == "http://127.0.0.1:9464/health"

    for engine in d.engines:
        proc, env = d.engine_process(engine)
        kv = json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])
        assert "traces_dir" not in kv["kv_connector_extra_config"]["tracedpush"]
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == f"{url}/v1/traces"
        assert env["OTEL_TRACES_EXPORTER"] == "otlp" and env["TRACEDPUSH_TRACES_DIR"] == ""
    proxy, env = d.proxy_process()
    assert "--no-trace-files" in proxy.argv and "--no-trace-context" not in proxy.argv
    assert "--traces" not in proxy.argv
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == url
    flags = servers.proxy_flags()
    assert all(a in flags for a in proxy.argv if a.startswith("--"))

    plain = Deployment(
        DeploymentConfig(mode="push", model=model, run_dir=tmp_path), log=None, lock=False
    )
    assert plain.collect_url is None and "collect" not in plain.logs
    assert "collect metrics" not in plain.urls()
    proxy_argv = plain.proxy_process()[0].argv
    assert proxy_argv[proxy_argv.index("--traces") + 1] == str(plain.traces_dir)
    with pytest.raises(ValueError, match="collect needs tracing"):
        Deployment(
            DeploymentConfig(mode="push", model=model, run_dir=tmp_path, trace=False, collect=True),
            log=None,
            lock=False,
        )
