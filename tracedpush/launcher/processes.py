"""Child processes the launcher owns: start, wait for health, stop without leftovers.

Each server runs in its own session (``start_new_session``) so one ``killpg`` reaches
the server and every helper process it forks (vLLM's EngineCore and worker processes).
``PR_SET_PDEATHSIG`` is set in each child as a backstop: if the launcher dies without
tearing down (even SIGKILL), the kernel sends the child SIGTERM. A server given ``cpus``
gets that CPU affinity before exec, so its whole process tree inherits it. Teardown then
checks what really happened: no process left in any session we created, no port still
bound.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tracedpush.launcher.servers import redacted
from tracedpush.parent_death import end_with_parent

DEFAULT_LOCK_PATH = "/tmp/tracedpush-engines.lock"


class LaunchError(RuntimeError):
    """A server failed to start; the message names it and carries the tail of its log."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so `with Deployment` unwinds and tears down
    exactly as on Ctrl-C (a KeyboardInterrupt subclass, so Ctrl-C handlers apply)."""


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


def stop_on_sigterm() -> None:
    """Make SIGTERM behave like Ctrl-C in this (main-thread) program."""
    signal.signal(signal.SIGTERM, _raise_terminated)


# ---------------------------------------------------------------------------- ports


def port_in_use(port: int, host: str = "0.0.0.0") -> bool:
    """True if something listens on ``port`` (a bind with SO_REUSEADDR, as servers do, fails).

    SO_REUSEADDR makes TIME_WAIT leftovers of closed connections not count: they do not
    stop a restarted server from binding either.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def busy_ports(ports: Iterable[int]) -> list[int]:
    return [p for p in ports if port_in_use(p)]


def wait_ports_free(ports: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Wait until every port is free; return the ones still bound at the deadline."""
    ports = list(ports)
    deadline = time.monotonic() + timeout
    while True:
        busy = busy_ports(ports)
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.2)


# ------------------------------------------------------------------- engines lock


HELD_BY_ENV = "TRACEDPUSH_ENGINES_LOCK_HELD_BY"
# a stage of a stop still running this long says that a second Ctrl-C would kill it
# (`stop_all`): longer than a vLLM engine's usual drain and teardown here (4-6 s), so
# a usual stop says nothing
HINT_AFTER_S = 8.0


def _held_by_parent() -> bool:
    """The parent process holds the lock for us (it set HELD_BY_ENV to its own pid)."""
    return os.environ.get(HELD_BY_ENV) == str(os.getppid())


def lock_delegation_env() -> dict[str, str]:
    """Environment for a child process that should run engines under our lock."""
    return {HELD_BY_ENV: str(os.getpid())}


class EnginesLock:
    """Process-wide, re-entrant exclusive lock on the file every engine launch shares.

    Two vLLM pairs on a 2-core machine starve each other, and fixed ports collide, so
    whoever launches real engines (tests, `tracedpush up`, benchmarks) holds this lock.
    Re-entrant inside one process so a test session can hold it while the Deployments it
    creates take it again; a holder can delegate it to a child process it starts
    (``lock_delegation_env()``). ``flock`` in a shell script interoperates.
    """

    _guard = threading.Lock()
    _fds: ClassVar[dict[str, int]] = {}  # per lock file: our descriptor
    _depths: ClassVar[dict[str, int]] = {}  # per lock file: re-entry depth

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.path = str(path or os.environ.get("TRACEDPUSH_ENGINES_LOCK", DEFAULT_LOCK_PATH))
        self.on_wait = on_wait

    def acquire(self) -> None:
        cls, key = type(self), os.path.realpath(self.path)
        with cls._guard:
            if key in cls._fds or cls._depths.get(key) or _held_by_parent():
                cls._depths[key] = cls._depths.get(key, 0) + 1
                return
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if self.on_wait:
                    self.on_wait(f"waiting for {self.path}: another run holds the engines")
                fcntl.flock(fd, fcntl.LOCK_EX)
            cls._fds[key], cls._depths[key] = fd, 1

    def release(self) -> None:
        cls, key = type(self), os.path.realpath(self.path)
        with cls._guard:
            depth = cls._depths.get(key, 0)
            if depth == 0:
                return
            cls._depths[key] = depth - 1
            if depth == 1:
                del cls._depths[key]
                fd = cls._fds.pop(key, None)
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)

    def __enter__(self) -> EnginesLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -------------------------------------------------------------------------- children


def _child_setup(cpus: tuple[int, ...] = ()) -> None:  # in the child between fork and exec
    if end_with_parent(signal.SIGTERM) is False:  # the launcher died before we asked
        os._exit(1)
    if cpus:
        # Before exec, while the child has a single thread: the server and every process
        # and thread it creates inherit the mask. A failure cannot be reported from here;
        # vllm_entry re-applies the mask and logs why it cannot.
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


# the line `ManagedProcess.start` writes to a server's log as it starts it (logs are
# appended to: a run directory used again, a respawned engine)
_STARTED = re.compile(r"^# \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} ", re.MULTILINE)


def latest_start(text: str) -> str:
    """What a log's text holds from its server's latest start on (all of it without one)."""
    starts = list(_STARTED.finditer(text))
    return text[starts[-1].start() :] if starts else text


def tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file (best effort, for error messages)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """One server we started: its session, log and the ports it must release."""

    name: str
    argv: list[str]
    log_path: Path
    ports: tuple[int, ...] = ()
    health_url: str | None = None
    cpus: tuple[int, ...] = ()  # CPU affinity of the server and all it starts; () = inherit
    # Stop by a SIGTERM to the server alone, which stops what it started in order (vLLM's
    # API server: EngineCore, then workers, each connector flushing its last spans); a
    # SIGTERM to the whole group lets the server kill them mid-flush. What is left of the
    # group when the server has exited gets SIGTERM then.
    stops_own_tree: bool = False
    # Ports whose release lets the next stop stage begin while this server still tears
    # down (`stop_stages`): an engine's NIXL side channel, closed as its worker exits,
    # which is all a decode engine's drain waits for; () = only its exit does.
    handover_ports: tuple[int, ...] = ()
    # How long it may take to exit after SIGTERM before it is killed; None: the stop's
    # `grace`. A longer one comes with `slow_stop`, said once the usual grace has passed:
    # why this server may take longer (a vLLM engine's drain).
    stop_grace: float | None = None
    slow_stop: str = ""
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _env: dict[str, str] = field(default_factory=dict, repr=False)
    _cwd: str | os.PathLike[str] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, env: Mapping[str, str], cwd: str | os.PathLike[str] | None = None) -> None:
        self._env, self._cwd = dict(env), cwd
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # `_STARTED`'s line
            log.write(f"# {time.strftime('%F %T')} {' '.join(redacted(self.argv))}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(_child_setup, tuple(self.cpus)),
            )

    def restart(self) -> None:
        """Start again as last started (same argv, environment, cwd and cores); the log
        is appended to. The caller stops what is left of the old one first."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        self.start(self._env, self._cwd)

    def failure(self, why: str) -> LaunchError:
        return LaunchError(
            f"{self.name} failed to start: {why}\n"
            f"--- last lines of {self.log_path} ---\n{tail(self.log_path)}"
        )


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    procs: Sequence[ManagedProcess],
    timeout: float,
    progress: Callable[[float, list[str]], None] | None = None,
    interval: float = 1.0,
) -> float:
    """Poll every process's health URL until all answer 200; return the seconds waited.

    Raises LaunchError naming the first process that exits or is still not healthy at the
    deadline. ``progress(elapsed, still_starting)`` is called about once per interval.
    """
    t0 = time.monotonic()
    pending = [p for p in procs if p.health_url]
    while pending:
        elapsed = time.monotonic() - t0
        for p in list(pending):
            if not p.alive():
                code = p.popen.returncode if p.popen else None
                raise p.failure(f"exited with code {code} after {elapsed:.0f}s")
            if http_ok(p.health_url or ""):
                pending.remove(p)
        if not pending:
            break
        if elapsed > timeout:
            raise pending[0].failure(f"not healthy after {timeout:.0f}s ({pending[0].health_url})")
        if progress:
            progress(elapsed, [p.name for p in pending])
        time.sleep(interval)
    return time.monotonic() - t0


# ------------------------------------------------------------------------- teardown


def session_members(sids: set[int]) -> list[int]:
    """PIDs of live processes whose session id is one of ``sids`` (zombies excluded)."""
    return [pid for pid, sid in _live_processes() if sid in sids]


def live_sessions(sids: set[int]) -> set[int]:
    """Those of ``sids`` that still have a live member (one pass over /proc)."""
    return {sid for _, sid in _live_processes() if sid in sids}


def _live_processes() -> Iterator[tuple[int, int]]:
    """(pid, session id) of every live process, zombies excluded."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) >= 4 and rest[0] != "Z":
            yield int(entry.name), int(rest[3])


@dataclass
class TeardownReport:
    """What stop() found afterwards: must be empty lists for a clean teardown."""

    leftover_pids: list[int]
    bound_ports: list[int]
    seconds: float
    killed: list[str]  # names of processes that needed SIGKILL

    @property
    def clean(self) -> bool:
        return not self.leftover_pids and not self.bound_ports


def stop_stages(
    stages: Sequence[Sequence[ManagedProcess]],
    grace: float = 15.0,
    port_timeout: float = 10.0,
    log: Callable[[str], None] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> TeardownReport:
    """`stop_all` on each stage in turn (e.g. the proxy, then the engines it sends to,
    then the collector they export to); one report for all.

    A stage begins once every earlier one has exited, except that the one just before
    may instead have freed its `handover_ports` (when each of its processes names some):
    the rest of its teardown (vLLM's EngineCore and API server after its worker, 2-4 s
    here) then overlaps this stage's. Each stage is stopped on a thread of its own.
    `interrupted`: as for `stop_all`, whose hint of it is said once for all stages."""
    t0 = time.monotonic()
    hinted = threading.Event()
    stops: list[tuple[_StageStop, list[int]]] = []
    for stage in stages:
        if not stage:
            continue
        for before, _ in stops[:-1]:
            before.done.wait()
        if stops:
            last, handover = stops[-1]
            while not last.done.wait(0.1):
                if handover and not busy_ports(handover):
                    break
        ports = [port for p in stage for port in p.handover_ports]
        handover = ports if all(p.handover_ports for p in stage) else []
        stop = _StageStop(
            functools.partial(stop_all, stage, grace, port_timeout, log, interrupted, hinted)
        )
        stops.append((stop, handover))
    reports = [stop.report() for stop, _ in stops]
    return TeardownReport(
        [pid for r in reports for pid in r.leftover_pids],
        [port for r in reports for port in r.bound_ports],
        time.monotonic() - t0,
        [name for r in reports for name in r.killed],
    )


class _StageStop:
    """`stop_all` of one stage on a thread of its own (`stop_stages`)."""

    def __init__(self, stop: Callable[[], TeardownReport]) -> None:
        self.done = threading.Event()
        self._result: TeardownReport | BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(stop,), name="tracedpush-stop", daemon=True
        )
        self._thread.start()

    def _run(self, stop: Callable[[], TeardownReport]) -> None:
        try:
            self._result = stop()
        except BaseException as exc:  # raised again by the caller's thread (`report`)
            self._result = exc
        finally:
            self.done.set()

    def report(self) -> TeardownReport:
        self._thread.join()
        if isinstance(self._result, BaseException):
            raise self._result
        assert self._result is not None
        return self._result


def stop_all(
    procs: Sequence[ManagedProcess],
    grace: float = 15.0,
    port_timeout: float = 10.0,
    log: Callable[[str], None] | None = None,
    interrupted: Callable[[], bool] | None = None,
    hinted: threading.Event | None = None,
) -> TeardownReport:
    """SIGTERM every process group, SIGKILL what is left after ``grace`` (or a process's
    own `stop_grace`), reap, verify.

    Signals go to whole sessions, so vLLM's EngineCore/worker children are included; a
    server that `stops_own_tree` gets its SIGTERM first and its group once it has exited.
    A server still stopping after ``grace`` with a longer `stop_grace` of its own has its
    `slow_stop` logged once, so a longer stop says why. With `interrupted` (a second
    Ctrl-C), a stop still running after `HINT_AFTER_S` says what it waits for and that
    a second Ctrl-C kills it; once `interrupted` turns true, every server still stopping
    is killed at once, each with a line saying what it had not flushed is lost.
    `hinted`: set once that was said (`stop_stages` says it once for all stages).
    """
    t0 = time.monotonic()
    started = [p for p in procs if p.popen is not None]
    sids = {p.popen.pid for p in started if p.popen}
    pending = {p.name for p in started if p.stops_own_tree}  # their group not signalled yet
    for p in started:
        if p.alive() and log:
            log(f"stopping {p.name} (pid {p.pid})")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if p.stops_own_tree:
                os.kill(p.pid or 0, signal.SIGTERM)
            else:
                os.killpg(p.pid or 0, signal.SIGTERM)
    signalled = time.monotonic()
    graces = {p.name: grace if p.stop_grace is None else p.stop_grace for p in started}
    deadline = signalled + max(graces.values(), default=grace)
    slow = {p.name for p in started if p.slow_stop and graces[p.name] > grace}
    killed: list[str] = []
    hinted = hinted or threading.Event()
    while time.monotonic() < deadline:
        for p in started:
            if p.popen and p.popen.poll() is not None and p.name in pending:
                pending.discard(p.name)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid or 0, signal.SIGTERM)
        running = live_sessions(sids)
        if not running:
            break
        waited = time.monotonic() - signalled
        stopping = [p for p in started if p.pid in running and p.name not in killed]
        if stopping and interrupted is not None and interrupted():
            for p in stopping:
                killed.append(p.name)
                if log:
                    log(
                        f"{p.name}: killed on a second Ctrl-C, {waited:.0f}s into its stop; "
                        "what it had not flushed (its last spans and records) is lost"
                    )
                _kill(p, waited, None)
            stopping = []
        if (
            interrupted is not None
            and log
            and stopping
            and waited >= HINT_AFTER_S
            and not hinted.is_set()
        ):
            hinted.set()
            log(
                f"still stopping {waited:.0f}s after SIGTERM: "
                f"{', '.join(p.name for p in stopping)}; Ctrl-C again to kill now, losing "
                "what they have not flushed"
            )
        for p in started:
            if p.pid not in running or p.name in killed:
                continue
            if p.name in slow and waited >= grace:
                slow.discard(p.name)
                if log:
                    hurry = ", or now on a second Ctrl-C" if interrupted is not None else ""
                    log(
                        f"{p.name} still stopping {waited:.0f}s after SIGTERM: {p.slow_stop}; "
                        f"killed if it runs {graces[p.name]:.0f}s{hurry}"
                    )
            elif waited >= graces[p.name]:
                killed.append(p.name)  # past its own grace while others may still stop
                _kill(p, graces[p.name], log)
        time.sleep(0.2)
    running = live_sessions(sids)
    for p in started:
        if p.name in killed or p.pid not in running:
            continue
        killed.append(p.name)
        _kill(p, graces[p.name], log)
    for p in started:
        if p.popen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=5)
    # Members that left the group (setpgid) but not the session are still found here.
    for pid in session_members(sids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    leftovers = session_members(sids)
    ports = [port for p in started for port in p.ports]
    bound = wait_ports_free(ports, timeout=port_timeout)
    return TeardownReport(leftovers, bound, time.monotonic() - t0, killed)


def _kill(p: ManagedProcess, grace: float, log: Callable[[str], None] | None) -> None:
    if log:
        log(f"{p.name} still running {grace:.0f}s after SIGTERM: SIGKILL")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid or 0, signal.SIGKILL)
