"""Faults, as a user causes them, on a real `tracedpush up` (issue 11).

Killing the decode engine under load: every client gets an answer naming the decode
leg, the prefill engine stays healthy, the launcher restarts the decode engine
(`--on-exit restart`, the default) and, once it is back, requests succeed again. Each
failed request's trace says it failed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tracedpush.analysis import TraceStore, analyze
from tracedpush.launcher.metrics import metric_sum
from tracedpush.launcher.processes import busy_ports, http_ok, lock_delegation_env
from tracedpush.testing.processes import alive, descendants

PORTS = {"--port": 18400, "--prefill-port": 18500, "--decode-port": 18600}
SIDE = {"--prefill-side-channel-port": 15800, "--decode-side-channel-port": 15900}
PROXY, PREFILL = "http://127.0.0.1:18400", "http://127.0.0.1:18500"
IN_FLIGHT = 8
ANSWER_WITHIN_S = 30.0
LEASE_S = 30.0  # vLLM's default kv_lease_duration (the launcher does not change it)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


class Up:
    """`tracedpush up` in a subprocess, its output collected by a thread."""

    def __init__(self, mode: str, run_dir: Path) -> None:
        argv = [sys.executable, "-m", "tracedpush", "up", "--mode", mode, "--run-dir", str(run_dir)]
        for flag, port in {**PORTS, **SIDE}.items():
            argv += [flag, str(port)]
        env = {**os.environ, **lock_delegation_env()}  # the session holds the engines lock
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self.seen: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.seen |= descendants(self.proc.pid)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            assert self.proc.poll() is None, f"tracedpush up exited:\n{self.output[-4000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output[-4000:]}"
            time.sleep(0.5)

    def pid_of(self, name: str) -> int:
        found = re.findall(rf"\b{name}: pid (\d+)", self.output)
        assert found, self.output
        return int(found[-1])

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        time.sleep(0.5)  # the reader thread drains the last lines
        return self.output


def _model() -> str:
    with urllib.request.urlopen(f"{PROXY}/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def _stream(model: str, request_id: str, max_tokens: int, first: threading.Event | None) -> dict:
    """One streamed completion; what the client saw: status, tokens, an error's text."""
    body = {"model": model, "prompt": "the handoff under fire " * 40, "max_tokens": max_tokens}
    body |= {"stream": True, "ignore_eos": True}
    req = urllib.request.Request(
        f"{PROXY}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "X-Request-Id": request_id},
    )
    out: dict[str, Any] = {"id": request_id, "status": None, "tokens": 0, "error": None}
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            out["status"] = resp.status
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    out["error"] = json.dumps(chunk["error"])
                elif chunk.get("choices"):
                    out["tokens"] += 1
                    if first is not None:
                        first.set()
    except urllib.error.HTTPError as e:
        out["status"], out["error"] = e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["ended"] = time.monotonic()
    out["seconds"] = out["ended"] - t0
    return out


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_killing_decode_under_load_leaves_prefill_serving(mode: str, tmp_path: Path) -> None:
    up = Up(mode, tmp_path)
    try:
        up.wait_for("Press Ctrl-C", 600)
        model = _model()
        prefix = f"fault-{mode}-{uuid.uuid4().hex[:6]}"
        started = threading.Event()
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            futures = [
                pool.submit(_stream, model, f"{prefix}-{i}", 400, started) for i in range(IN_FLIGHT)
            ]
            assert started.wait(120), "no request got a first token"
            time.sleep(0.5)  # a few more in flight, at different stages
            decode_pid = up.pid_of("decode")
            os.killpg(decode_pid, signal.SIGKILL)  # the whole engine: API server and children
            killed_at = time.monotonic()
            p_health = []
            while not all(f.done() for f in futures):
                p_health.append(http_ok(f"{PREFILL}/health", timeout=10.0))
                assert time.monotonic() - killed_at < ANSWER_WITHIN_S + 5, "clients still waiting"
                time.sleep(0.5)
            results = [f.result() for f in futures]

        # every client answered within 30 s, each failure naming the decode leg
        for r in results:
            assert r["ended"] - killed_at <= ANSWER_WITHIN_S, r
        failed = [r for r in results if r["error"] or r["status"] != 200]
        assert failed, "killing D failed no request: it was not under load"
        for r in failed:
            assert "decode" in (r["error"] or ""), r
            assert r["status"] in (200, 502, 504), r  # 200: a stream cut short by an SSE error
        # P stayed healthy, and frees the dead requests' KV blocks within vLLM's KV lease
        # (kv_lease_duration, 30 s by default) plus a heartbeat's slack
        assert p_health and all(p_health), p_health
        deadline = killed_at + LEASE_S + 30
        while (usage := metric_sum(PREFILL, "vllm:kv_cache_usage_perc")) > 0:
            assert time.monotonic() < deadline, f"P still holds KV blocks: usage {usage}"
            time.sleep(1)
        freed_s = time.monotonic() - killed_at
        # the launcher restarts D while P and the proxy keep running
        up.wait_for(f"decode (pid {decode_pid}) exited unexpectedly", 30)
        up.wait_for("decode is healthy again", 420)
        p_pid = up.pid_of("prefill")
        assert alive(p_pid)
        deadline = time.monotonic() + 60
        while not http_ok(f"{PROXY}/health", timeout=5):  # the proxy sees D back
            assert time.monotonic() < deadline, "the proxy did not mark D healthy again"
            time.sleep(1)
        with ThreadPoolExecutor(4) as pool:
            after = list(
                pool.map(lambda i: _stream(model, f"{prefix}-after-{i}", 8, None), range(16))
            )
        bad = [r for r in after if r["status"] != 200 or r["error"] or r["tokens"] != 8]
        assert not bad, bad

        # each failed request's trace says where it failed
        ids = {r["id"] for r in failed}
        store = TraceStore.from_path(tmp_path / "traces")
        deadline = time.monotonic() + 60
        while True:
            run = analyze(store, spans=False)
            got = {r.request_id: r for r in run.requests if r.request_id in ids}
            if len(got) == len(ids) and all(r.error for r in got.values()):
                break
            assert time.monotonic() < deadline, {i: got.get(i) and got[i].error for i in ids}
            time.sleep(1)
            store.refresh()
        print(
            f"\n{mode}: {len(failed)}/{IN_FLIGHT} failed, answered "
            f"{max(r['ended'] - killed_at for r in results):.1f} s after the kill at most; "
            f"P's KV freed {freed_s:.1f} s after it; "
            f"errors: {sorted({r.error for r in got.values()})}"
        )
    finally:
        rest = up.stop()
    assert "no process left, ports free" in rest, rest[-3000:]
    assert [pid for pid in up.seen if alive(pid)] == []
    assert busy_ports([*PORTS.values(), *SIDE.values()]) == []
