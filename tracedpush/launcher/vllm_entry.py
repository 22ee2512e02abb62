"""vLLM's OpenAI server, with the NIXL worker kept on the engine's own CPU core.

On the CPU platform vLLM's NIXL worker moves its main thread to "the last core of each
NUMA node" (``discover_numa_topology``), meant as a core reserved for KV transfer beside
the OpenMP compute cores. With one core per engine (``VLLM_CPU_OMP_THREADS_BIND=0`` for
P, ``=1`` for D) the main thread *is* the compute thread, so on a 2-core machine both
engines' model runners end up on core 1 and core 0 idles. Here the reserved core is the
engine's own core instead.

Runs as ``python -m tracedpush.launcher.vllm_entry <api_server args>`` (the same arguments
as ``python -m vllm.entrypoints.openai.api_server``). This module stays ``__main__``, so
vLLM's spawned EngineCore and Worker processes re-import it as ``__mp_main__`` and run the
module-level patch too. Where vLLM has no such platform method, nothing is patched;
``TRACEDPUSH_PIN_KV_THREAD=0`` turns the patch off.
"""

from __future__ import annotations

import os


def _own_cores() -> list[int]:
    mask = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    cores: list[int] = []
    for part in mask.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


def keep_kv_thread_on_own_core() -> bool:
    """Patch vLLM's CPU platform so the NIXL worker pins to this engine's cores."""
    cores = _own_cores()
    if not cores:
        return False
    try:
        from vllm.platforms import cpu
    except ImportError:
        return False
    platform = getattr(cpu, "CpuPlatform", None)
    if platform is None or not hasattr(platform, "discover_numa_topology"):
        return False
    platform.discover_numa_topology = classmethod(lambda cls: [cores])
    return True


if os.environ.get("TRACEDPUSH_PIN_KV_THREAD", "1") != "0":
    keep_kv_thread_on_own_core()

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
