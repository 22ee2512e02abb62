"""Engines that need an API key (vLLM's ``--api-key``, given in their arguments).

Real engines check it on every /v1 route. P here accepts two keys and D one of them; the
launcher gives the proxy the one both accept (in its environment, ``VLLM_API_KEY``), and
no log holds a key. D's one key goes in D's environment too (the launcher takes it off
the command line, which any user of the host can read); P's two must stay on P's, and
the launcher says so. The proxy's own calls must send it: the model
catalog it learns as it starts (else the first request waits for a lookup, with the
client's key) and, with ``--kv-discovery probe``, the 1-token prefill that asks P for
its NIXL coordinates (else push learns them only from P's first answer). A client's key
passes through to both engines (and to D for ``GET /v1/models``); a request without one
is refused by the engines, and the proxy relays that. The benchmark clients send
``OPENAI_API_KEY`` as vLLM's does.

The probe pins a KV block on P until its lease expires (docs/proxy.md, "Probe cost"), and
vLLM's drain waits for it. The deployment stops within such a lease: P's drain lasts
through it (the launcher gives a prefill engine its lease and 5 s as --shutdown-timeout),
so P still flushes its last spans and final export record. The lease, `LEASE_S`, outlasts
the 10 s drain P had before, which ended in a kill that lost them (docs/launcher.md,
"Stopping"). The test probes P once more just before the stop, so the drain has a whole
lease to last through however long the workload took (on a slow CI machine the proxy's
own probe was 14 s old by the stop, and a drain of 6 s tested nothing).

It runs before the shared deployments start (no `pd` marker), on its own ports, under
the session's engines lock.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze, phases
from tracedpush.bench.workload import PromptMaker, run_workload
from tracedpush.launcher import Deployment
from tracedpush.launcher.processes import session_members
from tracedpush.proxy.coords import probe
from tracedpush.testing.unpinned import check_flushed, push_config

KEY = "tp-e2e-key"
P_ONLY_KEY = "tp-e2e-prefill-only"  # P's first key: a proxy that sent it would get D's 401
LEASE_S = 20  # P's kv_lease_duration (vLLM's default is 30 s), over the old 10 s drain
# vLLM's log lines: a pinned block expiring, and the engine's drain starting
_EXPIRED = "Releasing expired KV blocks for request cmpl-tp-probe-"
_DRAIN = "[shutdown] EngineCore: start mode=drain"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _status(url: str, body: dict | None = None, key: str | None = None) -> int:
    """A GET (no `body`) or a JSON POST to the proxy, with or without the key."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def _pin_a_block(prefill_url: str) -> None:
    """Pin a KV block on P for a whole lease, as the proxy's probe does (its own code)."""

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            await probe(session, prefill_url, 60, {"Authorization": f"Bearer {KEY}"})

    asyncio.run(run())


def _cmdline(pid: int) -> str:
    """A process's command line as any user of the host reads it ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def test_the_proxy_sends_the_engines_key_and_clients_keys_pass_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = push_config(
        tmp_path,
        proxy_args=("--kv-discovery", "probe"),
        kv_extra_config={"kv_lease_duration": LEASE_S},
        prefill_args=("--api-key", P_ONLY_KEY, KEY),
        decode_args=("--api-key", KEY),
    )
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    prompts = PromptMaker(config.model, seed=3).mix([128, 512], 3)
    said: list[str] = []
    with Deployment(config, log=lambda m: (said.append(m), print(m, file=sys.stderr))) as d:
        # D's one key is in its environment, on no command line any user of the host can
        # read (D checks it: below); P's two keys stay on P's, and the launcher says so
        decode = next(p for p in d.processes if p.name == "decode")
        tree = session_members({decode.pid})
        assert tree and [pid for pid in tree if KEY in _cmdline(pid)] == [], tree
        assert any("prefill: its 2 API keys stay on its command line" in m for m in said), said
        body = {"model": d.model_name, "prompt": "no key", "max_tokens": 2}
        assert _status(f"{d.proxy_url}/v1/completions", body) == 401
        assert _status(f"{d.proxy_url}/v1/models") == 401
        assert _status(f"{d.proxy_url}/v1/models", key=KEY) == 200  # relayed with the key
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        results = run_workload(d.proxy_url, prompts, 2, 8, model=d.model_name)
        pinned_at = time.monotonic()
        _pin_a_block(d.prefill_url)
        stopped_at = time.monotonic()  # within that lease: P drains through it
    assert stopped_at < pinned_at + LEASE_S - 10, "the stop came too late to test the drain"
    assert d.teardown is not None and d.teardown.killed == [], d.teardown
    assert all(r.ok for r in results), [r.to_dict() for r in results if not r.ok]
    logs = {p.name: p.read_text(errors="replace") for p in config.run_dir.glob("*.log")}
    leaks = [n for n, text in logs.items() if KEY in text or P_ONLY_KEY in text]
    assert "prefill.log" in logs and not leaks, (leaks, logs.keys())
    # both pins (the proxy's and ours) expired, ours while P drained
    prefill_lines = logs["prefill.log"].splitlines()
    expired = [i for i, line in enumerate(prefill_lines) if _EXPIRED in line]
    drain = next(i for i, line in enumerate(prefill_lines) if _DRAIN in line)
    assert len(expired) == 2 and expired[-1] > drain, (expired, drain)
    proxy_log = logs["proxy.log"]
    assert "coordinates from its probe" in proxy_log, proxy_log[-2000:]
    store = TraceStore.from_path(config.traces_dir)
    run = analyze(store, spans=False)
    check_flushed(run.export_health(), d)
    ok = [r for r in run.requests if r.failure is None]
    assert len(ok) == len(prompts), [(r.request_id, r.failure) for r in run.requests]
    for r in ok:  # the catalog was learnt at start, with the engines' key
        assert phases.MODEL_LOOKUP not in {s.phase for s in r.critical_path}, r.critical_path
        names = {s.name for s in store.spans(r.trace_id)}
        assert sc.SPAN_PROXY_MODELS not in names and sc.SPAN_KV_WRITE in names, names
