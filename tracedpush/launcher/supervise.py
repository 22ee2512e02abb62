"""What `tracedpush up` does when one of its processes exits: `--on-exit`.

* ``restart`` (default): restart that process with backoff, the same command line,
  environment and cores; print one line naming it with its log tail; everything else
  keeps serving. A user testing failover, or running a long benchmark, keeps the
  deployment through one engine crash (the proxy answers that engine's requests with
  502 naming the leg meanwhile).
* ``stop``: stop everything (fail fast, for scripts).
* ``keep``: leave it dead and keep the rest running.

The watch runs on the launcher's main thread, never on an engine: a poll of each
child's exit status every second, and a health probe only for a process that is coming
back.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from tracedpush.launcher.processes import ManagedProcess, http_ok, stop_all, tail

ON_EXIT = ("restart", "stop", "keep")
BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 32.0, 60.0)  # delay before restart attempt n (capped)
STABLE_S = 120.0  # healthy this long after a restart: the next crash starts backoff over


@dataclass
class _State:
    attempts: int = 0  # restarts since the process was last stable
    due: float | None = None  # when the pending restart runs (monotonic)
    restarted_at: float | None = None  # waiting to see it healthy again
    healthy_at: float | None = None  # healthy again since
    given_up: bool = False  # `keep`: dead and left so


@dataclass
class Supervisor:
    """Watch `processes`; act on exits by `policy`. `step()` once per `interval_s`."""

    processes: Sequence[ManagedProcess]
    policy: str = "restart"
    backoff_s: Sequence[float] = BACKOFF_S
    stable_s: float = STABLE_S
    out: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    # starts a process again after its leftovers are cleared (`Deployment.respawn`)
    respawn: Callable[[ManagedProcess], None] = ManagedProcess.restart
    _state: dict[str, _State] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in ON_EXIT:
            raise ValueError(f"--on-exit {self.policy!r}: choose one of {', '.join(ON_EXIT)}")
        self._state = {p.name: _State() for p in self.processes}

    def say(self, text: str) -> None:
        print(f"tracedpush up: {text}", file=self.out, flush=True)

    def step(self) -> bool:
        """Check every process once; False when the deployment should stop."""
        now = self.clock()
        for p in self.processes:
            st = self._state[p.name]
            if st.given_up:
                continue
            if p.alive():
                self._watch_recovery(p, st, now)
                continue
            if st.due is None:
                if not self._exited(p, st, now):
                    return False
            elif now >= st.due:
                self._restart(p, st, now)
        return True

    def watch(self, interval_s: float = 1.0) -> None:
        """Until a process exits under ``stop`` (or a signal unwinds the caller)."""
        while self.step():
            time.sleep(interval_s)

    # ------------------------------------------------------------------ actions
    def _exited(self, p: ManagedProcess, st: _State, now: float) -> bool:
        code = p.popen.returncode if p.popen else None
        what = f"{p.name} (pid {p.pid}) exited unexpectedly (code {code})"
        log_tail = f"; last lines of {p.log_path}:\n{tail(p.log_path, 15)}"
        if self.policy == "stop":
            self.say(f"{what}; stopping everything (--on-exit stop){log_tail}")
            return False
        if self.policy == "keep":
            st.given_up = True
            self.say(f"{what}; the others keep running (--on-exit keep){log_tail}")
            return True
        if st.healthy_at is not None and now - st.healthy_at >= self.stable_s:
            st.attempts = 0
        delay = self.backoff_s[min(st.attempts, len(self.backoff_s) - 1)]
        st.due, st.restarted_at, st.healthy_at = now + delay, None, None
        self.say(f"{what}; restarting it in {delay:g} s (attempt {st.attempts + 1}){log_tail}")
        return True

    def _restart(self, p: ManagedProcess, st: _State, now: float) -> None:
        # What is left of the dead server's session (an EngineCore whose API server was
        # killed, say) holds its ports and cores: clear it first.
        stop_all([p], grace=5.0, port_timeout=10.0)
        st.attempts += 1
        st.due = None
        try:
            self.respawn(p)
        except OSError as e:
            st.due = now + self.backoff_s[min(st.attempts, len(self.backoff_s) - 1)]
            self.say(f"restarting {p.name} failed ({e}); trying again")
            return
        st.restarted_at = self.clock()
        self.say(f"restarted {p.name} (pid {p.pid}); waiting for {p.health_url or 'it'}")

    def _watch_recovery(self, p: ManagedProcess, st: _State, now: float) -> None:
        if st.restarted_at is None or st.healthy_at is not None:
            return
        if p.health_url is None or http_ok(p.health_url, timeout=2.0):
            st.healthy_at = now
            self.say(f"{p.name} is healthy again, {now - st.restarted_at:.0f} s after restart")
