"""Stub engines and the real `tracedpush proxy`, each in a process of its own.

For measures of the proxy alone (its CPU, its memory, its clients' latency): in one
process with the stubs, their work would count as the proxy's. The stubs are
`StubEngine`s (mocks of vLLM's OpenAI server) served by aiohttp; the proxy is the real
command, optionally another checkout's (``env``/``cwd``: its code first on the path).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web

from tracedpush.testing.net import free_port
from tracedpush.testing.stub_engine import StubEngine

STUB_ENGINE_ID = "stub-engine"


def _serve_stub(role: str, mode: str, port: int, tokens: int, token_delay: float) -> None:
    """One stub engine on `port`, until killed (runs in its own process)."""
    if role == "decode" and tokens:
        stub = StubEngine(role, mode=mode, tokens=("x" * 200,) * tokens)
        stub.token_delay = token_delay
    else:
        stub = StubEngine(role, mode=mode)

    async def main() -> None:
        runner = web.AppRunner(stub.app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
        await asyncio.Event().wait()

    asyncio.run(main())


@contextmanager
def stub_engines(
    mode: str, *, decode_tokens: int = 0, token_delay: float = 0.0
) -> Iterator[tuple[str, str]]:
    """A stub P and a stub D, each in a process of its own; yields their URLs. D streams
    ``decode_tokens`` tokens of ~230 bytes, ``token_delay`` s apart (0: its default)."""
    spawn = multiprocessing.get_context("spawn")
    ports = (free_port(), free_port())
    procs = [
        spawn.Process(
            target=_serve_stub, args=(role, mode, port, decode_tokens, token_delay), daemon=True
        )
        for role, port in zip(("prefill", "decode"), ports, strict=True)
    ]
    for proc in procs:
        proc.start()
    urls = tuple(f"http://127.0.0.1:{port}" for port in ports)
    try:
        for url, proc in zip(urls, procs, strict=True):
            wait_http(url + "/health", proc.is_alive)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            proc.kill()
            proc.join(10)


def wait_http(url: str, alive: Callable[[], bool], limit: float = 30) -> None:
    """Until `url` answers; AssertionError if `alive()` turns false or after `limit` s."""
    deadline = time.monotonic() + limit
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            assert alive(), f"{url}: the server died"
            assert time.monotonic() < deadline, f"{url} did not answer"
            time.sleep(0.1)


@contextmanager
def proxy_process(
    mode: str,
    p_url: str,
    d_url: str,
    log: Path,
    *,
    traces: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[tuple[int, str]]:
    """`tracedpush proxy` in front of the stubs, its output in `log`; yields (pid, URL).
    ``traces``: its trace files' directory (None: ``--no-trace-files``)."""
    port = free_port()
    argv = [sys.executable, "-m", "tracedpush", "proxy", "--mode", mode,
            "--prefill", f"{p_url}#engine_id={STUB_ENGINE_ID},host=127.0.0.1,port=5600",
            "--decode", d_url, "--host", "127.0.0.1", "--port", str(port),
            "--health-interval", "0"]  # fmt: skip
    argv += ["--traces", str(traces)] if traces is not None else ["--no-trace-files"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env or os.environ), cwd=cwd
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/health", lambda: proc.poll() is None)
            yield proc.pid, url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # never left behind
                proc.kill()
                proc.wait()


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
