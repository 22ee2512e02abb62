"""Faults, as a user causes them, on a real `tracedpush up` (issue 11).

Killing the decode engine under load: every client gets an answer naming the decode
leg, the prefill engine stays healthy, the launcher restarts the decode engine
(`--on-exit restart`, the default) and, once it is back, requests succeed again. Each
failed request's trace says it failed.
"""

from __future__ import annotations

import itertools
import json
import math
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

from tracedpush import semconv
from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis.steps import EngineSteps
from tracedpush.launcher import shm
from tracedpush.launcher.metrics import metric_sum
from tracedpush.launcher.processes import busy_ports, http_ok, lock_delegation_env
from tracedpush.testing.figures import Figures
from tracedpush.testing.net import free_port
from tracedpush.testing.otlp import HangingEndpoint, OtlpHttpReceiver
from tracedpush.testing.processes import alive, descendants, sigint_default

PORTS = {"--port": 18400, "--prefill-port": 18500, "--decode-port": 18600}
SIDE = {"--prefill-side-channel-port": 15800, "--decode-side-channel-port": 15900}
PROXY, PREFILL = "http://127.0.0.1:18400", "http://127.0.0.1:18500"
IN_FLIGHT = 8
ANSWER_WITHIN_S = 30.0
LEASE_S = 30.0  # vLLM's default kv_lease_duration (the launcher does not change it)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
# Killing an engine in pull mode runs behind `make soak` (pytest -m soak), not `make test`:
# the two pull runs add five minutes, and the push runs cover the watch and the restart.
KILL_MODES = ["push", pytest.param("pull", marks=pytest.mark.soak)]
# The 2P1D prefill kill starts three engines and restarts one (2.5-3 min per mode on
# 2 cores), which put `make test` over its 25 minutes: both modes run in `make soak`.
# In `make test`, the watch and the restarted P are covered by
# tests/unit/test_connector_producer_renewal.py (vLLM's real workers, a fake NIXL agent).
SOAK_MODES = [pytest.param(m, marks=pytest.mark.soak) for m in ("push", "pull")]


class Up:
    """`tracedpush up` in a subprocess, its output collected by a thread."""

    def __init__(
        self, mode: str, run_dir: Path, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.run_dir = run_dir
        self.shm_before = shm.names()  # segments an engine killed outright leaks, the stop removes
        argv = [sys.executable, "-m", "tracedpush", "up", "--mode", mode, "--run-dir", str(run_dir)]
        argv += extra
        for flag, port in {**PORTS, **SIDE}.items():
            argv += [flag, str(port)]
        # the session holds the engines lock
        env = {**os.environ, **lock_delegation_env(), **(env or {})}
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            preexec_fn=sigint_default,  # `stop` sends Ctrl-C
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

    def stop_clean(self, *more_ports: int) -> None:
        """Stop, and check `up` left no process, no bound port and no shared-memory
        segment of its engines (a killed engine's) behind."""
        rest = self.stop()
        assert "no process left, ports free" in rest, rest[-3000:]
        assert [pid for pid in self.seen if alive(pid)] == []
        assert busy_ports([*PORTS.values(), *SIDE.values(), *more_ports]) == []
        assert (shm.names() - self.shm_before) - shm.in_use() == set(), rest[-2000:]

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


def _stream(
    model: str,
    request_id: str,
    max_tokens: int,
    first: threading.Event | None,
    prompt: str = "the handoff under fire " * 96,  # ~480 tokens
) -> dict:
    """One streamed completion; what the client saw: status, tokens, an error's text."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    # the usage chunk gives the token count: vLLM merges tokens into fewer events when
    # its API server falls behind, so counting events undercounts under load
    body |= {"stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
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
                    out.setdefault("first_s", time.monotonic() - t0)
                    out.setdefault("chunks_ns", []).append(time.time_ns())
                    if first is not None:
                        first.set()
                elif chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:
        out["status"], out["error"] = e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["ended"], out["ended_ns"] = time.monotonic(), time.time_ns()
    out["seconds"] = out["ended"] - t0
    return out


def _answers(results: list[dict], killed_at: float) -> dict[str, int | float | None]:
    """Figures of the clients cut by a kill: failed, how, how fast, and lost (no answer)."""
    failed = [r for r in results if r["error"] or r["status"] != 200]
    return {
        "requests_failed": len(failed),
        "failed_with_502": sum(r["status"] == 502 for r in failed),
        "failed_in_stream": sum(r["status"] == 200 for r in failed),  # SSE error event
        "answered_within_s": max((r["ended"] - killed_at for r in results), default=None),
        "failed_answered_within_s": max((r["ended"] - killed_at for r in failed), default=None),
        # lost: no HTTP answer at all, or none within ANSWER_WITHIN_S of the kill
        "requests_lost": sum(
            r["status"] is None or r["ended"] - killed_at > ANSWER_WITHIN_S for r in results
        ),
    }


def _record_traced(figures: Figures, got: dict[str, Any]) -> None:
    figures.record(
        traced_errors=len(got), errors="; ".join(sorted({str(r.error) for r in got.values()}))
    )


def _traced_errors(traces: Path, ids: set[str]) -> dict[str, Any]:
    """The analysed requests `ids` once each one's trace has landed and ends in an error."""
    store = TraceStore.from_path(traces)
    deadline = time.monotonic() + 60
    while True:
        run = analyze(store, spans=False)
        got = {r.request_id: r for r in run.requests if r.request_id in ids}
        if len(got) == len(ids) and all(r.error for r in got.values()):
            return got
        assert time.monotonic() < deadline, {i: got.get(i) and got[i].error for i in ids}
        time.sleep(1)
        store.refresh()


@pytest.mark.parametrize("mode", KILL_MODES)
def test_killing_decode_under_load_leaves_prefill_serving(
    mode: str, tmp_path: Path, figures: Figures
) -> None:
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
        figures.record(
            requests_in_flight=IN_FLIGHT,
            **_answers(results, killed_at),
            failed_naming_decode=sum(
                "decode" in (r["error"] or "") for r in results if r["error"] or r["status"] != 200
            ),
            prefill_probes=len(p_health),
            prefill_probes_healthy=sum(p_health),
        )

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
        figures.record(prefill_kv_freed_s=freed_s)
        # the launcher restarts D while P and the proxy keep running
        up.wait_for(f"decode (pid {decode_pid}) exited unexpectedly", 30)
        up.wait_for("decode is healthy again", 420)
        figures.record(decode_back_s=time.monotonic() - killed_at)  # to within 0.5 s
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
        figures.record(requests_after=len(after), requests_after_ok=len(after) - len(bad))
        assert not bad, bad

        # each failed request's trace says where it failed
        got = _traced_errors(tmp_path / "traces", {r["id"] for r in failed})
        _record_traced(figures, got)
        print(
            f"\n{mode}: {len(failed)}/{IN_FLIGHT} failed, answered "
            f"{max(r['ended'] - killed_at for r in results):.1f} s after the kill at most; "
            f"P's KV freed {freed_s:.1f} s after it; "
            f"errors: {sorted({r.error for r in got.values()})}"
        )
    finally:
        up.stop_clean()


LONG_PROMPT = "the handoff under fire " * 360  # ~1,800 tokens: P's prefill takes a while
DECODE = "http://127.0.0.1:18600"


@pytest.mark.parametrize("mode", SOAK_MODES)
def test_killing_a_prefill_mid_transfer_leaves_the_other_serving(
    mode: str, tmp_path: Path, figures: Figures
):
    """2P1D under a closed loop of 8 clients with long prompts; one P is SIGKILLed.

    Push: D has registered blocks for the requests P was prefilling, and no WRITE will
    come. vLLM alone kept them for good; D's producer watch fails those receives once
    P's side channel refuses connections, and D frees the blocks. Pull: D's READs from
    the dead P fail. Either way every client is answered, the failures name the prefill
    leg (or come back whole, recomputed by D), and the other P serves the next requests.

    Then the launcher brings the dead P back on its port under its engine id, and it
    serves again. vLLM alone kept the dead P's NIXL agent on D: in push every request
    routed to the new P hung, in pull every one failed (D's producer renewal).
    """
    up = Up(mode, tmp_path, "--num-prefill", "2")
    try:
        up.wait_for("Press Ctrl-C", 600)
        model = _model()
        prefix = f"pkill-{mode}-{uuid.uuid4().hex[:6]}"
        stop = threading.Event()
        results: list[dict] = []

        def client(w: int) -> None:
            i = 0
            while not stop.is_set():
                results.append(_stream(model, f"{prefix}-{w}-{i}", 16, None, LONG_PROMPT))
                i += 1

        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            for w in range(IN_FLIGHT):
                pool.submit(client, w)
            deadline = time.monotonic() + 120
            while len(results) < IN_FLIGHT:  # both Ps are busy
                assert time.monotonic() < deadline, results
                time.sleep(0.2)
            os.killpg(up.pid_of("prefill"), signal.SIGKILL)
            killed_at = time.monotonic()
            held = metric_sum(DECODE, "vllm:kv_cache_usage_perc")
            stop.set()  # each client ends with the request it has in flight
        cut = [r for r in results if r["ended"] >= killed_at]
        last_end = max(r["ended"] for r in cut)

        # every failure reached its client within 30 s of the kill: a 502 naming the
        # prefill leg, or, where P had answered but died before its WRITE (push) or
        # during D's READ (pull), D's own error before any token, once D gave up on the
        # KV (vLLM's kv_load_failure_policy "fail"); everyone else got every token
        failed = [r for r in cut if r["error"] or r["status"] != 200]
        figures.record(
            requests_cut=len(cut),
            **_answers(cut, killed_at),
            failed_naming_prefill=sum("prefill leg" in (r["error"] or "") for r in failed),
            failed_decode_gave_up=sum(r["status"] == 200 and r["tokens"] == 0 for r in failed),
            decode_kv_usage_at_kill=held,
        )
        assert failed, "killing P failed no request: it was not under load"
        for r in failed:
            assert r["ended"] - killed_at <= ANSWER_WITHIN_S, r
            named_prefill = r["status"] == 502 and "prefill leg" in (r["error"] or "")
            decode_gave_up = r["status"] == 200 and r["tokens"] == 0
            assert named_prefill or decode_gave_up, r
        assert all(r["tokens"] == 16 for r in cut if r not in failed), cut

        # D frees every block once the last client is answered: nothing waits for a WRITE
        # or READ that will never come (push: vLLM alone held them for good)
        deadline = killed_at + 60
        while (usage := metric_sum(DECODE, "vllm:kv_cache_usage_perc")) > 0:
            assert time.monotonic() < deadline, f"D still holds KV blocks: usage {usage}"
            time.sleep(0.5)
        freed_s = max(0.0, time.monotonic() - last_end)
        figures.record(decode_kv_freed_after_last_answer_s=freed_s)

        # the surviving P serves the next requests, and the proxy knows the dead one
        with ThreadPoolExecutor(4) as pool:
            after = list(
                pool.map(lambda i: _stream(model, f"{prefix}-after-{i}", 8, None), range(16))
            )
        bad = [r for r in after if r["status"] != 200 or r["error"] or r["tokens"] != 8]
        figures.record(requests_after=len(after), requests_after_ok=len(after) - len(bad))
        assert not bad, bad
        assert http_ok("http://127.0.0.1:18501/health", timeout=10)
        got = _traced_errors(tmp_path / "traces", {r["id"] for r in failed})
        _record_traced(figures, got)
        if mode == "push":  # D had registered blocks with the dead P, and let them go
            assert "refuses connections" in (tmp_path / "decode.log").read_text()
        _restarted_prefill_serves(up, model, prefix, mode, killed_at, figures)
        print(
            f"\n{mode}: {len(failed)}/{len(cut)} requests failed, answered "
            f"{max(r['ended'] - killed_at for r in failed):.1f} s after the kill at most "
            f"({sum('prefill leg' in (r['error'] or '') for r in failed)} naming the prefill "
            f"leg); D's KV usage {held:.3f} at "
            f"the kill, all freed {freed_s:.1f} s after the last answer; errors: "
            f"{sorted({r.error for r in got.values()})}"
        )
    finally:
        up.stop_clean(18501, 15801)  # the second P's HTTP and side-channel ports


def _restarted_prefill_serves(
    up: Up, model: str, prefix: str, mode: str, killed_at: float, figures: Figures
) -> None:
    """The killed P, restarted by `up` on its port and engine id, serves requests again.

    Push: the request that finds D still holding the dead P's agent is served too (D
    handshakes again and resends its registration). Pull: that request's READ fails and
    it gets an error; D then handshakes again, and the next ones are served.
    """
    up.wait_for("prefill is healthy again", 420)
    figures.record(prefill_back_s=time.monotonic() - killed_at)
    deadline = time.monotonic() + 60
    while not all(i["healthy"] for i in _proxy_health()["prefill"]):
        assert time.monotonic() < deadline, _proxy_health()
        time.sleep(1)
    before = metric_sum(PREFILL, "vllm:request_success_total")  # the new process: from 0
    first = []  # one at a time until the restarted P has served one
    while metric_sum(PREFILL, "vllm:request_success_total") == before and len(first) < 6:
        first.append(_stream(model, f"{prefix}-back-{len(first)}", 8, None))
    with ThreadPoolExecutor(4) as pool:
        after = list(
            pool.map(lambda i: _stream(model, f"{prefix}-back-{i}", 8, None), range(6, 22))
        )
    lost_first = [r for r in first if r["status"] != 200 or r["error"] or r["tokens"] != 8]
    bad = [r for r in after if r["status"] != 200 or r["error"] or r["tokens"] != 8]
    served = metric_sum(PREFILL, "vllm:request_success_total") - before
    figures.record(
        requests_after_restart=len(first) + len(after),
        requests_after_restart_failed=len(lost_first) + len(bad),
        restarted_prefill_served=served,
    )
    assert served >= 2, (served, first, after)  # both rounds reached the restarted P
    assert not bad, bad
    if mode == "push":
        assert not lost_first, lost_first
    else:  # at most the one READ issued before D saw P's agent was gone: a clear error
        assert len(lost_first) <= 1 and all(r["error"] for r in lost_first), lost_first
    if lost_first or mode == "push":
        log = (up.run_dir / "decode.log").read_text()
        assert "no longer answers at its NIXL agent" in log


def _proxy_health() -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{PROXY}/health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # 503 while an instance is down: same body
        return json.loads(e.read())


# Each hang outlasts one of the OTLP exporter's attempts (the SDK's 10 s default timeout,
# OTEL_EXPORTER_OTLP_TIMEOUT unset): spans are dropped and counted, and D steps hundreds
# of times meanwhile. Two hangs with a healthy window between (was one of 60 s, then 30 s)
# so hung and healthy alternate: D's step time drifts by up to x1.5 over tens of seconds.
HANG_S = 15.0
HANG_TIMES = 2
HEALTHY_S = 10.0

Window = tuple[int, int]  # [start, end) in time_ns


def _window(seconds: float) -> Window:
    """Sleep `seconds`; the window slept."""
    start = time.time_ns()
    time.sleep(seconds)
    return start, time.time_ns()


def _decode_step_ms(traces: Path, windows: list[Window]) -> list[float]:
    """D's decoding steps' durations (bind -> clear, forward included) that started in
    `windows`."""
    steps = EngineSteps.from_spans(TraceStore.from_path(traces).all_spans())
    return sorted(
        s.duration_us / 1e3
        for per_engine in steps.steps.values()
        for s in per_engine
        if s.role == "decode"
        and s.decode_reqs
        and s.duration_us
        and any(t0 <= s.start_ns < t1 for t0, t1 in windows)
    )


def _export_drops(
    traces: Path,
    exporter: str,
    reasons: tuple[str, ...] = tuple(semconv.EXPORT_DROPPED),
    since_ns: int = 0,
) -> dict[str, int]:
    """`exporter`'s drops for `reasons` (all by default), per engine process, from the
    latest engine.export record of each, among those from `since_ns` on (records land
    only while the store takes lines)."""
    latest: dict[str, tuple[int, int]] = {}
    keys = [semconv.EXPORT_DROPPED[r] for r in reasons]
    for span in TraceStore.from_path(traces).all_spans():
        if (
            span.name != semconv.SPAN_ENGINE_EXPORT
            or span.resource.service == semconv.SERVICE_PROXY
            or span.start_ns < since_ns
        ):
            continue  # the proxy writes records too: this counts the engine processes
        a = span.attributes
        exporters = list(a.get(semconv.EXPORT_EXPORTER) or ())
        if exporter not in exporters:
            continue
        i = exporters.index(exporter)
        n = sum(int(a[k][i]) for k in keys if k in a)
        who = f"{span.resource.service}/{span.resource.pid}"
        if who not in latest or span.start_ns > latest[who][0]:
            latest[who] = (span.start_ns, n)
    return {k: n for k, (_, n) in latest.items()}


FULL_S = 5.0  # seconds of load on a full trace store, FULL_TIMES times, alternating
FULL_TIMES = 3  # with as long on a store with room
STORE_MB = 256
FREE_MB = 32  # what the filler gives back to make room


class SmallStore:
    """The traces directory on its own tmpfs, which the test can fill (issue 11, item 4).

    Mounting needs root (CI runs as root); where it is refused the store-full phase is
    not run, and the test records why."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True)
        self.path = path
        mount = ["mount", "-t", "tmpfs", "-o", f"size={STORE_MB}m", "tmpfs", str(path)]
        done = subprocess.run(mount, capture_output=True, text=True)
        self.mounted = done.returncode == 0
        self.why_not = done.stderr.strip() or f"mount exited {done.returncode}"

    def fill_and_free(self, seconds: float, times: int) -> tuple[list[Window], list[Window]]:
        """Under load, `times` times: keep the store full for `seconds`, then give it
        `FREE_MB` of room for `seconds`; the full windows and the windows with room.

        Full and free alternate (A B A B) because client TPOT drifts by 10-20 % over
        tens of seconds on this machine. Only the first fill writes the whole store:
        later ones write back the `FREE_MB` given back (a few ms), so filling costs the
        full windows nothing the free ones do not pay."""
        filler = self.path / "filler"
        full: list[Window] = []
        free: list[Window] = []
        with filler.open("ab") as f:
            block = b"\0" * (1 << 20)
            for _ in range(times):
                try:
                    while True:
                        f.write(block)
                        f.flush()
                except OSError:
                    pass  # ENOSPC: full
                full.append(_window(seconds))
                os.ftruncate(f.fileno(), max(0, f.tell() - (FREE_MB << 20)))
                f.seek(0, os.SEEK_END)
                free.append(_window(seconds))
        filler.unlink()
        return full, free

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def _token_gaps_ms(results: list[dict], windows: list[Window]) -> list[float]:
    """Client-side gaps between a request's streamed chunks that ended in `windows`."""
    out = []
    for r in results:
        ts = r.get("chunks_ns") or []
        for a, b in itertools.pairwise(ts):
            if any(t0 <= b < t1 for t0, t1 in windows):
                out.append((b - a) / 1e6)
    return sorted(out)


def _p50(values: list[float]) -> float:
    return values[len(values) // 2] if values else math.nan


def check_full_store(
    run_dir: Path, done: list[dict], full: list[Window], free: list[Window], figures: Figures
) -> None:
    """While the store was full: the engines kept the pace they had in the windows with
    room between (same load), nothing was lost, drops were counted (engines' /metrics,
    then the store's engine.export records) and logged once per exporter; then writing
    resumed and no line anywhere is torn."""
    full_ms, free_ms = _token_gaps_ms(done, full), _token_gaps_ms(done, free)
    assert len(full_ms) >= 100 and len(free_ms) >= 100, (len(full_ms), len(free_ms))
    full_p50, free_p50 = _p50(full_ms), _p50(free_ms)
    ratio = full_p50 / free_p50
    figures.record(
        store_full_s=sum(t1 - t0 for t0, t1 in full) / 1e9,
        store_full_times=len(full),
        token_gaps_full=len(full_ms),
        token_gap_p50_room_ms=free_p50,
        token_gap_p50_full_ms=full_p50,
        token_gap_full_ratio=ratio,
    )
    assert ratio <= 1.5, (free_p50, full_p50)  # the engines do not wait for the disk
    dropped = {
        url: metric_sum(url, semconv.METRIC_SPANS_DROPPED + "_total", reason="store_full")
        for url in (PREFILL, "http://127.0.0.1:18600")
    }
    figures.record(store_full_dropped_min=min(dropped.values()))
    assert all(dropped.values()), f"store_full drops on the engines' /metrics: {dropped}"
    logs = {n: (run_dir / f"{n}.log").read_text() for n in ("prefill", "decode", "proxy")}
    warned = {n: text.count("(counted as store_full)") for n, text in logs.items()}
    resumed = {n: len(re.findall(r"export resumed to .*jsonl", text)) for n, text in logs.items()}
    figures.record(store_full_log_lines_max=max(warned.values()))
    # one warning per exporter and outage: an engine has two (scheduler and worker)
    assert all(1 <= n <= 2 for n in warned.values()), warned
    deadline = time.monotonic() + 30
    while True:  # writing resumed by itself: engine.export records count the drops
        landed = _export_drops(run_dir / "traces", "jsonl", (semconv.DROP_STORE_FULL,))
        if (landed and all(landed.values())) or time.monotonic() > deadline:
            break
        time.sleep(1)
    figures.record(store_full_counted_in_store=sum(landed.values()))
    assert landed and all(landed.values()), f"store_full drops in engine.export: {landed}"
    assert sum(resumed.values()) >= 3, resumed
    torn = [
        (p.name, i)
        for p in (run_dir / "traces").glob("*.jsonl")
        for i, line in enumerate(p.read_bytes().splitlines())
        if not _parses(line)
    ]
    assert torn == [], torn[:5]
    files = list((run_dir / "traces").glob("*.jsonl"))
    print(
        f"\nfull store: {len(full)} x {FULL_S:.0f} s full under load, as long with room "
        f"between; client token gap p50 {free_p50:.2f} ms with room, {full_p50:.2f} ms full "
        f"(x{ratio:.2f}); "
        f"store_full drops on /metrics {dropped}; warnings per log {warned}; resumed, drops "
        f"in engine.export {landed}; {len(files)} files, no torn line"
    )


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def test_a_hanging_collector_never_slows_the_engines(tmp_path: Path, figures: Figures) -> None:
    """1P1D push exporting OTLP to a collector that answers, then for 15 s accepts
    connections and never answers, then answers again, twice, under a steady closed loop.

    D's engine steps (from the JSON lines store, which stays healthy) keep their
    duration; the OTLP exporters drop and count (engine.export records); export resumes
    without a restart.

    Before the hang, on the same deployment and load, the JSON lines store (its own tmpfs)
    is full for 5 s, then has room for 5 s, three times (`check_full_store`). It once
    filled after the collector recovered, against the 15 s before as its baseline: that
    lay in the hang, which lightens the load (the exporters stop encoding, the receiver
    stops parsing; client TPOT 16-18 ms against 19-23 ms healthy), and CI failed on it."""
    port = free_port()
    traces = tmp_path / "traces"
    store = SmallStore(traces)
    collector: OtlpHttpReceiver | HangingEndpoint = OtlpHttpReceiver(port)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    up = Up("push", tmp_path, env=env)
    stop = threading.Event()
    done: list[dict] = []
    try:
        up.wait_for("Press Ctrl-C", 600)
        model = _model()

        def client(w: int) -> None:
            i = 0
            while not stop.is_set():
                done.append(_stream(model, f"hang-{w}-{i}", 48, None))
                i += 1

        with ThreadPoolExecutor(4) as pool:
            for w in range(4):
                pool.submit(client, w)
            time.sleep(10)  # warm
            healthy = [_window(HEALTHY_S)]
            if store.mounted:  # A B A B A B A: the healthy window's last seconds first
                full, room = store.fill_and_free(FULL_S, FULL_TIMES)
                room.insert(0, (healthy[0][1] - int(FULL_S * 1e9), healthy[0][1]))
                healthy += room[1:]  # the collector answers there too
            hung: list[Window] = []
            assert isinstance(collector, OtlpHttpReceiver)
            before_hang = len(collector.names)
            for i in range(HANG_TIMES):  # A B A B: hung and healthy alternate
                if i:
                    healthy.append(_window(HEALTHY_S))
                collector.close()
                collector = HangingEndpoint(port)
                hung.append(_window(HANG_S))
                collector.close()
                collector = OtlpHttpReceiver(port)
                deadline = time.monotonic() + 60
                while not collector.names:  # recovered: spans arrive again
                    assert time.monotonic() < deadline, f"export did not resume after hang {i}"
                    time.sleep(0.5)
            stop.set()
        bad = [r for r in done if r["status"] != 200 or r["error"] or r["tokens"] != 48]
        figures.record(
            hang_s=HANG_S * HANG_TIMES,
            hang_times=HANG_TIMES,
            requests=len(done),
            requests_whole=len(done) - len(bad),
            spans_before_hang=before_hang,
            token_gap_p50_healthy_ms=_p50(_token_gaps_ms(done, healthy)),
            token_gap_p50_hang_ms=_p50(_token_gaps_ms(done, hung)),
        )
        assert not bad, bad[:3]
        assert before_hang > 0, "nothing reached the healthy collector"

        deadline = time.monotonic() + 30
        while True:  # every engine process's first engine.export record after the hangs
            drops = _export_drops(tmp_path / "traces", "otlp", since_ns=hung[-1][1])
            everyone = _export_drops(tmp_path / "traces", "otlp")
            if len(drops) >= len(everyone) or time.monotonic() > deadline:
                break  # records come every 10 s
            time.sleep(1)
        ok_ms = _decode_step_ms(tmp_path / "traces", healthy)
        hang_ms = _decode_step_ms(tmp_path / "traces", hung)
        figures.record(decode_steps_healthy=len(ok_ms), decode_steps_hang=len(hang_ms))
        assert len(ok_ms) > 50 and len(hang_ms) > 50, (len(ok_ms), len(hang_ms))
        ok_p50, hang_p50 = ok_ms[len(ok_ms) // 2], hang_ms[len(hang_ms) // 2]
        figures.record(
            decode_step_p50_healthy_ms=ok_p50,
            decode_step_p50_hang_ms=hang_p50,
            step_p50_ratio=hang_p50 / ok_p50,
        )
        assert hang_p50 <= 1.5 * ok_p50, (ok_p50, hang_p50)  # within this machine's noise
        figures.record(
            engine_processes_counting=len(drops),
            spans_dropped_min=min(drops.values(), default=None),
            spans_dropped_max=max(drops.values(), default=None),
            spans_dropped_total=sum(drops.values()),
        )
        assert any(drops.values()), f"OTLP drops in engine.export records after the hangs: {drops}"
        figures.record(spans_after_recovery=len(collector.names))
        if store.mounted:
            check_full_store(tmp_path, done, full, room, figures)
        else:
            figures.record(store_full="not run: " + store.why_not)
        print(
            f"\nhung collector: D's step p50 {ok_p50:.2f} ms healthy, {hang_p50:.2f} ms during "
            f"{HANG_TIMES} hangs of {HANG_S:.0f} s (x{hang_p50 / ok_p50:.2f}); OTLP drops "
            f"counted {drops}; {len(collector.names)} spans arrived after it answered again; "
            f"{len(done)} requests, 0 lost"
        )
    finally:
        stop.set()
        collector.close()
        up.stop_clean()
        store.unmount()
