"""When an engine's API server had a request: the kernel's receive stamp, else the loop's read.

`network` must be transport only. Stamping in the app (or even when the event loop read
the bytes) adds the API server's wait: its loop busy with other requests, or its thread
waiting for a core it shares with busy-polling engine threads. Only the kernel knows when
the bytes arrived, and it tells only a ``recvmsg`` with ``SO_TIMESTAMPNS`` set; uvloop
(vLLM's loop) reads with plain ``read``. So, per connection:

- a duplicate of the socket, with ``SO_TIMESTAMPNS`` on, is peeked once when the
  connection is made (a new connection's first bytes are often in already), then watched
  by the same loop, registered *after* the transport starts reading, so that for the same
  readiness its callback runs first (epoll reports the newest registration first);
- the callback ``MSG_PEEK``-s the unread bytes: nothing is consumed, and the stamp is the
  arrival of the last bytes queued (TCP keeps the newest stamp when it coalesces). It then
  stops watching until the loop has read those bytes, so a transport whose reading is
  paused never makes it spin;
- the protocol's ``data_received`` takes the stamp. Where none is there (a platform
  without the option, the transport's callback won the race) the read clock stands in:
  the moment the loop read them;
- the kernel stamps arriving packets only while some socket on the host asks for stamps,
  so one socket asks for as long as the clock is on (`_keep_stamping`): without it, the
  first bytes of a new connection that came while no connection was open had no stamp.

Both land in the ASGI scope (`KERNEL_SCOPE_KEY`, `SCOPE_KEY`), overwritten by each read of
the request, so they tell when its *last* bytes arrived: the proxy's ``request_sent`` is
stamped before its last chunk is written. Any failure falls back silently to the read
clock; nothing here can fail a request. The cost is one peek and two ``epoll_ctl`` per
read on the API server's loop (14 us of CPU per 4 KB read here, under uvloop), nothing on
the engine.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from time import time_ns
from typing import Any

SCOPE_KEY = "tracedpush.http_read_ns"  # scope key: the loop read the request's last bytes
KERNEL_SCOPE_KEY = "tracedpush.http_kernel_ns"  # scope key: the kernel had its last bytes

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if os.uname().sysname == "Linux" else 0)
_PEEK_BYTES = 1 << 20  # a request longer than this is stamped at its first MiB's arrival
_ATTR = "_tracedpush_kernel_stamp"
_PROTOCOLS = (  # uvicorn's HTTP/1.1 protocols (`--http auto` picks httptools)
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
    ("uvicorn.protocols.http.h11_impl", "H11Protocol"),
)
_WRAPPED: dict[type, dict[str, Callable[..., None]]] = {}  # class -> its own methods
_local = threading.local()  # one peek buffer per event-loop thread
log = logging.getLogger(__name__)


def _peek_buffer() -> bytearray:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(_PEEK_BYTES)
    return buf


class KernelStamp:
    """One connection's watcher: the kernel's receive time of its unread bytes (unix ns)."""

    __slots__ = ("_armed", "_loop", "_sock", "ns")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._sock = socket.socket(fileno=os.dup(fd))
        self._loop, self._armed, self.ns = loop, False, 0
        try:
            self._sock.setblocking(False)
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            self._sock.close()
            raise
        self._peek()  # a new connection's first bytes are often in before it is made
        if not self.ns:
            loop.call_soon(self.arm)  # after the transport's own registration

    def arm(self) -> None:
        if not self._armed and self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._peek)
            self._armed = True

    def _disarm(self) -> None:
        if self._armed:
            self._armed = False
            self._loop.remove_reader(self._sock.fileno())

    def _peek(self) -> None:
        try:
            _, ancillary, _, _ = self._sock.recvmsg_into(
                [_peek_buffer()], socket.CMSG_SPACE(16), socket.MSG_PEEK
            )
        except (BlockingIOError, InterruptedError):  # the transport read them first
            return
        except OSError:
            self.close()
            return
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                sec, nsec = struct.unpack("qq", data[:16])
                self.ns = sec * 1_000_000_000 + nsec
        self._disarm()  # until the loop reads these bytes (at EOF, for good)

    def take(self) -> int:
        """The stamp for the bytes being read now (0 if none); watch for the next ones."""
        ns, self.ns = self.ns, 0
        try:
            self.arm()
        except (OSError, RuntimeError, ValueError):  # loop closing: no more stamps
            pass
        return ns

    def close(self) -> None:
        try:
            self._disarm()
        except (OSError, RuntimeError, ValueError):
            pass
        self._sock.close()


def _attach(protocol: Any, transport: Any) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6) or not SO_TIMESTAMPNS:
        return
    try:
        setattr(protocol, _ATTR, KernelStamp(asyncio.get_running_loop(), sock.fileno()))
    except (OSError, RuntimeError, ValueError) as e:
        if not getattr(_local, "warned", False):
            _local.warned = True
            log.warning("tracedpush: no kernel receive stamps (%s); using the read clock", e)


def _connection_made(original: Callable[..., None]) -> Callable[..., None]:
    def connection_made(self: Any, transport: Any, *args: Any, **kwargs: Any) -> None:
        original(self, transport, *args, **kwargs)
        try:
            _attach(self, transport)
        except Exception:  # never let the clock refuse a connection
            log.debug("tracedpush: kernel stamp not attached", exc_info=True)

    return connection_made


def _connection_lost(original: Callable[..., None]) -> Callable[..., None]:
    def connection_lost(self: Any, exc: Exception | None) -> None:
        stamp = getattr(self, _ATTR, None)
        if stamp is not None:
            setattr(self, _ATTR, None)
            stamp.close()
        original(self, exc)

    return connection_lost


def _data_received(original: Callable[[Any, bytes], None]) -> Callable[[Any, bytes], None]:
    def data_received(self: Any, data: bytes) -> None:
        t = time_ns()
        stamp = getattr(self, _ATTR, None)
        kernel_ns = stamp.take() if stamp is not None else 0
        original(self, data)
        scope = getattr(self, "scope", None)  # the request these bytes belong to
        if type(scope) is dict:
            scope[SCOPE_KEY] = t
            if kernel_ns:
                scope[KERNEL_SCOPE_KEY] = kernel_ns
            else:  # a stale stamp from an earlier read must not stand for this one
                scope.pop(KERNEL_SCOPE_KEY, None)

    return data_received


_WRAPPERS = {
    "connection_made": _connection_made,
    "connection_lost": _connection_lost,
    "data_received": _data_received,
}


_asking: list[socket.socket] = []  # the one socket that keeps the kernel stamping


def _keep_stamping() -> None:
    """Hold one socket that asks for receive stamps, for as long as the clock is on.

    Linux stamps an arriving packet only while some socket on the host asks for stamps
    (a global switch), and a stamp asked for later is not made up. So the first bytes of
    a new connection, in before its `KernelStamp` existed, had none whenever no other
    connection was open (the proxy's pool empty, the API server starved on a busy core),
    and the loop's late read stood in for them: `network` took the API server's wait.
    The cost is the kernel stamping every packet, as it does for any host that runs
    tcpdump or chrony."""
    if _asking or not SO_TIMESTAMPNS:
        return
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        sock.close()
        return
    _asking.append(sock)


def install_read_clock() -> list[str]:
    """Wrap uvicorn's HTTP protocols (idempotent); returns the classes wrapped now."""
    _keep_stamping()
    done = []
    for module, name in _PROTOCOLS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # that parser is not installed
            continue
        if cls in _WRAPPED or not all(callable(getattr(cls, m, None)) for m in _WRAPPERS):
            continue
        _WRAPPED[cls] = {m: getattr(cls, m) for m in _WRAPPERS}
        for method, wrap in _WRAPPERS.items():
            setattr(cls, method, wrap(_WRAPPED[cls][method]))
        done.append(f"{module}.{name}")
    return done


def uninstall_read_clock() -> None:
    for cls, originals in _WRAPPED.items():
        for method, original in originals.items():
            setattr(cls, method, original)
    _WRAPPED.clear()
    while _asking:
        _asking.pop().close()


def received_ns(scope: Mapping[str, Any]) -> int:
    """When the request's last bytes were in: the kernel's stamp, else the loop's read."""
    return scope.get(KERNEL_SCOPE_KEY) or scope.get(SCOPE_KEY) or 0
