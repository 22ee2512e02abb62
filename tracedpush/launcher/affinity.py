"""CPU affinity of an engine's whole process tree: the local deployment emulates hosts.

Each engine of a local deployment owns its cores (``VLLM_CPU_OMP_THREADS_BIND``: "0" for
P, "1" for D on a 2-core machine). vLLM itself binds only the worker's OpenMP compute
threads there; the API server, EngineCore and every other thread (NIXL/UCX, ZMQ, the
asyncio loop, busy-polling schedulers) float on all cores, so in push mode D's
EngineCore busy-loops on P's core and slows P's prefill 2-4x. Separate hosts do not
share cores, so the launcher pins every process and thread of an engine to its cores:

* the launcher sets the affinity of each engine server between fork and exec
  (``ManagedProcess(cpus=...)``), so every process and thread it later creates inherits it;
* ``tracedpush.launcher.vllm_entry`` re-applies it to every thread of every process that
  imports it (the API server, and vLLM's spawned EngineCore/Worker, which re-import it as
  ``__mp_main__``).

``TRACEDPUSH_PIN_ENGINE_TREE=0`` turns both off (then only vLLM's own OpenMP binding
applies). Standard library only: imported by every engine process before vLLM.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping

PIN_ENV = "TRACEDPUSH_PIN_ENGINE_TREE"
CORES_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def parse_cpus(spec: str) -> tuple[int, ...]:
    """Core ids of a CPU list such as ``"0"``, ``"0-3"``, ``"0,2"`` or ``"0-1|2-3"``.

    ``|`` separates vLLM's per-rank lists (all of them count). Parts that are not a core
    or a range (``"auto"``, ``"nobind"``) are ignored, so those give ``()``.
    """
    cores: set[int] = set()
    for part in spec.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cores.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cores))


def tree_pinning_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(PIN_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def engine_cores(env: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The cores an engine's whole process tree is pinned to, from its environment.

    ``()`` (do not pin) when ``TRACEDPUSH_PIN_ENGINE_TREE=0`` or when
    ``VLLM_CPU_OMP_THREADS_BIND`` holds no explicit core list.
    """
    env = os.environ if env is None else env
    if not tree_pinning_enabled(env):
        return ()
    return parse_cpus(env.get(CORES_ENV, ""))


def pin_all_threads(cores: Iterable[int]) -> list[int]:
    """Set the affinity of every thread of this process to ``cores``; return their ids.

    ``os.sched_setaffinity(0, ...)`` changes only the calling thread, so threads that
    already exist (started by imports before this runs) are pinned one by one; threads
    and processes created later inherit the mask. Raises OSError if the main thread
    cannot be pinned (e.g. a core outside this container's cpuset).
    """
    cores = set(cores)
    os.sched_setaffinity(0, cores)
    pinned = [threading.get_native_id()]
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return pinned
    for tid in tids:
        if tid in pinned:
            continue
        try:
            os.sched_setaffinity(tid, cores)
            pinned.append(tid)
        except OSError:  # the thread exited meanwhile
            pass
    return pinned
