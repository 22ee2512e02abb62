"""The real 1P1D emulates two hosts: every process and every thread of P (API server,
EngineCore, workers, NIXL/UCX, ZMQ, ...) is allowed only on P's cores, and of D only on
D's, and the two sets do not overlap; the proxy is not pinned.

Read from /proc after a request went through, so threads started lazily (the NIXL
handshake, transfer threads) exist. The process tree is found by parent pid from /proc
(this kernel has no /proc/<pid>/task/<tid>/children).
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

from tracedpush.bench.workload import PromptMaker


@dataclass
class Task:
    pid: int
    tid: int
    process: str  # comm of the process
    thread: str  # comm of the thread
    cpus: set[int]  # Cpus_allowed_list


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def cpu_list(text: str) -> set[int]:
    """A /proc Cpus_allowed_list ("0-1,3") as a set."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def cpus_allowed(status: str) -> set[int]:
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return cpu_list(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list in /proc status")


def parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            rest = _read(f"/proc/{name}/stat").rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if rest[0] != "Z":
            out[int(name)] = int(rest[1])
    return out


def tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    ppid = parents()
    found, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in ppid.items() if parent in frontier]
        found += children
        frontier = children
    return found


def tasks(pids: list[int]) -> list[Task]:
    out = []
    for pid in pids:
        try:
            process = _read(f"/proc/{pid}/comm").strip()
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:  # exited meanwhile
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                thread, status = _read(f"{base}/comm").strip(), _read(f"{base}/status")
            except OSError:
                continue
            out.append(Task(pid, tid, process, thread, cpus_allowed(status)))
    return out


def one_request(pd) -> None:
    body = {
        "model": pd.model_name,
        "prompt": PromptMaker(pd.model, seed=21).make(200).text,
        "max_tokens": 4,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{pd.proxy_url}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "X-Request-Id": f"e2e-affinity-{uuid.uuid4().hex}"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["usage"]["completion_tokens"] == 4


@pytest.mark.pd("push")
def test_each_engine_process_tree_is_pinned_to_its_own_cores(pd):
    one_request(pd)
    servers = {p.name: p for p in pd.processes}
    observed: dict[str, set[int]] = {}
    for engine in pd.engines:
        want = cpu_list(engine.cpus)  # its VLLM_CPU_OMP_THREADS_BIND
        root = servers[engine.name].pid
        assert root is not None
        pids = tree(root)
        found = tasks(pids)
        # API server + EngineCore at least (+ workers, resource tracker, ...), each with
        # more threads than one.
        assert len(pids) >= 2, f"{engine.name}: only {pids} in its process tree"
        assert len(found) > len(pids)
        stray = [t for t in found if t.cpus != want]
        assert not stray, (
            f"{engine.name} owns cores {sorted(want)}, but these of its {len(found)} threads "
            f"in {len(pids)} processes may run elsewhere:\n"
            + "\n".join(
                f"  pid {t.pid} ({t.process}) tid {t.tid} ({t.thread}): {sorted(t.cpus)}"
                for t in stray
            )
        )
        observed[engine.name] = set().union(*(t.cpus for t in found))
        print(
            f"{engine.name}: {len(pids)} processes "
            f"({', '.join(sorted({t.process for t in found}))}), {len(found)} threads, "
            f"all on cores {sorted(observed[engine.name])}"
        )
    if (os.cpu_count() or 1) >= 2:
        assert observed["prefill"].isdisjoint(observed["decode"]), observed
    # The proxy is not pinned: it keeps the launcher's (this process's) affinity.
    proxy = servers["proxy"].pid
    assert proxy is not None
    proxy_cpus = {t.tid: t.cpus for t in tasks(tree(proxy))}
    assert proxy_cpus
    assert all(c == os.sched_getaffinity(0) for c in proxy_cpus.values()), proxy_cpus
