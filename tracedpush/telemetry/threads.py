"""OS view of an engine's threads: CPU time, the core each last ran on, affinity.

Sampled from /proc about once a second on the builder thread (never on an engine
thread). The EngineCore process samples itself and its parent, the API server; each
worker samples itself. Python thread names (and so roles: model runner, push writer,
our own threads) are known only inside the sampling process; threads of other
processes are named by their OS `comm`.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

_TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 10.0


@dataclass(slots=True)
class ThreadRow:
    pid: int
    tid: int
    process: str  # "api_server" | "engine_core" | "worker"
    name: str
    role: str  # one of semconv.THREAD_ROLES
    cpu_ms: float  # utime + stime since the thread started
    core: int  # the core it last ran on
    affinity: str  # e.g. "0" or "0-1"


def name_os_thread(name: str) -> None:
    """Give the calling thread an OS name (`comm`, 15 bytes), so `top -H`, `ps -L` and
    /proc show our threads as ours. Best effort: silently nothing off Linux."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def cores_text(cores: set[int] | frozenset[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5" (the kernel's Cpus_allowed_list format)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cores):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _read_stat(pid: int, tid: int) -> tuple[str, float, int] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    lpar, rpar = raw.find(b"("), raw.rfind(b")")
    comm = raw[lpar + 1 : rpar].decode("utf-8", "replace")
    fields = raw[rpar + 2 :].split()
    # fields[0] is field 3 (state): utime = field 14, stime = 15, processor = 39
    try:
        cpu_ms = (int(fields[11]) + int(fields[12])) * _TICK_MS
        core = int(fields[36])
    except (IndexError, ValueError):
        return None
    return comm, cpu_ms, core


def _role(process: str, pid: int, tid: int, name: str, python: bool) -> str:
    if name.startswith("tracedpush"):
        return "tracedpush"
    if name == "nixl-push-writer":
        return "push_writer"
    if tid == pid:
        return {"worker": "model_runner", "engine_core": "engine_core"}.get(process, "api_server")
    if process == "worker" and not python:
        return "compute"  # OpenMP / torch pools and native NIXL/UCX threads
    return "other"


def sample_process(pid: int, process: str, python_names: dict[int, str] | None) -> list[ThreadRow]:
    """One row per thread of `pid`; `python_names` maps native ids to Python names."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
    rows: list[ThreadRow] = []
    for tid in sorted(tids):
        stat = _read_stat(pid, tid)
        if stat is None:
            continue
        comm, cpu_ms, core = stat
        py_name = python_names.get(tid) if python_names else None
        name = py_name or comm
        try:
            affinity = cores_text(os.sched_getaffinity(tid))
        except OSError:
            affinity = ""
        role = _role(process, pid, tid, name, py_name is not None)
        rows.append(ThreadRow(pid, tid, process, name, role, cpu_ms, core, affinity))
    return rows


def sample_engine(side: str) -> list[ThreadRow]:
    """This process's threads, and for the scheduler side also its parent's (the API server)."""
    me = os.getpid()
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    if side == "worker":
        return sample_process(me, "worker", names)
    rows = sample_process(me, "engine_core", names)
    parent = os.getppid()
    if parent > 1:
        rows += sample_process(parent, "api_server", None)
    return rows
