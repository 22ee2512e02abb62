"""vLLM's OpenAI server, with the whole engine (and its NIXL worker) on the engine's cores.

Two corrections for a local deployment that emulates separate hosts:

1. Whole-tree pinning (``tracedpush.launcher.affinity``). At import, before vLLM is
   imported, every thread of this process is pinned to the engine's cores
   (``VLLM_CPU_OMP_THREADS_BIND``); processes and threads created later inherit that.
   The launcher already sets it between fork and exec; re-applying it here makes it hold
   for every process that runs this module, whoever started it. Without it vLLM binds
   only the OpenMP compute threads, and the API server, EngineCore and NIXL threads of
   one engine run on the other engine's core. ``TRACEDPUSH_PIN_ENGINE_TREE=0`` turns it
   off.
2. The NIXL worker's core. On the CPU platform vLLM's NIXL worker moves its main thread
   to "the last core of each NUMA node" (``discover_numa_topology``), meant as a core
   reserved for KV transfer beside the OpenMP compute cores. With one core per engine
   (``VLLM_CPU_OMP_THREADS_BIND=0`` for P, ``=1`` for D) the main thread *is* the compute
   thread, so on a 2-core machine both engines' model runners end up on core 1 and core
   0 idles. Here the reserved core is the engine's own core instead. Where vLLM has no
   such platform method (it is private), nothing is patched and the engine log gets one
   warning saying so (``KV_THREAD_WARNED_ENV`` keeps vLLM's child processes from
   repeating it); ``TRACEDPUSH_PIN_KV_THREAD=0`` turns the correction and the warning off.
3. An ablation switch, off by default: ``TRACEDPUSH_NIXL_PROGRESS_THREAD=0`` builds the
   NIXL agent without its UCX progress thread (see ``nixl_progress_thread_off``).

Runs as ``python -m tracedpush.launcher.vllm_entry <api_server args>`` (the same arguments
as ``python -m vllm.entrypoints.openai.api_server``). This module stays ``__main__``, so
vLLM's spawned EngineCore and Worker processes re-import it as ``__mp_main__`` and run the
module-level code too.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

from tracedpush.launcher.affinity import engine_cores, parse_cpus, pin_all_threads


def _own_cores() -> list[int]:
    return list(parse_cpus(os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")))


def pin_engine_tree() -> list[int]:
    """Pin every thread of this process to the engine's cores; return the cores ([] if not).

    A failure (a core outside this machine's or container's cpuset) is reported on stderr,
    i.e. in the engine's log, and the engine runs unpinned.
    """
    cores = engine_cores()
    if not cores:
        return []
    try:
        pin_all_threads(cores)
    except OSError as e:
        print(
            f"[tracedpush] cannot pin pid {os.getpid()} to cores {list(cores)}: {e}",
            file=sys.stderr,
            flush=True,
        )
        return []
    return list(cores)


def keep_kv_thread_on_own_core() -> bool:
    """Patch vLLM's CPU platform so the NIXL worker pins to this engine's cores.

    ``CpuPlatform.discover_numa_topology`` is private to vLLM: when it is missing (or the
    module cannot be imported) nothing is patched and a warning says what that means,
    once per engine (see ``warn_kv_thread_not_kept``). Returns whether it patched.
    """
    cores = _own_cores()
    if not cores:
        return False
    try:
        cpu = importlib.import_module("vllm.platforms.cpu")
    except ImportError as e:
        warn_kv_thread_not_kept(cores, f"vllm.platforms.cpu cannot be imported ({e})")
        return False
    platform = getattr(cpu, "CpuPlatform", None)
    if platform is None or not callable(getattr(platform, "discover_numa_topology", None)):
        warn_kv_thread_not_kept(cores, "vLLM's CpuPlatform has no discover_numa_topology")
        return False
    platform.discover_numa_topology = classmethod(lambda cls: [cores])
    return True


KV_THREAD_WARNED_ENV = "TRACEDPUSH_KV_THREAD_WARNED"


def warn_kv_thread_not_kept(cores: list[int], why: str) -> bool:
    """Say on stderr (the engine log) that the NIXL worker's core is not corrected, once.

    The API server, EngineCore and Worker all import this module; the first one to warn
    sets ``KV_THREAD_WARNED_ENV``, which the processes it starts inherit, so the engine's
    log holds one warning. Returns whether it printed.
    """
    if os.environ.get(KV_THREAD_WARNED_ENV) == "1":
        return False
    os.environ[KV_THREAD_WARNED_ENV] = "1"
    version = getattr(sys.modules.get("vllm"), "__version__", "of unknown version")
    print(
        f"[tracedpush] WARNING: {why} (vLLM {version}), so the NIXL worker's thread is NOT "
        f"kept on this engine's cores {cores} (VLLM_CPU_OMP_THREADS_BIND). If this vLLM "
        "still moves that thread to the last core of each NUMA node, engines sharing a "
        "machine all run their model runner on that one core: prefill and decode slow "
        "down several-fold and push/pull comparisons are skewed (check the engine.threads "
        "spans, or Contention in `tracedpush report`). TRACEDPUSH_PIN_KV_THREAD=0 turns "
        "this correction and this warning off.",
        file=sys.stderr,
        flush=True,
    )
    return True


def nixl_progress_thread_off() -> bool:
    """Ablation: vLLM builds its NIXL agent without NIXL's UCX progress thread.

    With `enable_prog_thread` (NIXL's default, which vLLM keeps) a native thread polls
    UCX continuously; on an engine that owns one core it competes with the model runner
    (`tracedpush report` names it under Contention). Without it, transfers progress only
    when vLLM polls them (once per engine step). Only for measuring that trade-off.
    """
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    except ImportError:
        return False
    original = getattr(base_worker, "nixl_agent_config", None)
    if original is None:
        return False
    base_worker.nixl_agent_config = functools.partial(original, enable_prog_thread=False)
    return True


pin_engine_tree()  # first, before vLLM (and torch) start any thread

if os.environ.get("TRACEDPUSH_PIN_KV_THREAD", "1") != "0":
    keep_kv_thread_on_own_core()

if os.environ.get("TRACEDPUSH_NIXL_PROGRESS_THREAD", "1") == "0":
    nixl_progress_thread_off()

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
