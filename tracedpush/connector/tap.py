"""A transparent stand-in for vLLM's NIXL agent that records what passes through it.

vLLM reaches the agent only through `worker.nixl_wrapper.<method>` at call time, so
replacing that attribute right after the worker is built observes every push and
pull phase (notifications, descriptor prep, posts, completions, telemetry) without
touching vLLM's code. Each observed call costs one `time.time_ns()` and a tuple
append; every other attribute is forwarded untouched. `get_new_notifs` drains a
queue: we only look at what the caller received, never call it ourselves.
"""

from __future__ import annotations

from time import time_ns
from typing import Any

from tracedpush.telemetry import events as ev


class NixlAgentTap:
    __slots__ = ("_agent", "_record")

    def __init__(self, agent: Any, record) -> None:
        object.__setattr__(self, "_agent", agent)
        object.__setattr__(self, "_record", record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._agent, name, value)

    @property
    def wrapped(self) -> Any:
        return self._agent

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        if backend is None:
            result = self._agent.send_notif(remote_agent_name, notif_msg)
        else:
            result = self._agent.send_notif(remote_agent_name, notif_msg, backend)
        self._record((ev.SEND_NOTIF, time_ns(), remote_agent_name, notif_msg))
        return result

    def get_new_notifs(self, *args, **kwargs):
        notifs = self._agent.get_new_notifs(*args, **kwargs)
        if notifs:
            self._record((ev.NOTIFS, time_ns(), notifs))
        return notifs

    def make_prepped_xfer(self, operation, *args, **kwargs):
        t0 = time_ns()
        handle = self._agent.make_prepped_xfer(operation, *args, **kwargs)
        notif = kwargs.get("notif_msg", args[4] if len(args) > 4 else b"")
        try:
            n_desc = len(args[1])
        except (IndexError, TypeError):
            n_desc = 0
        self._record((ev.PREP, t0, time_ns(), operation, notif, handle, n_desc))
        return handle

    def transfer(self, handle, notif_msg=b""):
        t0 = time_ns()
        state = self._agent.transfer(handle, notif_msg)
        self._record((ev.POST, t0, time_ns(), handle, state))
        return state

    def check_xfer_state(self, handle):
        state = self._agent.check_xfer_state(handle)
        if state != "PROC":
            self._record((ev.STATE, time_ns(), handle, state))
        return state

    def get_xfer_telemetry(self, handle):
        telemetry = self._agent.get_xfer_telemetry(handle)
        self._record((ev.TELEMETRY, time_ns(), handle, telemetry))
        return telemetry
