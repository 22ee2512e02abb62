"""Whole-tree CPU pinning of engines (the local deployment emulates separate hosts).

Real child processes, no vLLM: each engine's server is started exactly as `tracedpush up`
starts it (``Deployment.engine_process``: the same ManagedProcess, environment and
pre-exec setup), only with a stand-in script instead of vLLM's command line, because a real
vLLM engine takes a minute to start (tests/e2e/test_engine_affinity.py checks the real
ones). The stand-in creates what vLLM creates: threads, a ``spawn``ed child (like
EngineCore, which re-imports the main module as ``__mp_main__``) and a forked child, and
each process reports the ``Cpus_allowed_list`` of every one of its threads from /proc.
The only mock is ``os.cpu_count`` in the wrap-around layout test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracedpush.launcher import Deployment, DeploymentConfig
from tracedpush.launcher.affinity import engine_cores, parse_cpus
from tracedpush.launcher.deployment import _cores_note
from tracedpush.launcher.processes import ManagedProcess, stop_all

PROJECT_ROOT = Path(__file__).resolve().parents[2]
NCPU = os.cpu_count() or 1
needs_two_cores = pytest.mark.skipif(NCPU < 2, reason="needs at least 2 CPU cores")

# Reports every thread of the current process (pid, tid -> Cpus_allowed_list) into
# <out>/<tag>-<pid>.json. Shared by the stand-in scripts below.
REPORT = textwrap.dedent(
    """
    import json, os, sys, threading, time

    def cpus_allowed(path):
        with open(path) as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip()

    def report(out, tag):
        threads = {}
        for tid in os.listdir("/proc/self/task"):
            threads[tid] = cpus_allowed(f"/proc/self/task/{tid}/status")
        with open(os.path.join(out, f"{tag}-{os.getpid()}.json"), "w") as f:
            json.dump({"tag": tag, "pid": os.getpid(), "threads": threads}, f)

    def start_thread():
        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
    """
)

# A stand-in engine server: a thread, a spawned child with a thread (EngineCore-like) and
# a forked child with a thread, all reporting their affinity.
FAKE_ENGINE = REPORT + textwrap.dedent(
    """
    import multiprocessing as mp

    def engine_core(out):
        start_thread()
        report(out, "spawned")

    if __name__ == "__main__":
        out = sys.argv[1]
        start_thread()
        core = mp.get_context("spawn").Process(target=engine_core, args=(out,))
        core.start()
        pid = os.fork()
        if pid == 0:
            start_thread()
            report(out, "forked")
            os._exit(0)
        os.waitpid(pid, 0)
        core.join(60)
        report(out, "server")
    """
)

# Like vLLM under tracedpush.launcher.vllm_entry: imports the entry module (after a thread
# already runs), then, as a library might, widens its own affinity to every core before
# spawning a child; the child re-imports this script as __mp_main__ and so the entry too.
ENTRY_IMPORTER = REPORT + textwrap.dedent(
    """
    import multiprocessing as mp
    start_thread()
    import tracedpush.launcher.vllm_entry  # noqa: E402  (pins, unless opted out)

    def engine_core(out):
        start_thread()
        report(out, "spawned")

    if __name__ == "__main__":
        out = sys.argv[1]
        report(out, "server")
        os.sched_setaffinity(0, range(os.cpu_count()))
        core = mp.get_context("spawn").Process(target=engine_core, args=(out,))
        core.start()
        core.join(60)
    """
)


def cpu_list(text: str) -> set[int]:
    """A /proc Cpus_allowed_list ("0-1,3") as a set, parsed here independently."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


@pytest.fixture
def run(tmp_path: Path):
    """Start a ManagedProcess with a stand-in script instead of its command line."""
    started: list[ManagedProcess] = []

    def start(proc: ManagedProcess, env: dict[str, str], script: str, name: str) -> Path:
        path, out = tmp_path / f"{name}.py", tmp_path / f"{name}-out"
        path.write_text(script)
        out.mkdir()
        proc.argv = [sys.executable, str(path), str(out)]
        proc.log_path = tmp_path / f"{name}.log"
        proc.ports, proc.health_url = (), None  # the stand-in binds nothing
        proc.start(env, cwd=tmp_path)
        started.append(proc)
        assert proc.popen is not None and proc.popen.wait(timeout=120) == 0, (
            proc.log_path.read_text()
        )
        return out

    yield start
    stop_all(started, grace=1.0, port_timeout=0)


def deployment(model: Path, tmp_path: Path, **kw) -> Deployment:
    kw.setdefault("trace", False)
    config = DeploymentConfig(mode="push", model=model, run_dir=tmp_path / "run", **kw)
    return Deployment(config, log=None, lock=False)


def test_parse_cpus():
    assert parse_cpus("0") == (0,)
    assert parse_cpus("1") == (1,)
    assert parse_cpus("0-3") == (0, 1, 2, 3)
    assert parse_cpus("2,0") == (0, 2)
    assert parse_cpus("0-1|4-5") == (0, 1, 4, 5)  # vLLM's per-rank lists
    assert parse_cpus("auto") == parse_cpus("nobind") == parse_cpus("") == ()


def test_engine_cores_follow_the_omp_bind_unless_opted_out():
    assert engine_cores({"VLLM_CPU_OMP_THREADS_BIND": "1"}) == (1,)
    assert engine_cores({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}) == (0, 1)
    assert engine_cores({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) == ()
    for off in ("0", "false", "no"):
        env = {"VLLM_CPU_OMP_THREADS_BIND": "1", "TRACEDPUSH_PIN_ENGINE_TREE": off}
        assert engine_cores(env) == ()
    env = {"VLLM_CPU_OMP_THREADS_BIND": "1", "TRACEDPUSH_PIN_ENGINE_TREE": "1"}
    assert engine_cores(env) == (1,)


def test_engine_processes_carry_their_cores_and_the_proxy_none(model: Path, tmp_path: Path):
    d = deployment(model, tmp_path)
    (p, p_env), (dec, d_env) = (d.engine_process(e) for e in d.engines)
    assert p_env["VLLM_CPU_OMP_THREADS_BIND"] == d.prefills[0].cpus == "0"
    assert d_env["VLLM_CPU_OMP_THREADS_BIND"] == d.decodes[0].cpus == str(1 % NCPU)
    assert p.cpus == (0,) and dec.cpus == (1 % NCPU,)
    assert p.argv[1:3] == ["-m", "tracedpush.launcher.vllm_entry"]
    assert d.proxy_process()[0].cpus == ()  # proxy (and clients) stay free
    # what `tracedpush up` prints
    assert _cores_note(p, p_env) == "core 0 (whole process tree)"
    # An explicit VLLM_CPU_OMP_THREADS_BIND in config.env wins, for both bindings.
    d = deployment(model, tmp_path, env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    proc, env = d.engine_process(d.decodes[0])
    assert proc.cpus == (0, 1) and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert _cores_note(proc, env) == "cores 0,1 (whole process tree)"


def test_more_engines_than_cores_wrap_around(model: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # mock: the layout of a 2-core machine
    d = deployment(model, tmp_path, num_prefill=3, num_decode=2)
    assert [d.engine_process(e)[0].cpus for e in d.engines] == [(0,), (1,), (0,), (1,), (0,)]


@needs_two_cores
def test_each_engine_tree_runs_on_its_own_cores(model: Path, tmp_path: Path, run):
    """Server, spawned and forked children, and every thread: on the engine's core only."""
    mine = os.sched_getaffinity(0)
    d = deployment(model, tmp_path)
    seen: dict[str, set[int]] = {}
    for e in d.engines:
        proc, env = d.engine_process(e)
        out = run(proc, env, FAKE_ENGINE, e.name)
        found = reports(out)
        assert sorted(r["tag"] for r in found) == ["forked", "server", "spawned"]
        threads = {(r["tag"], tid): cpu_list(c) for r in found for tid, c in r["threads"].items()}
        assert len(threads) >= 6  # main + one thread per process, at least
        want = {int(e.cpus)}
        assert all(cores == want for cores in threads.values()), (e.name, want, threads)
        seen[e.name] = set().union(*threads.values())
    assert seen == {"prefill": {0}, "decode": {1}}  # disjoint: as on two hosts
    assert os.sched_getaffinity(0) == mine  # the launcher itself is not pinned


@needs_two_cores
def test_opt_out_leaves_the_tree_unpinned(model: Path, tmp_path: Path, run):
    mine = os.sched_getaffinity(0)
    d = deployment(model, tmp_path, env={"TRACEDPUSH_PIN_ENGINE_TREE": "0"})
    proc, env = d.engine_process(d.decodes[0])
    assert proc.cpus == () and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert _cores_note(proc, env) == "core 1 (OpenMP threads only)"
    out = run(proc, env, FAKE_ENGINE, "decode")
    threads = [cpu_list(c) for r in reports(out) for c in r["threads"].values()]
    assert len(threads) >= 6 and all(cores == mine for cores in threads)


@needs_two_cores
@pytest.mark.parametrize("pin", ["1", "0"])
def test_vllm_entry_repins_every_thread_and_spawned_child(tmp_path: Path, pin: str):
    """Started without any launcher pinning: importing the entry module pins the threads
    that already run, and a spawned child (re-importing it as __mp_main__) re-pins even
    after its parent widened its own mask."""
    script, out = tmp_path / "entry_user.py", tmp_path / "out"
    script.write_text(ENTRY_IMPORTER)
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "TRACEDPUSH_PIN_KV_THREAD": "0",  # do not import vLLM here
        "TRACEDPUSH_PIN_ENGINE_TREE": pin,
    }
    subprocess.run(
        [sys.executable, str(script), str(out)], env=env, check=True, timeout=120, cwd=tmp_path
    )
    found = {r["tag"]: [cpu_list(c) for c in r["threads"].values()] for r in reports(out)}
    assert set(found) == {"server", "spawned"}
    assert all(len(threads) >= 2 for threads in found.values())  # main + the early thread
    if pin == "1":
        assert all(cores == {1} for threads in found.values() for cores in threads), found
    else:  # opted out: the server keeps what it inherited, the child the widened mask
        assert all(cores == os.sched_getaffinity(0) for cores in found["server"]), found
        assert all(cores == set(range(NCPU)) for cores in found["spawned"]), found


def test_unusable_core_does_not_stop_the_server(tmp_path: Path):
    """A core outside the machine cannot be set before exec; the server still starts."""
    proc = ManagedProcess(
        "x", [sys.executable, "-c", "pass"], tmp_path / "x.log", cpus=(NCPU + 4096,)
    )
    proc.start(dict(os.environ))
    assert proc.popen is not None and proc.popen.wait(timeout=60) == 0
