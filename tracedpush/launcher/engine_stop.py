"""How vLLM stops an engine: the budget its ``--shutdown-timeout`` must cover, and what
its log says it killed when that budget ran out.

vLLM 0.32's ``--shutdown-timeout N`` is not a drain time alone. On SIGTERM the API server
gives EngineCore N seconds in all (``v1.utils.shutdown``: SIGTERM, join, then SIGKILL):
the drain of its requests, and then its teardown, which waits for its workers to exit
(``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``, 5 s), SIGTERMs those still running, waits
4 s more, SIGKILLs them (``MultiprocExecutor``), and only then runs EngineCore's own
exit, where the scheduler's connector flushes its last spans and final export record.
A budget of the drain alone leaves that exit to chance: CI lost a prefill scheduler's
final record so (tests/e2e/test_late_registration.py, a worker slow to exit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from tracedpush.launcher.processes import latest_start, tail

WORKER_GRACE_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"  # vLLM's wait for its workers
WORKER_GRACE_S = 5  # its default
WORKER_SIGTERM_WAIT_S = 4  # then SIGTERM, and this long before SIGKILL (hard-coded in vLLM)
# then EngineCore's own exit, the scheduler connector's flush among it: 5-7 s here after
# vLLM killed a worker (a prefill engine stopped with requests expired, by hand, traced
# and not), about 2 s after a worker that exited in its grace
ENGINE_CORE_EXIT_S = 8

# what vLLM logs as it begins a stop, and as it kills what outlived its budget: (the
# line, what it killed; None: the process named in the line's group)
_STOP_BEGINS = "[shutdown] API server: shutdown triggered"
_KILLED: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"\[shutdown\] Process manager: force killing remaining process (\S+)"), None),
    (
        re.compile(r"\[shutdown\] Executor: workers still running after SIGTERM; sending SIGKILL"),
        "workers",
    ),
)
_LOG_TAIL_LINES = 2000


def teardown_s(env: Mapping[str, str] | None = None) -> int:
    """What an engine's teardown after its drain may take within ``--shutdown-timeout``
    (`env`: the engine's environment, for vLLM's worker grace; default ``os.environ``)."""
    env = os.environ if env is None else env
    try:
        grace = max(0, int(env.get(WORKER_GRACE_ENV, WORKER_GRACE_S)))
    except ValueError:  # vLLM will say so as it starts
        grace = WORKER_GRACE_S
    return grace + WORKER_SIGTERM_WAIT_S + ENGINE_CORE_EXIT_S


def shutdown_timeout(drain_s: int, env: Mapping[str, str] | None = None) -> int:
    """The ``--shutdown-timeout`` that lets an engine drain for `drain_s` and still tear
    down in order, each of its processes flushing before it exits."""
    return drain_s + teardown_s(env)


def forced_kills(log_path: Path) -> list[str]:
    """What vLLM killed in the last stop its log records since the engine's latest start
    (`processes.latest_start`): ``EngineCore`` (its budget ran out before it exited: the
    scheduler's last spans and final record are lost) and/or ``workers`` (they outlived
    EngineCore's wait); [] when it stopped in order or the log cannot be read (`tail`
    then says so, which matches nothing)."""
    text = latest_start(tail(log_path, lines=_LOG_TAIL_LINES))  # a stop: about 100 lines
    text = text[max(text.rfind(_STOP_BEGINS), 0) :]  # no stop line: all of it
    killed: list[str] = []
    for pattern, name in _KILLED:
        for m in pattern.finditer(text):
            what = name or m.group(1)
            if what not in killed:
                killed.append(what)
    return killed
