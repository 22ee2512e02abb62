"""Who has an analysis index open, written in the index itself: a lease file per process.

`tracedpush index prune` and the size cap never remove an index a process has open. On
Linux ``/proc`` says which processes of this host have its files open; it cannot see a
console on another host sharing the index root (a network file system), another user's
process, nor anything on a system without ``/proc`` (macOS, Windows). So each process
that opens an index also writes ``lease-<host>-<pid>`` in its directory (its command
line inside), touches it at most every `TOUCH_S` while it updates the index, and
removes it when it closes it (or, not closed, as the process exits). However idle the
process (a console nobody visits, a notebook), one thread of it touches every lease it
holds every `KEEP_S` (`_keeper`).

A lease says "in use" (`holders`):
* of this host, while its process lives (POSIX: signal 0; elsewhere as another host's);
* of another host, for `LEASE_S` (three `KEEP_S`) after its last touch: a process
  killed there leaves one that protects the index that much longer. Said in
  docs/report.md.

Writing a lease never fails an index: a directory it cannot write (a read-only copy)
just has no lease.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tracedpush import pids

PREFIX = "lease-"
TOUCH_S = 60.0  # an open index's lease is touched at most this often (as it updates)
KEEP_S = 3600.0  # and at least this often, however idle its process (`_keeper`)
# another host's lease counts this long after its last touch: two touches may be missed
# (a host suspended, a network file system that lagged) before it stops counting
LEASE_S = 3 * KEEP_S


@dataclass(frozen=True, slots=True)
class User:
    """A process with an index open: of this host as ``/proc`` shows it (`host` ""), or
    as its lease says it (`holders`: another host's, or one ``/proc`` did not show)."""

    pid: int
    command: str
    host: str = ""

    def __str__(self) -> str:
        """As a line says it: "pid command", or "host pid command (lease)"."""
        if self.host:
            return f"{self.host} {self.pid} {self.command} (lease)"
        return f"{self.pid} {self.command}"

    @property
    def who(self) -> str:
        """For a status column: "pid N" or "host pid N"."""
        return f"{self.host} pid {self.pid}" if self.host else f"pid {self.pid}"


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


class Lease:
    """This process's lease on the index in `directory` (`hold` as it opens and updates
    it, `release` as it closes it). Its name is fixed when made: a forked build worker
    that touches it touches its parent's, and leaves no lease of its own behind."""

    def __init__(self, directory: Path) -> None:
        self._pid = os.getpid()
        self.path = directory / f"{PREFIX}{_host()}-{self._pid}"
        self._touched = 0.0
        self._at_exit = False

    def hold(self) -> None:
        """Write the lease, or touch it if `TOUCH_S` passed since the last time."""
        now = time.monotonic()
        if self._touched and now - self._touched < TOUCH_S:
            return
        try:
            if self.path.exists():
                os.utime(self.path)
            else:
                self.path.write_text(" ".join(sys.orig_argv)[:200] + "\n")
                if not self._at_exit:  # a process that ends without closing the index
                    atexit.register(self.release)  # (the console's server) removes it
                    self._at_exit = True
        except OSError:  # not there yet, or not ours to write: no lease (tried again)
            return
        self._touched = now
        _kept(self)

    def keep(self) -> None:
        """Touch the lease now if this process holds it: a long-lived process that may
        not update its index for hours (an idle console) keeps it counted by other hosts,
        which count a lease `LEASE_S` after its last touch. It never writes a lease
        that is not there (released meanwhile, by another thread)."""
        if self._touched and os.getpid() == self._pid:
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Remove the lease (only in the process it is of: a forked child closing its
        copy of the index leaves its parent's)."""
        if os.getpid() != self._pid:
            return
        self._touched = 0.0
        with _held_lock:
            _held.discard(self)
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


# the leases this process holds, and the one thread that keeps them (`_keeper`)
_held: set[Lease] = set()  # until released (as it exits, where its index is not closed)
_held_lock = threading.Lock()
_tick = threading.Event()  # wakes the keeper before `KEEP_S` (tests)
_keeping = False


def _kept(lease: Lease) -> None:
    """Register a lease just held with this process's keeper, started on the first
    (not a forked build worker's touch of its parent's lease)."""
    global _keeping
    if lease._pid != os.getpid():
        return
    with _held_lock:
        _held.add(lease)
        if not _keeping:
            try:
                threading.Thread(target=_keeper, name="tracedpush-leases", daemon=True).start()
            except RuntimeError:  # at interpreter shutdown: the lease is written, unkept
                return
            _keeping = True


def _keeper() -> None:
    """Every `KEEP_S`, touch each lease this process holds (`Lease.keep`): a process
    that holds an index open for days without updating it keeps it counted by the
    hosts that share the index root. A lease released (its index closed) is not kept.
    It sleeps between touches: nothing else."""
    while True:
        _tick.wait(KEEP_S)
        _tick.clear()
        with _held_lock:
            leases = list(_held)
        for lease in leases:
            lease.keep()


def _forked() -> None:
    """In a forked child: the parent's leases are its own, and its keeper was not
    copied (a child that holds a lease starts its own)."""
    global _keeping, _held_lock, _tick
    _held_lock = threading.Lock()  # the parent's may have been held as it forked
    _tick = threading.Event()
    _held.clear()
    _keeping = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def files(directory: Path) -> list[Path]:
    """Every lease file in `directory`, live or not."""
    try:
        return sorted(directory.glob(f"{PREFIX}*"))
    except OSError:
        return []


def holders(
    directory: Path, *, skip_pids: set[int] | frozenset[int] = frozenset(), now: float | None = None
) -> list[User]:
    """The processes whose leases say the index in `directory` is in use; not this
    process's own, nor this host's of `skip_pids` (those ``/proc`` showed already)."""
    now = time.time() if now is None else now
    here, me = _host(), os.getpid()
    out = []
    for f in files(directory):
        host, _, pid_text = f.name.removeprefix(PREFIX).rpartition("-")
        if not host or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        try:
            age = now - f.stat().st_mtime
            command = f.read_text(errors="replace").strip()[:80]
        except OSError:  # released meanwhile
            continue
        if host == here:
            if pid == me or pid in skip_pids:
                continue
            alive = pids.alive(pid) if os.name == "posix" else age < LEASE_S
        else:
            alive = age < LEASE_S
        if alive:
            out.append(User(pid, command, host))
    return out
