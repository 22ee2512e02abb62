"""When the EngineCore process had a request: stamped on vLLM's input thread.

`engine input` (vLLM's arrival_time -> its scheduler has the request) lumped two
mechanisms: the API server rendering and tokenizing the prompt and sending it to the
EngineCore process, and the EngineCore's busy loop taking it only between two engine
steps. Under load they call for different cures (API-server processes against shorter
steps), so they are told apart here.

vLLM 0.32's EngineCore decodes each request on its input thread
(`EngineCoreProc.process_input_sockets`) and calls `preprocess_add_request` there, then
queues it for the busy loop, which adds it to the scheduler between steps. Wrapping
`EngineCore.preprocess_add_request` stamps `time_ns()` under the request id in
`RECEIVED`, which the scheduler-side connector pops in `on_new_request`: one dict store
on the input thread (atomic under the GIL: no lock, no I/O), never on the engine thread.
Where vLLM runs the EngineCore in-process, the same method runs just before the
scheduler takes the request, and the stamp says so (no wait).

`install()` / `uninstall()` as an OpenTelemetry instrumentor's: once per process
(every connector of the process shares the stamps), undone exactly.
"""

from __future__ import annotations

import logging
from time import time_ns
from typing import Any

log = logging.getLogger("tracedpush.connector")

# request id -> when the EngineCore's input thread had it (ns since the epoch). Popped by
# `on_new_request`; a request vLLM refused before its scheduler saw it leaves its stamp
# behind, so the dict is emptied when it reaches `LIMIT` (stamps of requests in flight
# then are lost, never mixed up).
RECEIVED: dict[str, int] = {}
LIMIT = 1 << 14
_WRAPPED = "__tracedpush_original__"


def _core_class() -> Any | None:
    try:
        from vllm.v1.engine.core import EngineCore
    except Exception:  # no vLLM, or one without the v1 EngineCore: no stamps
        return None
    return EngineCore


def install() -> bool:
    """Wrap vLLM's `EngineCore.preprocess_add_request`; False when it is not there."""
    core = _core_class()
    original = getattr(core, "preprocess_add_request", None)  # None without vLLM's class
    if original is None:
        log.info("tracedpush: no EngineCore.preprocess_add_request; engine input not split")
        return False
    if getattr(original, _WRAPPED, None) is not None:
        return True  # another connector of this process did it

    def preprocess_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if len(RECEIVED) >= LIMIT:
                RECEIVED.clear()
            RECEIVED[request.request_id] = time_ns()
        except Exception:  # never in vLLM's way
            pass
        return original(self, request, *args, **kwargs)

    setattr(preprocess_add_request, _WRAPPED, original)
    preprocess_add_request.__doc__ = original.__doc__
    core.preprocess_add_request = preprocess_add_request  # type: ignore[union-attr]
    return True


def uninstall() -> None:
    """vLLM's own method back, and no stamps kept."""
    core = _core_class()
    original = getattr(getattr(core, "preprocess_add_request", None), _WRAPPED, None)
    if original is not None:
        core.preprocess_add_request = original  # type: ignore[union-attr]
    RECEIVED.clear()


def received(request_id: str) -> int:
    """When the EngineCore had `request_id` (ns since the epoch), 0 if not stamped; the
    stamp is dropped."""
    return RECEIVED.pop(request_id, 0)
