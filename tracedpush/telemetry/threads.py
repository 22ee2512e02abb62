"""OS view of an engine's threads: CPU time, time waiting for a CPU, the core each last
ran on, affinity.

Sampled from /proc about once a second on the builder thread (never on an engine
thread). The EngineCore process samples itself and its parent, the API server; each
worker samples itself. Python thread names (and so roles: model runner, push writer,
our own threads) are known only inside the sampling process; threads of other
processes are named by their OS `comm`.

The wait is the kernel's ``schedstat`` run delay: how long the thread was runnable on a
run queue without a CPU, cumulative. CPU share alone says where a thread ran; the wait
says whom that cost: an API server on a core that another engine busy-polls shows
seconds of it, and so does a pinned EngineCore whose one core its own engine's NIXL
thread polls (docs/findings.md).
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
    wait_ms: float = -1.0  # runnable without a CPU since it started; -1: not known


class ThreadDeltas:
    """Each sample's CPU and wait for a CPU since the previous sample, summed by
    (process, role): what the engine's /metrics counts (`observations.THREADS`). A
    thread's first sample adds nothing (its history before it is not this engine's
    run); only the threads of the latest sample are remembered."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], tuple[float, float]] = {}

    def update(self, rows: list[ThreadRow]) -> dict[tuple[str, str], tuple[float, float]]:
        """(process, role) -> (CPU ms, wait ms) since the previous sample (a wait of -1,
        not known, counts as none)."""
        last, self._last = self._last, {(r.pid, r.tid): (r.cpu_ms, r.wait_ms) for r in rows}
        out: dict[tuple[str, str], tuple[float, float]] = {}
        for r in rows:
            before = last.get((r.pid, r.tid))
            if before is None:
                continue
            cpu = max(r.cpu_ms - before[0], 0.0)
            wait = max(r.wait_ms - before[1], 0.0) if r.wait_ms >= 0 and before[1] >= 0 else 0.0
            if cpu or wait:
                c, w = out.get((r.process, r.role), (0.0, 0.0))
                out[r.process, r.role] = (c + cpu, w + wait)
        return out


def native_thread_ids() -> set[int]:
    """OS ids of every thread of this process."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def python_thread_ids() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def name_os_thread(name: str) -> None:
    """Give the calling thread an OS name (`comm`, 15 bytes), so `top -H`, `ps -L` and
    /proc show our threads as ours. Best effort: silently nothing off Linux."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


_CORES_TEXT: dict[frozenset[int], str] = {}


def affinity_text(tid: int) -> str:
    try:
        cores = frozenset(os.sched_getaffinity(tid))
    except OSError:
        return ""
    text = _CORES_TEXT.get(cores)
    if text is None:
        text = _CORES_TEXT[cores] = cores_text(cores)
    return text


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


def _task_file(pid: int, tid: int, name: str, size: int) -> bytes | None:
    """The start of a thread's /proc file (`stat`, `schedstat`); None once it is gone or
    where the kernel has no such file."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/{name}", os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_stat(pid: int, tid: int) -> tuple[str, float, int] | None:
    raw = _task_file(pid, tid, "stat", 1024)
    if raw is None:
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


def _read_wait(pid: int, tid: int) -> float:
    """The thread's run delay in ms (`schedstat`'s second field), -1 where the kernel has
    no schedstats (or the thread is gone)."""
    raw = _task_file(pid, tid, "schedstat", 128)
    try:
        return -1.0 if raw is None else int(raw.split()[1]) / 1e6
    except (ValueError, IndexError):
        return -1.0


def _role(process: str, pid: int, tid: int, name: str, python: bool, known: dict[int, str]) -> str:
    if not python and tid in known:
        return known[tid]
    if name.startswith("tracedpush"):
        return "tracedpush"
    if name == "nixl-push-writer":
        return "push_writer"
    if tid == pid:
        return {"worker": "model_runner", "engine_core": "engine_core"}.get(process, "api_server")
    if process == "worker" and not python:
        return "compute"  # OpenMP / torch pools and native NIXL/UCX threads
    return "other"


def sample_process(
    pid: int,
    process: str,
    python_names: dict[int, str] | None,
    known_roles: dict[int, str] | None = None,
) -> list[ThreadRow]:
    """One row per thread of `pid`; `python_names` maps native ids to Python names,
    `known_roles` gives the role of native threads identified otherwise (NIXL's)."""
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
        affinity = affinity_text(tid)
        role = _role(process, pid, tid, name, py_name is not None, known_roles or {})
        wait_ms = _read_wait(pid, tid)
        rows.append(ThreadRow(pid, tid, process, name, role, cpu_ms, core, affinity, wait_ms))
    return rows


def sample_engine(side: str, known_roles: dict[int, str] | None = None) -> list[ThreadRow]:
    """This process's threads, and for the scheduler side also its parent's (the API server)."""
    me = os.getpid()
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    if side == "worker":
        return sample_process(me, "worker", names, known_roles)
    rows = sample_process(me, "engine_core", names)
    parent = os.getppid()
    if parent > 1:
        rows += sample_process(parent, "api_server", None)
    return rows
