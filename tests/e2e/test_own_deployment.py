"""The README's own-deployment recipe ("Try it on one machine"), run as written.

No `tracedpush up`: the bash blocks of that README section are extracted and run as they
are, with only the ports, the tiny model's directory and the traces directory swapped
for this test's (each swap must find its literal, so a README that drifts breaks this
test). Two engines by hand (`python -m tracedpush.launcher.vllm_entry`, pinned per the
README), the proxy told the engines' traces place, three requests with curl, then
`tracedpush report` on that one place must find a complete trace for every request.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracedpush.launcher import engine_tmp
from tracedpush.launcher.processes import (
    ManagedProcess,
    busy_ports,
    stop_all,
    tail,
    wait_healthy,
)

REPO = Path(__file__).resolve().parents[2]
SECTION = "### Try it on one machine"
# the README's ports -> this test's (other e2e tests use 18xxx and 15600-16100)
PORTS = {"8000": "19000", "8100": "19100", "8200": "19200", "5600": "16600", "5700": "16700"}
MODEL_LITERAL = "~/.cache/tracedpush/models/tiny-qwen2"
TRACES_LITERAL = "/tmp/tracedpush-traces"
ROLES = {"terminal 1": "prefill", "terminal 2": "decode", "terminal 3": "proxy"}
N_REQUESTS = 3  # the client block's `for i in 1 2 3`


def readme_blocks() -> dict[str, str]:
    """The section's bash blocks by role: setup, prefill, decode, proxy, client."""
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    end = re.compile(r"^#{2,3} ", re.M).search(text, start + len(SECTION))
    section = text[start : end.start() if end else len(text)]
    blocks: dict[str, str] = {}
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        first = block.splitlines()[0]
        role = next((r for key, r in ROLES.items() if key in first), None)
        if role is None:
            role = "client" if "terminal 4" in first else "setup"
        assert role not in blocks, f"two README blocks for {role}"
        blocks[role] = block
    assert set(blocks) == {"setup", "prefill", "decode", "proxy", "client"}, sorted(blocks)
    return blocks


def localize(block: str, model: Path, traces: Path, must_have: tuple[str, ...]) -> str:
    """The block with this test's ports and directories; each literal must be there."""
    for literal in must_have:
        assert literal in block, f"README block no longer has {literal!r}:\n{block}"
    block = block.replace(MODEL_LITERAL, shlex.quote(str(model)))
    block = block.replace(TRACES_LITERAL, str(traces))
    return re.sub(r"\b(8000|8100|8200|5600|5700)\b", lambda m: PORTS[m.group(1)], block)


def test_readme_blocks_are_found():
    """Cheap guard, no engines (not marked e2e): the section still has its blocks."""
    blocks = readme_blocks()
    assert "python -m tracedpush.launcher.vllm_entry" in blocks["prefill"]
    assert "--traces /tmp/tracedpush-traces" in blocks["proxy"]
    assert "tracedpush report --traces /tmp/tracedpush-traces" in blocks["client"]


def _env() -> dict[str, str]:
    """This machine's environment, as a user's shell: the venv first on PATH, offline."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "TRACEDPUSH_", "VLLM_")) or k == "TRACEDPUSH_MODEL_DIR"
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    return env


def _report_json(traces: Path, env: dict[str, str]) -> dict:
    done = subprocess.run(
        ["tracedpush", "report", "--traces", str(traces), "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return json.loads(done.stdout) if done.stdout.strip() else {"requests": []}


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_readme_own_deployment_gives_complete_traces(tmp_path: Path):
    from tracedpush.model.build import ensure_model

    blocks = readme_blocks()
    env = _env()
    model = ensure_model(None)
    traces = tmp_path / "shared-traces"  # not created: the README's processes must do it
    cwd = tmp_path / "cwd"  # a proxy not told the place would write to ./traces here
    cwd.mkdir()
    assert not busy_ports(int(p) for p in PORTS.values()), "test ports busy"

    subprocess.run(["bash", "-c", blocks["setup"]], env=env, cwd=cwd, check=True, timeout=120)
    procs = []
    for role, literals in (
        ("prefill", ("8100", "5600", MODEL_LITERAL, TRACES_LITERAL)),
        ("decode", ("8200", "5700", MODEL_LITERAL, TRACES_LITERAL)),
        ("proxy", ("8000", "8100", "5600", "8200", TRACES_LITERAL)),
    ):
        script = localize(blocks[role], model, traces, literals)
        port = {"prefill": 19100, "decode": 19200, "proxy": 19000}[role]
        side = {"prefill": (16600,), "decode": (16700,), "proxy": ()}[role]
        procs.append(
            ManagedProcess(
                role,
                ["bash", "-c", script],
                tmp_path / f"{role}.log",
                ports=(port, *side),
                health_url=f"http://127.0.0.1:{port}/health",
            )
        )
    # the engines' temp files (vLLM's sockets, torch's file store) in a directory of the
    # test's, as `tracedpush up` gives its engines: a user's shell leaves them in /tmp
    tmp = engine_tmp.make()
    env.update(engine_tmp.env(tmp, env))
    t0 = time.monotonic()
    try:
        for proc in procs[:2]:
            proc.start(env, cwd=cwd)
        try:
            wait_healthy(procs[:2], 420.0)
            engines_s = time.monotonic() - t0
            procs[2].start(env, cwd=cwd)
            wait_healthy(procs[2:], 60.0)
        except Exception as exc:
            logs = "\n".join(f"--- {p.name} ---\n{tail(p.log_path)}" for p in procs)
            pytest.fail(f"README deployment did not come up: {exc}\n{logs}")
        client = localize(blocks["client"], model, traces, ("8000", TRACES_LITERAL))
        t1 = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", client],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )
        client_s = time.monotonic() - t1
        assert done.returncode == 0, done.stderr[-3000:]
        answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert len(answers) == N_REQUESTS, done.stdout[-3000:]
        assert all(a["choices"][0]["text"] for a in answers), answers
        assert "complete traces:" in done.stdout  # the README's report printed its table

        # Every request through the proxy has one complete trace in the one place
        # (the exporters flush in the background: re-read for a while).
        deadline = time.monotonic() + 90
        while True:
            requests = _report_json(traces, env)["requests"]
            if len(requests) >= N_REQUESTS and all(r["complete"] for r in requests):
                break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{len(requests)} requests in {traces}, complete: "
                    f"{[(r['request_id'], r['complete'], r['problems']) for r in requests]}"
                )
            time.sleep(2)
        assert len(requests) == N_REQUESTS
        assert {r["mode"] for r in requests} == {"push"}
        ids = [r["request_id"] for r in requests]
        assert all(any(i in a["id"] for a in answers) for i in ids), (ids, answers)
        files = sorted(p.name for p in traces.iterdir())
        assert any(f.startswith("tracedpush-proxy") for f in files), files
        assert any(f.startswith("vllm-prefill") for f in files), files
        assert any(f.startswith("vllm-decode") for f in files), files
        assert not (cwd / "traces").exists()  # nothing went to the proxy's default place
        ttfts = sorted(r["ttft_ms"] for r in requests)
        # the README's pinning works: 0.18-0.24 s measured; unpinned 0.9, 15 and 32 s
        assert ttfts[-1] < 10_000, f"TTFT ms {ttfts}: are the engines pinned as written?"
        print(
            f"\nREADME deployment: engines healthy in {engines_s:.0f}s, client block "
            f"{client_s:.1f}s, TTFT ms {ttfts}, files {files}"
        )
    finally:
        report = stop_all(procs, grace=15.0)
        if tmp is not None and report.clean:
            engine_tmp.remove(tmp)
    assert report.clean, f"README processes left behind: {report}"
