"""Who has an analysis index open, written in the index itself: a lease file per process.

`tracedpush index prune` and the size cap never remove an index a process has open. On
Linux ``/proc`` says which processes of this host have its files open; it cannot see a
console on another host sharing the index root (a network file system), another user's
process, nor anything on a system without ``/proc`` (macOS, Windows). So each process
that opens an index also writes ``lease-<host>-<pid>`` in its directory (its command
line inside), touches it at most every `TOUCH_S` while it updates the index, and
removes it when it closes it (or, not closed, as the process exits).

A lease says "in use" (`holders`):
* of this host, while its process lives (POSIX: signal 0; elsewhere as another host's);
* of another host, for `LEASE_S` after its last touch: a process killed there leaves
  one that protects the index a day longer. A console touches its lease every hour
  however idle (`keep`), so one left open there stays protected. Said in docs/report.md.

Writing a lease never fails an index: a directory it cannot write (a read-only copy)
just has no lease.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tracedpush import pids

PREFIX = "lease-"
TOUCH_S = 60.0  # an open index's lease is touched at most this often (as it updates)
LEASE_S = 86400.0  # another host's lease counts this long after its last touch


@dataclass(frozen=True, slots=True)
class User:
    """A process with an index open: of this host as ``/proc`` shows it (`host` ""), or
    as its lease says it (`holders`: another host's, or one ``/proc`` did not show)."""

    pid: int
    command: str
    host: str = ""

    def __str__(self) -> str:
        """ "pid command", or "host pid command (lease)"."""
        if self.host:
            return f"{self.host} {self.pid} {self.command} (lease)"
        return f"{self.pid} {self.command}"

    @property
    def who(self) -> str:
        """ "pid N" or "host pid N", for a status column."""
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

    def keep(self) -> None:
        """Touch the lease now if this process holds it: a long-lived process that may
        not update its index for hours (an idle console) keeps it counted by other hosts,
        which count a lease `LEASE_S` after its last touch. Nothing once released."""
        if self._touched:
            self._touched = 0.0
            self.hold()

    def release(self) -> None:
        """Remove the lease (only in the process it is of: a forked child closing its
        copy of the index leaves its parent's)."""
        if os.getpid() != self._pid:
            return
        self._touched = 0.0
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


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
