"""`tracedpush proxy` as the launcher runs it: flags, the ready line, SIGTERM, trace files.

The engines are stub aiohttp servers in this test process (vLLM cannot run in unit
tests); the proxy itself is the real command in a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tracedpush.proxy.command import add_arguments, build_config
from tracedpush.testing.stub_engine import StubEngine

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_build_the_config():
    args = parse(
        "--mode", "push",
        "--prefill", "http://p0:8100#engine_id=prefill-0,port=5600",
        "--prefill", "http://p1:8100",
        "--decode", "http://d0:8200",
        "--first-byte-timeout", "12", "--total-timeout", "34", "--connect-timeout", "1.5",
        "--no-trace-context", "--kv-discovery", "probe", "--health-interval", "0",
    )  # fmt: skip
    config = build_config(args)
    assert config.mode == "push"
    assert [s.url for s in config.prefill] == ["http://p0:8100", "http://p1:8100"]
    assert config.prefill[0].fields == {"engine_id": "prefill-0", "port": "5600"}
    assert (config.timeouts.connect, config.timeouts.first_byte, config.timeouts.total) == (
        1.5,
        12,
        34,
    )
    assert config.trace_context is False and config.kv_discovery == "probe"
    assert args.port == 8000 and args.host == "0.0.0.0"


def test_environment_fallbacks(monkeypatch):
    monkeypatch.setenv("TRACEDPUSH_PROXY_MODE", "pull")
    monkeypatch.setenv("TRACEDPUSH_PREFILL_URLS", "http://p0:8100 http://p1:8100")
    monkeypatch.setenv("TRACEDPUSH_DECODE_URLS", "http://d0:8200")
    monkeypatch.setenv("TRACEDPUSH_PROXY_PORT", "8123")
    monkeypatch.setenv("TRACEDPUSH_TRACE_CONTEXT", "0")
    args = parse()
    config = build_config(args)
    assert config.mode == "pull" and len(config.prefill) == 2 and args.port == 8123
    assert config.trace_context is False


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--prefill", "http://p:1", "--decode", "http://d:2"), "--mode"),
        (("--mode", "push", "--decode", "http://d:2"), "--prefill"),
        (("--mode", "push", "--prefill", "http://p:1"), "--decode"),
        (("--mode", "push", "--prefill", "http://p:1#bogus=1", "--decode", "http://d:2"),
         "unknown key 'bogus'"),
        (("--mode", "pull", "--prefill", "http://p:1", "--decode", "http://d:2",
          "--total-timeout", "0"), "--total-timeout"),
    ],
)  # fmt: skip
def test_bad_flags_are_explained(argv, needle, monkeypatch):
    for name in ("TRACEDPUSH_PROXY_MODE", "TRACEDPUSH_PREFILL_URLS", "TRACEDPUSH_DECODE_URLS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=re.escape(needle)):
        build_config(parse(*argv))


def test_command_serves_prints_ready_and_stops_on_sigterm(tmp_path):
    async def scenario() -> None:
        prefill, decode = StubEngine("prefill"), StubEngine("decode")
        servers = [TestServer(prefill.app()), TestServer(decode.app())]
        for server in servers:
            await server.start_server()
        p_url, d_url = (str(s.make_url("")).rstrip("/") for s in servers)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tracedpush", "proxy",
            "--mode", "pull", "--prefill", p_url, "--decode", d_url,
            # --traces-dir: the alias named like the engines' traces_dir
            "--host", "127.0.0.1", "--port", "0", "--traces-dir", str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO, env=env,
        )  # fmt: skip
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            match = re.match(r"tracedpush proxy ready on (http://127\.0\.0\.1:\d+) ", line)
            assert match, line
            assert line.rstrip().endswith(f"; trace files in {tmp_path}"), line  # where to look
            url = match.group(1)
            async with aiohttp.ClientSession() as session:
                body = {"model": "stub-model", "prompt": "hello", "max_tokens": 3}
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["choices"][0]["text"] == "Hello world!"
                async with session.get(f"{url}/health") as resp:
                    assert resp.status == 200
                # SIGTERM with a request in flight: it is cut, and its leg closed.
                prefill.hang = True
                pending = asyncio.create_task(
                    session.post(f"{url}/v1/completions", json=body | {"stream": True})
                )
                prefill.received.clear()
                await asyncio.wait_for(prefill.received.wait(), 10)
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 30) == 0
                await asyncio.wait_for(prefill.cancelled.wait(), 10)
                await asyncio.gather(pending, return_exceptions=True)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            for server in servers:
                await server.close()

    asyncio.run(scenario())
    # The proxy's spans were flushed to OTLP JSON lines on shutdown.
    names = set()
    for path in tmp_path.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    names.update(span["name"] for span in ss["spans"])
    assert {"tracedpush.request", "proxy.prefill", "proxy.decode", "kv.relay"} <= names


def test_traces_place_defaults_to_the_engines_variable(monkeypatch):
    """TRACEDPUSH_TRACES_DIR is also the traced connectors' default traces_dir."""
    monkeypatch.setenv("TRACEDPUSH_TRACES_DIR", "/var/log/tracedpush")
    args = parse("--mode", "push", "--prefill", "http://p:1", "--decode", "http://d:2")
    assert args.traces == "/var/log/tracedpush"
    assert parse("--traces-dir", "/x").traces == "/x" == parse("--traces", "/x").traces
