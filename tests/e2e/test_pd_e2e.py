"""The real 1P1D, push and pull: tokens come back through the proxy AND the prompt's KV
crossed the connector (D's external_kv_transfer counter grows by exactly the prompt
length, so D did not recompute it); bad kv_transfer_params never reach an engine;
teardown leaves no process and no bound port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tracedpush.bench.workload import PromptMaker, run_workload
from tracedpush.launcher import engine_tmp
from tracedpush.launcher.metrics import (
    EXTERNAL_KV_COUNTER,
    external_kv_prompt_tokens,
    metric_sum,
    wait_external_kv_tokens,
)
from tracedpush.launcher.processes import busy_ports, lock_delegation_env
from tracedpush.testing.processes import alive, descendants, sigint_default

MODES = [pytest.param(m, marks=pytest.mark.pd(m), id=m) for m in ("push", "pull")]


def rid(tag: str) -> str:
    """A unique X-Request-Id (push mode pairs P and D by it, so ids must not repeat)."""
    return f"e2e-{tag}-{uuid.uuid4().hex[:8]}"


def _post(url: str, body: dict[str, Any], request_id: str | None = None, timeout: float = 120):
    headers = {"Content-Type": "application/json"}
    if request_id:
        headers["X-Request-Id"] = request_id
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    return urllib.request.urlopen(req, timeout=timeout)


def stream_completion(base: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
    """POST a streamed completion; return the text, chunk count and final usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    text, chunks, usage = "", 0, None
    with _post(f"{base}/v1/completions", body, request_id) as resp:
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            assert "error" not in chunk, chunk
            usage = chunk.get("usage") or usage
            if chunk.get("choices"):  # carries token(s); a token's text may be ""
                text += "".join(c.get("text") or "" for c in chunk["choices"])
                chunks += 1
    return {"text": text, "chunks": chunks, "usage": usage}


def assert_kv_crossed(decode_url: str, before: int, prompt_tokens: int) -> None:
    after = wait_external_kv_tokens(decode_url, before + prompt_tokens)
    assert after - before == prompt_tokens, (
        f"D's {EXTERNAL_KV_COUNTER}{{source=external_kv_transfer}} grew by {after - before}, "
        f"expected the prompt length {prompt_tokens}: KV did not (fully) cross the connector"
    )


@pytest.mark.parametrize("mode", MODES)
def test_streamed_completion_moves_kv_over_connector(pd, mode):
    prompt = PromptMaker(pd.model, seed=11).make(700, index=1)
    before = external_kv_prompt_tokens(pd.decode_url)
    local_before = metric_sum(pd.prefill_url, EXTERNAL_KV_COUNTER, source="local_compute")
    out = stream_completion(
        pd.proxy_url,
        {"model": pd.model_name, "prompt": prompt.text, "max_tokens": 12, "ignore_eos": True},
        rid(f"{mode}-stream"),
    )
    # vLLM may merge tokens into one chunk when its API server lags: count by usage.
    assert out["usage"]["completion_tokens"] == 12 and out["chunks"] >= 1, out
    assert out["text"]
    assert out["usage"]["prompt_tokens"] == prompt.tokens == 700
    assert_kv_crossed(pd.decode_url, before, prompt.tokens)
    # P computed the prompt (its own counter says so), D received it.
    local_after = metric_sum(pd.prefill_url, EXTERNAL_KV_COUNTER, source="local_compute")
    assert local_after - local_before >= prompt.tokens


@pytest.mark.parametrize("mode", MODES)
def test_plain_openai_client_streams_through_proxy(pd, mode):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{pd.proxy_url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [pd.model_name]
    before = external_kv_prompt_tokens(pd.decode_url)
    stream = client.completions.create(
        model=pd.model_name,
        prompt=PromptMaker(pd.model, seed=12).make(300, index=2).text,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        pieces += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 10 and pieces
    assert "".join(pieces)
    assert_kv_crossed(pd.decode_url, before, usage.prompt_tokens)


@pytest.mark.parametrize("mode", MODES)
def test_chat_completions_stream_and_not(pd, mode):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{pd.proxy_url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": PromptMaker(pd.model, seed=13).make(200).text}]
    before = external_kv_prompt_tokens(pd.decode_url)
    stream = client.chat.completions.create(
        model=pd.model_name,
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        pieces += [c.delta.content or "" for c in chunk.choices if c.delta]
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 8
    assert "".join(pieces)
    assert_kv_crossed(pd.decode_url, before, usage.prompt_tokens)

    before = external_kv_prompt_tokens(pd.decode_url)
    reply = client.chat.completions.create(
        model=pd.model_name, messages=messages, max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens == 8
    assert_kv_crossed(pd.decode_url, before, reply.usage.prompt_tokens)


# A client's kv_transfer_params must never reach an engine: a missing remote_request_id
# alone kills a push-mode decode EngineCore (cpu-stack.md).
BAD_PARAMS = {
    "push-shaped, no remote_request_id": {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-engine-001",
        "remote_host": "127.0.0.1",
        "remote_port": 15600,
        "tp_size": 1,
        "remote_block_ids": [],
    },
    "not an object": "do_remote_prefill",
    "empty object": {},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(BAD_PARAMS))
def test_client_kv_transfer_params_rejected_engines_survive(pd, mode, case):
    body = {"model": pd.model_name, "prompt": "hello there", "max_tokens": 4}
    body["kv_transfer_params"] = BAD_PARAMS[case]
    with pytest.raises(urllib.error.HTTPError) as err:
        _post(f"{pd.proxy_url}/v1/completions", body, rid(f"{mode}-bad"))
    assert err.value.code == 400
    error = json.loads(err.value.read())["error"]
    assert "kv_transfer_params" in error["message"]

    assert all(pd.healthy().values()), pd.healthy()
    before = external_kv_prompt_tokens(pd.decode_url)
    out = stream_completion(
        pd.proxy_url,
        {"model": pd.model_name, "prompt": "still serving " * 20, "max_tokens": 4},
        rid(f"{mode}-after-bad"),
    )
    assert out["chunks"] >= 1
    assert_kv_crossed(pd.decode_url, before, out["usage"]["prompt_tokens"])


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_mixed_workload_every_request_crosses(pd, mode):
    prompts = PromptMaker(pd.model, seed=14).mix([100, 1000, 3000], 6)
    before = external_kv_prompt_tokens(pd.decode_url)
    results = run_workload(pd.proxy_url, prompts, concurrency=3, max_tokens=8)
    assert [r.error for r in results] == [None] * 6
    assert all(r.output_tokens == 8 and r.ttft_s and r.tpot_s is not None for r in results)
    assert [r.prompt_tokens for r in results] == [p.tokens for p in prompts]
    assert_kv_crossed(pd.decode_url, before, sum(p.tokens for p in prompts))


@pytest.mark.pd("pull")
def test_switching_mode_stopped_push_cleanly(pd, pd_session):
    """The push deployment (stopped to start pull) left no process, no bound port and
    none of vLLM's temp files (its sockets, torch's file store: in the engines' own
    directory, removed)."""
    push = [s for s in pd_session.stopped if s.mode == "push"]
    if not push:
        pytest.skip("no push deployment ran in this session")
    record = push[-1]
    # APIServer + EngineCore + Worker per engine, plus the proxy.
    assert len(record.pids_before) >= 7, record
    assert record.alive_after == [], record
    assert record.bound_after == [] and record.report.clean, record
    # per engine, vLLM's sockets (API server <-> EngineCore) and torch's file store, all
    # in the engines' own directory; each engine start left them in /tmp before
    assert record.engine_tmp_files >= 4 and not record.engine_tmp_after, record


@pytest.mark.e2e
def test_up_serves_then_ctrl_c_leaves_nothing(tmp_path):
    """`tracedpush up` as a user runs it: prints the URLs, serves a streamed request
    through the proxy with KV over the connector, and Ctrl-C stops every process it
    started and frees every port. (Runs before the shared pd deployments start.)"""
    ports = {"--port": 18000, "--prefill-port": 18100, "--decode-port": 18200}
    ports |= {"--prefill-side-channel-port": 15600, "--decode-side-channel-port": 15700}
    argv = [sys.executable, "-m", "tracedpush", "up", "--mode", "pull", "--no-trace"]
    argv += ["--run-dir", str(tmp_path)]
    for flag, port in ports.items():
        argv += [flag, str(port)]
    env = {**os.environ, **lock_delegation_env()}  # we hold the engines lock: share it
    up = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=sigint_default,  # Ctrl-C below reaches it wherever the tests run
    )
    output, seen = [], set()
    try:
        assert up.stdout is not None
        for line in up.stdout:
            output.append(line)
            seen |= descendants(up.pid)
            if line.startswith("Press Ctrl-C"):
                break
        printed = "".join(output)
        assert "tracedpush is up" in printed, printed
        assert "http://127.0.0.1:18000/v1" in printed and "18200/metrics" in printed
        seen |= descendants(up.pid)
        # 2 engines x (APIServer, EngineCore, Worker) + proxy
        assert len(seen) >= 7, seen

        model = json.loads(urllib.request.urlopen("http://127.0.0.1:18000/v1/models").read())
        before = external_kv_prompt_tokens("http://127.0.0.1:18200")
        out = stream_completion(
            "http://127.0.0.1:18000",
            {"model": model["data"][0]["id"], "prompt": "up and running " * 30, "max_tokens": 5},
            rid("up-cli"),
        )
        assert out["usage"]["completion_tokens"] == 5 and out["chunks"] >= 1
        assert_kv_crossed("http://127.0.0.1:18200", before, out["usage"]["prompt_tokens"])
        # the engines' temp files (vLLM's sockets, ...) are in the launcher's own directory
        during = list(Path(tempfile.gettempdir()).glob(f"{engine_tmp.PREFIX}{up.pid}-*"))
        assert len(during) == 1 and any(during[0].iterdir()), during

        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, "".join(output) + rest
    assert "no process left, ports free" in rest, rest
    # vLLM's temp files went with the directory the engines were given
    assert not list(Path(tempfile.gettempdir()).glob(f"{engine_tmp.PREFIX}{up.pid}-*"))
    assert [pid for pid in seen if alive(pid)] == []
    assert busy_ports(ports.values()) == []
